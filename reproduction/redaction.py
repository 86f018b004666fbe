"""Keep secrets out of everything a run records: redact command lines, configs and environments; find leaks.

What counts as a secret:
- the value of a key (config key, environment variable, `--flag` or `key=value` argument) whose name
  looks like a credential: one of its words (split at `_ - . ` and case changes) is token (or ends in
  it: `hftoken`), secret, password, passwd, credential(s), auth, authorization, or the pairs api key,
  access key, private key; e.g. `HF_TOKEN`, `hub.token`, `--api-key`. Words such as `tokenizer`,
  `max_tokens` or `author` are not credentials, nor is a name with a quantity word (`max_token_len`,
  `token_budget`, `token_id`);
- any string that looks like a Hugging Face token (`hf_` followed by 30 or more letters/digits);
- any value, wherever it appears inside a longer string, of an environment variable whose name looks
  like a credential (so a token that leaked into a URL or a log line is replaced too).

Secrets are replaced by `REDACTED` ("<redacted>"). `find_secret(root, token)` is the check tests use:
it scans every file under a folder for the raw bytes of a planted token. Stdlib only.
"""

from __future__ import annotations

import functools
import logging
import mmap
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REDACTED = "<redacted>"
SECRET_WORDS = frozenset(
    {"token", "secret", "password", "passwd", "credential", "credentials", "auth", "authorization", "apikey"}
)
QUANTITY_WORDS = frozenset(
    {"max", "min", "num", "len", "length", "count", "size", "limit", "budget", "per", "ids", "id", "type", "dim"}
)
SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key")})
HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")
# Shorter values are too likely to be ordinary words ("1", "true") to replace inside other strings.
MIN_SECRET_LEN = 8


@functools.lru_cache(maxsize=4096)  # a pure function of the name; run.json redaction asks for the same keys often
def is_secret_name(name: str) -> bool:
    """True if a key or variable name looks like it holds a credential (`HF_TOKEN`, `hub.token`, `--api-key`)."""
    words = [w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+", name)]
    if QUANTITY_WORDS.intersection(words):  # max_token_len, num_tokens, token_budget: sizes, not credentials
        return False
    if any(w in SECRET_WORDS or (w.endswith("token") and len(w) > 5) for w in words):
        return True
    return any(pair in SECRET_PAIRS for pair in zip(words, words[1:]))


def secret_values(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Values of the environment's credential-looking variables (long enough to match safely), longest first."""
    env = os.environ if environ is None else environ
    values = {v for k, v in env.items() if is_secret_name(k) and len(v) >= MIN_SECRET_LEN}
    return tuple(sorted(values, key=len, reverse=True))


def redact_text(text: str, *, secrets: Sequence[str] = ()) -> str:
    """`text` with every known secret value and every HF-token-shaped string replaced by REDACTED."""
    for value in secrets:
        if value in text:
            text = text.replace(value, REDACTED)
    return HF_TOKEN.sub(REDACTED, text) if "hf_" in text else text


def redact(value: Any, *, environ: Mapping[str, str] | None = None, secrets: Sequence[str] | None = None) -> Any:
    """A copy of a JSON-like value (dicts, lists, strings, numbers) with secrets replaced; the input is not mutated.

    Values of credential-named keys are replaced whole (unless None or empty); every string is also
    passed through `redact_text` with the environment's secret values. Keys are kept.
    """
    known = tuple(secrets) if secrets is not None else secret_values(environ)
    return _redact(value, known)


def _redact(value: Any, known: Sequence[str], *, under_secret: bool = False) -> Any:
    """Recursive redaction; below a credential-named key every non-empty leaf is a secret.
    (Leaves are tested first and with concrete types: run.json is redacted at every state change, and an ABC
    isinstance per number was half its cost.)"""
    if isinstance(value, str):
        if under_secret and value:
            return REDACTED
        return redact_text(value, secrets=known)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return REDACTED if under_secret else value
    if isinstance(value, (dict, Mapping)):
        return {
            key: _redact(item, known, under_secret=under_secret or is_secret_name(str(key)))
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_redact(item, known, under_secret=under_secret) for item in value]
    return REDACTED if under_secret else value


def redact_argv(
    argv: Sequence[str], *, environ: Mapping[str, str] | None = None, secrets: Sequence[str] | None = None
) -> list[str]:
    """A command line with secret arguments replaced: `--token X`, `--token=X`, `hub.token=X`, token-shaped strings."""
    known = tuple(secrets) if secrets is not None else secret_values(environ)
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("-") and "=" not in arg and is_secret_name(arg.lstrip("-")):
            out.append(arg)
            hide_next = True
            continue
        key, sep, _ = arg.partition("=")
        if sep and is_secret_name(key.lstrip("-")):
            out.append(f"{key}={REDACTED}")
            continue
        out.append(redact_text(arg, secrets=known))
    return out


def redact_environ(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of the environment with credential-named variables' values and embedded secrets replaced."""
    env = dict(os.environ if environ is None else environ)
    return redact(env, secrets=secret_values(env))


class RedactingFilter(logging.Filter):
    """A logging filter that redacts every record's message (arguments merged in first) before any handler writes it.

    Attach it to the handlers that write a run's log files: `handler.addFilter(RedactingFilter())`.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self._secrets = secret_values(environ)

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact_text(record.getMessage(), secrets=self._secrets)
        record.args = None
        return True


@dataclass(frozen=True, slots=True)
class SecretFinding:
    """One place a secret was found: the file and the byte offsets of its occurrences."""

    path: Path
    offsets: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.path} (at byte {', '.join(str(o) for o in self.offsets[:5])})"


def find_secret(root: Path, token: str, *, skip: Iterable[str] = ()) -> list[SecretFinding]:
    """Every file under `root` (a file or folder, links not followed) holding `token`'s bytes; [] when clean.

    Searches the raw bytes (UTF-8) and the UTF-16-LE form; compressed files are searched as stored,
    so a token inside a .tar.zst is not seen (the run writes none). `skip` names relative paths to leave out.
    """
    if len(token) < MIN_SECRET_LEN:
        raise ValueError(f"a planted token should be at least {MIN_SECRET_LEN} characters, got {len(token)}")
    needles = (token.encode("utf-8"), token.encode("utf-16-le"))
    root = Path(root)
    skipped = set(skip)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    found = []
    for path in files:
        if root.is_dir() and path.relative_to(root).as_posix() in skipped:
            continue
        offsets = _offsets(path, needles)
        if offsets:
            found.append(SecretFinding(path, offsets))
    return found


def _offsets(path: Path, needles: Sequence[bytes]) -> tuple[int, ...]:
    """Byte offsets of every needle in a file, searched through mmap (a multi-GB checkpoint is not read into memory)."""
    with open(path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size == 0:
            return ()
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            out = []
            for needle in needles:
                at = data.find(needle)
                while at != -1:
                    out.append(at)
                    at = data.find(needle, at + 1)
    return tuple(sorted(out))

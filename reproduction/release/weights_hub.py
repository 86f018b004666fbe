"""`portable weights pin` and `portable weights fetch`: weight manifests against the Hugging Face Hub.

pin: resolve a revision to a commit, list the repo tree at that commit and record each chosen
file's size and sha256 from the Hub's metadata: LFS files carry their sha256 (the LFS oid), so
nothing large is downloaded; small regular files (configs, tokenizer JSON; the Hub keeps them in
git with only a sha1) are read into memory, checked against their git blob id and hashed.

fetch: download exactly the manifest's files, every URL pinned to the recorded commit (a branch
that moved since pinning changes nothing), resuming partial files and hashing while writing
(release/hub_transfer.py, the code `portable fetch` uses); a file whose bytes differ from the pinned
sha256 is refused and never renamed into place. Built components are built locally instead.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from reproduction.digests import sha256_files
from reproduction.errors import HubAuthError, HubIntegrityError, InvalidInputError
from reproduction.fsio import refuse_file_for_folder, refuse_unwritable
from reproduction.release.hub_transfer import (
    Download,
    HubSettings,
    download_all,
    fetch_small,
    hub_import,
    quiet_hub_logs,
    request_timeout,
    with_retries,
)
from reproduction.release.manifest import STATE_DIR, check_relative_path
from reproduction.release.weights_manifest import (
    UNPINNED,
    Component,
    LicenseIndex,
    WeightFile,
    WeightsManifest,
    check_component,
    check_file,
    load_license_index,
)
from reproduction.ui import UiOptions, human_bytes, say

if TYPE_CHECKING:
    from reproduction.release.weights import WeightsReport

T = TypeVar("T")
_CONFIG_NAMES = ("config.json", "tokenizer_config.json", "preprocessor_config.json", "policy_preprocessor.json")


def guess_kind(repo_path: str) -> str:
    name = repo_path.rsplit("/", 1)[-1]
    if name.endswith((".safetensors", ".bin", ".pt", ".pth")) and not name.startswith("policy_"):
        return "weights"
    if name.startswith("policy_"):
        return "processor"
    if name.startswith(("tokenizer", "special_tokens_map")) or name.endswith(".model"):
        return "tokenizer"
    if name == "config.json" or name.endswith("_config.json"):
        return "config"
    return "other"


def _select(tree: dict[str, Any], globs: list[str], repo: str) -> list[str]:
    chosen: list[str] = []
    for pattern in globs:
        hits = sorted(p for p in tree if fnmatch.fnmatchcase(p, pattern) and p != ".gitattributes")
        if not hits:
            raise InvalidInputError(
                f"{repo}: no file matches {pattern!r} (the repo has: {', '.join(sorted(tree)[:20])})",
                field="--files",
                hint="pass globs that match files of the repo at that revision",
            )
        chosen += [p for p in hits if p not in chosen]
    return chosen


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _license_for(lic_arg: str | None, card_license: str | None, index: LicenseIndex, repo: str) -> dict[str, Any]:
    """The license entry for `--license ID|LICENSES/<file>`, else the card's id; checked against the index."""
    lid = lic_arg or card_license
    if lid is None:
        raise InvalidInputError(
            f"{repo} declares no license on its card",
            field="--license",
            hint=f"pass --license with one of {', '.join(index.ids)} (or a LICENSES/<file>)",
        )
    if lid.startswith("LICENSES/"):
        name = lid.removeprefix("LICENSES/")
        entry = index.files.get(name, {"id": "?"})
        lic = {"id": entry["id"], "file": lid}
    else:
        files = sorted(n for n, e in index.files.items() if e["id"] == lid)
        lic = {"id": lid, "file": f"LICENSES/{files[0]}" if files else f"LICENSES/{lid}"}
        if len(files) > 1:
            raise InvalidInputError(
                f"license id {lid!r} has several texts in LICENSES/ ({', '.join(files)})",
                field="--license",
                hint="pass the file instead: --license LICENSES/<file>",
            )
    lic["source"] = "--license" if lic_arg else f"the Hub card of {repo}"
    if index.files.get(lic["file"].removeprefix("LICENSES/"), {}).get("gated"):
        lic["gated"] = True
    index.check_license(lic, where="license")
    return lic


def _file_digest(api_url: str, entry: Any, settings: HubSettings, ui: UiOptions | None) -> str:
    """sha256 of one tree entry: its LFS oid, or (small regular file) the bytes, checked against the git blob id."""
    if entry.lfs is not None:
        return str(entry.lfs.sha256)
    try:
        data = fetch_small(api_url, what=f"read {entry.path}", settings=settings, ui=ui, limit=64 << 20)
    except HubAuthError as exc:  # metadata of a gated repo is public, its files are not
        raise HubAuthError(
            exc.message,
            hint="if the repo is gated (Gemma, PaliGemma), accept its terms on its Hub page with the account "
            "whose token you use (`hf auth login` or HF_TOKEN), then pin again",
        ) from None
    if hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() != entry.blob_id or len(data) != entry.size:
        raise HubIntegrityError(
            f"{entry.path}: the bytes served do not match the Hub's git blob id {entry.blob_id}",
            hint="the server or a proxy altered the file; pin again later",
        )
    return hashlib.sha256(data).hexdigest()


@quiet_hub_logs()
def pin_hub(
    repo: str,
    *,
    revision: str | None = None,
    repo_type: str | None = None,
    globs: list[str] | None = None,
    license_arg: str | None = None,
    existing: Component | None = None,
    settings: HubSettings | None = None,
    ui: UiOptions | None = None,
    licenses: LicenseIndex | None = None,
) -> Component:
    """A component for `repo` at the commit `revision` (default: the existing one's, else main) resolves to.

    Keeps an existing component's role, key mapping, presets, local folder and file kinds; its files
    are re-pinned unless `globs` choose others. Raises InvalidInputError (a glob matching nothing, an
    unknown or missing license), HubNotFoundError, HubAuthError (gated or private), HubTransferError.
    """
    hf_hub_url = hub_import("huggingface_hub").hf_hub_url

    from reproduction.release.hub import _client, check_repo_id

    check_repo_id(repo)
    settings = settings or HubSettings.from_env()
    index = licenses or load_license_index()
    rev = revision or (existing.source.get("revision") if existing else None) or "main"
    rtype = repo_type or (existing.source.get("repo_type") if existing else None) or "model"
    api = _client(settings, ui)
    info = with_retries(  # an explicit timeout: huggingface_hub's default None means none (audit46 hub F1)
        lambda: api.repo_info(repo, repo_type=rtype, revision=rev, timeout=request_timeout(settings)),
        what=f"resolve {repo}@{rev}",
        settings=settings,
        ui=ui,
    )
    commit = str(info.sha)
    if not re.fullmatch(r"[0-9a-f]{40}", commit):  # it goes into every URL and into the component
        raise _refuse("sha", f"{commit[:60]!r} is not a commit id (40 hex digits)", _answer_label(repo, rev))
    tree = with_retries(
        lambda: _list_tree(repo, rtype, commit, settings),
        what=f"list {repo}@{commit[:12]}",
        settings=settings,
        ui=ui,
    )
    old = {f.repo_path: f for f in existing.files if f.repo_path} if existing else {}
    chosen = _select(tree, globs or [p for p in old] or ["*"], repo)
    folder = _folder(existing, repo)
    endpoint = settings.resolved_endpoint()
    label = _answer_label(repo, commit)
    # the Hub's claims, checked as a manifest's files are, before any is read or printed (audit46 hub F11)
    files = [
        _claimed_file(
            {
                "path": old[rp].path if rp in old else f"{folder}{rp}",
                "repo_path": rp,
                "kind": (old[rp].kind if rp in old else None) or guess_kind(rp),
                "size": tree[rp].size,
                # a small git file's sha256 is ours to compute (below); this stands in until then
                "sha256": tree[rp].lfs.sha256 if tree[rp].lfs is not None else hashlib.sha256().hexdigest(),
            },
            label=label,
        )
        for rp in chosen
    ]
    for f in files:
        url = hf_hub_url(repo, f.repo_path, repo_type=rtype, revision=commit, endpoint=endpoint)
        f.sha256 = _file_digest(url, tree[f.repo_path], settings, ui)
    if license_arg is None and existing is not None:
        lic = dict(existing.license)
    else:
        card_license = None if license_arg else _card_license(info, tree, repo, rtype, commit, settings, ui)
        lic = _license_for(license_arg, card_license, index, repo)
    same = existing is not None and existing.source.get("commit") == commit
    comp = Component(
        role=existing.role if existing else repo.split("/", 1)[1].lower().replace(".", "-"),
        source={
            "kind": "hub",
            "repo": repo,
            "repo_type": rtype,
            "revision": rev,
            "commit": commit,
            # re-pinning the same commit keeps the manifest byte for byte
            "pinned_at": existing.source.get("pinned_at") if same and existing.source.get("pinned_at") else _now(),
        },
        license=lic,
        model_config=_config_of(files, existing),
        files=files,
        key_mapping=existing.key_mapping if existing else None,
        presets=existing.presets if existing else (),
        note=existing.note if existing else None,
    )
    _hub_answer(label, lambda: check_component(comp.to_dict(), where="component", label=label))
    if comp.unpinned():  # the loader accepts "to-be-pinned"; an answer from the Hub may not claim it
        raise _refuse(f"component.{comp.unpinned()[0]}", f"is {UNPINNED!r}", label)
    say(
        f"pinned {repo}@{rev} -> {commit}: {len(files)} files, {human_bytes(sum(int(f.size) for f in files))}",
        options=ui,
    )
    return comp


def _answer_label(repo: str, commit: str) -> str:
    return f"the Hub's answer for {repo}@{commit[:12]}"


_BAD_ANSWER = "the Hub (or a proxy in between) answered what no weights manifest may hold; nothing was written"


def _hub_answer(label: str, check: Callable[[], T]) -> T:
    """`check()`, its InvalidInputError (exit 4) said to be about the Hub's answer `label`, on one line."""
    try:
        return check()
    except InvalidInputError as exc:
        message = exc.message if exc.message.startswith(label) else f"{label}: {exc.message}"
        raise InvalidInputError(message, field=exc.fields.get("field"), hint=_BAD_ANSWER) from None


def _refuse(where: str, message: str, label: str) -> InvalidInputError:
    """InvalidInputError (exit 4): the field `where` of the Hub's answer `label` is refused."""
    return InvalidInputError(f"{label}: {where}: {message}", field=where, hint=_BAD_ANSWER)


def _claimed_file(data: dict[str, Any], *, label: str) -> WeightFile:
    """One file as the Hub's tree describes it, checked by a manifest's rules, with a size and a sha256."""
    where = f"entry {data['repo_path']!r}"

    def check() -> WeightFile:
        check_relative_path(data["repo_path"], where=f"{where}.repo_path")  # the Hub's name, before ours
        found = check_file(data, where=where, label=label)
        for key in ("size", "sha256"):
            if getattr(found, key) == UNPINNED:
                raise _refuse(f"{where}.{key}", f"is {UNPINNED!r}", label)
        return found

    return _hub_answer(label, check)


def _list_tree(repo: str, rtype: str, commit: str, settings: HubSettings) -> dict[str, Any]:
    """{path: RepoFile} of every file of `repo` at `commit`, page by page (the Hub's Link header).

    What `HfApi.list_repo_tree(recursive=True)` does, but each page bounded by the stall timeout: that
    method takes no timeout and passes timeout=None, which httpx reads as "wait forever" (audit46 hub F1).
    """
    from urllib.parse import quote

    RepoFile = hub_import("huggingface_hub.hf_api").RepoFile
    hub_utils = hub_import("huggingface_hub.utils")
    build_hf_headers = hub_utils.build_hf_headers
    get_session = hub_utils.get_session
    hf_raise_for_status = hub_utils.hf_raise_for_status

    label = _answer_label(repo, commit)
    url: str | None = f"{settings.resolved_endpoint()}/api/{rtype}s/{repo}/tree/{quote(commit, safe='')}"
    params: dict[str, Any] | None = {"recursive": True, "expand": False}
    tree: dict[str, Any] = {}
    seen = 0
    while url is not None:
        response = get_session().get(url, params=params, headers=build_hf_headers(), timeout=request_timeout(settings))
        hf_raise_for_status(response)
        try:
            page = response.json()
        except ValueError:
            raise _refuse("tree", f"not JSON ({len(response.content)} bytes)", label) from None
        if not isinstance(page, list):
            raise _refuse("tree", f"should be a list, got {type(page).__name__}", label)
        for i, e in enumerate(page, start=seen):
            if not isinstance(e, dict) or not isinstance(e.get("path"), str):
                raise _refuse(f"entry {i}", "should be an object with a string path", label)
            if e.get("type") != "file":
                continue
            try:
                tree[e["path"]] = RepoFile(**e)
            except (KeyError, TypeError, ValueError) as exc:
                raise _refuse(f"entry {e['path']!r}", f"malformed ({type(exc).__name__}: {exc})", label) from None
        seen += len(page)
        url, params = response.links.get("next", {}).get("url"), None  # the next link carries the query
    return tree


def _card_license(
    info: Any, tree: dict[str, Any], repo: str, rtype: str, commit: str, settings: HubSettings, ui: UiOptions | None
) -> str | None:
    """The `license:` of the repo's card: the Hub's parsed card data, else the README's YAML header."""
    hf_hub_url = hub_import("huggingface_hub").hf_hub_url

    card = getattr(info, "card_data", None)
    if card is not None and hasattr(card, "get") and card.get("license"):
        return str(card.get("license"))
    readme = tree.get("README.md")
    if readme is None or readme.lfs is not None:
        return None
    url = hf_hub_url(repo, "README.md", repo_type=rtype, revision=commit, endpoint=settings.resolved_endpoint())
    text = fetch_small(url, what="read README.md", settings=settings, ui=ui, limit=4 << 20).decode("utf-8", "replace")
    header = re.match(r"---\s*\n(.*?)\n---", text, re.S)
    found = re.search(r"^license:\s*['\"]?([\w.+-]+)", header.group(1), re.M) if header else None
    return found.group(1) if found else None


def _folder(existing: Component | None, repo: str) -> str:
    for f in existing.files if existing else []:
        if f.repo_path and f.path.endswith(f.repo_path):
            return f.path[: len(f.path) - len(f.repo_path)]
    return repo.split("/", 1)[1] + "/"


def _config_of(files: list[WeightFile], existing: Component | None = None) -> dict[str, Any]:
    """The model config digest: the file the existing component names, else the first config-like file."""
    by_path = {f.path: f for f in files}
    old = existing.model_config.get("path") if existing is not None else None
    if old in by_path:
        return {"path": old, "sha256": by_path[old].sha256}
    for name in _CONFIG_NAMES:
        for f in files:
            if f.repo_path == name:
                return {"path": f.path, "sha256": f.sha256}
    return {"path": files[0].path, "sha256": files[0].sha256}


def refuse_unpinned(manifest: WeightsManifest, what: str) -> None:
    """InvalidInputError listing every "to-be-pinned" field, if any."""
    missing = manifest.unpinned()
    if missing:
        shown = "\n  ".join(missing[:30]) + (f"\n  ... and {len(missing) - 30} more" if len(missing) > 30 else "")
        raise InvalidInputError(
            f"{manifest.path or manifest.name}: cannot {what}: "
            f"{len(missing)} field(s) are still {UNPINNED!r}:\n  {shown}",
            path=manifest.path,
            field="components",
            hint=f"pin it first where the Hub is reachable: portable weights pin {manifest.path or 'MANIFEST'}",
        )


@dataclass(kw_only=True, slots=True)
class WeightsFetchResult:
    """What `fetch_weights` did."""

    files: int
    """Files the manifest lists (all present and verified now)."""
    downloaded: int
    built: int
    bytes_downloaded: int


def present_files(dest: Path, entries: list[WeightFile]) -> set[str]:
    """Paths of `entries` already in `dest` with the pinned size and sha256."""
    candidates = {
        dest / e.path: e for e in entries if (dest / e.path).is_file() and (dest / e.path).stat().st_size == e.size
    }
    digests = sha256_files(candidates) if candidates else {}
    return {e.path for p, e in candidates.items() if digests[p] == e.sha256}


def fetch_weights(
    manifest: WeightsManifest, dest: Path, *, settings: HubSettings | None = None, ui: UiOptions | None = None
) -> WeightsFetchResult:
    """`fetch_and_verify_weights` without its report."""
    return fetch_and_verify_weights(manifest, dest, settings=settings, ui=ui)[0]


def fetch_and_verify_weights(
    manifest: WeightsManifest, dest: Path, *, settings: HubSettings | None = None, ui: UiOptions | None = None
) -> tuple[WeightsFetchResult, WeightsReport]:
    """Download (or build) every file of `manifest` into `dest`/<path>, each pinned to its commit, then
    hash the files on disk against the manifest; returns what was done and that verify report.

    Holds `dest`'s lock (`.portable/lock`, the one `portable fetch` takes) from before the first file is
    looked at until the files on disk verified: a second fetch into the same folder is LockHeldError
    (exit 7) naming the holder, never a second writer of the same partial file (audit46 hub F4).
    Files already there with the pinned sha256 are kept. A download whose bytes differ from the pin
    is retried, then refused (HubIntegrityError naming the file); nothing unverified is renamed into
    place. Raises InvalidInputError for an unpinned manifest, HubAuthError (with what a gated license
    asks the user to accept), HubNotFoundError, HubTransferError, IntegrityError (a built file's bytes,
    or a file on disk that does not verify), LockHeldError.
    """
    from reproduction.release.lock import LOCK_NAME, folder_lock, state_dir
    from reproduction.release.weights import verify_or_raise

    refuse_unpinned(manifest, "fetch")
    settings = settings or HubSettings.from_env()
    dest = Path(dest)
    refuse_file_for_folder(dest, hint="fetch the weights into a new folder, or one an earlier fetch wrote")
    refuse_unwritable(  # before the Hub is asked anything, also where a rerun finds its lock file (audit47 F17)
        dest,
        "the weights",
        hint=f"make {dest} writable (its permissions, `chattr -i`, a read-write mount) or fetch into another folder",
    )
    state = state_dir(dest, what="fetch weights")
    with folder_lock(dest, state / LOCK_NAME, what="fetch weights", subject="this weights folder"):
        result = _fetch_weights_locked(manifest, dest, settings=settings, ui=ui)
        # the bytes on disk, not the bytes received: what is in place is what the manifest pins
        return result, verify_or_raise(manifest, dest)


def _fetch_weights_locked(
    manifest: WeightsManifest, dest: Path, *, settings: HubSettings, ui: UiOptions | None
) -> WeightsFetchResult:
    hf_hub_url = hub_import("huggingface_hub").hf_hub_url

    from reproduction.release.weights_build import build_component

    have = present_files(dest, [f for _, f in manifest.files()])
    endpoint = settings.resolved_endpoint()
    jobs, built = [], 0
    for comp in manifest.components:
        todo = [f for f in comp.files if f.path not in have]
        if comp.kind == "built":
            if todo:
                build_component(comp, dest)
                built += 1
            continue
        src = comp.source
        jobs += [
            Download(
                rel=f.path,
                url=hf_hub_url(
                    src["repo"],
                    f.repo_path or f.path,
                    repo_type=src["repo_type"],
                    revision=src["commit"],
                    endpoint=endpoint,
                ),
                dest=dest / f.path,
                partial=dest
                / STATE_DIR
                / "partial"
                / f"{hashlib.sha256(f.path.encode()).hexdigest()[:20]}.{f.sha256[:20]}.part",
                size=int(f.size),
                sha256=f.sha256,
                pinned_in=str(manifest.path) if manifest.path else f"weights manifest {manifest.name}",
            )
            for f in todo
        ]
    say(f"weights {manifest.name}: {len(have)} present, {len(jobs)} to download, {built} built", options=ui)
    try:
        download_all(jobs, settings=settings, ui=ui)
    except HubAuthError as exc:
        gated = [c for c in manifest.components if c.license.get("gated") and c.kind == "hub"]
        if not gated:
            raise
        index = load_license_index(near=manifest.path)
        accept = index.files.get(gated[0].license["file"].removeprefix("LICENSES/"), {}).get("accept", "")
        raise HubAuthError(
            exc.message + f"\n  gated: {', '.join(c.source['repo'] for c in gated)} ({gated[0].license['id']})",
            hint=accept or exc.hint,
        ) from None
    return WeightsFetchResult(
        files=len(manifest.files()),
        downloaded=len(jobs),
        built=built,
        bytes_downloaded=sum(j.size for j in jobs),
    )


def pin_manifest(
    path: Path,
    *,
    settings: HubSettings | None = None,
    ui: UiOptions | None = None,
    licenses: LicenseIndex | None = None,
) -> WeightsManifest:
    """Pin every component of the manifest at `path` in place: Hub ones at their `revision`, built ones by
    building. The file is rewritten atomically only once every component is pinned."""
    import tempfile

    from reproduction.release.weights_build import pin_built
    from reproduction.release.weights_manifest import load_weights_manifest, write_weights_manifest

    manifest = load_weights_manifest(path, licenses=licenses, repin=True)
    with tempfile.TemporaryDirectory(prefix="portable-pin-") as scratch:
        for i, comp in enumerate(manifest.components):
            if comp.kind == "built":
                pin_built(comp, Path(scratch))
                say(f"pinned {comp.label}: sha256 {comp.files[0].sha256}", options=ui)
            else:
                manifest.components[i] = pin_hub(
                    comp.source["repo"], existing=comp, settings=settings, ui=ui, licenses=licenses
                )
    write_weights_manifest(path, WeightsManifest.from_dict(manifest.to_dict(), path=path))
    return manifest


def pin_into(path: Path, comp: Component, *, licenses: LicenseIndex | None = None) -> WeightsManifest:
    """Replace the component of the manifest at `path` with the same repo (or append `comp`); write it."""
    from reproduction.release.weights_manifest import load_weights_manifest, write_weights_manifest

    manifest = load_weights_manifest(path, licenses=licenses)
    same = [i for i, c in enumerate(manifest.components) if c.source.get("repo") == comp.source["repo"]]
    if same:
        manifest.components[same[0]] = comp
    else:
        manifest.components.append(comp)
    checked = WeightsManifest.from_dict(manifest.to_dict(), path=path)
    write_weights_manifest(path, checked)
    return checked


def existing_component(path: Path | None, repo: str) -> Component | None:
    from reproduction.release.weights_manifest import load_weights_manifest

    if path is None or not Path(path).exists():
        return None
    found = [c for c in load_weights_manifest(path).components if c.source.get("repo") == repo]
    return found[0] if found else None

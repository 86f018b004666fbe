"""Prompt text for the value model: RECAP's normalisation/template, tokenizers, padding to the longest.

Real bundles ship Gemma3's `tokenizer.json`; the `tiny` preset trains a byte-level BPE in-process
from the dataset's task strings (milliseconds) and saves it with the checkpoint. Both load through
`AutoTokenizer.from_pretrained(local_dir)` and never touch the network.

    <dir>/tokenizer.json          the tokenizers model (vocab, merges, post-processor adding <bos>)
    <dir>/tokenizer_config.json   special tokens, for AutoTokenizer
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from reproduction.errors import InputNotFoundError

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
MAX_TOKEN_LEN = 200


def normalize_task(text: str) -> str:
    """RECAP.md 2.1: lower-case, strip, `_`/newline -> space, drop one trailing punctuation char but a quote (RLinf's
    BaseValueTextProcessor `_clean_text` then `_strip_trailing_punctuation`, which keeps a closing `"` or `'`)."""
    text = text.lower().strip().replace("_", " ").replace("\n", " ")
    if text and text[-1] in string.punctuation and text[-1] not in "\"'":
        text = text[:-1]
    return text


def format_prompt(task: str) -> str:
    """The template the value model reads: `Task: {normalised task}.`"""
    return f"Task: {normalize_task(task)}."


def train_tokenizer(tasks: Iterable[str], out_dir: Path, *, vocab_size: int = 512) -> Any:
    """Train a byte-level BPE on the formatted task strings, save it to `out_dir`, return it loaded.

    Deterministic for the same task set (sorted, de-duplicated before training). Ids 0..3 are
    <pad>, <bos>, <eos>, <unk>; every encoding starts with <bos> (Gemma3 does the same).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    texts = sorted({format_prompt(t) for t in tasks})
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", tok.token_to_id("<bos>"))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return load_tokenizer(out_dir)


def load_tokenizer(path: Path) -> Any:
    """Load a tokenizer folder (`tokenizer.json` inside) offline; InputNotFoundError if absent."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not (path / "tokenizer.json").is_file():
        raise InputNotFoundError(
            f"tokenizer: {path / 'tokenizer.json'} does not exist",
            path=path / "tokenizer.json",
            hint="point the value config's tokenizer at the bundle's tokenizer folder, "
            "or use the tiny preset, which trains one from the dataset's tasks",
        )
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def encode_prompts(
    tokenizer: Any, prompts: list[str], *, max_len: int = MAX_TOKEN_LEN
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and mask (B, T), right-padded with the pad id to the batch's longest prompt (<= max_len)."""
    encoded = tokenizer(prompts, add_special_tokens=True, truncation=True, max_length=max_len)["input_ids"]
    longest = max((len(e) for e in encoded), default=1)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(encoded), longest), pad, dtype=torch.long)
    mask = torch.zeros((len(encoded), longest), dtype=torch.bool)
    for row, seq in enumerate(encoded):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, : len(seq)] = True
    return ids, mask

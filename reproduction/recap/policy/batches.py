"""Stage 4's training data inside each worker: samples over the saved arrays (and camera frames), the prompt
routing hook, the batched fast path and the collator that tokenises prompts.

Prompt routing (conditioning.py) draws from the trainer's per-sample uniforms (seed, epoch, position), so a resumed
run routes exactly as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


class PolicySamples:
    """Map-style training set over the saved arrays: normalised state, action chunk, label, task (and images)."""

    def __init__(
        self,
        arrays: Any,
        stats: Mapping[str, Any],
        *,
        cameras: Mapping[str, str] | None = None,
        sources: Sequence[Mapping[str, Any]] = (),
        fingerprints: Mapping[str, str] | None = None,
        image_size: int = 64,
    ) -> None:
        from reproduction.recap.policy.normalize import Normalizer

        self.arrays = arrays
        norm = Normalizer(stats)  # z-score, or openpi's quantiles (pi05): normalize.py
        self.state = norm.state(arrays.state)
        self.action = norm.action(arrays.action)
        self.cameras = dict(cameras or {})
        self.sources = list(sources)
        self.fingerprints = dict(fingerprints or {})
        self.image_size = image_size
        self._datasets: dict[int, Any] = {}

    def __len__(self) -> int:
        return len(self.arrays)

    def _dataset(self, d: int) -> Any:
        if d not in self._datasets:
            from reproduction.data.reader import open_dataset
            from reproduction.errors import FingerprintMismatchError

            src = self.sources[d]
            ds = open_dataset(src["path"])
            want = self.fingerprints.get(src["name"])
            if want and ds.fingerprint != want:
                raise FingerprintMismatchError(
                    f"{src['path']}: the dataset changed since the policy setup was written "
                    f"(fingerprint {want[:12]} -> {ds.fingerprint[:12]})",
                    path=src["path"],
                    expected=want,
                    actual=ds.fingerprint,
                    hint="rerun the policy stage from the start",
                )
            self._datasets[d] = ds
        return self._datasets[d]

    def __getitem__(self, i: int) -> dict[str, Any]:
        a = self.arrays
        sample = {
            "state": self.state[i],
            "actions": self.action[a.chunk[i]],
            "task_id": int(a.task_id[i]),
            "label": bool(a.label[i]),
            "kind": 0,
        }
        if self.cameras:
            from reproduction.recap.value.data import to_pixels

            ds = self._dataset(int(a.source[i]))
            present = {slot: key for slot, key in self.cameras.items() if key in ds.camera_keys}
            raw = ds.read_frames([int(a.row[i])], list(present.values())) if present else {}
            sample["images"] = {slot: to_pixels(raw[key][0], self.image_size) for slot, key in present.items()}
        return sample


@dataclass(kw_only=True)
class PolicyBatcher:
    """The trainer's batched fast path (`TrainTask.make_batch`) for a camera-free, text-state-free
    preset: gathers state and chunks by index, routes prompts with `route_batch` over the batch's
    per-sample uniforms, and tokenises through the collator's prompt table (no per-sample objects)."""

    samples: PolicySamples
    collator: PolicyCollator
    augment: RouteAugment | None

    def __call__(self, keys: Any) -> dict[str, Any]:
        from reproduction.recap.policy.conditioning import route_batch

        a, idx = self.samples.arrays, np.asarray(keys.indices, np.int64)
        label = np.asarray(a.label[idx], bool)
        if self.augment is None:
            kinds = np.zeros(len(idx), np.int64)
        else:
            aug = self.augment
            u = keys.uniforms(1)[:, 0]
            kinds = route_batch(label, u, mode=aug.mode, dropout=aug.dropout, positive_only=aug.positive_only)
        return self.collator.collate_arrays(
            state=self.samples.state[idx],
            actions=self.samples.action[a.chunk[idx]],
            task_ids=np.asarray(a.task_id[idx], np.int64),
            kinds=np.asarray(kinds, np.int64),
            labels=label,
        )


@dataclass(kw_only=True)
class RouteAugment:
    """The trainer's per-sample hook: draws u ~ U(0,1) from the sample's RNG and routes its prompt."""

    mode: str
    dropout: float
    positive_only: bool

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        from reproduction.recap.policy.conditioning import route

        out = dict(sample)
        out["kind"] = route(
            sample["label"], float(rng.random()), mode=self.mode, dropout=self.dropout, positive_only=self.positive_only
        )
        return out


class PolicyCollator:
    """Samples -> batch: state (B,S), actions (B,H,A'), prompt tokens (B,T) by (task, kind), kinds, images.

    `prompt` (pi05) is the pi0.5 prompt style (pi05.PROMPTS): `pi05` the task alone tokenised as openpi's
    PaligemmaTokenizer does without a state, `pi05_state` (or `state_text=True`) the state written into the prompt as
    openpi's 256-bin text, `pi05_state_clipped` the state text of exports written before openpi's binning was
    matched; None (tiny) the value model's `Task: ...` template. `action_dim` pads action chunks with zeros to the
    model's width (pi0.5's max_action_dim). Token ids of the few distinct prompts are cached (the tokenizer is the
    slowest part of a tiny batch otherwise)."""

    def __init__(
        self,
        tokenizer: Any,
        tasks: Sequence[str],
        *,
        cameras: Sequence[str] = (),
        image_size: int = 64,
        max_token_len: int = 64,
        state_text: bool = False,
        action_dim: int | None = None,
        prompt: str | None = None,
    ) -> None:
        from reproduction.recap.policy.pi05 import PROMPTS

        prompt = "pi05_state" if prompt is None and state_text else prompt
        if prompt is not None and prompt not in PROMPTS:
            raise ValueError(f"prompt style {prompt!r} is not one of {', '.join(PROMPTS)}")
        self.tokenizer = tokenizer
        self.tasks = list(tasks)
        self.cameras = tuple(sorted(cameras))
        self.image_size = image_size
        self.prompt = prompt
        self.max_token_len = 200 if prompt is not None else max_token_len  # openpi's pi0.5 max_token_len
        self.state_text = prompt is not None
        """A pi0.5 prompt (batches go through the per-sample path; the historical name: it once always held the
        state)."""
        self.action_dim = action_dim
        self._ids: dict[str, list[int]] = {}

    def prompts(self, task_ids: Sequence[int], kinds: Sequence[int], states: np.ndarray | None = None) -> list[str]:
        from reproduction.recap.policy.conditioning import prompt_text
        from reproduction.recap.tokenizer import format_prompt

        if self.prompt == "pi05":
            from reproduction.recap.policy.pi05 import clean_task

            return [clean_task(prompt_text(self.tasks[t], k)) for t, k in zip(task_ids, kinds)]
        if self.prompt is not None:
            from reproduction.recap.policy.pi05 import discretize_state, pi05_prompt

            texts = discretize_state(states, clip=self.prompt == "pi05_state_clipped")
            return [pi05_prompt(prompt_text(self.tasks[t], k), s) for t, k, s in zip(task_ids, kinds, texts)]
        return [format_prompt(prompt_text(self.tasks[t], k)) for t, k in zip(task_ids, kinds)]

    def encode(self, prompts: list[str]) -> tuple[Any, Any]:
        """(ids, mask) right-padded to the longest, through a per-prompt cache."""
        import torch

        todo = sorted({p for p in prompts if p not in self._ids})
        if todo:
            if self.prompt == "pi05":
                from reproduction.recap.policy.pi05 import pi05_token_ids

                self._ids.update(zip(todo, pi05_token_ids(self.tokenizer, todo, max_len=self.max_token_len)))
            else:
                enc = self.tokenizer(todo, add_special_tokens=True, truncation=True, max_length=self.max_token_len)
                self._ids.update(zip(todo, enc["input_ids"]))
            if len(self._ids) > 4096:  # state text makes prompts distinct: keep the cache bounded
                self._ids = {p: self._ids[p] for p in todo}
        seqs = [self._ids[p] for p in prompts]
        longest = max((len(q) for q in seqs), default=1)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(seqs), longest), pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), longest), dtype=torch.bool)
        for row, q in enumerate(seqs):
            ids[row, : len(q)] = torch.tensor(q, dtype=torch.long)
            mask[row, : len(q)] = True
        return ids, mask

    def prompt_table(self, task_ids: np.ndarray, kinds: np.ndarray) -> tuple[Any, Any, Any]:
        """The distinct prompts of a batch and each row's index into them: (ids (U,T), mask (U,T),
        index (B,)), without a per-row Python loop (a prompt is fixed by its (task, kind) pair)."""
        import torch

        from reproduction.recap.policy.conditioning import KINDS

        pair = np.asarray(task_ids, np.int64) * len(KINDS) + np.asarray(kinds, np.int64)
        uniq, inverse = np.unique(pair, return_inverse=True)
        ids, mask = self.encode(self.prompts((uniq // len(KINDS)).tolist(), (uniq % len(KINDS)).tolist()))
        return ids, mask, torch.from_numpy(inverse.reshape(-1).astype(np.int64))

    def collate_arrays(
        self, *, state: np.ndarray, actions: np.ndarray, task_ids: np.ndarray, kinds: np.ndarray, labels: np.ndarray
    ) -> dict[str, Any]:
        """A camera-free, text-state-free batch from arrays: the prompts go in once each as
        `prompt_ids`/`prompt_mask` with the per-row `prompt_index` (the model's prefix runs once per
        distinct prompt), and `input_ids`/`attention_mask` are their per-row gathers."""
        import torch

        if self.cameras or self.state_text:
            raise ValueError("collate_arrays serves camera-free, text-state-free presets only")
        ids, mask, index = self.prompt_table(task_ids, kinds)
        actions = np.ascontiguousarray(actions, np.float32)
        if self.action_dim and actions.shape[-1] < self.action_dim:
            pad = np.zeros((*actions.shape[:-1], self.action_dim - actions.shape[-1]), np.float32)
            actions = np.concatenate([actions, pad], -1)
        return {
            "state": torch.from_numpy(np.ascontiguousarray(state, np.float32)),
            "actions": torch.from_numpy(actions),
            "input_ids": ids[index],
            "attention_mask": mask[index],
            "prompt_ids": ids,
            "prompt_mask": mask,
            "prompt_index": index,
            "kind": torch.from_numpy(np.asarray(kinds, np.int64)),
            "label": torch.from_numpy(np.asarray(labels, bool)),
        }

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        kinds = [int(s["kind"]) for s in samples]
        states = np.stack([s["state"] for s in samples])
        ids, att = self.encode(self.prompts([s["task_id"] for s in samples], kinds, states))
        actions = np.stack([s["actions"] for s in samples])
        if self.action_dim and actions.shape[-1] < self.action_dim:
            actions = np.concatenate(
                [actions, np.zeros((*actions.shape[:-1], self.action_dim - actions.shape[-1]), actions.dtype)], -1
            )
        batch = {
            "state": torch.from_numpy(states),
            "actions": torch.from_numpy(actions),
            "input_ids": ids,
            "attention_mask": att,
            "kind": torch.tensor(kinds, dtype=torch.long),
            "label": torch.tensor([bool(s["label"]) for s in samples]),
        }
        if self.cameras:
            zeros = torch.full((3, self.image_size, self.image_size), -1.0)
            batch["images"], batch["image_masks"] = {}, {}
            for slot in self.cameras:
                got = [s.get("images", {}).get(slot) for s in samples]
                batch["image_masks"][slot] = torch.tensor([g is not None for g in got])
                batch["images"][slot] = torch.stack([g if g is not None else zeros for g in got])
        return batch

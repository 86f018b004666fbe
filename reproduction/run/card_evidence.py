"""Evaluation evidence rebuilt from a published model card's `model-index` (what `portable compare
hub:OWNER/NAME` and `portable compare CARD.md` read).

It lives in run/, beside the evidence it builds, so that release/ (the control plane's packing and publishing,
which writes the model-index: release/model_card.py) imports no pipeline package (docs/architecture.md,
"Dependency rules"); like run/compare_cmd.py it is stdlib only at import.
"""

from __future__ import annotations

from typing import Any

from reproduction.errors import InvalidInputError
from reproduction.release.model_card import card_model_index
from reproduction.run.evidence import EvalRecord, build_evidence
from reproduction.run.evidence_check import COUNT_METRICS


def evidence_from_card(text: str, *, where: str = "model card") -> dict[str, Any]:
    """Evaluation evidence (format 2.0, one policy primary and the rest baselines) rebuilt from a card's
    model-index; raises InvalidInputError when the card holds no recap-portable results."""
    try:
        entries, meta = _card_entries(card_model_index(text), where)
    except (AttributeError, TypeError, KeyError) as exc:  # a hand-edited index: lists where mappings go, ...
        raise InvalidInputError(
            f"{where}: its model-index is not of the shape recap-portable publishes ({type(exc).__name__}: {exc})",
            field="model-index",
            hint="compare against the run's evidence JSON instead, or publish the card again with `portable publish`",
        ) from None
    if not entries:
        raise InvalidInputError(
            f"{where} has no recap-portable results in its model-index",
            hint="publish the bundle with recap-portable (its evidence/*.json become the card's model-index)",
        )
    records = [
        EvalRecord(
            result={"tasks": {t: r for t, r in e["tasks"].items() if "episodes" in r}},
            label=label,
            mode=str(e["policy"].get("mode") or "other"),
            guidance_scale=e["policy"].get("guidance_scale"),
        )
        for label, e in entries.items()
    ]
    return build_evidence(
        records[0],
        baselines=records[1:],
        name=str(meta.get("name") or where),
        run_id="hub",
        seeds=dict(meta.get("seeds") or {}),
        settings={"source": where},
    )


def _card_entries(index: list[Any], where: str) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """{policy label: {"policy", "tasks": {task: {"episodes", metric: successes}}}} and the evidence's name/seeds,
    from a card's model-index."""
    entries: dict[str, dict[str, Any]] = {}
    meta: dict[str, Any] = {}
    for model in index:
        for result in model.get("results", []):
            label = str((result.get("policy") or {}).get("label") or result.get("task", {}).get("name"))
            task = str(result.get("dataset", {}).get("name"))
            policy = {"label": label, "mode": "other", "guidance_scale": None} | (result.get("policy") or {})
            entry = entries.setdefault(label, {"policy": policy, "tasks": {}})
            entry["policy"]["checkpoint"] = {"path": None, "sha256": None, "step": None}
            row = entry["tasks"].setdefault(task, {})
            for metric in result.get("metrics", []):
                args = metric.get("args") or {}
                if metric.get("type") in COUNT_METRICS and {"successes", "episodes"} <= set(args):
                    k, n = args["successes"], args["episodes"]
                    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (k, n)) or not 0 <= k <= n:
                        raise InvalidInputError(
                            f"{where}: {label}/{task} {metric['type']} is {k!r} of {n!r} episodes, not a success "
                            "count (whole numbers, 0 <= successes <= episodes)",
                            field="model-index",
                            hint="fix the card's model-index, or compare against the run's evidence JSON instead",
                        )
                    row["episodes"] = n
                    row[metric["type"]] = k
            meta = meta or (result.get("evidence") or {})
    return entries, meta

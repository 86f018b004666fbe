"""Stage 4: the advantage-conditioned flow-matching policy (model, flow matching, guidance, data, task, export)."""

TRAINING_MODULES = tuple(
    f"reproduction.recap.policy.{m}" for m in ("task", "config", "setup", "batches", "model", "data")
)
"""The modules whose source decides what policy training computes: a recipe stage that trains this policy lists
them in its StageSpec.code (so an edit to any of them changes the stage's key)."""

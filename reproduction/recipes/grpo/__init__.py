"""GRPO: online RL (group-relative PPO-clip with a KL to the SFT policy) of RECAP's flow-matching policy in the
simulator; `GRPO` is the recipe value (`recipe: grpo`)."""

from reproduction.recipes.grpo.recipe import GRPO

__all__ = ["GRPO"]

"""GRPO: online RL (group-relative PPO-clip with a KL to the SFT policy) of RECAP's flow-matching policy in the
simulator. `RECIPE` is what `recipe: grpo` names (GRPO the same value); the demo is demo.py. Importing it imports
no torch: stage functions load when they run."""

from reproduction.recipes.grpo.recipe import GRPO

RECIPE = GRPO
"""What `recipe: grpo` names."""

__all__ = ["GRPO", "RECIPE"]

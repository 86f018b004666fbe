"""RECAP as a recipe: its stage graph and adapters (recipe.py, policy.py), config schema (config.py), the demo
(demo.py), and `portable eval` (eval_cmd.py). Importing it imports no torch: stage functions load when they run."""

from reproduction.recipes.recap.recipe import RECAP

RECIPE = RECAP
"""What `recipe: recap` names."""

__all__ = ["RECAP", "RECIPE"]

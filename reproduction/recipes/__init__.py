"""Built-in recipes, one package each (reproduction/recipes/<name>/ exporting RECIPE); `portable run` finds them by
the name a run config gives (`recipe: recap`, the default)."""

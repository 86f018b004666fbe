"""Runs: stage graph, resume, evidence, lineage, plots, the demo."""

"""Stage 4: the advantage-conditioned flow-matching policy (model, flow matching, guidance, data, task, export)."""

"""Stage 2: the distributional value model (data, model, loss, training task, inference, weights)."""

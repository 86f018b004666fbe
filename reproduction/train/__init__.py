"""Training core: devices, Ray launcher, FSDP2, DCP checkpoints, the training loop."""

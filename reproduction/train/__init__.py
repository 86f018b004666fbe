"""Training core: devices, Ray launcher, FSDP2, DCP checkpoints, the training loop.

Entry point: `reproduction.train.api.train(make_task, TrainConfig(...), out_dir=..., resume=...)`;
the contract a stage fills in is `reproduction.train.task.TrainTask`. Nothing is imported here:
Ray helper processes import this package and must not load torch (PLATFORM.md).
"""

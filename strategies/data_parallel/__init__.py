"""Data parallel and sharding: every rank runs the whole model on its own batches.

DDP and DP, ZeRO-1/2 (the sharded optimizer), FSDP2, DeepSpeed, the forward redirection the wrappers share, and the
fault-tolerant replica groups on torchft (``ft_ddp``, ``ft_hsdp``).
Each strategy module is imported when first used (``from trainer.strategies import DDPStrategy``)."""

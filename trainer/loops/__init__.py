"""The loops: fit (epochs), the training epoch (batches, accumulation windows, in-epoch validation), one
optimizer step (automatic or manual), evaluation and prediction; how ``configure_optimizers``' return is read and
schedulers stepped, and which arguments a ``*_step`` takes. What they need of the Trainer is :class:`LoopHost`."""

"""``ReplicaMonitor``: logs the fault-tolerance metrics of a replica-group strategy (``ft_ddp``/``ft_hsdp``).

The Trainer adds it by itself when the strategy has them (``strategy.replica_metrics``): ``ft/replicas`` (groups in
the step's quorum), ``ft/stall_s`` (seconds the last membership change cost), ``ft/samples_skipped`` (samples of
missing groups and of dropped steps, so far) and ``ft/failed_steps`` (steps that did not commit, so far).
"""
from __future__ import annotations

from typing import Any

from trainer.callbacks.callback import Callback


class ReplicaMonitor(Callback):
    """Log the strategy's ``replica_metrics`` after every training batch (values also in ``callback_metrics``)."""

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        metrics = getattr(trainer.strategy, "replica_metrics", None)
        if metrics:
            module.log_dict(dict(metrics), on_step=True, on_epoch=False, batch_size=1)

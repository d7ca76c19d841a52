"""``StochasticWeightAveraging``: average the weights of the last epochs (Izmailov et al., 2018).

Built on :mod:`torch.optim.swa_utils`: ``AveragedModel`` holds the running average, ``SWALR`` anneals the
learning rate to ``swa_lrs`` and ``update_bn`` recomputes BatchNorm statistics for the averaged weights.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import SWALR, AveragedModel, update_bn

from trainer.callbacks.callback import Callback
from trainer.callbacks.host import SchedulerConfig, isolated_rng, training_batches
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.rank import rank_zero_info, rank_zero_warn


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


class StochasticWeightAveraging(Callback):
    """``StochasticWeightAveraging(swa_lrs=1e-2)``: from epoch ``swa_epoch_start`` on, the optimizer's LR
    schedulers are replaced by ``SWALR`` (annealing to ``swa_lrs`` over ``annealing_epochs`` epochs) and the
    weights at the end of each epoch are averaged into an ``AveragedModel``. When training ends, the averaged
    weights are copied into the module and, if it has BatchNorm layers, their statistics are recomputed with
    ``update_bn`` over the training dataloader.

    Args:
        swa_lrs: the SWA learning rate, or one per param group of the optimizer.
        swa_epoch_start: an epoch index (int >= 0), or a fraction of ``max_epochs`` in (0, 1).
        annealing_epochs: epochs over which the LR goes from its current value to ``swa_lrs`` (0: at once).
        annealing_strategy: ``"cos"`` or ``"linear"``.
        avg_fn: ``(averaged_param, param, num_averaged) -> new averaged_param``; default: the equal-weight mean.
        device: where the averaged copy lives (``None``: the module's device); the CPU by default, which
            spares accelerator memory.

    The running average, ``SWALR``'s state and whether SWA started are saved in checkpoints, so a resumed fit
    ends with the same weights as an uninterrupted one. One optimizer only; sharded strategies are not
    supported (under DDP every rank keeps its own, identical, average).
    """

    def __init__(
        self,
        swa_lrs: Union[float, list[float]],
        swa_epoch_start: Union[int, float] = 0.8,
        annealing_epochs: int = 10,
        annealing_strategy: str = "cos",
        avg_fn: Optional[Callable[[Tensor, Tensor, Union[Tensor, int]], Tensor]] = None,
        device: Optional[Union[torch.device, str]] = torch.device("cpu"),
    ) -> None:
        name = type(self).__name__
        lrs_ok = _positive_number(swa_lrs) or (
            isinstance(swa_lrs, (list, tuple)) and len(swa_lrs) > 0 and all(_positive_number(lr) for lr in swa_lrs)
        )
        if not lrs_ok:
            raise ConfigurationError(
                f"{name}(swa_lrs={swa_lrs!r}) must be a positive float, or a list of positive floats (one per "
                "param group of the optimizer)."
            )
        if isinstance(swa_epoch_start, bool) or not (
            (isinstance(swa_epoch_start, int) and swa_epoch_start >= 0)
            or (isinstance(swa_epoch_start, float) and 0 < swa_epoch_start < 1)
        ):
            raise ConfigurationError(
                f"{name}(swa_epoch_start={swa_epoch_start!r}) must be an epoch index (int >= 0) or a fraction of "
                "max_epochs (float in (0, 1))."
            )
        if isinstance(annealing_epochs, bool) or not isinstance(annealing_epochs, int) or annealing_epochs < 0:
            raise ConfigurationError(f"{name}(annealing_epochs={annealing_epochs!r}) must be an int >= 0.")
        if annealing_strategy not in ("cos", "linear"):
            raise ConfigurationError(f"{name}(annealing_strategy={annealing_strategy!r}) must be 'cos' or 'linear'.")
        if avg_fn is not None and not callable(avg_fn):
            raise ConfigurationError(
                f"{name}(avg_fn={avg_fn!r}) must be None or a callable (averaged_param, param, num_averaged) -> Tensor."
            )
        if device is not None:
            try:
                device = torch.device(device)
            except (RuntimeError, TypeError):
                raise ConfigurationError(
                    f"{name}(device={device!r}) must be None (the module's device), a torch.device or a device "
                    "string such as 'cpu' or 'cuda:0'."
                ) from None
        self._swa_lrs = [float(lr) for lr in swa_lrs] if isinstance(swa_lrs, (list, tuple)) else float(swa_lrs)
        self._swa_epoch_start = swa_epoch_start
        self._annealing_epochs = annealing_epochs
        self._annealing_strategy = annealing_strategy
        self._avg_fn = avg_fn
        self._device: Optional[torch.device] = device
        self._reset()

    def _reset(self) -> None:
        self.swa_start: int = -1  # the 0-based epoch SWA starts at, resolved in setup
        self._average_model: Optional[AveragedModel] = None
        self._scheduler: Optional[SWALR] = None
        self._replaced: list[SchedulerConfig] = []  # the user's scheduler configs SWALR took the place of
        self._latest_update_epoch = -1
        self._restored: dict[str, Any] = {}

    @property
    def n_averaged(self) -> int:
        """How many epochs' weights the average holds so far."""
        return int(self._average_model.n_averaged) if self._average_model is not None else 0

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict[str, Any]:
        """Whether SWA started, the last averaged epoch, ``AveragedModel``'s and ``SWALR``'s states."""
        if self._scheduler is None or self._average_model is None:
            return {"started": False}
        return {
            "started": True,
            "latest_update_epoch": self._latest_update_epoch,
            "average_model": self._average_model.state_dict(),  # parameters, buffers and n_averaged
            "scheduler": self._scheduler.state_dict(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the saved state; it is applied once the fit has set up the model and optimizer."""
        self._restored = dict(state_dict) if state_dict.get("started") else {}

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: Any, module: Any, stage: str) -> None:
        if stage != "fit":
            return
        name = type(self).__name__
        if trainer.strategy.is_sharded:
            raise ConfigurationError(
                f"{name} does not support sharded strategies (strategy={trainer.strategy.strategy_name!r}): the "
                "averaged copy and SWALR need whole parameters and optimizer on every rank. Use a single device "
                "or strategy='ddp'."
            )
        max_epochs = trainer.max_epochs
        if max_epochs is None or max_epochs < 0:
            raise ConfigurationError(
                f"{name} needs Trainer(max_epochs=...) to be set: SWA averages the last epochs of the fit, so it "
                "must know when the fit ends."
            )
        self._reset()
        start = self._swa_epoch_start
        self.swa_start = int(max_epochs * start) if isinstance(start, float) else start
        if self.swa_start >= max_epochs:
            raise ConfigurationError(
                f"{name}(swa_epoch_start={start}) is past the last epoch (max_epochs={max_epochs}, epochs "
                f"0..{max_epochs - 1}): SWA would never start. Use an epoch index < max_epochs or a fraction in (0, 1)."
            )
        # Copied before the strategy moves/wraps the module, without the Trainer it points to.
        module.trainer = None
        try:
            self._average_model = AveragedModel(module, device=self._device, avg_fn=self._avg_fn)
        finally:
            module.trainer = trainer

    def on_fit_start(self, trainer: Any, module: Any) -> None:
        name = type(self).__name__
        if len(trainer.optimizers) != 1:
            raise ConfigurationError(
                f"{name} works with exactly one optimizer; configure_optimizers returned {len(trainer.optimizers)}."
            )
        groups = len(trainer.optimizers[0].param_groups)
        if isinstance(self._swa_lrs, list) and len(self._swa_lrs) != groups:
            raise ConfigurationError(
                f"{name}(swa_lrs={self._swa_lrs}) has {len(self._swa_lrs)} learning rates but the optimizer has "
                f"{groups} param group(s); pass one float, or one per param group."
            )
        if self._restored:
            self._average_model.load_state_dict(self._restored["average_model"])
            self._latest_update_epoch = int(self._restored["latest_update_epoch"])

    def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
        if self._scheduler is None and trainer.current_epoch >= self.swa_start:
            self._start(trainer, module)

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        self._update(trainer, module)

    def on_save_checkpoint(self, trainer: Any, module: Any, checkpoint: dict[str, Any]) -> None:
        # A checkpoint saved at this epoch's end by a callback running before this one must already hold the
        # epoch in the average: a fit resumed from it starts at the next epoch.
        if trainer.fit_loop.progress.epoch_finished:
            self._update(trainer, module)
        if self._scheduler is not None and "lr_schedulers" in checkpoint:
            # On resume, configure_optimizers returns the user's schedulers again: give them their own states
            # (SWALR's state is in this callback's) so loading does not put SWALR's state into another class.
            checkpoint["lr_schedulers"] = [config.scheduler.state_dict() for config in self._replaced]

    def on_train_end(self, trainer: Any, module: Any) -> None:
        if self.n_averaged == 0:
            rank_zero_warn(
                f"{type(self).__name__}: training ended at epoch {trainer.current_epoch}, before SWA started "
                f"(epoch {self.swa_start}); the weights are left as trained."
            )
            return
        with torch.no_grad():
            for averaged, param in zip(self._average_model.module.parameters(), module.parameters()):
                param.copy_(averaged.to(param.device))
        batch_norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        if batch_norms:
            self._recompute_batch_norm(trainer, module, batch_norms)

    # ------------------------------------------------------------------ internals
    def _start(self, trainer: Any, module: Any) -> None:
        """Replace the LR schedulers by SWALR (restored on resume) and move the average where it lives."""
        optimizer = trainer.optimizers[0]
        self._average_model.to(self._device or module.device)
        lrs = self._swa_lrs if isinstance(self._swa_lrs, list) else [self._swa_lrs] * len(optimizer.param_groups)
        self._scheduler = SWALR(
            optimizer, swa_lr=lrs, anneal_epochs=self._annealing_epochs, anneal_strategy=self._annealing_strategy
        )
        if self._restored:
            self._scheduler.load_state_dict(self._restored["scheduler"])
            self._restored = {}
        self._replaced = list(trainer.lr_scheduler_configs)
        trainer.lr_scheduler_configs = [SchedulerConfig(self._scheduler, interval="epoch", frequency=1)]
        replaced = ", ".join(type(c.scheduler).__name__ for c in self._replaced) or "no scheduler"
        rank_zero_info("StochasticWeightAveraging: epoch %d: SWALR replaces %s.", trainer.current_epoch, replaced)

    def _update(self, trainer: Any, module: Any) -> None:
        """Average the weights of the epoch that just ended (once per epoch)."""
        epoch = trainer.current_epoch
        if self._scheduler is None or epoch <= self._latest_update_epoch or trainer.state_stage != "fit":
            return
        self._average_model.update_parameters(module)
        self._latest_update_epoch = epoch

    def _recompute_batch_norm(self, trainer: Any, module: Any, batch_norms: list[nn.Module]) -> None:
        """BatchNorm statistics for the averaged weights: one pass over the training data with ``update_bn``."""
        strategy = trainer.strategy
        # Batches moved and converted as training sees them (device, and dtype under "*-true" precisions).
        batches = (strategy.batch_to_device(batch) for batch in training_batches(trainer.fit_loop.combined_loader))
        # isolated_rng: a shuffling loader must not change the random streams the user's code sees next.
        with isolated_rng(), strategy.precision.forward_context():
            update_bn(batches, module)
        if trainer.world_size > 1:  # each rank saw its shard of the data: average the statistics
            with torch.no_grad():
                for bn in batch_norms:
                    for name in ("running_mean", "running_var"):
                        stat = getattr(bn, name)
                        if stat is not None:
                            stat.copy_(strategy.reduce(stat, "mean"))

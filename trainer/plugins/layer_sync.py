"""Layer syncs: ``Trainer(plugins=[TorchSyncBatchNorm()])`` is ``Trainer(sync_batchnorm=True)``, as in Lightning.
A ``LayerSync`` subclass converts the module's layers before a distributed strategy wraps it."""
from __future__ import annotations

from torch import nn


class LayerSync:
    """Converts layers to versions that synchronise across processes (``apply``) and back (``revert``)."""

    def apply(self, model: nn.Module) -> nn.Module:
        """Return ``model`` with its layers converted (children may be replaced in place)."""
        raise NotImplementedError

    def revert(self, model: nn.Module) -> nn.Module:
        """Undo :meth:`apply`."""
        raise NotImplementedError


class TorchSyncBatchNorm(LayerSync):
    """``BatchNorm*d`` ↔ ``torch.nn.SyncBatchNorm`` (GPUs only when several processes train)."""

    def apply(self, model: nn.Module) -> nn.Module:
        """Every ``BatchNorm*d`` becomes a ``SyncBatchNorm`` with the same parameters and statistics."""
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)

    def revert(self, model: nn.Module) -> nn.Module:
        """Every ``SyncBatchNorm`` becomes a ``BatchNorm`` of the input's dimensionality again (its parameters and
        statistics kept)."""
        converted = model
        if isinstance(model, nn.SyncBatchNorm):
            converted = _BatchNormXd(model.num_features, model.eps, model.momentum, model.affine,
                                     model.track_running_stats)  # fmt: skip
            if model.affine:
                converted.weight = model.weight
                converted.bias = model.bias
            converted.running_mean = model.running_mean
            converted.running_var = model.running_var
            converted.num_batches_tracked = model.num_batches_tracked
        for name, child in model.named_children():
            converted.add_module(name, self.revert(child))
        return converted


class _BatchNormXd(nn.modules.batchnorm._BatchNorm):
    """A BatchNorm for any input dimensionality (what a reverted ``SyncBatchNorm`` becomes)."""

    def _check_input_dim(self, input: object) -> None:
        return

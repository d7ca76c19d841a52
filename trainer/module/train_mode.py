"""Each submodule's own train/eval mode, kept across validation, test and export as Lightning keeps it.

A fine-tuning module freezes a part with ``self.backbone.eval()`` (BatchNorm statistics, dropout off): a
validation inside ``fit`` must hand back that part in eval mode and the rest in train mode, not ``.train()``
everything. The modes are recorded once per validation run, never per step.
"""
from __future__ import annotations

from torch import nn

from trainer.strategies.rank import rank_zero_warn


class ModuleModes:
    """The ``training`` flag of every submodule of a module, recorded by :meth:`capture`, put back by :meth:`restore`."""

    def __init__(self) -> None:
        self._modes: list[tuple[nn.Module, bool]] = []

    def capture(self, module: nn.Module) -> None:
        """Record the mode of ``module`` and of each of its submodules."""
        self._modes = [(sub, sub.training) for sub in module.modules()]

    def restore(self) -> None:
        """Put back every recorded mode (submodules added since keep theirs)."""
        for sub, training in self._modes:
            sub.training = training
        self._modes = []


def warn_modules_in_eval_mode(module: nn.Module) -> None:
    """Warn, as Lightning does, when ``fit`` starts with submodules in eval mode: they train in that mode (fine for a
    frozen backbone, a mistake after e.g. an evaluation that called ``.eval()``)."""
    names = [name or type(module).__name__ for name, sub in module.named_modules() if not sub.training]
    if names:
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        rank_zero_warn(
            f"{len(names)} module(s) are in eval mode at the start of training ({shown}); they stay so, as in "
            "Lightning. If that is not intended, call model.train() before fit."
        )

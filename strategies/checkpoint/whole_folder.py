"""A sharded checkpoint folder read whole, by the strategies that hold the whole model in each process.

Kept apart from :mod:`trainer.strategies.checkpoint.sharded_checkpoint` so that the strategies mixing it in (the
single-device one among them) do not load the DCP reading code until a folder is loaded.
"""
from __future__ import annotations

import os
from typing import Any

from trainer.strategies.checkpoint import storage


class WholeFolderLoading:
    """Mixin for strategies that hold the whole model in each process (single device, DDP, DP, model parallel): a
    sharded folder another strategy wrote is read whole
    (:func:`~trainer.strategies.checkpoint.sharded_checkpoint.load_full`); a file goes to the next class's
    ``load_checkpoint``. Kept out of the ``Strategy`` interface, which imports no checkpoint format."""

    def load_checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        """A sharded folder read whole in this process, or (a file) what the strategy's file reading gives."""
        if storage.isdir(path):
            from trainer.strategies.checkpoint.sharded_checkpoint import load_full

            return load_full(path)
        return super().load_checkpoint(path)  # type: ignore[misc]

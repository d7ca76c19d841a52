"""``HFCheckpoint``: the Hugging Face model a module holds, written as a ``from_pretrained`` folder when training ends
(and, if asked, every few epochs), each rank writing only its shards (see ``trainer.hf.save_pretrained``)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Union

import torch

from trainer.callbacks.callback import Callback
from trainer.strategies.checkpoint.hf_folder import parse_dtype, parse_size, save_hf_folder
from trainer.strategies.errors import ConfigurationError


class HFCheckpoint(Callback):
    """Write the module's ``transformers`` model as a Hugging Face folder.

    Args:
        dirpath: the folder written when training ends (``config.json``, sharded safetensors, the index).
        every_n_epochs: also write ``dirpath/epoch=N`` after every ``every_n_epochs``-th training epoch.
        max_shard_size: the largest safetensors file (``"5GB"``, ``"500MB"``, bytes).
        dtype: the saved dtype (``"bf16"``, ``torch.bfloat16``, ...); default as trained.
    """

    def __init__(self, dirpath: Union[str, os.PathLike], every_n_epochs: Optional[int] = None,
                 max_shard_size: Union[int, str] = "5GB", dtype: Union[None, str, torch.dtype] = None) -> None:  # fmt: skip
        if every_n_epochs is not None and (isinstance(every_n_epochs, bool) or not isinstance(every_n_epochs, int)
                                           or every_n_epochs < 1):  # fmt: skip
            raise ConfigurationError(f"HFCheckpoint(every_n_epochs={every_n_epochs!r}) must be a positive int or None.")
        parse_size(max_shard_size)  # refused now, not after the training
        self.dirpath = Path(dirpath)
        self.every_n_epochs = every_n_epochs
        self.max_shard_size = max_shard_size
        self.dtype = parse_dtype(dtype)
        #: The folders written so far, in order.
        self.saved: list[Path] = []

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.every_n_epochs and (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            self._save(pl_module, self.dirpath / f"epoch={trainer.current_epoch}")

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._save(pl_module, self.dirpath)

    def _save(self, module: Any, directory: Path) -> None:
        self.saved.append(save_hf_folder(module, directory, self.max_shard_size, self.dtype))

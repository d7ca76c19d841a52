"""``trainer.hf.save_pretrained`` / ``trainer.hf.load_pretrained``: a Hugging Face folder from and into the model a
TrainModule (or any module) holds, at whatever layout the strategy gave it."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Union

import torch
from torch import nn

from trainer.strategies.checkpoint.hf_folder import load_hf_folder, parse_dtype, save_hf_folder


def save_pretrained(module_or_model: nn.Module, directory: Union[str, os.PathLike], *,
                    max_shard_size: Union[int, str] = "5GB",
                    dtype: Union[None, str, torch.dtype] = None) -> Path:  # fmt: skip
    """Write the Hugging Face model in ``module_or_model`` (a TrainModule holding it, or the model) to
    ``directory``: ``config.json`` (+ ``generation_config.json``), ``model-0000i-of-0000N.safetensors`` of at most
    ``max_shard_size`` each and ``model.safetensors.index.json``, tied weights once, floating tensors in ``dtype``
    (default: as trained; ``"bf16"``, ``torch.bfloat16``, ...). Call it on every rank (after ``fit``, or from a
    hook such as ``on_train_end``): each rank writes only the shards it holds. Returns the folder."""
    return save_hf_folder(module_or_model, directory, max_shard_size, parse_dtype(dtype))


def load_pretrained(module_or_model: nn.Module, directory: Union[str, os.PathLike]) -> None:
    """Load the Hugging Face folder ``directory`` into the model in ``module_or_model``, at any layout: on every
    rank, each reading only what it holds. Inside ``configure_model`` right after building the model (on ``meta``
    under sharded strategies) the weights arrive as each rank materialises its shards, instead of the init."""
    load_hf_folder(module_or_model, directory)

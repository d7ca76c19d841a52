"""``trainer checkpoint consolidate SHARDED_DIR OUT.ckpt``: one file from a sharded checkpoint folder.

A folder written by ``strategy="fsdp"``, ``"zero1"`` or ``"zero2"`` becomes one full checkpoint, loadable with
``torch.load(OUT, weights_only=True)``, ``Module.load_from_checkpoint(OUT)`` or any strategy's ``ckpt_path``.
It runs in one process without a process group and needs memory for the whole model and optimizer state.
"""
from __future__ import annotations

import argparse
from typing import Any

from trainer.strategies.checkpoint.checkpoint_io import CheckpointError
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.checkpoint.sharded_checkpoint import consolidate
from trainer.cli.common import command_parser


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``trainer checkpoint`` and its ``consolidate`` action."""
    parser = command_parser(subparsers, "checkpoint", "work with checkpoint files and folders", __doc__)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    action = actions.add_parser("consolidate", help="turn a sharded checkpoint folder into one file")
    action.add_argument("sharded_dir", help="the sharded checkpoint folder")
    action.add_argument("out", help="the full checkpoint file to write")
    action.set_defaults(handler=main)
    return parser


def main(args: argparse.Namespace) -> int:
    """Consolidate and say what was written."""
    try:
        checkpoint = consolidate(args.sharded_dir, args.out)
    except (CheckpointError, FileNotFoundError) as err:
        raise ConfigurationError(str(err)) from err
    weights = sum(t.numel() * t.element_size() for t in checkpoint.get("state_dict", {}).values())
    print(f"Wrote {args.out}: {len(checkpoint.get('state_dict', {}))} tensors ({weights / 2**20:.1f} MiB of weights), "
          f"{len(checkpoint.get('optimizer_states', []))} optimizer state(s), step {checkpoint.get('global_step')}.")
    return 0

"""``python -m trainer checkpoint consolidate SHARDED_DIR OUT.ckpt``: a sharded checkpoint folder (written by
``strategy="fsdp"``, ``"zero1"`` or ``"zero2"``) becomes one full checkpoint file, loadable with
``torch.load(OUT, weights_only=True)``, ``Module.load_from_checkpoint(OUT)`` or any strategy's ``ckpt_path``.

Runs in one process without a process group; it needs memory for the whole model and optimizer state.
"""
from __future__ import annotations

import argparse
from typing import Any

from strategies.sharded_checkpoint import consolidate


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """The ``checkpoint`` command and its ``consolidate`` action (sets ``handler``, like the CLI's commands)."""
    parser = subparsers.add_parser("checkpoint", help="work with checkpoint files and folders")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    action = actions.add_parser("consolidate", help="turn a sharded checkpoint folder into one file",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    action.add_argument("sharded_dir", help="the sharded checkpoint folder")
    action.add_argument("out", help="the full checkpoint file to write")
    action.set_defaults(handler=_run)
    return parser


def _run(args: argparse.Namespace) -> int:
    checkpoint = consolidate(args.sharded_dir, args.out)
    weights = sum(t.numel() * t.element_size() for t in checkpoint.get("state_dict", {}).values())
    print(f"Wrote {args.out}: {len(checkpoint.get('state_dict', {}))} tensors ({weights / 2**20:.1f} MiB of weights), "
          f"{len(checkpoint.get('optimizer_states', []))} optimizer state(s), step {checkpoint.get('global_step')}.")
    return 0

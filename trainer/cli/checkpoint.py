"""``trainer checkpoint consolidate SHARDED_DIR OUT.ckpt``: one file from a sharded checkpoint folder.
``trainer checkpoint export --format hf CKPT DIRECTORY --config CONFIG``: a Hugging Face folder from a checkpoint.

consolidate: a folder written by ``strategy="fsdp"``, ``"zero1"`` or ``"zero2"`` becomes one full checkpoint,
loadable with ``torch.load(OUT, weights_only=True)``, ``Module.load_from_checkpoint(OUT)`` or any strategy's
``ckpt_path``. It runs in one process without a process group and needs memory for the whole model and optimizer
state.

export: the model weights of a checkpoint (a file, or a sharded folder of any layout: fsdp, tp, pp) become a folder
``transformers.AutoModelForCausalLM.from_pretrained`` loads: ``config.json`` (from ``--config``: the folder or
``config.json`` the model was built from), sharded safetensors of at most ``--max-shard-size``, their index. It runs
in one process and reads one output file's tensors at a time: the model is never whole in memory.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from trainer.strategies.checkpoint.checkpoint_io import CheckpointError
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.checkpoint.sharded_checkpoint import consolidate
from trainer.cli.common import command_parser


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``trainer checkpoint`` and its ``consolidate`` and ``export`` actions."""
    parser = command_parser(subparsers, "checkpoint", "work with checkpoint files and folders", __doc__)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    action = actions.add_parser("consolidate", help="turn a sharded checkpoint folder into one file")
    action.add_argument("sharded_dir", help="the sharded checkpoint folder")
    action.add_argument("out", help="the full checkpoint file to write")
    action.set_defaults(handler=main)
    export = actions.add_parser("export", help="write a checkpoint's model as a Hugging Face folder")
    export.add_argument("--format", required=True, choices=("hf",), help="the folder's format (hf: transformers)")
    export.add_argument("checkpoint", help="a checkpoint file or sharded folder (any layout)")
    export.add_argument("directory", help="the folder to write")
    export.add_argument("--config", required=True,
                        help="the model's transformers config: a folder holding config.json, or the file")
    export.add_argument("--max-shard-size", default="5GB", help="the largest safetensors file (default 5GB)")
    export.add_argument("--dtype", default=None, help="the saved dtype (bf16, fp16, fp32; default as stored)")
    export.add_argument("--prefix", default=None,
                        help="the model's name in the checkpoint's state_dict, e.g. 'model.' (default: found)")
    export.set_defaults(handler=export_main)
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


def export_main(args: argparse.Namespace) -> int:
    """Export to a Hugging Face folder and say what was written."""
    from trainer.strategies.checkpoint.hf_folder import export_checkpoint, parse_dtype

    try:
        from transformers import AutoConfig
    except ImportError as err:
        raise ConfigurationError("export --format hf needs transformers: pip install 'trainwright[hf]'.") from err
    config_path = Path(args.config)
    if not config_path.exists():
        raise ConfigurationError(f"--config {args.config!r} does not exist; give the folder holding config.json or the file.")
    config = AutoConfig.from_pretrained(str(config_path.parent if config_path.is_file() else config_path))
    if not Path(args.checkpoint).exists():
        raise ConfigurationError(f"Checkpoint not found: {args.checkpoint!r}.")
    try:
        summary = export_checkpoint(args.checkpoint, args.directory, config, args.max_shard_size,
                                    parse_dtype(args.dtype), args.prefix)  # fmt: skip
    except CheckpointError as err:
        raise ConfigurationError(str(err)) from err
    print(f"Wrote {args.directory}: {summary['tensors']} tensors in {summary['files']} safetensors file(s) "
          f"({summary['bytes'] / 2**20:.1f} MiB), from '{summary['prefix']}*' of {args.checkpoint}.")
    return 0

"""``trainer plan``: the job as it will run, dry, in one process, before any cluster time.

    trainer plan train.py:make_module --nodes 16 --devices-per-node 8 --strategy nd_parallel --tp 8
                 --precision bf16-mixed --micro-batch-size 2 --seq-len 4096 --hardware h100 [--json]

The module is built on ``meta`` (its ``configure_model``; weights are allocated, not initialised), the strategy's
own set-up (FSDP2, ZeRO, the TP plan ``configure_model`` applies, the pipeline cut) runs at the full world size on
torch's ``fake`` process group for each rank role (every pipeline stage), and one forward, backward and optimizer step runs on fake
tensors, with the module's ``example_input_array`` or a batch of ``--micro-batch-size`` × ``--seq-len`` tokens.
Per rank role: parameter, gradient and optimizer-state bytes, the step's peak and what held it, each collective,
and the step-time bounds against ``--hardware`` (h100, h200, a100, b200, or a YAML file). A layout the real job
would refuse, or one over ``--device-memory`` (default: the profile's), exits with status 2 and one message.
See docs/gpu_memory.md ("Planning a job").
"""
from __future__ import annotations

import argparse
import json
from typing import Any

from trainer.cli.common import command_parser, positive_int
from trainer.strategies.errors import ConfigurationError


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``trainer plan``."""
    parser = command_parser(subparsers, "plan", "a dry run of the whole job on fake ranks: memory, collectives, "
                            "step time, refusals", __doc__)  # fmt: skip
    parser.add_argument("module", help="file.py:Class, file.py:function or package.module:name (built on meta)")
    parser.add_argument("--init-args", default=None, metavar="JSON", help="the class's keyword arguments, as JSON")
    parser.add_argument("--nodes", type=positive_int, default=1, metavar="N")
    parser.add_argument("--devices-per-node", type=positive_int, default=None, metavar="G")
    parser.add_argument("--world-size", type=positive_int, default=None, metavar="N",
                        help="checked against nodes × devices-per-node (alone: one node of N devices)")
    parser.add_argument("--strategy", default="fsdp", help="fsdp, zero2 or nd_parallel")
    for flag in ("dp_replicate", "dp_shard", "tp", "pp"):
        parser.add_argument(f"--{flag.replace('_', '-')}", type=int, default=-1 if flag == "dp_shard" else 1,
                            metavar="N", help="-1: what the others leave" if flag == "dp_shard" else None)  # fmt: skip
    parser.add_argument("--microbatches", type=positive_int, default=None, metavar="N", help="pipeline micro-batches")
    parser.add_argument("--schedule", default="1F1B", choices=("1F1B", "GPipe"))
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--micro-batch-size", type=positive_int, default=None, metavar="B")
    parser.add_argument("--seq-len", type=positive_int, default=None, metavar="L")
    parser.add_argument("--accumulate", type=positive_int, default=None, metavar="N")
    parser.add_argument("--global-batch-size", type=positive_int, default=None, metavar="N")
    parser.add_argument("--optimizer", default="adamw", help="for a plain nn.Module: adam, adamw, sgd, ...")
    parser.add_argument("--wrap", default="", metavar="CLASS[,CLASS]", help="the FSDP units' classes")
    parser.add_argument("--activation-checkpointing", default="", metavar="CLASS[,CLASS]")
    parser.add_argument("--tp-plan", default=None, metavar="megatron|FILE.py:FUNCTION",
                        help="for a plain nn.Module with --tp: the plan applied to it")
    parser.add_argument("--device-memory", default=None, metavar="SIZE", help="e.g. 80GB (default: the profile's)")
    parser.add_argument("--hardware", default="h100", metavar="NAME|FILE.yaml")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--compare", action="store_true",
                        help="sweep the strategies (ddp, zero1, zero2, fsdp, model_parallel) with the fast arithmetic, "
                             "then plan on fake ranks the one with the least communication that fits")  # fmt: skip
    parser.set_defaults(handler=main)
    return parser


def parse_size(text: str) -> int:
    """``80GB``, ``80GiB``, ``512MB`` or a number of bytes → bytes (GB and GiB both read as 2**30, as devices are sold)."""
    units = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "KIB": 2**10, "M": 2**20, "MB": 2**20, "MIB": 2**20,
             "G": 2**30, "GB": 2**30, "GIB": 2**30, "T": 2**40, "TB": 2**40, "TIB": 2**40}  # fmt: skip
    stripped = text.strip().upper()
    number = stripped.rstrip("KMGTIB ")
    unit = stripped[len(number):].strip()
    try:
        return int(float(number) * units[unit])
    except (KeyError, ValueError):
        raise ConfigurationError(f"--device-memory {text!r} is not a size; write e.g. 80GB, 141GB or 512MB.") from None


def job_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~trainer.plan.job.JobSpec` the flags describe."""
    from trainer.plan.job import JobSpec
    from trainer.plan.module_spec import module_factory

    devices = args.devices_per_node or (args.world_size if args.nodes == 1 and args.world_size else 1)
    names = lambda text: tuple(n.strip() for n in text.split(",") if n.strip())  # noqa: E731
    return JobSpec(build=module_factory(args.module, args.init_args), module_name=args.module, nodes=args.nodes,
                   devices_per_node=devices, strategy=args.strategy, dp_replicate=args.dp_replicate,
                   dp_shard=args.dp_shard, tp=args.tp, pp=args.pp, microbatches=args.microbatches,
                   schedule=args.schedule, precision=args.precision, micro_batch_size=args.micro_batch_size,
                   seq_len=args.seq_len, accumulate=args.accumulate, global_batch_size=args.global_batch_size,
                   optimizer=args.optimizer, wrap=names(args.wrap),
                   activation_checkpointing=names(args.activation_checkpointing),
                   tp_plan=_tp_plan(args.tp_plan))  # fmt: skip


def _tp_plan(spec: Any) -> Any:
    if spec is None:
        return None
    if spec == "megatron":
        from trainer.strategies.nd.tp_plan import megatron_plan

        return lambda module: megatron_plan(module, ())
    from trainer.plan.module_spec import load_object

    return load_object(spec, "function")


def main(args: argparse.Namespace) -> int:
    """Plan the job and print the table (or ``--json``)."""
    from trainer.plan.hardware import load_profile
    from trainer.plan.planner import plan_job
    from trainer.plan.report import format_plan

    spec = job_from_args(args)
    memory = parse_size(args.device_memory) if args.device_memory else None
    if args.compare:
        return _compare(args, spec, memory)
    plan = plan_job(spec, load_profile(args.hardware), world_size=args.world_size, device_memory=memory)
    print(json.dumps(plan.as_dict(), indent=1) if args.json else format_plan(plan))
    return 0


def _compare(args: argparse.Namespace, spec: Any, memory: Any) -> int:
    """``--compare``: the first pass's table of every strategy, then the recommendation planned on fake ranks."""
    from trainer.memory.planner import compare, format_table
    from trainer.plan.compare import recommend_planned, recommendation_text, strategy_candidates
    from trainer.plan.hardware import load_profile
    from trainer.plan.job import make_module

    if args.json:
        raise ConfigurationError("--compare prints a table; drop --json (or plan one strategy with --strategy).")
    if (args.dp_replicate, args.dp_shard, args.tp, args.pp) != (1, -1, 1, 1) or args.strategy != "fsdp":
        raise ConfigurationError(
            "--compare sweeps the strategies itself, so it takes no --strategy, --dp-replicate, --dp-shard, --tp or "
            "--pp. To sweep N-D layouts, give each a comma list: trainer estimate-memory MODULE --world-size N "
            "--tp 1,2,8 --pp 1,4 --tp-plan megatron --device-memory 80GB."
        )
    hardware = load_profile(args.hardware)
    budget = memory if memory is not None else hardware.memory_bytes
    module = make_module(spec)
    estimates = compare(module, spec.world_size, precision=spec.precision, optimizer=spec.optimizer,
                        example_input=getattr(module, "example_input_array", None))  # fmt: skip
    print(f"First pass (arithmetic), per device at world size {spec.world_size}:\n{format_table(estimates)}")
    chosen, plan, passed = recommend_planned(strategy_candidates(spec, estimates, budget), hardware, budget)
    print(recommendation_text(chosen, plan, passed, budget))
    return 0 if plan is not None else 2

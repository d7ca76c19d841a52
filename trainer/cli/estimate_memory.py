"""``trainer estimate-memory``: per-device memory of a module under each strategy or N-D layout, and a recommendation.

    trainer estimate-memory model.py:GPT --world-size 8 --precision bf16-mixed --device-memory 80GB --wrap Block
    trainer estimate-memory model.py:GPT --world-size 8 --tp 1,2,8 --pp 1,4 --tp-plan megatron --wrap Block

The class is built on the ``meta`` device (no memory, no weights), so a model far larger than this machine is
planned in seconds: with no arguments, or with ``--init-args '{"n_layer": 48}'`` (JSON keyword arguments); or
name a function instead (``file.py:make_model``) that returns the module, built with what it needs; its ``example_input_array``, if set, gives the activations (one
micro-batch of one data-parallel rank). The table is the arithmetic first pass of :mod:`trainer.memory.planner`;
with ``--device-memory`` the rows that fit are planned on fake ranks in order of communication
(:mod:`trainer.plan.compare`, as ``trainer plan --compare``) and the first the plan accepts is recommended with
that plan's figures: one planner, not two.

Without layout flags it compares the strategies (``model_parallel`` means WORLD_SIZE devices in one
process). With any of ``--dp-replicate``, ``--dp-shard``, ``--tp``, ``--pp`` (each a size or a comma list of
sizes; ``--dp-shard`` defaults to -1: whatever the others leave) it prints one row per layout that makes
WORLD_SIZE ranks. ``--tp-plan`` is ``megatron`` (the built-in Megatron-LM split of the transformer blocks,
printed so it can be passed to ``parallelize_module``) or ``file.py:function`` / ``package.module:function``
returning the plan dict, called with the (meta) module. ``--pipeline`` names the modules that begin stages
1, 2, ... (default: balanced by bytes, blocks whole).
"""
from __future__ import annotations

import argparse
import inspect
from typing import Any

import torch
from torch import nn

from trainer.strategies.errors import ConfigurationError
from trainer.cli.common import command_parser, positive_int
from trainer.plan.module_spec import load_object
from trainer.memory.planner import SCHEDULES, STRATEGIES, layout_report, layouts_for, report

_LAYOUT_FLAGS = ("dp_replicate", "dp_shard", "tp", "pp")
# ``trainer plan``'s flags that this sweep (its activations come from example_input_array) does not take.
_PLAN_ONLY = ("--nodes", "--devices-per-node", "--micro-batch-size", "--seq-len", "--accumulate",
              "--global-batch-size", "--activation-checkpointing", "--json")  # fmt: skip


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``trainer estimate-memory``."""
    parser = command_parser(subparsers, "estimate-memory", "per-device memory of a module under each strategy or layout",
                            __doc__)  # fmt: skip
    parser.add_argument("module", help="path/to/file.py:ClassName or package.module:ClassName, or a function "
                                       "returning the module (file.py:make_model)")
    parser.add_argument("--init-args", default=None, metavar="JSON",
                        help="keyword arguments of the class, as a JSON object, e.g. '{\"n_layer\": 48}'")
    parser.add_argument("--world-size", type=positive_int, default=1, metavar="N")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--optimizer", default="adam", help="adam, adamw, sgd, sgd_momentum, rmsprop, adagrad")
    parser.add_argument("--device-memory", default=None, metavar="SIZE", help="e.g. 80GB: also recommend")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), metavar="NAME[,NAME]")
    parser.add_argument("--wrap", default="", metavar="CLASS[,CLASS]",
                        help="the block classes: FSDP units, the megatron plan's blocks, kept whole by --pipeline auto")  # fmt: skip
    for flag in _LAYOUT_FLAGS:
        parser.add_argument(f"--{flag.replace('_', '-')}", type=_sizes, default=None, metavar="N[,N]",
                            help="-1: the rest of the world size" if flag == "dp_shard" else None)  # fmt: skip
    parser.add_argument("--tp-plan", default=None, metavar="megatron|FILE.py:FUNCTION")
    parser.add_argument("--pipeline", default="auto", metavar="auto|MODULE[,MODULE]",
                        help="the modules that begin pipeline stages 1, 2, ...")  # fmt: skip
    parser.add_argument("--microbatches", type=positive_int, default=None, metavar="N", help="default: pp")
    parser.add_argument("--schedule", default="1F1B", choices=SCHEDULES)
    parser.add_argument("--hardware", default="h100", metavar="NAME|FILE.yaml", help="the fake-rank plan's profile")
    for flag in _PLAN_ONLY:
        extra: dict[str, Any] = {"action": "store_const", "const": True} if flag == "--json" else {}
        parser.add_argument(flag, default=None, help=argparse.SUPPRESS, **extra)
    parser.set_defaults(handler=main)
    return parser


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size or a comma list of sizes, e.g. 2 or 1,2,8") from None
    if not sizes or any(size < 1 and size != -1 for size in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: sizes are positive ints (or -1: the rest of the world size)")
    return sizes


def main(args: argparse.Namespace) -> int:
    """Print the table (and the recommendation when ``--device-memory`` is given)."""
    given = [flag for flag in _PLAN_ONLY if getattr(args, flag[2:].replace("-", "_")) is not None]
    if given:
        raise ConfigurationError(
            f"{' '.join(given)} is a flag of trainer plan, which estimate-memory's sweep does not take. Use "
            f"trainer plan {args.module} with it: one --strategy and layout, or --compare to sweep the strategies."
        )
    module = build_module(args.module, args.init_args)
    wrap = {name.strip() for name in args.wrap.split(",") if name.strip()}
    classes = {type(m).__name__: type(m) for m in module.modules()}
    unknown = wrap - set(classes)
    if unknown:
        raise ConfigurationError(f"--wrap {args.wrap}: {args.module} has no submodule of class {sorted(unknown)}.")
    policy = {classes[name] for name in wrap} or None
    common = dict(precision=args.precision, optimizer=args.optimizer, auto_wrap_policy=policy,
                  example_input=getattr(module, "example_input_array", None))  # fmt: skip
    if all(getattr(args, flag) is None for flag in _LAYOUT_FLAGS) and args.tp_plan is None and args.pipeline == "auto":
        strategies = [name.strip() for name in args.strategies.split(",") if name.strip()]
        print(report(module, args.world_size, None, strategies=strategies, **common))
        if args.device_memory is not None:
            from trainer.memory.planner import compare, recommend
            from trainer.plan.compare import strategy_candidates

            estimates = compare(module, args.world_size, strategies=strategies, **common)
            _recommend(args, lambda base, budget: strategy_candidates(base, estimates, budget),
                       recommend(estimates, args.device_memory) if "fsdp" in strategies else "")
        return 0
    sizes = {flag: getattr(args, flag) or ([-1] if flag == "dp_shard" else [1]) for flag in _LAYOUT_FLAGS}
    layouts = layouts_for(args.world_size, **sizes)
    plan = _tp_plan(args.tp_plan, module, policy) if any(layout.tp > 1 for layout in layouts) else None
    pipeline = "auto" if args.pipeline == "auto" else [name.strip() for name in args.pipeline.split(",") if name.strip()]
    if pipeline != "auto" and all(layout.pp == 1 for layout in layouts):
        raise ConfigurationError(f"--pipeline {args.pipeline} names pipeline stage boundaries, but no layout has --pp above 1.")
    print(layout_report(module, layouts, None, tp_plan=plan, pipeline=pipeline,
                        microbatches=args.microbatches, schedule=args.schedule, **common))  # fmt: skip
    if args.device_memory is not None:
        from trainer.memory.planner import estimate_layout
        from trainer.plan.compare import layout_candidates

        kwargs = dict(common, tp_plan=plan, pipeline=pipeline, microbatches=args.microbatches, schedule=args.schedule)
        estimates = [estimate_layout(module, layout, **kwargs) for layout in layouts]
        _recommend(args, lambda base, budget: layout_candidates(base, estimates, budget))
    if args.tp_plan == "megatron" and plan:
        from trainer.strategies.nd.tp_plan import format_plan

        print("The 'megatron' TP plan, for parallelize_module(model, tp_mesh, {...}):\n    "
              + format_plan(plan).replace("\n", "\n    "))  # fmt: skip
    return 0


def _recommend(args: argparse.Namespace, candidates: Any, hint: str = "") -> None:
    """The recommendation: the first-pass rows that fit, planned on fake ranks in order of communication (one planner:
    the figures printed are those of ``trainer plan``)."""
    from trainer.cli.plan import _tp_plan as plan_tp_plan
    from trainer.cli.plan import parse_size
    from trainer.plan.compare import recommend_planned, recommendation_text
    from trainer.plan.hardware import load_profile
    from trainer.plan.job import JobSpec
    from trainer.plan.module_spec import module_factory

    budget = parse_size(args.device_memory)
    wrap = tuple(n.strip() for n in args.wrap.split(",") if n.strip())
    base = JobSpec(build=module_factory(args.module, args.init_args), module_name=args.module,
                   devices_per_node=args.world_size, precision=args.precision, optimizer=args.optimizer, wrap=wrap,
                   microbatches=args.microbatches, schedule=args.schedule, tp_plan=plan_tp_plan(args.tp_plan))  # fmt: skip
    chosen, plan, passed = recommend_planned(candidates(base, budget), load_profile(args.hardware), budget)
    print(recommendation_text(chosen, plan, passed, budget, hint if hint.startswith("Nothing fits") else ""))


def _tp_plan(spec: Any, module: nn.Module, policy: Any) -> Any:
    if spec is None:
        raise ConfigurationError(
            "--tp above 1 needs --tp-plan: 'megatron' (the built-in split of transformer blocks) or "
            "FILE.py:FUNCTION returning the dict you pass to parallelize_module."
        )
    if spec == "megatron":
        from trainer.strategies.nd.tp_plan import megatron_plan

        return megatron_plan(module, policy or ())
    function = load_object(spec, "function")
    plan = function(module) if inspect.signature(function).parameters else function()
    if not isinstance(plan, dict):
        raise ConfigurationError(f"--tp-plan {spec} returned {type(plan).__name__}; it must return the plan dict.")
    return plan




def build_module(spec: str, init_args: Any = None) -> nn.Module:
    """The module ``spec`` names, built on the meta device: a class called with ``init_args`` (a JSON object), or a
    function returning the module. A class whose required arguments are missing is an error that says how."""
    import json

    kwargs = {}
    if init_args is not None:
        try:
            kwargs = json.loads(init_args)
        except ValueError as err:
            raise ConfigurationError(f"--init-args {init_args!r} is not JSON ({err}). Pass an object, e.g. "
                                     "--init-args '{\"n_layer\": 48, \"vocab_size\": 50304}'.") from None  # fmt: skip
        if not isinstance(kwargs, dict):
            raise ConfigurationError(f"--init-args {init_args!r} must be a JSON object of keyword arguments.")
    target = load_object(spec, "module")
    name = spec.partition(":")[2]
    try:
        inspect.signature(target).bind(**kwargs)
    except TypeError as err:
        missing = [p.name for p in inspect.signature(target).parameters.values()
                   if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                   and p.name not in kwargs]  # fmt: skip
        what = f"needs the argument(s) {', '.join(missing)}" if missing else f"cannot take these arguments ({err})"
        example = ", ".join(f'"{m}": ...' for m in missing) or '"name": value'
        raise ConfigurationError(
            f"'{spec}': {name} {what}. Pass them as --init-args '{{{example}}}' (JSON), or name a function that "
            f"builds the model instead, e.g. {spec.partition(':')[0]}:make_model with def make_model(): return "
            f"{name}(...)."
        ) from None
    except ValueError:  # no signature (a builtin): let the call say
        pass
    with torch.device("meta"):
        module = target(**kwargs)
    if not isinstance(module, nn.Module):
        raise ConfigurationError(f"'{spec}' returned {type(module).__name__}, not an nn.Module.")
    return module


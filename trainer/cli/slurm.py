"""``trainer slurm``: write an sbatch script for a SLURM cluster and, with ``--submit``, submit it.

``trainer slurm train.py --nodes 2 --devices-per-node 4 --time 04:00:00 --submit -- --lr 0.1`` writes
``train.sbatch`` (one task per device, ``srun python train.py --lr 0.1``) and prints the job id. The script
asks SLURM for a warning signal before the time limit (``--signal=USR1@90``), ``--requeue`` and appended
logs: the Trainer saves on that signal, requeues the job, and the requeued job resumes from the checkpoint.
Arguments after ``--`` go to the training script.

With ``--submit --plan train.py:make_module [--plan-args "--strategy nd_parallel --tp 8 ..."]`` the job is first
planned at its size (``trainer plan`` with ``--nodes``/``--devices-per-node`` from here): a layout the plan shows
cannot start (a tp that does not divide the heads, an empty pipeline stage, over the device's memory, ...) ends
with status 2 and nothing is written or queued. ``--no-plan`` skips the plan.
"""
from __future__ import annotations

import argparse
import datetime
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from trainer.strategies.errors import ConfigurationError
from trainer.cli.common import command_parser, job_variables, merged_config, parse_env, positive_int, value_options
from trainer.config.yaml_config import ExperimentConfig, check_trainer_values, split_trainer_args

# minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (sbatch --time)
_TIME = re.compile(r"^(\d+(:\d{1,2}){0,2}|\d+-\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE)$")
_SIGNAL = re.compile(r"^(?:([RB]):)?(?:SIG)?([A-Z0-9]+)(?:@(\d+))?$")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``trainer slurm``."""
    summary = "write (and --submit) an sbatch script for a SLURM cluster"
    parser = command_parser(subparsers, "slurm", summary, __doc__, "before --")
    parser.add_argument("script", metavar="SCRIPT", help="the training script")
    parser.add_argument("--config", "-c", metavar="FILE", help="experiment file (its num_nodes/devices are defaults)")
    parser.add_argument("--nodes", type=positive_int, metavar="N", help="nodes (default 1)")
    parser.add_argument("--devices-per-node", type=positive_int, metavar="N",
                        help="tasks per node, one per GPU (default 1)")  # fmt: skip
    parser.add_argument("--accelerator", choices=("gpu", "cpu"), default="gpu",
                        help="gpu (default): request one GPU per task; cpu: no GPUs")  # fmt: skip
    parser.add_argument("--time", "-t", metavar="TIME", help="time limit, e.g. 04:00:00 or 1-00:00:00")
    parser.add_argument("--partition", "-p", metavar="NAME")
    parser.add_argument("--account", "-A", metavar="NAME")
    parser.add_argument("--cpus-per-task", type=positive_int, metavar="N")
    parser.add_argument("--mem", metavar="SIZE", help="memory per node, e.g. 64G")
    parser.add_argument("--job-name", "-J", metavar="NAME", help="default: the script's name")
    parser.add_argument("--signal", default="USR1@90", metavar="SIG@SECONDS",
                        help="sent that long before the time limit (default USR1@90; may come 60 s early)")  # fmt: skip
    parser.add_argument("--no-requeue", action="store_true", help="do not mark the job requeueable")
    parser.add_argument("--log-dir", default="logs", metavar="DIR",
                        help="where SLURM writes the job's output (default logs)")  # fmt: skip
    parser.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                        help="any other sbatch option, e.g. --sbatch=--qos=high (repeatable)")  # fmt: skip
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="export in the job (repeatable)")  # fmt: skip
    parser.add_argument("--python", default=sys.executable, metavar="PATH",
                        help="interpreter on the nodes (default: this one)")  # fmt: skip
    parser.add_argument("--output", "-o", metavar="FILE", help="where to write the script (default JOB_NAME.sbatch)")
    parser.add_argument("--submit", action="store_true", help="submit with sbatch and print the job id")
    parser.add_argument("--plan", default=None, metavar="MODULE",
                        help="with --submit: run `trainer plan MODULE` at the job's size first; refuse what it refuses")  # fmt: skip
    parser.add_argument("--plan-args", default="", metavar="'FLAGS'",
                        help="the plan's other flags, e.g. '--strategy nd_parallel --tp 8 --seq-len 4096 ...'")  # fmt: skip
    parser.add_argument("--no-plan", action="store_true", help="submit without planning")
    parser.set_defaults(handler=main)
    return parser


def split_argv(argv: list[str], parser: argparse.ArgumentParser) -> tuple[list[str], list[str], list[str]]:
    """Options may come before or after SCRIPT; the script's own arguments follow ``--``."""
    if "--" in argv:
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1:]
    else:
        passthrough = []
    rest, tokens = split_trainer_args(argv, value_options(parser), stop_at_positional=False)
    return rest, tokens, passthrough


def check_time(value: str) -> str:
    """A SLURM time limit (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS)."""
    if not _TIME.match(value):
        raise ConfigurationError(
            f"--time {value!r} is not a SLURM time limit. Use HH:MM:SS (e.g. 04:00:00), D-HH:MM:SS (e.g. 1-12:00:00) "
            "or a number of minutes."
        )
    return value


def check_signal(value: str) -> tuple[signal.Signals, str]:
    """Parse ``[R:]SIG[@SECONDS]``; returns the signal and the ``--signal`` value to write."""
    match = _SIGNAL.match(value.upper())
    name = match.group(2) if match else ""
    try:
        signum = signal.Signals(int(name)) if name.isdigit() else signal.Signals["SIG" + name]
    except (KeyError, ValueError):
        match = None
    if match is None:
        raise ConfigurationError(f"--signal {value!r} is not understood. Use SIGNAL@SECONDS, e.g. USR1@90.")
    if match.group(1) == "B":
        raise ConfigurationError(
            f"--signal {value!r}: 'B:' signals only the batch shell, so the Trainer (running in srun's tasks) would "
            "never see it. Drop 'B:' (e.g. --signal USR1@90) so every task is signalled."
        )
    seconds = match.group(3) or "60"
    return signum, f"{'R:' if match.group(1) else ''}{signum.name[3:]}@{seconds}"


def sbatch_script(args: argparse.Namespace, job_name: str, config: ExperimentConfig, variables: dict[str, str]) -> str:
    """The text of the sbatch script."""
    _, signal_option = check_signal(args.signal)
    lines = [
        "#!/bin/bash",
        f"# Written by `trainer slurm` on {datetime.date.today()}; submit with sbatch.",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={config.num_nodes}",
        f"#SBATCH --ntasks-per-node={config.devices}",
    ]
    if args.accelerator == "gpu":
        lines.append(f"#SBATCH --gpus-per-node={config.devices}")
    optional = {"time": args.time and check_time(args.time), "partition": args.partition, "account": args.account,
                "cpus-per-task": args.cpus_per_task, "mem": args.mem}  # fmt: skip
    for option, value in optional.items():
        if value:
            lines.append(f"#SBATCH --{option}={value}")
    lines.append(f"#SBATCH --signal={signal_option}")
    if not args.no_requeue:
        lines.append("#SBATCH --requeue")
    lines += [
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={Path(args.log_dir).resolve() / '%x-%j.out'}",
    ]
    for option in args.sbatch:
        if not option.startswith("--"):
            raise ConfigurationError(f"--sbatch {option!r} must be a long sbatch option, e.g. --sbatch=--qos=high.")
        lines.append(f"#SBATCH {option}")
    lines += ["", f"cd {shlex.quote(str(Path.cwd()))}"]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in variables.items()]
    script = str(Path(args.script).resolve())
    lines += [
        'echo "[trainer] job $SLURM_JOB_ID, restart ${SLURM_RESTART_COUNT:-0}, nodes $SLURM_JOB_NODELIST"',
        # --kill-on-bad-exit: one failed task ends the step instead of leaving the others waiting in a collective.
        shlex.join(["srun", "--kill-on-bad-exit=1", args.python, script, *args.passthrough]),
        "",
    ]
    return "\n".join(lines)


def submit(path: Path) -> int:
    """``sbatch --parsable PATH``; returns the job id."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise ConfigurationError(
            f"--submit needs `sbatch`, which is not on PATH here. Run this on the cluster's login node, or submit "
            f"the written script there with `sbatch {path}`."
        )
    result = subprocess.run([sbatch, "--parsable", str(path)], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise ConfigurationError(f"sbatch rejected {path}: {result.stderr.strip() or result.stdout.strip()}")
    return int(result.stdout.strip().split(";")[0])


def plan_before_submit(args: argparse.Namespace, nodes: int, devices: int) -> None:
    """``trainer plan`` of ``--plan MODULE`` at ``nodes`` × ``devices``; a refusal becomes this command's error, saying
    nothing was submitted. Without ``--plan``, a note on how to plan."""
    if args.plan is None:
        print("Not planned: pass --plan FILE.py:make_module (and --plan-args) to check the layout before it queues, "
              "or --no-plan.", file=sys.stderr)  # fmt: skip
        return
    from trainer.cli import plan as plan_command

    parser = argparse.ArgumentParser(prog="trainer slurm --plan-args")
    plan_parser = plan_command.add_parser(parser.add_subparsers())
    flags = shlex.split(args.plan_args)
    for fixed in ("--nodes", "--devices-per-node", "--world-size"):
        if fixed in flags:
            raise ConfigurationError(f"--plan-args {args.plan_args!r}: {fixed} comes from this command's own "
                                     "--nodes/--devices-per-node; leave it out.")  # fmt: skip
    try:
        plan_args = plan_parser.parse_args([args.plan, "--nodes", str(nodes), "--devices-per-node", str(devices), *flags])
    except SystemExit as err:
        raise ConfigurationError(f"--plan-args {args.plan_args!r} are not `trainer plan` flags (see trainer plan -h).") from err
    try:
        plan_command.main(plan_args)
    except ConfigurationError as err:
        raise ConfigurationError(f"the plan refuses this job, so nothing was submitted (--no-plan skips the plan): {err}") from None


def main(args: argparse.Namespace) -> int:
    """Write the script; with ``--submit`` plan the job (``--plan``), submit it and print the job id."""
    if not Path(args.script).is_file():
        raise ConfigurationError(
            f"script '{args.script}' does not exist (resolved to '{Path(args.script).resolve()}')."
        )
    config = merged_config(args.config, {"num_nodes": args.nodes, "devices": args.devices_per_node})
    config.given = config.given | {"num_nodes", "devices"}
    config.env.update(parse_env(args.env))
    trainer_args: dict[str, Any] = {"accelerator": "cpu" if args.accelerator == "cpu" else "gpu"}
    trainer_args.update(args.trainer_args)
    check_trainer_values({**config.trainer, **args.trainer_args}, f"{args.config}: trainer." if args.config else "--trainer.")
    if args.submit and not args.no_plan:
        plan_before_submit(args, config.num_nodes, config.devices)
    job_name = args.job_name or Path(args.script).stem
    text = sbatch_script(args, job_name, config, job_variables(config, args.config, trainer_args))
    path = Path(args.output or f"{job_name}.sbatch")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    print(f"Wrote {path} ({config.num_nodes} node(s) x {config.devices} task(s)).")
    if args.submit:
        job_id = submit(path)
        print(f"Submitted batch job {job_id}; output: {Path(args.log_dir) / f'{job_name}-{job_id}.out'}")
    else:
        print(f"Submit it with: sbatch {path}")
    return 0


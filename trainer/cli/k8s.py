"""``trainer k8s``: write a Kubeflow manifest (PyTorchJob or TrainJob) for a Kubernetes cluster.

``trainer k8s train.py --nodes 2 --devices-per-node 8 --image registry/me/train:1 --pvc ckpts -- --lr 0.1``
writes ``train.yaml`` (``-o -`` prints it: ``trainer k8s ... -o - | kubectl apply -f -``). Each pod asks for its GPUs, runs the
script from ``--workdir`` in the image, mounts the claim ``--pvc`` at ``--mount`` (the run's folder, so
checkpoints outlive a pod) and gets ``--grace-period`` seconds after SIGTERM: the Trainer saves within them.
A pod that restarts resumes from the newest checkpoint there (``TRAINER_AUTO_RESUME=1``).

``--kind pytorchjob`` (default, Kubeflow training operator ``kubeflow.org/v1``): one Master and N-1 Worker pods;
the script runs directly and the Trainer starts ``devices-per-node`` processes in each pod.
``--kind trainjob`` (Kubeflow Trainer v2, ``trainer.kubeflow.org/v1alpha1``): ``numNodes`` pods of the
``torch-distributed`` runtime, which runs torchrun with ``PET_*``; the Trainer joins torchrun's processes.
Arguments after ``--`` go to the training script.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import re
from pathlib import Path, PurePosixPath
from typing import Any

from trainer.strategies.errors import ConfigurationError
from trainer.cli.common import command_parser, job_variables, merged_config, parse_env, positive_int
from trainer.cli.slurm import split_argv as split_argv  # the same: options anywhere, the script's after --
from trainer.checkpoint.auto_resume import AUTO_RESUME_VARIABLE
from trainer.config.yaml_config import check_trainer_values

KINDS = ("pytorchjob", "trainjob")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # a DNS-1123 label, what Kubernetes accepts as a job name


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``trainer k8s``."""
    summary = "write a Kubeflow PyTorchJob/TrainJob manifest for a Kubernetes cluster"
    parser = command_parser(subparsers, "k8s", summary, __doc__, "before --")
    parser.add_argument("script", metavar="SCRIPT", help="the training script, as its path in the image's --workdir")
    parser.add_argument("--image", required=True, metavar="IMAGE", help="container image holding the script")
    parser.add_argument("--kind", choices=KINDS, default="pytorchjob", help="pytorchjob (default) or trainjob")
    parser.add_argument("--config", "-c", metavar="FILE", help="experiment file (its num_nodes/devices are defaults)")
    parser.add_argument("--nodes", type=positive_int, metavar="N", help="pods (default 1)")
    parser.add_argument("--devices-per-node", type=positive_int, metavar="N", help="processes (GPUs) per pod (default 1)")
    parser.add_argument("--accelerator", choices=("gpu", "cpu"), default="gpu",
                        help="gpu (default): request nvidia.com/gpu per pod; cpu: no GPUs")  # fmt: skip
    parser.add_argument("--pvc", metavar="NAME", help="PersistentVolumeClaim for the run's folder (checkpoints)")
    parser.add_argument("--mount", default="/checkpoints", metavar="PATH",
                        help="where the claim is mounted; the Trainer's default_root_dir (default /checkpoints)")  # fmt: skip
    parser.add_argument("--workdir", default="/workspace", metavar="PATH", help="the script's folder in the image")
    parser.add_argument("--grace-period", type=positive_int, default=120, metavar="SECONDS",
                        help="time between SIGTERM and SIGKILL, to save a checkpoint (default 120)")  # fmt: skip
    parser.add_argument("--cpu", metavar="N", help="CPU request per pod, e.g. 16")
    parser.add_argument("--memory", metavar="SIZE", help="memory request per pod, e.g. 200Gi")
    parser.add_argument("--namespace", "-n", metavar="NAME", help="Kubernetes namespace (default: kubectl's)")
    parser.add_argument("--job-name", "-J", metavar="NAME", help="default: the script's name")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="export in the pods (repeatable)")
    parser.add_argument("--python", default="python", metavar="PATH", help="interpreter in the image (default python)")
    parser.add_argument("--output", "-o", metavar="FILE", help="where to write the manifest (default JOB_NAME.yaml; - prints it)")
    parser.set_defaults(handler=main)
    return parser


def job_name(args: argparse.Namespace) -> str:
    """The job's name: ``--job-name`` or the script's, as a DNS-1123 label (Kubernetes refuses others)."""
    name = args.job_name or PurePosixPath(args.script).stem.lower().replace("_", "-").replace(".", "-")
    if not _NAME.match(name) or len(name) > 63:
        raise ConfigurationError(
            f"job name {name!r} is not a Kubernetes name: lowercase letters, digits and '-', starting and ending with "
            "a letter or digit, at most 63 characters. Pass --job-name."
        )
    return name


def _resources(args: argparse.Namespace, devices: int) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    if args.accelerator == "gpu":
        limits["nvidia.com/gpu"] = devices
    if args.cpu:
        requests["cpu"] = str(args.cpu)
    if args.memory:
        requests["memory"] = args.memory
    resources: dict[str, Any] = {}
    if limits:
        resources["limits"] = limits
    if requests:
        resources["requests"] = requests
    return resources


def _env_list(variables: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": key, "value": str(value)} for key, value in variables.items()]


def manifest(args: argparse.Namespace, name: str, nodes: int, devices: int, variables: dict[str, str]) -> dict[str, Any]:
    """The manifest as a dict (``yaml.safe_dump`` writes it)."""
    script = [*args.passthrough]
    volumes, mounts = [], []
    if args.pvc:
        volumes = [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": args.pvc}}]
        mounts = [{"name": "checkpoints", "mountPath": args.mount}]
    metadata: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/created-by": "trainer-k8s"}}
    if args.namespace:
        metadata["namespace"] = args.namespace
    resources = _resources(args, devices)
    if args.kind == "trainjob":
        trainer: dict[str, Any] = {
            "image": args.image,
            "command": ["torchrun", str(PurePosixPath(args.workdir) / args.script), *script],
            "numNodes": nodes,
            "numProcPerNode": devices,
            "env": _env_list(variables),
        }
        if resources:
            trainer["resourcesPerNode"] = resources
        pod_override: dict[str, Any] = {"targetJobs": [{"name": "node"}]}
        if volumes:
            pod_override.update(volumes=volumes, containers=[{"name": "node", "volumeMounts": mounts}])
        spec: dict[str, Any] = {"runtimeRef": {"name": "torch-distributed"}, "trainer": trainer,
                                "podSpecOverrides": [pod_override]}  # fmt: skip
        return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": metadata, "spec": spec}
    container: dict[str, Any] = {
        "name": "pytorch",  # the operator finds the training container by this name
        "image": args.image,
        "workingDir": args.workdir,
        "command": [args.python, args.script, *script],
        "env": _env_list(variables),
    }
    if resources:
        container["resources"] = resources
    if mounts:
        container["volumeMounts"] = mounts
    pod: dict[str, Any] = {"terminationGracePeriodSeconds": args.grace_period, "containers": [container]}
    if volumes:
        pod["volumes"] = volumes

    def replicas(count: int) -> dict[str, Any]:
        return {"replicas": count, "restartPolicy": "OnFailure", "template": {"spec": copy.deepcopy(pod)}}

    specs = {"Master": replicas(1)}
    if nodes > 1:
        specs["Worker"] = replicas(nodes - 1)
    spec = {"runPolicy": {"cleanPodPolicy": "None"}, "pytorchReplicaSpecs": specs}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": metadata, "spec": spec}


def main(args: argparse.Namespace) -> int:
    """Write the manifest and say how to apply it."""
    import yaml

    name = job_name(args)
    config = merged_config(args.config, {"num_nodes": args.nodes, "devices": args.devices_per_node})
    config.given = config.given | {"num_nodes", "devices"}
    config.env.update(parse_env(args.env))
    trainer_args: dict[str, Any] = {"accelerator": "cpu" if args.accelerator == "cpu" else "gpu"}
    if args.pvc:
        trainer_args["default_root_dir"] = args.mount
    trainer_args.update(args.trainer_args)
    check_trainer_values({**config.trainer, **args.trainer_args}, f"{args.config}: trainer." if args.config else "--trainer.")
    variables = {**job_variables(config, args.config, trainer_args), AUTO_RESUME_VARIABLE: "1"}
    document = manifest(args, name, config.num_nodes, config.devices, variables)
    text = (f"# Written by `trainer k8s` on {datetime.date.today()}; apply with kubectl apply -f.\n"
            + yaml.safe_dump(document, sort_keys=False))  # fmt: skip
    if args.output == "-":
        print(text, end="")
        return 0
    path = Path(args.output or f"{name}.yaml")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"Wrote {path} ({document['kind']}: {config.num_nodes} pod(s) x {config.devices} process(es)).")
    print(f"Apply it with: kubectl apply -f {path}")
    return 0

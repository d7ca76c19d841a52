"""``notebook_launcher`` and ``debug_launcher``: run a training function in several processes forked from this
one (a notebook, a test), each of which creates its own ``Accelerator()`` and joins the job."""
from __future__ import annotations

import os
from typing import Any, Callable, Optional

from trainer.strategies.errors import ConfigurationError


def _run(local_rank: int, function: Callable[..., Any], args: tuple, variables: dict[str, str], world: int) -> None:
    os.environ.update(variables)
    os.environ.update(LOCAL_RANK=str(local_rank), RANK=str(local_rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world), NODE_RANK="0")  # fmt: skip
    function(*args)


def notebook_launcher(function: Callable[..., Any], args: tuple = (), num_processes: Optional[int] = None,
                      mixed_precision: str = "no", use_port: Optional[str] = None, master_addr: str = "127.0.0.1",
                      node_rank: int = 0, num_nodes: int = 1, **unsupported: Any) -> None:  # fmt: skip
    """Run ``function(*args)`` in ``num_processes`` processes forked from this one (one machine); with one process
    (or None) it runs here. Each process sees the launch variables, so ``Accelerator()`` inside ``function`` joins
    the job; ``mixed_precision`` is the default its ``Accelerator(mixed_precision=None)`` takes. ``use_port``: the
    rendezvous port (a free one when not given; Accelerate's default is 29500)."""
    if unsupported:
        raise ConfigurationError(f"notebook_launcher({', '.join(sorted(unsupported))}=...) is not supported here: it "
                                 "starts the processes of one machine (use `trainer run` for elastic or multi-node jobs).")  # fmt: skip
    if num_nodes != 1 or node_rank != 0:
        raise ConfigurationError("notebook_launcher runs on one machine (num_nodes=1); use `trainer run --num-nodes N` "
                                 "for several.")  # fmt: skip
    if "LOCAL_RANK" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ:
        raise ConfigurationError("notebook_launcher was called inside a launched process; call function() directly.")
    variables = {"ACCELERATE_MIXED_PRECISION": str(mixed_precision)}
    if not num_processes or num_processes == 1:
        previous = os.environ.get("ACCELERATE_MIXED_PRECISION")
        os.environ.update(variables)
        try:
            function(*args)
        finally:
            if previous is None:
                del os.environ["ACCELERATE_MIXED_PRECISION"]
            else:
                os.environ["ACCELERATE_MIXED_PRECISION"] = previous
        return
    from torch.multiprocessing import start_processes

    from trainer.strategies.launch.environments.local import find_free_port

    variables.update(MASTER_ADDR=master_addr, MASTER_PORT=str(use_port or find_free_port()))
    start_processes(_run, args=(function, tuple(args), variables, num_processes), nprocs=num_processes,
                    start_method="fork")  # fmt: skip


def debug_launcher(function: Callable[..., Any], args: tuple = (), num_processes: int = 2) -> None:
    """Run ``function(*args)`` in ``num_processes`` CPU processes forked from this one (to debug a distributed
    loop on a laptop)."""
    os.environ["ACCELERATE_USE_CPU"] = "yes"
    try:
        notebook_launcher(function, args, num_processes=num_processes)
    finally:
        os.environ.pop("ACCELERATE_USE_CPU", None)

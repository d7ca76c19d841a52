"""One replica group of a fault-tolerant fit (``ft_ddp``/``ft_hsdp``), launched by tests/test_fault_tolerance.py.

``python ft_group.py OUT --steps N [--strategy ft_ddp] [--pause S] [--alone-pause S] [--crash-at K] [--ckpt-every K]
[--resume]``: the group's replica
id, the lighthouse and the number of groups come from ``REPLICA_GROUP_ID``, ``TORCHFT_LIGHTHOUSE`` and
``NUM_REPLICA_GROUPS``. After every step, group rank 0 appends ``global_step time`` to ``OUT/steps-<id>.txt``; at the
end it saves ``OUT/weights-<id>.pt`` (global step, weights) and ``OUT/opened-<id>.txt`` lists every checkpoint
file the group read (a healed group reads none). ``--crash-at K``: group 1 (``--crash-group``) SIGKILLs itself at step K, once.
"""
import argparse
import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for helpers
from helpers import Regressor, regression_data  # noqa: E402

from trainer import Trainer  # noqa: E402
from trainer.callbacks import ModelCheckpoint  # noqa: E402


class Paced(Regressor):
    def __init__(self, pause: float = 0.0, out: str = ".", alone_pause: float = 0.0, crash_at: int = -1,
                 crash_group: str = "1") -> None:  # fmt: skip
        super().__init__()
        self.pause, self.out, self.alone_pause, self.crash_at = pause, out, alone_pause, crash_at
        self.crash_group = crash_group

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.global_rank == 0:
            replica = os.environ["REPLICA_GROUP_ID"]
            with open(Path(self.out, f"steps-{replica}.txt"), "a") as f:
                f.write(f"{self.global_step} {time.time():.3f}\n")
        crashed = Path(self.out, "crashed")
        if self.global_step == self.crash_at and os.environ["REPLICA_GROUP_ID"] == self.crash_group and not crashed.exists():
            crashed.touch()
            os.kill(os.getpid(), signal.SIGKILL)  # the group dies once, as a node would
        groups = self.trainer.strategy.replica_metrics["ft/replicas"]
        alone = groups < int(os.environ["NUM_REPLICA_GROUPS"])
        # A group missing: go slower, so a restarted one (seconds to start) rejoins before this run ends.
        pause = self.alone_pause if alone and self.alone_pause else self.pause
        if pause:
            time.sleep(pause)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--strategy", default="ft_ddp")
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--alone-pause", type=float, default=0.0)
    parser.add_argument("--crash-at", type=int, default=-1)
    parser.add_argument("--crash-group", default="1")
    parser.add_argument("--ckpt-every", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--mode", default="sync", help="ft_ddp's mode: sync, local_sgd or diloco")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    replica = os.environ["REPLICA_GROUP_ID"]
    opened: list[str] = []
    real_load = torch.load

    def recording_load(f, *a, **k):  # every checkpoint file read in this process
        opened.append(str(f))
        return real_load(f, *a, **k)

    torch.load = recording_load
    options = dict(ft_timeout=5, quorum_timeout=60, connect_timeout=10)
    if args.strategy == "ft_ddp":
        from trainer.strategies.data_parallel.fault_tolerant import FaultTolerantStrategy

        strategy = FaultTolerantStrategy(mode=args.mode, sync_every=5, **options)
    else:  # one full state dict at the end, to compare the groups' weights whole
        from trainer.strategies.data_parallel.fault_tolerant_hsdp import FaultTolerantHSDPStrategy

        strategy = FaultTolerantHSDPStrategy(state_dict_type="full", **options)
    torch.manual_seed(int(replica))  # the groups start different: the first quorum makes them equal
    model = Paced(args.pause, args.out, args.alone_pause, args.crash_at, args.crash_group)
    data = DataLoader(regression_data(n=64), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1))
    callbacks = []
    if args.ckpt_every:
        callbacks.append(ModelCheckpoint(dirpath=out / "checkpoints", every_n_train_steps=args.ckpt_every,
                                         save_top_k=-1, save_last=True))  # fmt: skip
    trainer = Trainer(accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")), strategy=strategy,
                      max_steps=args.steps, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=bool(args.ckpt_every), callbacks=callbacks, default_root_dir=out,
                      num_sanity_val_steps=0)  # fmt: skip
    trainer.fit(model, data, ckpt_path="last" if args.resume else None)
    state = trainer.strategy.module_state_dict()  # every rank: a sharded strategy gathers it on rank 0
    if trainer.is_global_zero:
        state = {k: v.clone() for k, v in state.items()}
        torch.save({"global_step": trainer.global_step, "state_dict": state,
                    "metrics": dict(trainer.strategy.replica_metrics)}, out / f"weights-{replica}.pt")  # fmt: skip
        Path(out, f"opened-{replica}.txt").write_text("\n".join(opened))


if __name__ == "__main__":
    main()

"""A Fabric-style training script (Lightning Fabric's API, after the rename ``lightning.fabric`` → ``trainer.fabric``)
and the same loop written by hand in plain PyTorch; every rank writes ``rank<r>.pt`` into OUT.

    python fabric_job.py OUT STRATEGY DEVICES [lightning]

The Fabric loop: model and optimizer through ``setup`` (or ``setup_module`` + ``setup_optimizers``), a shuffled
dataloader through ``setup_dataloaders``, accumulation of 2 micro-batches under ``no_backward_sync`` (a partial
last window per epoch), ``backward``, ``clip_gradients``, ``log``, ``call``, ``save``/``load`` of a state dict.
The reference: one process, plain torch, each step on the global batch (what every rank's DistributedSampler
gave it that step, concatenated). With ``lightning`` the same loop runs on ``lightning.fabric.Fabric``.
"""
from __future__ import annotations

import faulthandler
import sys
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

N, BATCH, ACCUMULATE, EPOCHS, LR, CLIP, SEED = 40, 4, 2, 2, 0.1, 0.5, 7


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(N, 6, generator=generator)
    return TensorDataset(x, x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(N, 1, generator=generator))


def make_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))


class Recorder:
    """A Fabric callback: ``fabric.call("on_epoch_end", epoch)`` lands here."""

    def __init__(self) -> None:
        self.epochs: list[int] = []

    def on_epoch_end(self, epoch: int) -> None:
        self.epochs.append(epoch)


def fabric_loop(fabric, sharded: bool) -> dict:
    fabric.seed_everything(SEED)
    net = make_net()
    if sharded:  # as Fabric asks under FSDP: the optimizer is built from the set-up module's parameters
        model = fabric.setup_module(net)
        optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9))
    else:
        model, optimizer = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9))
    loader = fabric.setup_dataloaders(DataLoader(dataset(), batch_size=BATCH, shuffle=True))
    model.marker = 7  # an attribute set on the set-up model is the user's module's, whatever wraps it
    reaches_module = (getattr(net, "marker", None) == 7 and getattr(model, "module", model) is net
                      and "module." not in "".join(model.state_dict()))  # fmt: skip
    losses, norms, step = [], [], 0
    for epoch in range(EPOCHS):
        for index, (x, y) in enumerate(loader):
            boundary = (index + 1) % ACCUMULATE == 0 or index + 1 == len(loader)
            with fabric.no_backward_sync(model, enabled=not boundary):
                loss = F.mse_loss(model(x), y)
                fabric.backward(loss / ACCUMULATE)
            losses.append(float(fabric.all_reduce(loss.detach(), reduce_op="mean")))
            if boundary:
                norms.append(float(fabric.clip_gradients(model, optimizer, max_norm=CLIP)))
                optimizer.step()
                optimizer.zero_grad()
                step += 1
                fabric.log("loss", loss, step=step)
        fabric.call("on_epoch_end", epoch)
    return {"losses": losses, "norms": norms, "step": step, "model": model, "optimizer": optimizer,
            "reaches_module": reaches_module}


def reference_loop(world_size: int) -> dict:
    """The same training in plain torch, one process: each step on every rank's batch of that step."""
    data = dataset()
    net = make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    losses, norms = [], []
    loader = DataLoader(data, batch_size=BATCH, shuffle=True)  # one process: Fabric keeps the loader's sampler
    for epoch in range(EPOCHS):
        if world_size == 1:
            steps = list(loader)
        else:
            shares = []
            for rank in range(world_size):
                sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=SEED)
                sampler.set_epoch(epoch)
                shares.append(list(sampler))
            steps = [data[[i for share in shares for i in share[start:start + BATCH]]]
                     for start in range(0, len(shares[0]), BATCH)]  # fmt: skip
        batches = len(steps)
        for index, (x, y) in enumerate(steps):
            loss = F.mse_loss(net(x), y)
            (loss / ACCUMULATE).backward()
            losses.append(loss.item())
            if (index + 1) % ACCUMULATE == 0 or index + 1 == batches:
                norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)))
                optimizer.step()
                optimizer.zero_grad()
    return {"losses": losses, "norms": norms, "weights": {k: v.detach().clone() for k, v in net.state_dict().items()}}


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a shard (FSDP's DTensors; every rank must call it)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def main() -> None:
    out, strategy, devices = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    faulthandler.dump_traceback_later(100, exit=True)
    if len(sys.argv) > 4 and sys.argv[4] == "lightning":
        from lightning.fabric import Fabric
        from lightning.fabric.loggers import CSVLogger
    else:
        from trainer.fabric import Fabric
        from trainer.loggers import CSVLogger
    recorder = Recorder()
    fabric = Fabric(accelerator="cpu", devices=devices, strategy=strategy, loggers=CSVLogger(str(out / "logs")),
                    callbacks=[recorder])  # fmt: skip
    fabric.launch()
    sharded = strategy == "fsdp"
    with fabric.rank_zero_first():
        dataset()  # where a script downloads or preprocesses once
    result = fabric_loop(fabric, sharded)
    model, optimizer = result.pop("model"), result.pop("optimizer")
    fabric.save(out / "state.ckpt", {"model": model, "optimizer": optimizer, "step": result["step"]})
    saved = fabric.load(out / "state.ckpt")  # no state: the whole file's dict
    fresh = make_net()
    torch.manual_seed(123)
    for param in fresh.parameters():
        nn.init.normal_(param)
    if sharded:
        fresh_model = fabric.setup_module(fresh)
        fresh_optimizer = fabric.setup_optimizers(torch.optim.SGD(fresh_model.parameters(), lr=LR, momentum=0.9))
    else:
        fresh_model, fresh_optimizer = fabric.setup(fresh, torch.optim.SGD(fresh.parameters(), lr=LR, momentum=0.9))
    state = {"model": fresh_model, "optimizer": fresh_optimizer, "step": 0}
    remainder = fabric.load(out / "state.ckpt", state)
    gathered = fabric.all_gather(torch.tensor([fabric.global_rank]))
    momenta = [[full(o.state[p]["momentum_buffer"]) for p in o.param_groups[0]["params"]]
               for o in (optimizer, fresh_optimizer)]  # fmt: skip
    report = dict(result, world_size=fabric.world_size, rank=fabric.global_rank, epochs=recorder.epochs,
                  loaded_step=state["step"], saved_as_folder=(out / "state.ckpt").is_dir(), remainder=sorted(remainder), saved_keys=sorted(saved),
                  gathered=gathered.tolist(), is_global_zero=fabric.is_global_zero,
                  same_momentum=len(momenta[0]) > 0 and all(torch.equal(a, b) for a, b in zip(*momenta)),
                  same_after_load=all(torch.equal(full(a), full(b)) for a, b in
                                      zip(model.state_dict().values(), fresh_model.state_dict().values())),
                  reference=reference_loop(fabric.world_size))  # fmt: skip
    # In the reference's order, whatever prefix the strategy's wrapper adds to the names.
    report["weights"] = [full(v).detach().clone() for v in model.state_dict().values()]
    fabric.print(f"printed by rank {fabric.global_rank}")
    fabric.logger.finalize("success")
    torch.save(report, out / f"rank{fabric.global_rank}.pt")
    fabric.barrier()


if __name__ == "__main__":
    main()

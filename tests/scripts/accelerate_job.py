"""Loops written as an Accelerate user writes them, with only the import changed; every rank writes
``rank<r>.pt`` into OUT (read by tests/test_accelerate_compat.py).

    trainer run --config acc.yaml accelerate_job.py OUT     # two CPU processes, the file says bf16

The Accelerators that measure numbers pass ``mixed_precision="no"`` (the script's explicit argument wins over the
file); one ``Accelerator()`` with the defaults reports what the file set.
"""
from __future__ import annotations

import faulthandler
import sys
from datetime import timedelta
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from trainer.accelerate import (  # noqa: E402
    Accelerator, DataLoaderConfiguration, DDPCommunicationHookType, DistributedDataParallelKwargs, DistributedType,
    InitProcessGroupKwargs,
)
from trainer.accelerate.local_sgd import LocalSGD  # noqa: E402
from trainer.accelerate.utils import gather_object, set_seed  # noqa: E402


def linear_schedule(optimizer: torch.optim.Optimizer, total: int = 10) -> torch.optim.lr_scheduler.LambdaLR:
    """transformers' get_linear_schedule_with_warmup(optimizer, 0, total)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, (total - step) / total))


def batches(accelerator: Accelerator, n: int, batch_size: int) -> list[list[int]]:
    loader = accelerator.prepare(DataLoader(list(range(n)), batch_size=batch_size))
    return [batch.tolist() for batch in loader]


def lr_after(accelerator: Accelerator, steps: int) -> float:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, linear_schedule(optimizer))
    for _ in range(steps):
        accelerator.backward(model(torch.ones(1, 2, device=accelerator.device)).sum())
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return scheduler.get_last_lr()[0]


def resumable(accelerator: Accelerator, state: Path, save_at: int = 0, resume: bool = False) -> dict:
    """Dropout, AdamW, a linear schedule, a shuffled loader dealt in whole batches, accumulation 2: saved after
    ``save_at`` micro-batches (epoch 1, inside a window) and continued, or resumed from there."""
    set_seed(123 if resume else 42)  # a resumed run starts from other weights and RNG
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.linspace(-1, 1, 60).reshape(20, 3), torch.linspace(0, 1, 20)[:, None])
    loader = DataLoader(data, batch_size=3, shuffle=True)  # 7 batches: 4 rounds on 2 processes, the last evened out
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, linear_schedule(optimizer, 40))
    if resume:
        accelerator.load_state(state)
    seen, step = [], 0
    for _ in range(loader.epoch, 3):
        for x, y in accelerator.skip_first_batches(loader, 1 if resume and not seen else 0):
            with accelerator.accumulate(model):
                accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            seen.append(x[:, 0].tolist())
            step += 1
            if step == save_at:
                accelerator.save_state(state)
    return {"seen": seen, "weights": [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()],
            "lr": scheduler.get_last_lr()[0]}  # fmt: skip


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    faulthandler.dump_traceback_later(100, exit=True)
    report: dict = {}

    # everything from the config file; the first Accelerator starts the process group, with this timeout
    defaults = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=321))])
    report["file"] = {"mixed_precision": defaults.mixed_precision, "device": str(defaults.device)}
    report["group_timeout"] = defaults.strategy.timeout  # what the strategy passed to init_process_group

    accelerator = Accelerator(mixed_precision="no", cpu=False)
    rank = accelerator.process_index
    report["members"] = {
        "mixed_precision": accelerator.mixed_precision, "distributed_type": accelerator.distributed_type,
        "is_multi_cpu": accelerator.distributed_type == DistributedType.MULTI_CPU,
        "num_processes": accelerator.num_processes, "process_index": rank,
        "use_distributed": accelerator.use_distributed, "is_main_process": accelerator.is_main_process,
        "is_last_process": accelerator.is_last_process,
    }  # fmt: skip
    report["dealt"] = batches(accelerator, 12, 2)
    report["even"] = batches(accelerator, 10, 4)
    report["lr"] = lr_after(accelerator, 3)
    set_seed(5)
    shuffled = accelerator.prepare(DataLoader(list(range(12)), batch_size=2, shuffle=True))
    report["shuffled"] = [[batch.tolist() for batch in shuffled] for _ in range(2)]  # two epochs

    # gather_for_metrics: the batch itself, and a tensor that is not the batch
    loader = accelerator.prepare(DataLoader(torch.arange(10), batch_size=4))
    samples, rows = [], 0
    for batch in loader:
        samples += accelerator.gather_for_metrics(batch).tolist()
        rows += accelerator.gather_for_metrics(torch.zeros(4)).shape[0]
        objects = accelerator.gather_for_metrics([f"r{rank}b{int(batch[0])}"])
    report["gathered"], report["gathered_rows"], report["last_objects"] = samples, rows, objects
    report["gather_object"] = gather_object([f"from {rank}"])

    # set_trigger on one rank stops every rank
    if rank == 1:
        accelerator.set_trigger()
    report["trigger"] = (accelerator.check_trigger(), accelerator.check_trigger())

    with accelerator.local_main_process_first():
        report["local_first"] = True
    with accelerator.split_between_processes(["A", "B", "C"], apply_padding=True) as prompts:
        report["split_prompts"] = prompts
    report["padded"] = accelerator.gather(accelerator.pad_across_processes(torch.arange(rank + 1) + 1)).tolist()
    report["on_main"] = accelerator.on_main_process(lambda: "ran")()

    # LocalSGD: own gradients, parameters averaged every 2 steps
    set_seed(7)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    inputs = torch.full((4, 3), float(rank + 1))
    weights = []
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=2) as local_sgd:
        for _ in range(4):
            accelerator.backward(model(inputs).pow(2).mean())
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()
            weights.append(accelerator.unwrap_model(model).weight.detach().clone())
    report["local_sgd"] = weights

    split = Accelerator(mixed_precision="no", dataloader_config=DataLoaderConfiguration(split_batches=True))
    report["split"] = batches(split, 12, 4)
    report["split_lr"] = lr_after(split, 3)
    uneven = Accelerator(mixed_precision="no", dataloader_config=DataLoaderConfiguration(even_batches=False))
    report["uneven"] = batches(uneven, 10, 4)
    every_call = Accelerator(mixed_precision="no", step_scheduler_with_optimizer=False, gradient_accumulation_steps=2)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model, optimizer, scheduler = every_call.prepare(model, optimizer, linear_schedule(optimizer))
    for _ in range(3):
        with every_call.accumulate(model):
            every_call.backward(model(torch.ones(1, 2)).sum())
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    report["every_call_lr"] = scheduler.get_last_lr()[0]

    # DistributedDataParallelKwargs: DDP's arguments and an fp16-compressing communication hook
    handler = DistributedDataParallelKwargs(find_unused_parameters=True, comm_hook=DDPCommunicationHookType.FP16)
    hooked = Accelerator(mixed_precision="no", kwargs_handlers=[handler])
    model = hooked.prepare(torch.nn.Linear(1, 1, bias=False))
    hooked.backward(model(torch.tensor([[1 / 3 + rank]])).sum())
    report["ddp"] = {"find_unused_parameters": model.find_unused_parameters,
                     "grad": hooked.unwrap_model(model).weight.grad.clone()}  # fmt: skip
    wrapped = DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.POWER_SGD,
                                            comm_wrapper=DDPCommunicationHookType.FP16)  # fmt: skip
    powersgd = Accelerator(mixed_precision="no", kwargs_handlers=[wrapped])
    model = powersgd.prepare(torch.nn.Linear(1, 1, bias=False))
    powersgd.backward(model(torch.tensor([[1 / 3 + rank]])).sum())
    report["powersgd_grad"] = powersgd.unwrap_model(model).weight.grad.clone()
    uninterrupted = resumable(Accelerator(mixed_precision="no", gradient_accumulation_steps=2), out / "state", save_at=5)
    resumed = resumable(Accelerator(mixed_precision="no", gradient_accumulation_steps=2), out / "state", resume=True)
    report["resume"] = {"uninterrupted": uninterrupted, "resumed": resumed}
    accelerator.end_training()
    torch.save(report, out / f"rank{rank}.pt")


if __name__ == "__main__":
    main()

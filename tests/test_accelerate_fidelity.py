"""Accelerate's own examples re-run on ``trainer.accelerate`` (only the imports changed): the behaviours they
showed, as loops an Accelerate user writes. Two gloo processes where the behaviour needs them."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from launching import finish, start
from test_ddp_processes import clean_env

ROOT = Path(__file__).resolve().parents[1]
RESUME_JOB = ROOT / "tests" / "scripts" / "accelerate_resume_job.py"
TIMEOUT_S = 240


def _run_job(job: Path, out: Path, processes: int) -> list[dict]:
    command = [sys.executable, "-m", "trainer", "run", "--devices", str(processes), str(job), str(out)]
    finish(start(command, clean_env(), out), TIMEOUT_S)
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(processes)]


@pytest.mark.timeout(2 * TIMEOUT_S)
@pytest.mark.parametrize("processes", [1, 2])
def test_a_save_at_an_epochs_end_resumes_with_the_next_epoch_exactly(tmp_path, processes):
    """checkpointing.py saves every N steps; when N divides the epoch the save falls on the epoch's last batch,
    and the resumed script's next pass must be the next epoch (not the rest of the finished one, which is empty).
    complete_nlp_example.py saves after the epoch's loop; in several processes the shuffled sampler's shared
    generator must continue from where the finished epochs left it. Either way the resumed run reads the
    uninterrupted run's batches and ends with its weights."""
    for rank, report in enumerate(_run_job(RESUME_JOB, tmp_path, processes)):
        for where, runs in report.items():
            uninterrupted, resumed = runs["uninterrupted"], runs["resumed"]
            per_epoch = uninterrupted["batches_per_epoch"]
            assert per_epoch == 6 // processes
            assert resumed["seen"] == uninterrupted["seen"][per_epoch:], f"rank {rank}, saved at {where}"
            assert torch.equal(resumed["weight"], uninterrupted["weight"]), f"rank {rank}, saved at {where}"


def test_fp16_on_cpu_trains_in_float16_where_accelerate_silently_uses_float32():
    """Accelerate 1.x turns ``mixed_precision="fp16"`` on a CPU into plain float32 (no autocast, no scaler) while
    ``accelerator.mixed_precision`` still says "fp16"; here the forward runs under CPU float16 autocast with a
    gradient scaler, as asked (docs/migrating_from_accelerate.md says how to get Accelerate's float32)."""
    from trainer.accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="fp16", cpu=True)
    assert accelerator.mixed_precision == "fp16"
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    inner = []
    model[0].register_forward_hook(lambda module, args, output: inner.append(output.dtype))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    loss = model(torch.randn(8, 4)).pow(2).mean()
    assert inner == [torch.float16] and loss.dtype == torch.float32  # autocast inside, float32 outputs
    accelerator.backward(loss)
    optimizer.step()
    assert all(p.dtype == torch.float32 for p in model.parameters())

"""The memory planner: optimizer state per optimizer kind and precision equals what torch allocates, the report
recommends the cheapest strategy that fits, and the command line plans a model too big to build for real (it is
built on the meta device). Per-rank exactness for ddp/zero1/zero2/fsdp is checked in test_sharded.py, for
model_parallel in test_model_parallel.py."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from trainer.strategies import ConfigurationError
from trainer.memory.planner import estimate, report

ROOT = Path(__file__).resolve().parents[1]


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def real_bytes(module: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[int, int, int]:
    """One real step; then the bytes of parameters, gradients and optimizer state."""
    module(torch.randn(2, 16, dtype=next(module.parameters()).dtype)).sum().backward()
    optimizer.step()
    nbytes = lambda t: t.numel() * t.element_size()  # noqa: E731
    state = sum(nbytes(v) for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    return (sum(nbytes(p) for p in module.parameters()), sum(nbytes(p.grad) for p in module.parameters()), state)


@pytest.mark.parametrize(
    "make, precision",
    [
        (lambda p: torch.optim.Adam(p), "32-true"),
        (lambda p: torch.optim.AdamW(p, amsgrad=True), "32-true"),
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), "32-true"),
        (lambda p: torch.optim.SGD(p, lr=0.1), "32-true"),
        (lambda p: torch.optim.Adam(p), "bf16-true"),
        (lambda p: torch.optim.Adam(p), "bf16-mixed"),
    ],
    ids=["adam", "adamw-amsgrad", "sgd-momentum", "sgd", "adam-bf16-true", "adam-bf16-mixed"],
)
def test_single_device_bytes_equal_what_torch_allocates(make, precision):
    module = mlp()
    if precision == "bf16-true":
        module = module.to(torch.bfloat16)
    optimizer = make(module.parameters())
    plan = estimate(mlp(), strategy="ddp", world_size=1, precision=precision, optimizer=optimizer)
    device = plan.devices[0]
    assert (device.parameters, device.gradients, device.optimizer_state) == real_bytes(module, optimizer)


def test_adam_keeps_two_states_and_sgd_momentum_one():
    params = sum(p.numel() for p in mlp().parameters()) * 4
    assert estimate(mlp(), optimizer="adam").devices[0].optimizer_state == 2 * params + 4 * 4  # + 4 step scalars
    assert estimate(mlp(), optimizer="sgd_momentum").devices[0].optimizer_state == params


def test_report_recommends_the_least_communication_that_fits():
    model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(8)])  # 33 KiB of float32 weights
    # Per device on 4 ranks with Adam: ddp 165 KiB, zero1 149 (its gather bucket holds the whole toy model),
    # zero2 66, fsdp (one layer per unit) 41.
    kwargs = dict(auto_wrap_policy={nn.Linear})
    assert "strategy='ddp'" in report(model, 4, device_memory="1MB", **kwargs)
    assert "strategy='zero1'" in report(model, 4, device_memory="180kB", **kwargs)
    assert "strategy='zero2'" in report(model, 4, device_memory="100kB", **kwargs)
    assert "strategy='fsdp'" in report(model, 4, device_memory="50kB", **kwargs)
    text = report(model, 4, device_memory="30kB", **kwargs)
    assert "Nothing fits" in text and "FSDP on about 8 devices" in text and "cpu_offload=True" in text
    assert estimate(model, "fsdp", 8, **kwargs).fits("30kB") and not estimate(model, "fsdp", 7, **kwargs).fits("30kB")
    table = text.splitlines()
    assert [line.split()[0] for line in table[3:8]] == ["ddp", "zero1", "zero2", "fsdp", "model_parallel"]


def test_misuse_is_named():
    with pytest.raises(ConfigurationError, match="optimizer='lion'"):
        estimate(mlp(), optimizer="lion")
    with pytest.raises(ConfigurationError, match="strategy='dp'"):
        estimate(mlp(), strategy="dp")
    with pytest.raises(ConfigurationError, match="world_size=0"):
        estimate(mlp(), world_size=0)


def test_command_plans_a_model_too_big_to_build(tmp_path):
    source = tmp_path / "big.py"
    source.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class Big(nn.Module):  # 8 layers of 16384 x 16384: 8.6 GB of float32 weights
            def __init__(self):
                super().__init__()
                self.layers = nn.Sequential(*[nn.Linear(16384, 16384) for _ in range(8)])
                self.example_input_array = torch.zeros(4, 16384)

            def forward(self, x):
                return self.layers(x)
    """))
    proc = subprocess.run([sys.executable, "-m", "trainer", "estimate-memory", f"{source}:Big", "--world-size", "8",
                           "--precision", "bf16-mixed", "--device-memory", "80GB", "--wrap", "Linear"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "world size 8, precision bf16-mixed, optimizer adam" in lines[0]
    ddp = next(line for line in lines if line.startswith("ddp"))
    assert "8.00 GiB" in ddp  # parameters: 2.1e9 x 4 bytes (float32 master weights)
    fsdp = next(line for line in lines if line.startswith("fsdp")).split()
    assert fsdp[7:9] == ["1.00", "GiB"]  # gathered: two Linear units (one computing, one prefetched) in bf16
    # The recommendation's figures are the fake-rank plan's (one planner): the first row that fits, planned.
    assert any(line.startswith("Use ddp: its plan on fake ranks peaks at") for line in lines), proc.stdout[-3000:]
    assert any(line.startswith("Plan of ") and "nd_parallel [dp_replicate=8]" in line for line in lines)
    bad = subprocess.run([sys.executable, "-m", "trainer", "estimate-memory", f"{source}:Missing"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "'Missing' is not an nn.Module class" in bad.stderr


def test_command_recommends_the_first_row_that_fits_with_its_fake_rank_plan(tmp_path, capsys):
    """One planner: the arithmetic table is the first pass; the recommendation's figures are ``trainer plan``'s."""
    from trainer.cli import main

    source = tmp_path / "stack.py"
    source.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        def make():
            model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(8)])
            model.example_input_array = torch.zeros(2, 32)
            return model
    """))
    args = ["estimate-memory", f"{source}:make", "--world-size", "4", "--wrap", "Linear", "--device-memory"]
    assert main([*args, "100kB"]) == 0
    out = capsys.readouterr().out
    assert "Use zero2: its plan on fake ranks peaks at" in out and "zero2 [dp_shard=4]" in out, out
    assert main([*args, "30kB"]) == 0
    out = capsys.readouterr().out
    assert "was accepted by the fake-rank plan" in out and "FSDP on about 9 devices would fit" in out, out
    assert main([*args, "30kB", "--seq-len", "16"]) == 2
    assert "--seq-len is a flag of trainer plan" in capsys.readouterr().err

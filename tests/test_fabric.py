"""``trainer.fabric.Fabric``: Lightning Fabric's API over the Engine core. A Fabric-style script (after the rename
``lightning.fabric`` → ``trainer.fabric``) trains as the same loop written in plain torch does, in one process
and in two (ddp, fsdp; gloo on the CPU), and its misuse gets Fabric's key phrases."""
from __future__ import annotations

import concurrent.futures
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from launching import finish, start
from test_ddp_processes import clean_env

JOB = Path(__file__).resolve().parent / "scripts" / "fabric_job.py"
TIMEOUT_S = 150
RUNS = {"single": ("auto", 1), "ddp": ("ddp", 2), "fsdp": ("fsdp", 2)}

pytestmark = pytest.mark.timeout(3 * TIMEOUT_S)


def _run(folder: Path, strategy: str, devices: int, *extra: str) -> str:
    command = [sys.executable, str(JOB), str(folder), strategy, str(devices), *extra]
    return finish(start(command, clean_env(), folder), TIMEOUT_S)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[str, tuple[Path, object]]:
    """Each run's folder and output (or the AssertionError it failed with), two runs at a time."""
    results: dict[str, tuple[Path, object]] = {}

    def launch(name: str) -> None:
        folder = tmp_path_factory.mktemp(f"fabric_{name}")
        try:
            results[name] = (folder, _run(folder, *RUNS[name]))
        except AssertionError as failure:
            results[name] = (folder, failure)

    tmp_path_factory.getbasetemp()  # made once here: two threads making it at once race in pytest
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(launch, RUNS))
    return results


def reports(jobs: dict, name: str) -> list[dict]:
    folder, output = jobs[name]
    if isinstance(output, AssertionError):
        raise output
    devices = RUNS[name][1]
    return [torch.load(folder / f"rank{rank}.pt", weights_only=False) for rank in range(devices)]


@pytest.mark.parametrize("name", list(RUNS))
def test_a_fabric_script_gives_the_losses_of_the_same_loop_in_plain_torch(jobs, name):
    """setup/setup_module+setup_optimizers, setup_dataloaders (shuffled), accumulation under no_backward_sync
    with a partial last window, backward, clip_gradients: the same losses, norms and weights as plain torch on
    the global batch (bit for bit in one process; summation order only across two)."""
    exact = name == "single"
    for report in reports(jobs, name):
        reference = report["reference"]
        assert len(report["losses"]) == len(reference["losses"]) and report["step"] == len(reference["norms"])
        if exact:
            assert report["losses"] == reference["losses"] and report["norms"] == reference["norms"]
        else:
            torch.testing.assert_close(report["losses"], reference["losses"], rtol=0, atol=1e-5)
            torch.testing.assert_close(report["norms"], reference["norms"], rtol=0, atol=1e-5)
        for ours, theirs in zip(report["weights"], reference["weights"].values()):
            torch.testing.assert_close(ours, theirs, rtol=0, atol=0 if exact else 1e-6)


@pytest.mark.parametrize("name", list(RUNS))
def test_save_and_load_of_a_state_dict_restore_modules_optimizers_and_values(jobs, name):
    for report in reports(jobs, name):
        assert report["saved_keys"] == ["model", "optimizer", "step"]
        assert report["same_after_load"] and report["same_momentum"]
        assert report["loaded_step"] == report["step"] and report["remainder"] == []
        assert report["reaches_module"]  # attributes, indexing and state-dict keys are the user's module's
        assert report["saved_as_folder"] == (name == "fsdp")  # FSDP: a sharded folder, each rank its shards


def test_collectives_callbacks_loggers_and_print_on_two_ranks(jobs):
    rank0, rank1 = reports(jobs, "ddp")
    assert rank0["gathered"] == rank1["gathered"] == [[0], [1]]
    assert (rank0["is_global_zero"], rank1["is_global_zero"]) == (True, False)
    assert rank0["epochs"] == rank1["epochs"] == [0, 1]
    folder, output = jobs["ddp"]
    assert output.count("printed by rank") == 1
    [metrics] = (folder / "logs").rglob("metrics.csv")
    assert len(metrics.read_text().splitlines()) == 1 + rank0["step"]  # rank 0 only, one row per step


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                    reason="lightning is not installed: the comparison with Lightning's own Fabric needs it")
def test_the_same_script_on_lightning_fabric_gives_the_same_losses(jobs, tmp_path):
    _run(tmp_path, "auto", 1, "lightning")
    theirs = torch.load(tmp_path / "rank0.pt", weights_only=False)
    ours = reports(jobs, "single")[0]
    assert ours["losses"] == theirs["losses"] and ours["norms"] == theirs["norms"]


# ------------------------------------------------------------------ one process, in this one
@pytest.fixture
def fabric():
    from trainer.fabric import Fabric

    return Fabric(accelerator="cpu", devices=1)


def test_save_takes_the_path_first_as_fabric_does(fabric, tmp_path):
    model = fabric.setup(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="Fabric's order is save"):
        fabric.save({"model": model}, tmp_path / "x.ckpt")
    fabric.save(tmp_path / "x.ckpt", {"model": model, "note": "kept"})
    assert fabric.load(tmp_path / "x.ckpt")["note"] == "kept"
    with pytest.raises(KeyError, match="does not exist in the loaded checkpoint"):
        fabric.load(tmp_path / "x.ckpt", {"model": model, "missing": 0})
    state = {"model": model, "missing": 0}
    assert fabric.load(tmp_path / "x.ckpt", state, strict=False) == {"note": "kept"} and state["missing"] == 0


def test_setup_returns_what_fabric_returns_and_refuses_a_second_setup(fabric):
    net = nn.Linear(2, 2)
    model, optimizer = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    assert isinstance(optimizer, torch.optim.Optimizer) and model.weight.device == fabric.device
    with pytest.raises(ValueError, match="A model should be passed only once"):
        fabric.setup(model)
    with pytest.raises(ValueError, match="requires at least one dataloader"):
        fabric.setup_dataloaders()
    loader = torch.utils.data.DataLoader(range(4), batch_size=2)
    a, b = fabric.setup_dataloaders(loader, loader)
    assert [batch.tolist() for batch in a] == [[0, 1], [2, 3]]


def test_clip_gradients_and_no_backward_sync_misuse_get_fabric_key_phrases(fabric):
    model = nn.Linear(2, 1)
    with pytest.raises(ValueError, match="You need to set up the model first"):
        fabric.no_backward_sync(model)
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    fabric.backward(model(torch.ones(1, 2)).sum())
    with pytest.raises(ValueError, match="Only one of `clip_val` or `max_norm` can be set"):
        fabric.clip_gradients(model, optimizer, clip_val=1.0, max_norm=1.0)
    with pytest.raises(ValueError, match="You have to specify either `clip_val` or `max_norm`"):
        fabric.clip_gradients(model, optimizer)
    norm = fabric.clip_gradients(model, optimizer, max_norm=1e-3)
    assert float(norm) > 1e-3 and float(torch.cat([p.grad.flatten() for p in model.parameters()]).norm()) <= 1e-3 + 1e-6


def test_collectives_and_members_in_one_process(fabric, capsys):
    assert fabric.all_gather(3).item() == 3 and fabric.all_reduce({"a": 2.0})["a"].item() == 2.0
    assert fabric.broadcast({"x": 1}) == {"x": 1}
    assert (fabric.world_size, fabric.global_rank, fabric.local_rank, fabric.node_rank) == (1, 0, 0, 0)
    assert fabric.is_global_zero and fabric.logger is None and fabric.loggers == []
    with fabric.rank_zero_first(), fabric.autocast():
        fabric.print("hello")
    assert capsys.readouterr().out == "hello\n"
    with fabric.init_module():
        layer = nn.Linear(2, 2)
    assert layer.weight.device == fabric.device
    assert fabric.seed_everything(3) == 3
    with pytest.raises(ValueError, match="not a logger"):
        type(fabric)(accelerator="cpu", devices=1, loggers="csv")


def test_two_models_and_optimizers_as_in_fabrics_dcgan_example(fabric, tmp_path):
    """Two set-up models, each with its optimizer, trained in turn; both saved and restored in one state dict."""
    torch.manual_seed(0)
    generator, discriminator = nn.Linear(4, 8), nn.Linear(8, 1)
    generator, g_optimizer = fabric.setup(generator, torch.optim.Adam(generator.parameters(), lr=1e-2))
    discriminator, d_optimizer = fabric.setup(discriminator, torch.optim.Adam(discriminator.parameters(), lr=1e-2))
    for _ in range(3):
        fake = generator(torch.randn(5, 4))
        fabric.backward(discriminator(fake.detach()).mean())
        d_optimizer.step()
        d_optimizer.zero_grad()
        fabric.backward(-discriminator(fake).mean())
        g_optimizer.step()
        g_optimizer.zero_grad()
    state = {"generator": generator, "discriminator": discriminator, "g_opt": g_optimizer, "d_opt": d_optimizer}
    fabric.save(tmp_path / "gan.ckpt", state)
    fresh_g, fresh_d = nn.Linear(4, 8), nn.Linear(8, 1)
    fresh_g, fresh_g_opt = fabric.setup(fresh_g, torch.optim.Adam(fresh_g.parameters(), lr=1e-2))
    fresh_d, fresh_d_opt = fabric.setup(fresh_d, torch.optim.Adam(fresh_d.parameters(), lr=1e-2))
    fabric.load(tmp_path / "gan.ckpt", {"generator": fresh_g, "discriminator": fresh_d, "g_opt": fresh_g_opt,
                                        "d_opt": fresh_d_opt})  # fmt: skip
    assert torch.equal(fresh_g.weight, generator.weight) and torch.equal(fresh_d.weight, discriminator.weight)
    assert fresh_g_opt.state_dict()["state"][0]["step"] == 3

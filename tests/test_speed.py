"""Speed features: ``compile=``, activation checkpointing, FLOPs/MFU, the profilers, and the CUDA batch copy.

Compiled runs use the ``aot_eager`` backend (Dynamo and AOTAutograd, no code generation) where what is tested is
the graph capture (weights, recompiles, key names, DDPOptimizer splits); one test runs the real inductor. The
2-rank job (tests/scripts/speed_train.py: DDP and FSDP2 over gloo) runs once for the module.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer.callbacks import Callback, ModelCheckpoint, ThroughputMonitor
from trainer.callbacks.flops import PEAK_FLOPS, peak_flops
from helpers import Regressor, loader, quiet_trainer
from trainer.strategies import ConfigurationError
from trainer.strategies.speed.activation_checkpointing import SavedTensorBytes, apply_activation_checkpointing
from test_ddp_processes import Job, clean_env
from trainer import Engine, TrainModule
from trainer.profiler.profilers import PyTorchProfiler, SimpleProfiler

ROOT = Path(__file__).resolve().parents[1]
AOT = {"backend": "aot_eager"}


def graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@pytest.fixture
def fresh_dynamo():
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class GraphsAfterValidation(Callback):
    def __init__(self) -> None:
        self.counts: list[int] = []

    def on_validation_end(self, trainer, module):
        if not trainer.sanity_checking:
            self.counts.append(graphs())


def fit_regressor(tmp_path, epochs=3, n_train=60, **options):
    """Regressor on 60 samples in batches of 8 (a short last batch of 4), validated every epoch on 20 samples."""
    torch.manual_seed(0)
    module = Regressor()
    trainer = quiet_trainer(default_root_dir=tmp_path, max_epochs=epochs, **options)
    trainer.fit(module, loader(n=n_train), loader(n=20, seed=1))
    return trainer, module


def assert_weights_close(a: nn.Module, b: nn.Module, atol: float) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(x, y, rtol=0, atol=atol, msg=name)


# ---------------------------------------------------------------------------------------------- compile
def test_compiled_fit_trains_like_eager_and_stops_compiling_after_the_second_validation(tmp_path, fresh_dynamo):
    _, eager = fit_regressor(tmp_path / "eager")
    before = graphs()
    counts = GraphsAfterValidation()
    _, compiled = fit_regressor(tmp_path / "compiled", epochs=4, compile=AOT, callbacks=[counts])
    assert graphs() > before  # it really was compiled
    # Training (full and short last batch) and evaluation graphs exist after the first epoch; none later.
    assert counts.counts[1] == counts.counts[-1] == graphs(), counts.counts
    _, compiled_3 = fit_regressor(tmp_path / "compiled3", compile=AOT)
    assert_weights_close(compiled_3, eager, atol=1e-6)  # aot_eager runs the same kernels: equal to 1e-6


def test_inductor_compiled_checkpoint_has_plain_keys_and_loads_both_ways(tmp_path, fresh_dynamo):
    # The real inductor (C++ code generated and built): the only test that pays for it.
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    trainer, compiled = fit_regressor(tmp_path, epochs=1, n_train=64, compile=True, callbacks=[checkpoint],
                                      enable_checkpointing=True)  # fmt: skip
    _, eager = fit_regressor(tmp_path / "eager", epochs=1, n_train=64)
    assert_weights_close(compiled, eager, atol=1e-5)  # inductor fuses and reorders float ops: 1e-5
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)["state_dict"]
    assert list(saved) == list(Regressor().state_dict()) == ["net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"]
    plain = Regressor()
    plain.load_state_dict(saved)  # compiled -> eager
    assert_weights_close(plain, compiled, atol=0)
    # eager -> compiled: an eager fit's checkpoint resumes in a compiled fit, which trains on like an eager one.
    eager_ckpt = tmp_path / "eager.ckpt"
    trainer_e = quiet_trainer(default_root_dir=tmp_path / "e2", max_epochs=1)
    torch.manual_seed(0)
    module_e = Regressor()
    trainer_e.fit(module_e, loader(n=64))
    trainer_e.save_checkpoint(eager_ckpt)
    resumed = Regressor()
    quiet_trainer(default_root_dir=tmp_path / "r", max_epochs=2, compile=AOT).fit(resumed, loader(n=64), ckpt_path=eager_ckpt)
    continued = Regressor()
    continued.load_state_dict(module_e.state_dict())
    quiet_trainer(default_root_dir=tmp_path / "c", max_epochs=2).fit(continued, loader(n=64), ckpt_path=eager_ckpt)
    assert_weights_close(resumed, continued, atol=1e-6)


def test_engine_prepare_compiles_under_mixed_precision_like_eager(fresh_dynamo):
    def run(compile_options):
        torch.manual_seed(0)
        engine = Engine(accelerator="cpu", devices=1, precision="bf16-mixed")
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        wrapper = Wrapper(model)
        prepared, optimizer = engine.prepare(wrapper, torch.optim.SGD(wrapper.parameters(), lr=0.1), compile=compile_options)
        assert prepared is wrapper  # compiled in place
        for x, y in loader(n=32):
            engine.backward(nn.functional.mse_loss(prepared(x), y))
            optimizer.step()
            optimizer.zero_grad()
        return wrapper

    before = graphs()
    compiled = run(AOT)
    assert graphs() > before
    assert_weights_close(compiled, run(None), atol=1e-6)  # autocast hooks stay eager around the compiled forward


class Wrapper(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x)


def test_compile_and_checkpointing_arguments_are_checked():
    with pytest.raises(ConfigurationError, match="compile='yes' is not understood"):
        quiet_trainer(compile="yes")
    with pytest.raises(ConfigurationError, match="not a torch.compile mode"):
        quiet_trainer(compile={"mode": "fastest"})
    with pytest.raises(ConfigurationError, match="unknown option"):
        quiet_trainer(compile={"fullgrph": True})
    with pytest.raises(ConfigurationError, match="not a torch.compile backend"):
        quiet_trainer(compile={"backend": "nonesuch"})
    with pytest.raises(ConfigurationError, match="activation_checkpointing=3"):
        quiet_trainer(activation_checkpointing=3)

    class NoForward(TrainModule):  # no forward and no submodule with one (see test_compile_any_module.py)
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(4, 1))

        def training_step(self, batch, batch_idx):
            return (batch[0] @ self.w).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    with pytest.raises(ConfigurationError, match="NoForward defines no forward and has no submodule with one"):
        quiet_trainer(compile=AOT, max_steps=1).fit(NoForward(), loader())
    with pytest.raises(ConfigurationError, match=r"matched no submodule of Regressor\. Its submodule classes are: "
                                                 r"\['Linear', 'Sequential', 'Tanh'\]"):  # fmt: skip
        quiet_trainer(activation_checkpointing=["Block"], max_steps=1).fit(Regressor(), loader())


# ---------------------------------------------------------------------------------------------- activation checkpointing
class Block(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return x + self.drop(self.down(torch.relu(self.up(x))))


class Blocks(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block() for _ in range(4)))
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        return self.head(self.blocks(x))

    def training_step(self, batch, batch_idx):
        return nn.functional.mse_loss(self(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def test_activation_checkpointing_saves_over_2x_fewer_bytes_and_trains_to_the_same_weights(tmp_path):
    x = torch.randn(16, 32)
    torch.manual_seed(0)
    model = Blocks()
    with SavedTensorBytes() as plain:
        model(x).sum()
    blocks = apply_activation_checkpointing(model, ["Block"])
    assert blocks == list(model.blocks)
    with SavedTensorBytes() as checkpointed:
        model(x).sum().backward()
    assert plain.bytes >= 2 * checkpointed.bytes > 0, (plain.bytes, checkpointed.bytes)
    assert list(model.state_dict()) == list(Blocks().state_dict())  # structure and names unchanged

    data = DataLoader(TensorDataset(torch.randn(48, 32), torch.randn(48, 1)), batch_size=8)
    results = []
    for option in (None, ["Block"]):
        torch.manual_seed(0)
        module = Blocks()  # dropout on: the recompute must draw the same masks
        quiet_trainer(default_root_dir=tmp_path, max_epochs=2, activation_checkpointing=option).fit(module, data)
        results.append(module)
    assert_weights_close(results[0], results[1], atol=1e-6)


# ---------------------------------------------------------------------------------------------- FLOPs and MFU
class LinearStack(TrainModule):
    """Linear layers only (no bias): its training FLOPs are 6 x parameters x samples, less the input gradient of
    the first layer, which nothing needs (2 x 8 x 512 per sample: 0.4% of the total)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 512, bias=False), nn.Linear(512, 512, bias=False),
                                 nn.Linear(512, 512, bias=False), nn.Linear(512, 1, bias=False))  # fmt: skip

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        return nn.functional.mse_loss(self(batch[0]), batch[1])

    def tokens_in_batch(self, batch):
        return batch[0].shape[0] * 5  # say each sample holds five tokens

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


@pytest.mark.parametrize("compile_options", [None, AOT], ids=["eager", "compiled"])
def test_flops_of_a_linear_stack_equal_6_n_tokens_and_mfu_uses_the_given_peak(tmp_path, compile_options, fresh_dynamo):
    monitor = ThroughputMonitor(peak_flops=1e12)
    module = LinearStack()
    data = DataLoader(TensorDataset(torch.randn(40, 8), torch.randn(40, 1)), batch_size=16)  # 16, 16, 8
    trainer = quiet_trainer(default_root_dir=tmp_path, max_epochs=2, callbacks=[monitor], compile=compile_options,
                            log_every_n_steps=1, logger=True)  # fmt: skip
    trainer.fit(module, data)
    params = sum(p.numel() for p in module.parameters())
    assert monitor.flops_per_batch == pytest.approx(6 * params * 16, rel=0.01)
    totals = monitor.totals()
    assert totals["tflops_per_sec"] == pytest.approx(monitor.flops_per_sample * 80 / totals["train_time_s"] / 1e12)
    assert totals["mfu"] == pytest.approx(totals["tflops_per_sec"] / 1.0)
    assert totals["tokens_per_sec"] == pytest.approx(5 * 80 / totals["train_time_s"])
    assert {"throughput/mfu", "throughput/tflops_per_sec", "throughput/tokens_per_sec"} <= set(trainer.logged_metrics)
    if compile_options is not None:
        assert graphs() > 0  # the counted first batch ran eagerly; compilation still happened after it


def test_mfu_peaks_cover_a100_h100_h200_and_need_peak_flops_on_the_cpu(tmp_path):
    assert peak_flops("NVIDIA A100-SXM4-80GB", "bf16-mixed") == (312e12, "A100 bf16")
    assert peak_flops("NVIDIA H100 80GB HBM3", "16-mixed") == (989.4e12, "H100 SXM fp16")
    assert peak_flops("NVIDIA H100 PCIe", "bf16-true")[0] == 756e12
    assert peak_flops("NVIDIA H200", "bf16-mixed")[0] == 989.4e12
    assert peak_flops("NVIDIA H100 80GB HBM3", "64-true")[0] == 67e12
    assert peak_flops("Radeon 9000", "bf16-mixed") is None
    assert {"A100", "H100 SXM", "H200 SXM"} <= {name for _, name, _ in PEAK_FLOPS}
    monitor = ThroughputMonitor()
    quiet_trainer(default_root_dir=tmp_path, max_epochs=1, callbacks=[monitor]).fit(Regressor(), loader())
    totals = monitor.totals()
    assert "tflops_per_sec" in totals and "mfu" not in totals and monitor.peak is None
    with pytest.raises(ConfigurationError, match="peak_flops=-1"):
        ThroughputMonitor(peak_flops=-1)


# ---------------------------------------------------------------------------------------------- profilers
class Wide(TrainModule):
    """Steps of a few milliseconds, so the loop's own code is a small part of each."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self(batch[0]), batch[1])
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class TrainWallTime(Callback):
    def on_train_start(self, trainer, module):
        self.start = time.perf_counter()

    def on_train_end(self, trainer, module):
        self.seconds = time.perf_counter() - self.start


def wide_data(n: int = 30 * 64) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(n, 64), torch.randn(n, 1)), batch_size=64)


def test_simple_profiler_phases_add_up_to_the_measured_training_time(tmp_path, capsys):
    wall = TrainWallTime()
    profiler = SimpleProfiler()
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=10, save_top_k=-1)
    trainer = quiet_trainer(default_root_dir=tmp_path, max_epochs=1, profiler=profiler, log_every_n_steps=5,
                            callbacks=[wall, checkpoint], enable_checkpointing=True, logger=True)  # fmt: skip
    trainer.fit(Wide(), wide_data())
    results = profiler.results
    for phase in ("data wait (next batch)", "training_step (forward)", "backward", "optimizer step", "logging",
                  "checkpointing", "ModelCheckpoint.on_train_batch_end"):  # fmt: skip
        assert phase in results, sorted(results)
    assert results["training_step (forward)"][0] == results["backward"][0] == 30
    assert results["checkpointing"][0] == 3
    outside_training = (".setup", ".teardown", ".on_fit_start", ".on_fit_end", ".on_train_start", ".on_train_end")
    phases = sum(total for name, (_, total) in results.items()
                 if "(own code)" not in name and not name.endswith(outside_training))  # fmt: skip
    assert 0.9 * wall.seconds <= phases <= 1.1 * wall.seconds, (phases, wall.seconds, results)
    printed = capsys.readouterr().out
    assert "Profile of fit" in printed and "training_step (forward)" in printed and "percent" in printed
    # Detached after the stage: the loop runs its plain calls again.
    assert not {"training_step", "backward", "optimizer_step", "batch_to_device"} & set(vars(trainer.strategy))
    assert "_run_validation_in_fit" not in vars(trainer) and not trainer.train_iterator_wrappers


def test_pytorch_profiler_writes_a_trace_that_parses_back(tmp_path):
    profiler = PyTorchProfiler(wait=1, warmup=1, active=2)
    trainer = quiet_trainer(default_root_dir=tmp_path, max_epochs=1, profiler=profiler)
    trainer.fit(Wide(), wide_data(8 * 64))
    [trace] = profiler.trace_files
    assert trace.parent == tmp_path / "profiler" and trace.name.startswith("rank0.")
    events = json.loads(trace.read_text())["traceEvents"]
    names = {event.get("name") for event in events}
    assert {"training_step (forward)", "backward", "optimizer step", "aten::addmm"} <= names
    steps = {event["name"] for event in events if str(event.get("name", "")).startswith("ProfilerStep#")}
    assert len(steps) == 2  # the active part of the schedule


def test_profiler_argument_is_checked():
    with pytest.raises(ConfigurationError, match="profiler='fancy' is not understood"):
        quiet_trainer(profiler="fancy")
    with pytest.raises(ConfigurationError, match="active=0"):
        PyTorchProfiler(active=0)
    assert isinstance(quiet_trainer(profiler="simple").profiler, SimpleProfiler)
    assert quiet_trainer().profiler is None


# ---------------------------------------------------------------------------------------------- DDP and FSDP2
@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("speed_job")
    script = ROOT / "tests" / "scripts" / "speed_train.py"
    reports = Job(out, [([sys.executable, str(script), "--out", str(out)], clean_env())]).run().check_ok()
    assert [len(reports)] == [2]
    return reports


def assert_same(a: dict, b: dict, atol: float = 1e-6) -> None:
    assert list(a) == list(b)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=atol, msg=name)


@pytest.mark.timeout(400)
def test_ddp_compiled_trains_like_eager_with_bucket_split_graphs_and_no_late_recompiles(ranks):
    for rank in ranks:
        assert_same(rank["ddp_compiled"], rank["ddp"])
        assert rank["ddp_compiled_keys"] == list(rank["ddp"])
        after = rank["ddp_graphs_after_validation"]
        assert len(after) == 3 and after[1] == after[2] == rank["ddp_graphs_at_end"]
        # The DDPOptimizer compiled more subgraphs than Dynamo captured graphs: it split them at the buckets.
        assert rank["ddp_subgraphs"] > rank["ddp_graphs_at_end"]


@pytest.mark.timeout(400)
def test_activation_checkpointing_under_ddp_and_fsdp2_with_compiled_blocks_trains_like_eager(ranks):
    for rank in ranks:
        assert_same(rank["ddp_checkpointed"], rank["ddp"])
        assert_same(rank["fsdp"], rank["ddp"])
        assert_same(rank["fsdp_checkpointed_compiled"], rank["fsdp"])
        assert rank["fsdp_compiled_blocks"] == ["net.0", "net.1", "net.2", "net.3"]
        assert rank["fsdp_compiled_frames"] > 0
        # Per sample: 2 FLOPs per weight forward, 4 backward, less the first layer's input gradient (the data
        # needs none). Checkpointing recomputes each block's `up` layer: the recompute stops once it has what
        # backward needs (the tanh output is `down`'s input). Batches of 4 on each rank.
        blocks, head = 4 * 2 * 128 * 512, 128
        plain = 4 * (6 * (blocks + head) - 2 * 128 * 512)
        assert rank["fsdp_flops"] == pytest.approx(plain, rel=0.01)
        assert rank["ddp_checkpointed_flops"] == pytest.approx(plain + 4 * 2 * (blocks // 2), rel=0.01)


@pytest.mark.timeout(400)
def test_pytorch_profiler_writes_one_trace_per_rank(ranks):
    files = [Path(path) for rank in ranks for path in rank["trace_files"]]
    assert sorted(path.name.split(".")[0] for path in files) == ["rank0", "rank1"]
    for path in files:
        assert json.loads(path.read_text())["traceEvents"]


# ---------------------------------------------------------------------------------------------- data to the device
def test_batches_on_the_cpu_are_passed_through_untouched():
    trainer = quiet_trainer()
    batch = (torch.randn(4, 2), {"y": torch.randn(4)})
    assert trainer.strategy.batch_to_device(batch) is batch
    assert not trainer.strategy.moves_batches  # so the loops do not even call it
    trainer.strategy.batch_to_device = lambda batch: batch  # set on the instance, as the profiler's timing does
    assert trainer.strategy.moves_batches


def test_a_strategy_that_moves_batches_its_own_way_is_called_for_every_batch(tmp_path):
    from trainer.strategies import SingleDeviceStrategy

    class Scaling(SingleDeviceStrategy):
        """Doubles every input: a stand-in for a user strategy with its own transfer."""

        def batch_to_device(self, batch):
            self.moved = getattr(self, "moved", 0) + 1
            return [batch[0] * 2, batch[1]]

    seen = []

    class Recording(Regressor):
        def training_step(self, batch, batch_idx):
            seen.append(batch[0])
            return super().training_step(batch, batch_idx)

    data = DataLoader(TensorDataset(torch.ones(8, 4), torch.zeros(8, 1)), batch_size=4)
    strategy = Scaling()
    assert strategy.moves_batches
    quiet_trainer(default_root_dir=tmp_path, strategy=strategy, max_epochs=1).fit(Recording(), data)
    assert strategy.moved == 2 and all(bool((x == 2).all()) for x in seen)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the side-stream copy needs one")
def test_cuda_batches_are_copied_on_a_side_stream_and_match_the_host_data(tmp_path):
    from trainer.strategies import SingleDeviceStrategy

    strategy = SingleDeviceStrategy("cuda:0")
    strategy.setup_environment()
    host = (torch.randn(64, 128).pin_memory(), {"y": torch.arange(64).pin_memory()})
    moved = strategy.batch_to_device(host)
    main = torch.cuda.current_stream()
    assert moved[0].device.type == "cuda"
    torch.testing.assert_close(moved[0].cpu(), host[0])
    torch.testing.assert_close(moved[1]["y"].cpu(), host[1]["y"])
    assert torch.cuda.current_stream() == main  # the copy stream was only used for the copy
    trainer = quiet_trainer(default_root_dir=tmp_path, accelerator="gpu", max_epochs=1)
    data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
    trainer.fit(Regressor(), data)
    assert trainer.train_dataloader.pin_memory


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the CUDA allocator's figures need one")
def test_activation_checkpointing_halves_the_cuda_memory_a_forward_keeps():
    def kept_by_forward(checkpointed: bool) -> int:
        torch.manual_seed(0)
        model = nn.Sequential(*(Block(1024) for _ in range(4))).cuda()
        if checkpointed:
            apply_activation_checkpointing(model, ["Block"])
        x = torch.randn(256, 1024, device="cuda")
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        loss = model(x).sum()  # what the forward keeps for backward stays allocated until it runs
        kept = torch.cuda.memory_allocated() - base
        loss.backward()
        return kept

    assert kept_by_forward(False) >= 2 * kept_by_forward(True)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: inductor's GPU code and MFU need one")
def test_compiled_bf16_fit_on_cuda_reports_mfu_from_the_peak_table(tmp_path, fresh_dynamo):
    monitor = ThroughputMonitor()
    trainer = quiet_trainer(default_root_dir=tmp_path, accelerator="gpu", precision="bf16-mixed", max_epochs=1,
                            compile=True, callbacks=[monitor])  # fmt: skip
    trainer.fit(LinearStack(), DataLoader(TensorDataset(torch.randn(256, 8), torch.randn(256, 1)), batch_size=32))
    totals = monitor.totals()
    name = torch.cuda.get_device_name()
    if peak_flops(name, "bf16-mixed") is not None:
        assert 0 < totals["mfu"] < 1
    assert graphs() > 0


def test_gpt_benchmark_dry_run_on_the_cpu(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpt.py"), "--dry-run"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=240, env=clean_env())  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Trainer/hand-written" in out.stdout and "compiled/eager" in out.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the advice given on a machine without a GPU")
def test_gpu_check_stops_with_advice_where_there_is_no_gpu():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "check_gpu.py")], capture_output=True, text=True,
                         timeout=120, env=clean_env())  # fmt: skip
    assert out.returncode == 1
    assert "sees no CUDA GPU" in out.stdout and "GPU_PYTHON" in out.stdout


def test_a_train_modules_attributes_resolve_as_on_any_nn_module():
    """TrainModule looks up submodules first (one step less in every training_step); every kind of attribute
    still resolves to the same object, and a missing one raises nn.Module's AttributeError."""

    class Module(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(2, 2)
            self.scale = nn.Parameter(torch.ones(1))
            self.register_buffer("offset", torch.zeros(1))

    module = Module()
    assert module.net is module._modules["net"] and module.scale is module._parameters["scale"]
    assert module.offset is module._buffers["offset"]
    module.net = nn.Linear(2, 3)  # replaced through nn.Module.__setattr__: the new one is found
    assert module.net.out_features == 3
    with pytest.raises(AttributeError, match="'Module' object has no attribute 'missing'"):
        module.missing
    del module.net
    with pytest.raises(AttributeError, match="no attribute 'net'"):
        module.net

"""Accelerate scripts on this framework after one import change (``from trainer.accelerate import Accelerator``):
loops written as an Accelerate user writes them, asserting Accelerate 1.x's values, in one process (here) and in
two gloo processes started by ``trainer run --config`` with the file ``accelerate config`` writes
(tests/scripts/accelerate_job.py)."""
from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from launching import finish, start
from test_ddp_processes import clean_env
from trainer.accelerate import (
    Accelerator, DataLoaderConfiguration, DistributedDataParallelKwargs, DistributedType, GradScalerKwargs,
    InitProcessGroupKwargs, ProfileKwargs, ProjectConfiguration,
)
from trainer.accelerate.utils import find_executable_batch_size, gather_object, set_seed, skip_first_batches
from trainer import Engine
from trainer.strategies.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "scripts" / "accelerate_job.py"
TIMEOUT_S = 240

ACCELERATE_FILE = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: {kind}
downcast_bf16: 'no'
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_cpu_threads_per_process: 1
num_machines: 1
num_processes: {processes}
rdzv_backend: static
same_network: true
use_cpu: true
"""


def linear_schedule(optimizer: torch.optim.Optimizer, total: int = 10) -> torch.optim.lr_scheduler.LambdaLR:
    """transformers' get_linear_schedule_with_warmup(optimizer, 0, total)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, (total - step) / total))


# ------------------------------------------------------------------------------------------- two processes
@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("accelerate_job")
    (tmp / "acc.yaml").write_text(ACCELERATE_FILE.format(kind="MULTI_CPU", processes=2))
    command = [sys.executable, "-m", "trainer", "run", "--config", "acc.yaml", str(JOB), str(tmp)]
    finish(start(command, clean_env(), tmp), TIMEOUT_S)
    return [torch.load(tmp / f"rank{rank}.pt", weights_only=False) for rank in (0, 1)]


@pytest.mark.timeout(2 * TIMEOUT_S)
def test_two_processes_members_and_config_file_precedence(ranks):
    for rank, report in enumerate(ranks):
        # Accelerator() leaves the file's mixed_precision: bf16; Accelerator(mixed_precision="no") overrides it.
        assert report["file"] == {"mixed_precision": "bf16", "device": "cpu"}
        assert report["group_timeout"] == timedelta(seconds=321)  # InitProcessGroupKwargs
        assert report["members"] == {
            "mixed_precision": "no", "distributed_type": DistributedType.MULTI_CPU, "is_multi_cpu": True,
            "num_processes": 2, "process_index": rank, "use_distributed": True, "is_main_process": rank == 0,
            "is_last_process": rank == 1,
        }  # fmt: skip


@pytest.mark.timeout(2 * TIMEOUT_S)
def test_two_processes_get_whole_batches_in_turn_as_accelerate_deals_them(ranks):
    rank0, rank1 = ranks
    assert rank0["dealt"] == [[0, 1], [4, 5], [8, 9]] and rank1["dealt"] == [[2, 3], [6, 7], [10, 11]]
    # even_batches: 10 samples, batch 4: the last round is completed with the first samples
    assert rank0["even"] == [[0, 1, 2, 3], [8, 9, 0, 1]] and rank1["even"] == [[4, 5, 6, 7], [2, 3, 4, 5]]
    assert rank0["uneven"] == [[0, 1, 2, 3], [8, 9]] and rank1["uneven"] == [[4, 5, 6, 7]]
    assert rank0["split"] == [[0, 1], [4, 5], [8, 9]] and rank1["split"] == [[2, 3], [6, 7], [10, 11]]


@pytest.mark.timeout(2 * TIMEOUT_S)
def test_two_processes_shuffle_with_accelerates_generator(ranks):
    """set_seed(5), then prepare: the sampler's generator is seeded from one draw of the global RNG (as Accelerate
    does), both ranks read one permutation per epoch, dealt in pairs."""
    set_seed(5)
    generator = torch.Generator().manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
    for epoch in range(2):
        order = torch.randperm(12, generator=generator).tolist()
        torch.randperm(12, generator=generator)  # RandomSampler's draw for the num_samples % n tail, at its end
        pairs = [order[i : i + 2] for i in range(0, 12, 2)]
        assert ranks[0]["shuffled"][epoch] == pairs[0::2] and ranks[1]["shuffled"][epoch] == pairs[1::2]


@pytest.mark.timeout(2 * TIMEOUT_S)
def test_two_processes_scheduler_steps_once_per_process(ranks):
    for report in ranks:
        assert report["lr"] == pytest.approx(0.4)  # 3 optimizer steps x 2 processes of a 10-step linear schedule
        assert report["split_lr"] == pytest.approx(0.7)  # split_batches: one step per optimizer step
        assert report["every_call_lr"] == pytest.approx(0.7)  # step_scheduler_with_optimizer=False: every call


@pytest.mark.timeout(2 * TIMEOUT_S)
def test_two_processes_gathers_and_trigger(ranks):
    for report in ranks:
        assert report["gathered"] == list(range(10))  # the repeated samples of the last round dropped
        assert report["gathered_rows"] == 10  # torch.zeros(4) per batch: 8 rows, then the remainder's 2
        assert report["last_objects"] == ["r0b8", "r1b2"]
        assert report["gather_object"] == ["from 0", "from 1"]
        assert report["trigger"] == (True, False)  # rank 1 set it; both see it once
        assert report["local_first"]
        assert report["padded"] == [1, 0, 1, 2]  # rank 0's [1] padded to rank 1's length
    assert ranks[0]["split_prompts"] == ["A", "B"] and ranks[1]["split_prompts"] == ["C", "C"]
    assert ranks[0]["on_main"] == "ran" and ranks[1]["on_main"] is None


@pytest.mark.timeout(2 * TIMEOUT_S)
def test_two_processes_local_sgd_averages_every_n_steps(ranks):
    rank0, rank1 = (report["local_sgd"] for report in ranks)
    for step in range(4):
        same = torch.equal(rank0[step], rank1[step])
        assert same == (step % 2 == 1), f"after step {step + 1}: ranks {'equal' if same else 'differ'}"


@pytest.mark.timeout(2 * TIMEOUT_S)
def test_two_processes_ddp_kwargs_handler_and_fp16_comm_hook(ranks):
    exact = torch.tensor([(1 / 3 + 4 / 3) / 2])  # the mean of the ranks' gradients, in float32
    for report in ranks:
        grad = report["ddp"]["grad"].flatten()
        assert report["ddp"]["find_unused_parameters"] is True
        assert torch.equal(grad, ranks[0]["ddp"]["grad"].flatten())
        assert torch.equal(grad, grad.half().float()) and not torch.equal(grad, exact)  # reduced in float16
        assert grad.item() == pytest.approx(exact.item(), rel=1e-3)
        # PowerSGD (plain all-reduce in its first iterations) wrapped in fp16 compression
        powersgd = report["powersgd_grad"].flatten()
        assert torch.equal(powersgd, powersgd.half().float()) and powersgd.item() == pytest.approx(exact.item(), rel=1e-3)


@pytest.mark.timeout(2 * TIMEOUT_S)
def test_two_processes_resume_mid_epoch_exactly_with_dealt_batches(ranks):
    """Saved after micro-batch 5 (the first of epoch 1, 4 batches per rank: inside an accumulation window); a run from other
    weights and RNG loads it (its skip_first_batches call returns the positioned loader) and ends bit for bit
    where the uninterrupted run ends."""
    for rank, report in enumerate(ranks):
        uninterrupted, resumed = report["resume"]["uninterrupted"], report["resume"]["resumed"]
        assert resumed["seen"] == uninterrupted["seen"][5:], f"rank {rank}: other batches after the resume"
        assert resumed["lr"] == uninterrupted["lr"]
        for expected, actual in zip(uninterrupted["weights"], resumed["weights"]):
            assert torch.equal(expected, actual), f"rank {rank}: weights differ after the resume"


# ------------------------------------------------------------------------------------------- one process
def test_one_process_members_and_accelerate_values():
    accelerator = Accelerator(mixed_precision=None, cpu=True)
    assert accelerator.mixed_precision == "no" and accelerator.precision == "32-true"
    assert accelerator.distributed_type == DistributedType.NO == "NO"
    assert (accelerator.num_processes, accelerator.process_index, accelerator.use_distributed) == (1, 0, False)
    assert Accelerator(mixed_precision="bf16", cpu=True).mixed_precision == "bf16"
    assert Accelerator(mixed_precision="fp16", cpu=True).precision == "16-mixed"
    accelerator.gradient_accumulation_steps = 4
    assert accelerator.gradient_accumulation_steps == 4
    assert accelerator.gather(torch.tensor(3.0)).shape == ()  # as Accelerate: unchanged in one process
    accelerator.set_trigger()
    assert accelerator.check_trigger() and not accelerator.check_trigger()


def test_one_process_loop_numbers():
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    loader = DataLoader(torch.arange(10), batch_size=4)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, linear_schedule(optimizer))
    seen, rows = [], 0
    for batch in loader:
        seen.append(batch.tolist())
        rows += accelerator.gather_for_metrics(torch.zeros(4)).shape[0]
        accelerator.backward(model(batch.float()[:, None].expand(-1, 2)).sum())
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    assert seen == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert rows == 10  # the last batch keeps len(dataset) % batch_size rows, as on Accelerate
    assert scheduler.get_last_lr()[0] == pytest.approx(0.7)


def test_accelerates_constructor_arguments_are_taken(tmp_path):
    accelerator = Accelerator(
        cpu=True, mixed_precision="fp16", gradient_accumulation_steps=2, log_with="all", project_dir=tmp_path,
        kwargs_handlers=[GradScalerKwargs(init_scale=1024.0), DistributedDataParallelKwargs(find_unused_parameters=True),
                         InitProcessGroupKwargs(timeout=None), ProfileKwargs()],
        dataloader_config=DataLoaderConfiguration(even_batches=True), step_scheduler_with_optimizer=True,
    )  # fmt: skip
    assert accelerator.gradient_accumulation_steps == 2 and accelerator.mixed_precision == "fp16"
    assert accelerator.strategy.precision.scaler.get_scale() == 1024.0
    accelerator.init_trackers("run", {"lr": 0.1})
    accelerator.log({"loss": 1.0}, step=0)
    accelerator.end_training()
    assert len(accelerator.loggers) == 1 and list((tmp_path / "run").iterdir())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(mixed_precision="fp8"), "fp8 is not supported"),
        (dict(mixed_precision="fp16", precision="bf16-mixed"), "disagree"),
        (dict(gradient_accumulation_steps=2, accumulate_grad_batches=3), "disagree"),
        (dict(kwargs_handlers=[object()]), "kwargs_handlers got a object"),
        (dict(dataloader_config=DataLoaderConfiguration(dispatch_batches=True)), "dispatch_batches"),
        (dict(log_with="wandb_typo"), "loggers='wandb_typo' is not valid"),
        (dict(device_placement=False), "device_placement=False"),
    ],
)
def test_misuse_is_a_clear_error(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        Accelerator(cpu=True, **kwargs)


def test_the_engine_keeps_the_trainers_split_and_says_where_accelerates_is():
    with pytest.raises(ConfigurationError, match="trainer.accelerate.Accelerator"):
        Engine(accelerator="cpu", split_batches=True)
    assert Engine(accelerator="cpu", mixed_precision="bf16").precision == "bf16-mixed"


def test_config_file_fills_what_the_script_leaves_at_its_default(tmp_path, monkeypatch):
    """`trainer run --config acc.yaml` exports the file; Accelerate's precedence: the script's defaults
    (mixed_precision=None, cpu=False, gradient_accumulation_steps=1) keep the file's values, an explicit value wins."""
    (tmp_path / "acc.yaml").write_text(ACCELERATE_FILE.format(kind="'NO'", processes=1))
    monkeypatch.setenv("TRAINER_CONFIG", str(tmp_path / "acc.yaml"))
    monkeypatch.setenv("TRAINER_ARGS", '{"accumulate_grad_batches": 3}')
    assert Accelerator(mixed_precision=None, cpu=False, gradient_accumulation_steps=1).mixed_precision == "bf16"
    assert Accelerator(gradient_accumulation_steps=1).gradient_accumulation_steps == 3
    assert Accelerator(mixed_precision="no").mixed_precision == "no"
    assert Accelerator(gradient_accumulation_steps=2).gradient_accumulation_steps == 2
    monkeypatch.setenv("TRAINER_ARGS", '{"accelerator": "gpu"}')  # the launcher's accelerator is kept by cpu=False
    if not torch.cuda.is_available():
        with pytest.raises(ConfigurationError):
            Accelerator(cpu=False)
    assert Accelerator(cpu=True).device.type == "cpu"


class ScheduleFree(torch.optim.SGD):
    """An optimizer with train()/eval() modes, as schedule-free optimizers have."""

    mode = "train"

    def train(self) -> None:
        self.mode = "train"

    def eval(self) -> None:
        self.mode = "eval"


def test_prepared_optimizer_passes_train_and_eval_through():
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 1)
    raw = ScheduleFree(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, raw)
    optimizer.eval()
    assert raw.mode == "eval"
    optimizer.train()
    assert raw.mode == "train"


def test_find_executable_batch_size_retries_on_a_real_out_of_memory_error():
    """The CPU allocator's own error (asking for a petabyte), as a too-large batch raises it."""
    tried = []

    @find_executable_batch_size(starting_batch_size=128)
    def train(batch_size: int, tag: str) -> int:
        tried.append(batch_size)
        torch.empty(2**50 if batch_size > 90 else 1, dtype=torch.uint8)
        return batch_size

    assert train("x") == 82 and tried == [128, 115, 103, 92, 82]  # 90% of the last each time, as Accelerate 1.x

    @find_executable_batch_size(starting_batch_size=8)
    def broken(batch_size: int) -> None:
        raise ValueError("not memory")

    with pytest.raises(ValueError, match="not memory"):
        broken()


def test_free_memory_then_prepare_again_and_automatic_checkpoint_naming(tmp_path):
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2)
    accelerator = Accelerator(cpu=True, project_config=config)
    model = torch.nn.Linear(2, 1)
    prepared = accelerator.prepare(model)
    assert accelerator.free_memory(prepared) == [None]
    with accelerator.profile(ProfileKwargs(output_trace_dir=str(tmp_path / "trace"))) as profiler:
        torch.ones(4).sum()
    assert (tmp_path / "trace" / "profile_0.json").stat().st_size > 0 and profiler.events()
    prepared = accelerator.prepare(model)
    for _ in range(3):
        accelerator.save_state()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint_1", "checkpoint_2"]
    accelerator.load_state()
    assert config.iteration == 3


def test_partial_state_for_distributed_inference():
    from trainer.accelerate import PartialState

    state = PartialState(cpu=True)
    with state.split_between_processes(["a", "b", "c"]) as prompts:
        assert prompts == ["a", "b", "c"] and state.process_index == 0 and state.is_main_process
    state.destroy_process_group()


def test_process_helpers_in_one_process(tmp_path):
    accelerator = Accelerator(cpu=True, log_with="csv", project_dir=tmp_path)
    with accelerator.split_between_processes({"a": [1, 2], "b": [3, 4]}) as share:
        assert share == {"a": [1, 2], "b": [3, 4]}
    assert accelerator.on_process(process_index=0)(lambda: 1)() == 1 and accelerator.on_last_process(lambda: 2)() == 2
    assert torch.equal(accelerator.pad_across_processes(torch.ones(2)), torch.ones(2))
    model = accelerator.prepare_model(torch.nn.Linear(2, 1))
    optimizer = accelerator.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    scheduler = accelerator.prepare_scheduler(torch.optim.lr_scheduler.StepLR(optimizer.optimizer, 1))
    accelerator.unscale_gradients()
    assert scheduler.get_last_lr() == [0.1] and accelerator.logging_dir == str(tmp_path)
    accelerator.init_trackers("run")
    tracker = accelerator.get_tracker("csv")  # Accelerate's tracker API over our CSVLogger
    assert tracker.name == "csv" and type(tracker.logger).__name__ == "CSVLogger"
    accelerator.save_model(model, tmp_path / "saved", safe_serialization=False)
    state = torch.load(tmp_path / "saved" / "pytorch_model.bin", weights_only=True)
    assert torch.equal(state["weight"], accelerator.unwrap_model(model).weight)


def test_skip_first_batches_and_gather_object_in_one_process():
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    assert accelerator.use_stateful_dataloader
    loader = accelerator.prepare(DataLoader(list(range(6)), batch_size=2))
    assert [b.tolist() for b in skip_first_batches(loader, 2)] == [[4, 5]]
    assert [b.tolist() for b in accelerator.skip_first_batches(loader, 1)] == [[2, 3], [4, 5]]
    assert gather_object(["a"]) == ["a"]


@pytest.mark.parametrize(
    "n, batch_size, processes, options, expected",
    [
        (12, 2, 2, {}, [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [10, 11]]]),
        (10, 4, 3, {}, [[[0, 1, 2, 3]], [[4, 5, 6, 7]], [[8, 9, 0, 1]]]),
        (10, 4, 2, {"drop_last": True}, [[[0, 1, 2, 3]], [[4, 5, 6, 7]]]),
        (3, 2, 4, {}, [[[0, 1]], [[2, 0]], [[1, 2]], [[0, 1]]]),  # fewer samples than processes x batch
        (10, 4, 2, {"split_batches": True}, [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [0, 1]]]),
        (10, 4, 2, {"split_batches": True, "even_batches": False}, [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7]]]),
    ],
)
def test_accelerates_split_of_a_loader(n, batch_size, processes, options, expected):
    """The batches each process of an Accelerate job reads (trainer/data/batch_shard.py), built for each rank."""
    from trainer.data.batch_shard import deal_batches

    drop_last = options.pop("drop_last", False)
    split, even = options.get("split_batches", False), options.get("even_batches", True)
    for rank in range(processes):
        loader = deal_batches(DataLoader(list(range(n)), batch_size=batch_size, drop_last=drop_last), processes, rank,
                              split, even)  # fmt: skip
        assert [batch.tolist() for batch in loader] == expected[rank] and len(loader) == len(expected[rank])


def test_a_custom_batch_sampler_is_dealt_batch_by_batch_and_a_batchless_loader_is_refused():
    from trainer.data.batch_shard import deal_batches

    class Buckets:
        def __iter__(self):
            return iter([[0], [1, 2], [3, 4, 5], [6]])

        def __len__(self):
            return 4

    loader = deal_batches(DataLoader(list(range(7)), batch_sampler=Buckets()), 2, 1, False, True)
    assert [batch.tolist() for batch in loader] == [[1, 2], [6]]
    with pytest.raises(ConfigurationError, match="batch_size=None"):
        deal_batches(DataLoader(list(range(7)), batch_size=None), 2, 0, False, True)
    with pytest.raises(ConfigurationError, match="divisible by 2"):
        deal_batches(DataLoader(list(range(7)), batch_size=3), 2, 0, True, True)


def test_accelerate_logging_and_tqdm(caplog, monkeypatch):
    from trainer.accelerate.logging import get_logger
    from trainer.accelerate.utils import tqdm

    logger = get_logger("h27.accelerate", log_level="INFO")
    with caplog.at_level("INFO", logger="h27.accelerate"):
        logger.info("on rank 0")
        logger.info("everywhere", main_process_only=False)
    assert [r.getMessage() for r in caplog.records] == ["[RANK 0] on rank 0", "[RANK 0] everywhere"]
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert tqdm(range(3)).disable and not tqdm(range(3), main_process_only=False).disable


@pytest.mark.timeout(2 * TIMEOUT_S)
def test_notebook_launcher_and_debug_launcher_fork_processes_that_join(tmp_path):
    finish(start([sys.executable, str(ROOT / "tests" / "scripts" / "notebook_job.py"), str(tmp_path)], clean_env(),
                 tmp_path), TIMEOUT_S)  # fmt: skip
    for name, precision in (("notebook", "bf16"), ("debug", "no")):
        for rank in (0, 1):
            report = torch.load(tmp_path / f"{name}{rank}.pt")
            assert report == {"rank": rank, "world": 2, "sum": 3.0, "mixed_precision": precision, "device": "cpu"}

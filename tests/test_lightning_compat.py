"""Lightning scripts run unchanged after the rename: modules written the way Lightning's docs write them (a GAN
with manual optimisation and toggle_optimizer, an autoencoder with the short step signatures, a warm-up in
optimizer_step), Lightning 2.6's Trainer arguments, and the docs table that lists every argument and member.
"""
from __future__ import annotations

import inspect
import io
import re
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainer.callbacks import Callback, ModelCheckpoint, RichProgressBar, Timer
from trainer.loggers import CSVLogger, Logger
from trainer.strategies import ConfigurationError, MixedPrecision
from trainer.strategies.checkpoint.checkpoint_io import CheckpointError, CheckpointIO
from trainer import DataModule, Trainer, TrainModule

ROOT = Path(__file__).resolve().parents[1]
MIGRATING = ROOT / "docs" / "migrating_from_lightning.md"

# Lightning 2.6's Trainer.__init__ keyword arguments (names only).
LIGHTNING_TRAINER_ARGUMENTS = (
    "accelerator", "strategy", "devices", "num_nodes", "precision", "logger", "callbacks", "fast_dev_run",
    "max_epochs", "min_epochs", "max_steps", "min_steps", "max_time", "limit_train_batches", "limit_val_batches",
    "limit_test_batches", "limit_predict_batches", "overfit_batches", "val_check_interval", "check_val_every_n_epoch",
    "num_sanity_val_steps", "log_every_n_steps", "enable_checkpointing", "enable_progress_bar",
    "enable_model_summary", "accumulate_grad_batches", "gradient_clip_val", "gradient_clip_algorithm",
    "deterministic", "benchmark", "inference_mode", "use_distributed_sampler", "profiler", "detect_anomaly",
    "barebones", "plugins", "sync_batchnorm", "reload_dataloaders_every_n_epochs", "default_root_dir",
    "enable_autolog_hparams", "model_registry",
)  # fmt: skip
#: Arguments another issue adds to the Trainer at the same time as this one (the table lists them as supported).
LANDING_WITH_OTHER_ISSUES = {"profiler": 14}


def docs_table(heading: str) -> dict[str, tuple[str, str]]:
    """``name → (status, notes)`` from the table under ``heading`` in docs/migrating_from_lightning.md."""
    text = MIGRATING.read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = (cells[1], cells[2])
    return rows


def quiet(**kwargs) -> Trainer:
    options = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, num_sanity_val_steps=0)  # fmt: skip
    options.update(kwargs)
    return Trainer(**options)


def blobs(n: int = 32, features: int = 6, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=generator)
    return TensorDataset(x, (x.sum(1, keepdim=True) > 0).float())


# ---------------------------------------------------------------------------------------------- the docs table
def test_every_lightning_trainer_argument_is_supported_or_listed_as_unsupported_with_a_reason():
    ours = set(inspect.signature(Trainer).parameters)
    table = docs_table("Trainer arguments")
    assert set(table) == set(LIGHTNING_TRAINER_ARGUMENTS), "the docs table must list exactly Lightning's arguments"
    problems = []
    for name in LIGHTNING_TRAINER_ARGUMENTS:
        status, notes = table[name]
        if name in ours or name in LANDING_WITH_OTHER_ISSUES:
            if status not in ("same", "partly"):
                problems.append(f"{name}: the Trainer takes it but the table says {status!r}")
        elif status != "not supported" or len(notes) < 40:
            problems.append(f"{name}: not a Trainer argument, and the table gives no reason and alternative")
    assert not problems, problems


def test_every_lightning_module_member_in_the_table_exists_or_has_a_reason():
    table = docs_table("LightningModule attributes and methods")
    members = set(dir(TrainModule())) | {"configure_model", "device_mesh"}  # issue 13 adds these two
    problems = []
    for name, (status, notes) in table.items():
        if status == "renamed":
            exists = re.search(r"`(\w+)`", notes).group(1) in members
        else:
            exists = name in members
        if exists == (status == "not supported") or (status == "not supported" and len(notes) < 40):
            problems.append(name)
    assert not problems, f"table rows that do not match TrainModule: {problems}"
    assert {"toggle_optimizer", "untoggle_optimizer", "logger", "loggers", "optimizer_step", "all_gather"} <= set(table)


# ---------------------------------------------------------------------------------------------- a GAN
class Generator(nn.Module):
    def __init__(self, latent_dim: int, features: int) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Linear(latent_dim, 16), nn.LeakyReLU(0.2), nn.Linear(16, features), nn.Tanh())

    def forward(self, z):
        return self.model(z)


class Discriminator(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Linear(features, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1), nn.Sigmoid())

    def forward(self, x):
        return self.model(x)


class GAN(TrainModule):
    """The shape of Lightning's basic GAN example: manual optimisation, two optimizers, toggle_optimizer,
    ``training_step(self, batch)``, ``configure_optimizers`` returning ``[opt_g, opt_d], []``."""

    def __init__(self, latent_dim: int = 4, features: int = 6, lr: float = 0.01, b1: float = 0.5, b2: float = 0.999):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = Generator(latent_dim, features)
        self.discriminator = Discriminator(features)
        self.validation_z = torch.randn(8, latent_dim, generator=torch.Generator().manual_seed(1))
        self.seen_during_generator_step: list[bool] = []

    def forward(self, z):
        return self.generator(z)

    def training_step(self, batch):
        imgs, _ = batch
        optimizer_g, optimizer_d = self.optimizers()
        z = torch.randn(imgs.shape[0], self.hparams.latent_dim).type_as(imgs)

        self.toggle_optimizer(optimizer_g)
        valid = torch.ones(imgs.size(0), 1).type_as(imgs)
        g_loss = F.binary_cross_entropy(self.discriminator(self(z)), valid)
        self.log("g_loss", g_loss, prog_bar=True)
        self.manual_backward(g_loss)
        self.seen_during_generator_step.append(all(p.grad is None and not p.requires_grad
                                                   for p in self.discriminator.parameters()))  # fmt: skip
        optimizer_g.step()
        optimizer_g.zero_grad()
        self.untoggle_optimizer(optimizer_g)

        self.toggle_optimizer(optimizer_d)
        real_loss = F.binary_cross_entropy(self.discriminator(imgs), valid)
        fake = torch.zeros(imgs.size(0), 1).type_as(imgs)
        fake_loss = F.binary_cross_entropy(self.discriminator(self(z).detach()), fake)
        d_loss = (real_loss + fake_loss) / 2
        self.log("d_loss", d_loss, prog_bar=True)
        self.manual_backward(d_loss)
        optimizer_d.step()
        optimizer_d.zero_grad()
        self.untoggle_optimizer(optimizer_d)

    def on_train_epoch_end(self):
        for logger in self.loggers:
            logger.log_metrics({"generated_mean": float(self(self.validation_z).detach().mean())}, step=self.global_step)

    def configure_optimizers(self):
        lr, b1, b2 = self.hparams.lr, self.hparams.b1, self.hparams.b2
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=lr, betas=(b1, b2))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=lr, betas=(b1, b2))
        return [opt_g, opt_d], []


def vanilla_gan(model: GAN, loader: DataLoader, epochs: int) -> None:
    """The same GAN updates in plain PyTorch, with each network's gradients cleared before its own backward."""
    opt_g = torch.optim.Adam(model.generator.parameters(), lr=0.01, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(model.discriminator.parameters(), lr=0.01, betas=(0.5, 0.999))
    for _ in range(epochs):
        for imgs, _ in loader:
            z = torch.randn(imgs.shape[0], 4)
            valid, fake = torch.ones(imgs.size(0), 1), torch.zeros(imgs.size(0), 1)
            opt_g.zero_grad()
            F.binary_cross_entropy(model.discriminator(model.generator(z)), valid).backward()
            opt_g.step()
            opt_d.zero_grad()
            d_loss = (F.binary_cross_entropy(model.discriminator(imgs), valid)
                      + F.binary_cross_entropy(model.discriminator(model.generator(z).detach()), fake)) / 2  # fmt: skip
            d_loss.backward()
            opt_d.step()


def test_gan_with_toggle_optimizer_trains_as_the_plain_pytorch_gan(tmp_path):
    torch.manual_seed(0)
    gan = GAN()
    frozen = gan.discriminator.model[0].bias
    frozen.requires_grad_(False)  # frozen by the user: toggling must not switch it back on
    reference = GAN()
    reference.load_state_dict(gan.state_dict())
    reference.discriminator.model[0].bias.requires_grad_(False)
    loader = DataLoader(blobs(), batch_size=8)
    logger = CSVLogger(tmp_path)
    trainer = quiet(max_epochs=2, logger=logger)
    torch.manual_seed(1)
    trainer.fit(gan, loader)
    torch.manual_seed(1)
    vanilla_gan(reference, loader, epochs=2)

    assert trainer.global_step == 2 * 4 * 2  # two optimizer steps per batch
    assert gan.seen_during_generator_step == [True] * 8  # no discriminator gradient was computed for g_loss
    assert not frozen.requires_grad and all(p.requires_grad for p in gan.generator.parameters())
    different = [k for k, v in reference.state_dict().items() if not torch.equal(v, gan.state_dict()[k])]
    assert not different, f"differs from the plain loop: {different}"
    assert gan.logger is logger and gan.loggers == [logger]
    assert "generated_mean" in Path(logger.metrics_file_path).read_text()
    assert {"g_loss", "d_loss"} <= set(trainer.progress_bar_metrics)


def test_toggle_optimizer_refuses_an_optimizer_the_module_does_not_have():
    gan = GAN()
    trainer = quiet(max_steps=1)
    trainer.fit(gan, DataLoader(blobs(8), batch_size=8))
    with pytest.raises(ConfigurationError, match="did not return"):
        gan.toggle_optimizer(torch.optim.SGD(gan.parameters(), lr=0.1))
    with gan.toggled_optimizer(gan.optimizers()[1]):
        assert not any(p.requires_grad for p in gan.generator.parameters())
    assert all(p.requires_grad for p in gan.generator.parameters())
    assert GAN().logger is None and GAN().loggers == []


# ---------------------------------------------------------------------------------------------- an autoencoder
class LitAutoEncoder(TrainModule):
    """Lightning's autoencoder example with the short signatures: ``validation_step(self, batch)``,
    ``test_step(self, batch, batch_idx, dataloader_idx=0)``, ``predict_step(self, batch)``."""

    def __init__(self, lr: float = 0.01):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
        self.decoder = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 6))
        self.inference_modes: list[bool] = []

    def _loss(self, batch):
        x, _ = batch
        return F.mse_loss(self.decoder(self.encoder(x)), x)

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch):
        self.inference_modes.append(torch.is_inference_mode_enabled())
        self.log("val_loss", self._loss(batch), prog_bar=True)

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        self.log("test_loss", self._loss(batch))

    def predict_step(self, batch):
        return self.encoder(batch[0])

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)}


def test_autoencoder_with_short_step_signatures_matches_a_plain_loop_and_runs_every_stage():
    torch.manual_seed(0)
    model = LitAutoEncoder()
    reference = LitAutoEncoder()
    reference.load_state_dict(model.state_dict())
    train, val = DataLoader(blobs(), batch_size=8), DataLoader(blobs(16, seed=1), batch_size=8)
    trainer = quiet(max_epochs=2)
    trainer.fit(model, train, val)

    optimizer = torch.optim.Adam(reference.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    for _ in range(2):
        for batch in train:
            optimizer.zero_grad()
            reference._loss(batch).backward()
            optimizer.step()
        scheduler.step()
    different = [k for k, v in reference.state_dict().items() if not torch.equal(v, model.state_dict()[k])]
    assert not different, f"differs from the plain loop: {different}"
    assert model.inference_modes and all(model.inference_modes)  # inference_mode=True is the default

    results = trainer.test(model, {"seen": train, "unseen": val}, verbose=False)  # a dict: dataloader_idx 0 and 1
    assert [sorted(r) for r in results] == [["test_loss/dataloader_idx_0"], ["test_loss/dataloader_idx_1"]]
    predictions = trainer.predict(model, [train, val])
    assert [len(p) for p in predictions] == [4, 2] and predictions[0][0].shape == (8, 2)

    no_inference = LitAutoEncoder()
    quiet(inference_mode=False).validate(no_inference, val, verbose=False)
    assert no_inference.inference_modes == [False, False]


class WarmUp(LitAutoEncoder):
    """Lightning's learning-rate warm-up recipe: ``optimizer_step`` overridden around ``optimizer.step``."""

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        scale = min(1.0, float(self.trainer.global_step + 1) / 3)
        for group in optimizer.param_groups:
            group["lr"] = scale * self.hparams.lr
        optimizer.step(closure=optimizer_closure)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def test_optimizer_step_override_warms_the_learning_rate_up_as_a_plain_loop_does():
    torch.manual_seed(0)
    model, reference = WarmUp(lr=0.1), WarmUp(lr=0.1)
    reference.load_state_dict(model.state_dict())
    train = DataLoader(blobs(), batch_size=8)
    trainer = quiet(max_epochs=1, accumulate_grad_batches=2, gradient_clip_val=0.5)
    trainer.fit(model, train)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for i, batch in enumerate(train):
        (reference._loss(batch) / 2).backward()
        if i % 2 == 1:
            for group in optimizer.param_groups:
                group["lr"] = min(1.0, (i // 2 + 1) / 3) * 0.1
            torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
            optimizer.step()
            optimizer.zero_grad()
    assert trainer.global_step == 2
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[key], value, rtol=0, atol=1e-7)


class Hooked(LitAutoEncoder):
    """Batch transfer hooks, a timm-style scheduler stepped through lr_scheduler_step, zeroed (not None) grads."""

    def __init__(self):
        super().__init__()
        self.transfers: list[str] = []
        self.scheduler_calls: list[int] = []

    def on_before_batch_transfer(self, batch, dataloader_idx):
        self.transfers.append("before")
        return batch[0] * 0 + 1, batch[1]  # every input becomes ones

    def on_after_batch_transfer(self, batch, dataloader_idx):
        self.transfers.append("after")
        return batch

    def training_step(self, batch, batch_idx):
        assert torch.equal(batch[0], torch.ones_like(batch[0]))
        return super().training_step(batch, batch_idx)

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        optimizer.zero_grad(set_to_none=False)

    def lr_scheduler_step(self, scheduler, metric):
        self.scheduler_calls.append(self.current_epoch)
        scheduler.step(epoch=self.current_epoch + 1)  # timm's signature

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)

        class EpochScheduler:  # not a torch scheduler: step(epoch) as timm's are
            def __init__(self, optimizer):
                self.optimizer = optimizer

            def step(self, epoch):
                for group in self.optimizer.param_groups:
                    group["lr"] = 0.1 / (epoch + 1)

            def state_dict(self):
                return {}

        return [optimizer], [EpochScheduler(optimizer)]


def test_batch_transfer_zero_grad_and_scheduler_hooks_are_called():
    model = Hooked()
    trainer = quiet(max_epochs=2)
    trainer.fit(model, DataLoader(blobs(16), batch_size=8))
    assert model.transfers == ["before", "after"] * 4
    assert model.scheduler_calls == [0, 1] and trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 / 3)
    # As in Lightning, gradients are cleared before each step's backward (here to zeros, kept): the last step's remain.
    assert all(p.grad is not None for p in model.parameters())


class Utilities(TrainModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
        self.example_input_array = torch.randn(3, 6)
        self.prepared = 0

    def prepare_data(self):
        self.prepared += 1

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch):
        gathered = self.all_gather({"loss": torch.tensor(1.0), "n": 2})
        assert gathered["loss"].shape == (1,) and gathered["n"].tolist() == [2]
        return F.mse_loss(self(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_prepare_data_all_gather_freeze_torchscript_and_strict_loading(tmp_path):
    model = Utilities()
    trainer = quiet(max_steps=2, sync_batchnorm=True)  # one process: nothing to synchronise, BatchNorm stays
    trainer.fit(model, DataLoader(blobs(16), batch_size=8))
    assert model.prepared == 1 and type(model.net[1]) is nn.BatchNorm1d
    trainer.save_checkpoint(tmp_path / "a.ckpt")

    model.freeze()
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    model.unfreeze()
    assert model.training and all(p.requires_grad for p in model.parameters())
    traced = model.to_torchscript(tmp_path / "m.pt", method="trace")
    model.eval()
    assert torch.equal(torch.jit.load(str(tmp_path / "m.pt"))(model.example_input_array), model(model.example_input_array))
    assert torch.equal(traced(model.example_input_array), model(model.example_input_array))

    class Wider(Utilities):
        def __init__(self):
            super().__init__()
            self.extra = nn.Linear(1, 1)

        def validation_step(self, batch):
            pass

    wider = Wider()
    with pytest.raises(CheckpointError, match=r"missing keys \[extra.bias, extra.weight\]"):
        quiet().validate(wider, DataLoader(blobs(8), batch_size=8), ckpt_path=tmp_path / "a.ckpt")
    wider.strict_loading = False
    quiet().validate(wider, DataLoader(blobs(8), batch_size=8), ckpt_path=tmp_path / "a.ckpt", verbose=False)
    assert torch.equal(wider.net[0].weight, model.net[0].weight)


# ---------------------------------------------------------------------------------------------- Trainer arguments
class Recorder(TrainModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(6, 1)
        self.first_samples: list[list[float]] = []
        self.loader_requests = {"train": 0, "val": 0}

    def training_step(self, batch, batch_idx):
        self.first_samples.append(batch[0][0, :1].tolist())
        return F.mse_loss(self.layer(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.mse_loss(self.layer(batch[0]), batch[1]))

    def train_dataloader(self):
        self.loader_requests["train"] += 1
        return DataLoader(blobs(32), batch_size=8, shuffle=True)

    def val_dataloader(self):
        self.loader_requests["val"] += 1
        return DataLoader(blobs(16), batch_size=8)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_overfit_batches_trains_on_the_same_batches_in_order_every_epoch():
    model = Recorder()
    trainer = quiet(overfit_batches=2, max_epochs=3)
    with pytest.warns(UserWarning, match="requested to overfit but enabled train dataloader shuffling"):
        trainer.fit(model)
    assert trainer.num_training_batches == 2 and trainer.num_val_batches == [2]
    assert model.first_samples[0:2] == model.first_samples[2:4] == model.first_samples[4:6]
    assert model.first_samples[0] == [blobs(32).tensors[0][0, 0].item()]  # in order: the dataset's first sample


def test_reload_dataloaders_every_n_epochs_asks_the_module_again():
    model = Recorder()
    quiet(reload_dataloaders_every_n_epochs=2, max_epochs=5).fit(model)
    assert model.loader_requests == {"train": 3, "val": 3}  # epochs 0, 2 and 4
    once = Recorder()
    quiet(max_epochs=3).fit(once)
    assert once.loader_requests == {"train": 1, "val": 1}


class StopAtOnce(Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        trainer.should_stop = True


def test_min_steps_holds_off_a_stop_request_and_max_time_stops_fit():
    trainer = quiet(min_steps=6, max_epochs=5, callbacks=[StopAtOnce()])
    trainer.fit(Recorder())
    assert trainer.global_step == 6
    with pytest.raises(ConfigurationError, match="min_steps=9 is larger than max_steps=3"):
        quiet(min_steps=9, max_steps=3)

    class Slow(Recorder):
        def training_step(self, batch, batch_idx):
            time.sleep(0.05)
            return super().training_step(batch, batch_idx)

        def train_dataloader(self):
            return DataLoader(blobs(800), batch_size=1)

    timed = quiet(max_time={"seconds": 1}, max_epochs=1, limit_val_batches=0)
    [timer] = [cb for cb in timed.callbacks if isinstance(cb, Timer)]
    start = time.monotonic()
    timed.fit(Slow())
    assert timed.global_step < 400 and time.monotonic() - start < 30  # 800 steps would take 40 s
    with pytest.warns(UserWarning, match="max_time=.* is ignored"):
        mine = Timer(duration="00:01:00:00")
        assert [cb for cb in quiet(max_time="00:00:00:01", callbacks=[mine]).callbacks if isinstance(cb, Timer)] == [mine]


def test_benchmark_barebones_and_autolog_hparams():
    before = torch.backends.cudnn.benchmark
    seen = []

    class Probe(Callback):
        def on_fit_start(self, trainer, module):
            seen.append(torch.backends.cudnn.benchmark)

    for benchmark in (True, False):  # held while a stage runs, then put back
        quiet(benchmark=benchmark, max_steps=1, callbacks=[Probe()]).fit(LitAutoEncoder(), DataLoader(blobs(8), batch_size=4))
        assert seen[-1] is benchmark and torch.backends.cudnn.benchmark is before
    with pytest.raises(ConfigurationError, match="benchmark=True .* contradicts deterministic"):
        quiet(benchmark=True, deterministic=True)

    bare = Trainer(barebones=True, accelerator="cpu", max_steps=2)
    assert bare.loggers == [] and bare.callbacks == [] and bare.barebones
    bare.fit(Recorder())
    with pytest.raises(ConfigurationError, match="barebones=True runs without loggers"):
        Trainer(barebones=True, logger=CSVLogger("unused"))

    class Params(Logger):
        def __init__(self):
            self.params: list[dict] = []

        def log_hyperparams(self, params, metrics=None):
            self.params.append(dict(params))

    class Data(DataModule):  # a LightningDataModule as Lightning's docs write one
        def __init__(self, batch_size: int = 4):
            super().__init__()
            self.save_hyperparameters()

        def train_dataloader(self):
            return DataLoader(blobs(8), batch_size=self.hparams.batch_size)

    for enabled, expected in ((True, [{"lr": 0.01, "batch_size": 4}]), (False, [])):
        logger = Params()
        quiet(logger=logger, enable_autolog_hparams=enabled, max_steps=1).fit(LitAutoEncoder(), datamodule=Data())
        assert logger.params == expected


class RecordingIO(CheckpointIO):
    """A checkpoint IO plugin (Lightning's ``plugins=[MyCheckpointIO()]``) that records what it was asked."""

    def __init__(self):
        self.calls: list[tuple[str, str]] = []

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        self.calls.append(("save", Path(path).name))
        super().save_checkpoint(checkpoint, path)

    def load_checkpoint(self, path, map_location="cpu"):
        self.calls.append(("load", Path(path).name))
        return super().load_checkpoint(path, map_location)

    def remove_checkpoint(self, path):
        self.calls.append(("remove", Path(path).name))
        super().remove_checkpoint(path)


def test_plugins_route_precision_checkpoint_io_and_cluster_environment(tmp_path):
    from trainer.strategies.launch.environments import LocalEnvironment

    io_plugin, environment = RecordingIO(), LocalEnvironment()
    checkpoint = ModelCheckpoint(dirpath=tmp_path, monitor="epoch", mode="max", save_top_k=1, filename="{epoch}")
    trainer = quiet(plugins=[MixedPrecision("bf16-mixed"), io_plugin, environment], max_epochs=2,
                    enable_checkpointing=True, callbacks=[checkpoint])  # fmt: skip
    assert trainer.precision == "bf16-mixed" and trainer.strategy.cluster_environment is environment
    trainer.fit(Recorder())
    assert io_plugin.calls == [("save", "epoch=0.ckpt"), ("save", "epoch=1.ckpt"), ("remove", "epoch=0.ckpt")]
    quiet(plugins=io_plugin).validate(Recorder(), ckpt_path=checkpoint.best_model_path, verbose=False)
    assert io_plugin.calls[-1] == ("load", Path(checkpoint.best_model_path).name)
    ddp = Trainer(accelerator="cpu", devices=2, strategy="ddp", plugins=[environment], logger=False)
    assert ddp.strategy.cluster_environment is environment
    with pytest.raises(ConfigurationError, match="precision='16-mixed' and a precision plugin"):
        quiet(plugins=MixedPrecision("bf16-mixed"), precision="16-mixed")
    with pytest.raises(ConfigurationError, match="is not a plugin the Trainer knows"):
        quiet(plugins=["bitsandbytes"])
    with pytest.raises(ConfigurationError, match="SyncBatchNorm synchronises statistics on GPUs only"):
        Trainer(accelerator="cpu", devices=2, strategy="ddp", sync_batchnorm=True, logger=False)


def test_sync_batchnorm_converts_the_layers_a_distributed_strategy_wraps():
    from trainer.strategies.data_parallel.ddp import DDPStrategy
    from trainer.config.plugins import sync_batchnorm_layers

    module = Utilities()
    sync_batchnorm_layers(module, DDPStrategy())
    assert isinstance(module.net[1], nn.SyncBatchNorm)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: SyncBatchNorm runs there only")
def test_sync_batchnorm_fits_on_a_gpu():
    model = Utilities()
    trainer = Trainer(accelerator="gpu", devices=1, sync_batchnorm=True, max_steps=2, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False)  # fmt: skip
    trainer.fit(model, DataLoader(blobs(16), batch_size=8))
    assert trainer.global_step == 2 and model.net[0].weight.device.type == "cuda"


def test_repr_of_a_trainer_whose_init_failed_does_not_raise():
    trainer = object.__new__(Trainer)
    with pytest.raises(ConfigurationError):
        trainer.__init__(accelerator="tpu")  # fails after the loop settings were stored, before the strategy
    assert repr(trainer) == "Trainer(max_epochs=None, max_steps=-1)"  # None until fit resolves it, as Lightning
    empty = object.__new__(Trainer)
    with pytest.raises(ConfigurationError):
        empty.__init__(max_epochs="ten")
    assert repr(empty) == "Trainer()"


# ---------------------------------------------------------------------------------------------- the plain-line display
class ConstantAccuracy(Recorder):
    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.mse_loss(self.layer(batch[0]), batch[1]), prog_bar=True)
        self.log("val_acc", 1.0, prog_bar=True)  # the same value at every validation

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss, prog_bar=True)
        return loss


def test_validation_lines_show_every_prog_bar_metric_the_validation_logged():
    buffer = io.StringIO()
    bar = RichProgressBar(console=Console(file=buffer, width=200))
    quiet(max_epochs=3, callbacks=[bar], enable_progress_bar=True).fit(ConstantAccuracy())
    lines = [line for line in buffer.getvalue().splitlines() if line.startswith("Validation")]
    assert len(lines) == 3
    for line in lines:
        assert re.search(r"val_loss=\S+", line) and "val_acc=1" in line and "train_loss" not in line, line

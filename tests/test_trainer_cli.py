"""``TrainerCLI`` (Lightning's ``LightningCLI``): fit then test with ``ckpt_path=best`` from one YAML file, the
``--print_config`` round trip, command-line overrides, the config saved beside the logs, and clear errors."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from trainer import TrainerCLI

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from cli_train import Data, Regression  # noqa: E402

SCRIPT = Path(__file__).parent / "scripts" / "cli_train.py"


def printed_config(capsys, *args: str) -> str:
    """What ``--print_config`` prints for these arguments."""
    with pytest.raises(SystemExit) as exit_info:
        TrainerCLI(Regression, Data, args=[*args, "--print_config"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def cli_error(capsys, *args: str, **kwargs) -> str:
    with pytest.raises(SystemExit) as exit_info:
        TrainerCLI(Regression, Data, args=list(args), **kwargs)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def write_config(tmp_path: Path, capsys) -> Path:
    """The printed defaults, edited as a user would: CPU, 3 epochs, quiet, a best-checkpoint callback."""
    config = yaml.safe_load(printed_config(capsys, "fit", "--model.lr=0.05"))
    config["seed_everything"] = 7
    config["trainer"].update(accelerator="cpu", max_epochs=3, default_root_dir=str(tmp_path / "runs"),
                             enable_progress_bar=False, enable_model_summary=False, callbacks=[
                                 {"class_path": "trainer.callbacks.ModelCheckpoint",
                                  "init_args": {"monitor": "val_loss", "save_top_k": 1, "save_last": True}}])  # fmt: skip
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_fit_then_test_with_the_best_checkpoint_from_one_config_file(tmp_path, capsys):
    config = write_config(tmp_path, capsys)
    fit = TrainerCLI(Regression, Data, args=["fit", "--config", str(config), "--trainer.max_epochs=4"])
    assert fit.trainer.current_epoch == 4 and fit.model.hparams.lr == 0.05 and fit.subcommand == "fit"
    best = fit.trainer.checkpoint_callback.best_model_path
    saved = yaml.safe_load((Path(fit.trainer.log_dir) / "config.yaml").read_text())
    assert saved == fit.config and saved["trainer"]["max_epochs"] == 4 and saved["seed_everything"] == 7

    # A new process (a new CLI and Trainer): "best" is the best checkpoint that fit recorded.
    test = TrainerCLI(Regression, Data, args=["test", "--config", str(config), "--ckpt_path", "best"])
    assert test.trainer.ckpt_path == best
    weights = torch.load(best, weights_only=True)["state_dict"]
    assert all(torch.equal(test.model.state_dict()[k], v) for k, v in weights.items())
    assert "test_loss" in capsys.readouterr().out


def test_print_config_round_trips_and_later_arguments_win(tmp_path, capsys):
    first = printed_config(capsys, "fit", "--model.hidden=16", "--trainer.max_epochs=2", "--data.batch_size", "4")
    (tmp_path / "printed.yaml").write_text(first)
    again = printed_config(capsys, "fit", "--config", str(tmp_path / "printed.yaml"))
    assert again == first
    config = yaml.safe_load(first)
    assert config["model"] == {"hidden": 16, "lr": 0.1, "activation": "tanh"} and config["data"]["batch_size"] == 4
    assert config["trainer"]["max_epochs"] == 2 and config["ckpt_path"] is None and config["seed_everything"] is True
    overridden = yaml.safe_load(printed_config(capsys, "fit", "--model.lr=0.5", "--config", str(tmp_path / "printed.yaml")))
    assert overridden["model"]["lr"] == 0.1  # the file came after the argument: it wins, as in Lightning


def test_without_run_the_objects_are_built_and_optimizer_sections_replace_configure_optimizers():
    cli = TrainerCLI(Regression, Data, run=False, args=["--trainer.accelerator=cpu", "--trainer.max_steps=2",
                                                          "--trainer.logger=false", "--optimizer=Adam",
                                                          "--optimizer.lr=0.01", "--lr_scheduler=StepLR",
                                                          "--lr_scheduler.step_size=2", "--seed_everything=3"])  # fmt: skip
    configured = cli.model.configure_optimizers()
    assert isinstance(configured["optimizer"], torch.optim.Adam) and configured["optimizer"].defaults["lr"] == 0.01
    assert isinstance(configured["lr_scheduler"], torch.optim.lr_scheduler.StepLR)
    assert cli.trainer.strategy.root_device.type == "cpu" and cli.subcommand is None
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)  # the script runs it, as with LightningCLI(run=False)
    assert cli.trainer.global_step == 2 and isinstance(cli.trainer.optimizers[0], torch.optim.Adam)
    subclass = TrainerCLI(run=False, subclass_mode_model=True, datamodule_class=Data,
                          args=["--model=tests.scripts.cli_train.Wider", "--model.lr=0.2"])  # fmt: skip
    assert type(subclass.model).__name__ == "Wider" and subclass.model.hparams.lr == 0.2
    assert subclass.config["model"] == {"class_path": "tests.scripts.cli_train.Wider", "init_args": {"lr": 0.2}}


def test_mistakes_are_errors_naming_the_key(capsys, tmp_path):
    assert "model.lr='fast' does not fit its type float" in cli_error(capsys, "fit", "--model.lr=fast")
    assert "Did you mean 'max_epochs'?" in cli_error(capsys, "fit", "--trainer.max_epoch=3")
    assert "Did you mean 'hidden'?" in cli_error(capsys, "fit", "--model.hiden=3")
    assert "'fitt' is not a subcommand. Did you mean 'fit'?" in cli_error(capsys, "fitt")
    (tmp_path / "bad.yaml").write_text("trainer:\n  max_epochs: 2\nmodle:\n  lr: 1\n")
    assert "unknown key 'modle'. Did you mean 'model'?" in cli_error(capsys, "fit", "--config", str(tmp_path / "bad.yaml"))


def test_the_script_runs_from_the_command_line_and_refuses_to_overwrite_a_saved_config(tmp_path):
    args = [sys.executable, str(SCRIPT), "fit", "--trainer.accelerator=cpu", "--trainer.max_steps=2",
            "--trainer.enable_progress_bar=false", "--trainer.logger={class_path: trainer.loggers.CSVLogger, "
            f"init_args: {{save_dir: {tmp_path}, version: 0}}}}"]  # fmt: skip
    first = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert (tmp_path / "logs" / "version_0" / "config.yaml").exists()
    again = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert again.returncode != 0 and "config.yaml exists already" in again.stderr

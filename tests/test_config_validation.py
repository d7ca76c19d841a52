"""A wrong experiment file is refused whole, before any worker starts: one `trainer run: error:` line naming the
file, the key and the expected type, exit status 2; `Trainer(...)` misspellings get the same "did you mean"."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer import ConfigurationError, Engine, Trainer


def run_cli(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    """`python -m trainer ...` as a user types it (a real process, so exit status and stderr are what they see)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("TRAINER_CONFIG", None)
    env.pop("TRAINER_ARGS", None)
    return subprocess.run([sys.executable, "-m", "trainer", *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_run_refuses_a_wrongly_typed_trainer_value_before_starting_workers(tmp_path):
    write(tmp_path, "cfg.yaml", 'devices: 2\ntrainer:\n  max_epochs: "three"\n')
    marker = tmp_path / "started"
    write(tmp_path, "train.py", f"open({str(marker)!r}, 'w').close()\n")
    result = run_cli(tmp_path, "run", "--config", "cfg.yaml", "train.py")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == ["trainer run: error: cfg.yaml: trainer.max_epochs='three' must be an int or null."]
    assert not marker.exists(), "a worker started although the file was invalid"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("trainer:\n  max_epoch: 3\n", "cfg.yaml: trainer: unknown key 'max_epoch'. Did you mean 'max_epochs'?"),
        ("trainer:\n  max_epochs: -5\n", "cfg.yaml: trainer.max_epochs=-5 must be None, -1 (no limit) or an int >= 0."),
        ("trainer:\n  precision: 17-mixed\n", "cfg.yaml: trainer.precision='17-mixed' is not supported."),
        ("trainer:\n  enable_progress_bar: 'no'\n", "cfg.yaml: trainer.enable_progress_bar='no' must be true/false."),
        ("", "Config file 'cfg.yaml' is empty"),
    ],
)
def test_run_error_lines_name_file_key_and_what_is_valid(tmp_path, capsys, text, expected):
    from trainer.cli import main

    write(tmp_path, "cfg.yaml", text)
    write(tmp_path, "train.py", "")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(["run", "--config", "cfg.yaml", "--dry-run", "train.py"]) == 2
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err
    assert err.startswith("trainer run: error: " + expected), err
    assert len(err.strip().splitlines()) == 1


def test_trainer_flags_on_the_command_line_are_type_checked(tmp_path, capsys):
    from trainer.cli import main

    write(tmp_path, "train.py", "")
    assert main(["run", "--trainer.max_epochs", "three", "--dry-run", str(tmp_path / "train.py")]) == 2
    assert "--trainer.max_epochs='three' must be an int or null." in capsys.readouterr().err


def test_from_config_errors_name_the_file(tmp_path):
    bad = write(tmp_path, "bad.yaml", 'trainer:\n  max_epochs: "three"\n')
    with pytest.raises(ConfigurationError, match=r"bad\.yaml: trainer\.max_epochs='three' must be an int or null"):
        Trainer.from_config(bad)
    negative = write(tmp_path, "negative.yaml", "trainer:\n  max_epochs: -5\n")
    with pytest.raises(ConfigurationError, match=r"Trainer\.from_config\('.*negative\.yaml'\): max_epochs=-5"):
        Trainer.from_config(negative)


def test_an_empty_file_is_an_error_not_a_silent_thousand_epochs(tmp_path):
    empty = write(tmp_path, "empty.yaml", "# nothing yet\n")
    with pytest.raises(ConfigurationError, match=r"'.*empty\.yaml' is empty.*max_epochs=1000"):
        Trainer.from_config(empty)


def test_misspelt_trainer_argument_in_python_says_did_you_mean():
    with pytest.raises(TypeError, match=r"Trainer\(\) got an unexpected keyword argument 'max_epoch'\. "
                                        r"Did you mean 'max_epochs'\?"):  # fmt: skip
        Trainer(max_epoch=3)
    with pytest.raises(TypeError, match=r"Engine\(\) got an unexpected keyword argument 'precison'\. "
                                        r"Did you mean 'precision'\?"):  # fmt: skip
        Engine(precison="32-true")

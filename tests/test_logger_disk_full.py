"""A logger that cannot write (a full disk) stops the run with one short error naming the file, and leaves no
half-written or empty temporary file behind.

Real conditions, without root: a child process with ``RLIMIT_FSIZE`` (SIGXFSZ ignored), so every write past the limit
fails in the kernel with EFBIG, as a full disk fails with ENOSPC at the same call; and ``/dev/full``, a real device
whose every write fails with ENOSPC ("No space left on device"), linked where the logger writes its temporary.
"""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainer.loggers.log_files import LogWriteError
from trainer.loggers.run_folder import save_hparams_yaml

TESTS = Path(__file__).resolve().parent

SCRIPT = textwrap.dedent(
    """
    import resource, signal, sys
    sys.path.insert(0, {tests!r})
    from helpers import Regressor, loader
    from trainer import Trainer
    from trainer.loggers import CSVLogger, TensorBoardLogger

    logger = {{"csv": CSVLogger, "tensorboard": TensorBoardLogger}}[sys.argv[1]]("logs")
    trainer = Trainer(max_epochs=2, logger=logger, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, accelerator="cpu", log_every_n_steps=1)
    model, data = Regressor(), loader()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing us
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
    trainer.fit(model, data)
    """
)


def fit_with_file_size_limit(tmp_path: Path, logger: str, limit: int) -> subprocess.CompletedProcess:
    (tmp_path / "fit.py").write_text(SCRIPT.format(tests=str(TESTS)))
    return subprocess.run([sys.executable, "fit.py", logger, str(limit)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=240)  # fmt: skip


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*") if ".tmp" in p.name]


def assert_one_short_error(result: subprocess.CompletedProcess, expected: str) -> None:
    assert result.returncode != 0
    err = result.stderr
    assert expected in err, err
    assert "During handling of the above exception" not in err, err
    assert "Exception in thread" not in err, err
    assert len(err.splitlines()) < 40, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("trainer.loggers.log_files.LogWriteError: Could not write"), last


def test_csv_logger_hparams_write_fails_with_the_file_named_and_no_temporary_left(tmp_path):
    # 16 bytes: hparams.yaml (the first file the run writes) does not fit
    result = fit_with_file_size_limit(tmp_path, "csv", 16)
    assert_one_short_error(result, "Could not write log file 'logs/logs/version_0/hparams.yaml': File too large.")
    folder = tmp_path / "logs" / "logs" / "version_0"
    assert not leftovers(folder), leftovers(folder)
    assert not (folder / "hparams.yaml").exists()


def test_csv_logger_metrics_write_fails_with_the_file_named(tmp_path):
    # 100 bytes: hparams.yaml fits, metrics.csv grows past the limit
    result = fit_with_file_size_limit(tmp_path, "csv", 100)
    assert_one_short_error(result, "Could not write log file 'logs/logs/version_0/metrics.csv': File too large.")
    folder = tmp_path / "logs" / "logs" / "version_0"
    assert not leftovers(folder), leftovers(folder)
    assert "lr: 0.05" in (folder / "hparams.yaml").read_text()  # the file written before is intact


def test_tensorboard_writer_thread_failure_is_one_error_naming_the_folder(tmp_path):
    pytest.importorskip("tensorboard")
    result = fit_with_file_size_limit(tmp_path, "tensorboard", 100)
    assert_one_short_error(result, "Could not write TensorBoard event files in 'logs/logs/version_0': File too large.")
    assert not leftovers(tmp_path / "logs")


@pytest.mark.skipif(not os.access("/dev/full", os.W_OK), reason="needs the /dev/full device")
def test_no_space_left_names_hparams_yaml_and_keeps_the_previous_file(tmp_path):
    path = tmp_path / "version_0" / "hparams.yaml"
    save_hparams_yaml(str(path), {"lr": 0.1})
    # the logger's temporary for this process, made a link to /dev/full: the write fails with ENOSPC
    from trainer.strategies.checkpoint.checkpoint_io import temporary_name

    temporary_name(path).symlink_to("/dev/full")
    with pytest.raises(LogWriteError) as caught:
        save_hparams_yaml(str(path), {"lr": 0.2, "layers": list(range(2000))})
    assert caught.value.errno == errno.ENOSPC
    assert caught.value.log_path == str(path)
    assert str(caught.value).startswith(f"Could not write log file '{path}': No space left on device.")
    assert caught.value.__suppress_context__  # printed alone, not under the writer's own chain
    assert path.read_text() == "lr: 0.1\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["hparams.yaml"]

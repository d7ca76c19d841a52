"""The ``trainer`` command line: config, run (command building), slurm (script writing), env, and misuse."""
from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer.cli import main
from trainer.config.yaml_config import load_config

SCRIPTS = Path(__file__).parent / "scripts"
PYTHON_BIN = Path(sys.executable).parent


def cli(capsys, *argv):
    """Run the command line in this process; returns (status, stdout, stderr)."""
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


# ---------------------------------------------------------------------------------------------- config
def test_config_flags_round_trip(tmp_path, capsys):
    status, out, _ = cli(capsys, "config", "--yes", "-o", "cfg.yaml", "--num-nodes", "2", "--devices", "4",
                         "--node-rank", "1", "--main-address", "10.0.0.1", "--main-port", "1234", "--max-restarts", "2",
                         "--precision", "bf16-mixed", "--strategy", "auto", "--env", "OMP_NUM_THREADS=1",
                         "--env", "A=b=c", "--trainer.max_epochs", "5")  # fmt: skip
    assert status == 0 and "trainer run --config cfg.yaml" in out
    config = load_config("cfg.yaml")
    assert (config.num_nodes, config.devices, config.node_rank, config.main_address, config.main_port,
            config.max_restarts) == (2, 4, 1, "10.0.0.1", 1234, 2)  # fmt: skip
    assert config.env == {"OMP_NUM_THREADS": "1", "A": "b=c"}
    assert config.trainer == {"precision": "bf16-mixed", "strategy": "auto", "max_epochs": 5}


def test_config_defaults_without_a_terminal(tmp_path, capsys):
    assert cli(capsys, "config", "-o", "sub/cfg.yaml")[0] == 0
    config = load_config("sub/cfg.yaml")
    assert (config.num_nodes, config.devices, config.main_port) == (1, 1, None)
    assert config.trainer == {"precision": "32-true", "strategy": "auto"}


def test_config_prompts_on_a_terminal(tmp_path):
    """A real pseudo-terminal: every question is asked, a bad answer is asked again."""
    answers = {"machines": "1", "per machine": "2", "Port": "", "Restart": "1", "Precision": "sixteen",
               "Strategy": "auto", "environment": "OMP_NUM_THREADS=1"}
    pid, fd = pty.fork()
    if pid == 0:  # child: the console script on the terminal
        os.execv(str(PYTHON_BIN / "trainer"), ["trainer", "config", "-o", str(tmp_path / "cfg.yaml")])
    transcript, asked_twice = "", False
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 4096).decode()
            except OSError:
                break
            if not chunk:
                break
            transcript += chunk
            if chunk.rstrip().endswith(":"):
                last = chunk.rstrip().splitlines()[-1]
                if "Precision" in last and "sixteen" in transcript:
                    answer, asked_twice = "16-mixed", True
                else:
                    answer = next(a for key, a in answers.items() if key in last)
                os.write(fd, (answer + "\n").encode())
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, transcript
    assert asked_twice and "is not supported" in transcript, transcript
    config = load_config(tmp_path / "cfg.yaml")
    assert (config.devices, config.max_restarts, config.env) == (2, 1, {"OMP_NUM_THREADS": "1"})
    assert config.trainer["precision"] == "16-mixed"


def test_config_misuse(tmp_path, capsys):
    status, _, err = cli(capsys, "config", "--yes", "--precision", "17")
    assert status == 2 and "precision" in err and "17" in err
    status, _, err = cli(capsys, "config", "--yes", "--strategy", "magic")
    assert status == 2 and "strategy='magic' is not known. Valid values: auto" in err
    status, _, err = cli(capsys, "config", "--yes", "--env", "NOVALUE")
    assert status == 2 and "KEY=VALUE" in err
    status, _, err = cli(capsys, "config", "--yes", "--num-nodes", "2", "--node-rank", "2")
    assert status == 2 and "node_rank=2 must be in 0..1" in err


# ---------------------------------------------------------------------------------------------- run
def test_run_builds_torchrun_command_and_flags_override_the_file(tmp_path, capsys):
    Path("cfg.yaml").write_text("devices: 3\nmax_restarts: 2\nenv: {EXTRA: x}\ntrainer: {max_epochs: 2}\n")
    status, out, _ = cli(capsys, "run", "--config", "cfg.yaml", "--devices", "2", "--trainer.max_steps=4",
                         "--dry-run", str(SCRIPTS / "report.py"), "--lr", "3", "--trainer.kept", "1")  # fmt: skip
    assert status == 0
    assert "-m torch.distributed.run --standalone --nnodes 1 --nproc-per-node 2 --max-restarts 2 " in out
    assert out.rstrip().endswith("report.py --lr 3 --trainer.kept 1")  # the script's own arguments pass through
    assert "EXTRA=x" in out and f"TRAINER_CONFIG={Path('cfg.yaml').resolve()}" in out
    assert """TRAINER_ARGS='{"devices": 2, "max_steps": 4}'""" in out


def test_run_multi_node_uses_static_rendezvous(tmp_path, capsys):
    status, out, _ = cli(capsys, "run", "--num-nodes", "2", "--node-rank", "1", "--main-address", "node1",
                         "--dry-run", str(SCRIPTS / "report.py"))  # fmt: skip
    assert status == 0
    assert "--nnodes 2 --node-rank 1 --master-addr node1 --master-port 29500 --nproc-per-node 1" in out


def test_run_misuse(tmp_path, capsys):
    status, _, err = cli(capsys, "run", "--num-nodes", "2", "--node-rank", "2", "--main-address", "h", "x.py")
    assert status == 2 and "--node-rank 2 is out of range for --num-nodes 2" in err
    status, _, err = cli(capsys, "run", "--num-nodes", "2", str(SCRIPTS / "report.py"))
    assert status == 2 and "needs --main-address" in err
    status, _, err = cli(capsys, "run", "missing.py")
    assert status == 2 and "script 'missing.py' does not exist" in err
    status, _, err = cli(capsys, "run", "--trainer.max_epoch", "3", "x.py")
    assert status == 2 and "Did you mean 'max_epochs'?" in err
    Path("bad.yaml").write_text("devices: [\n")
    status, _, err = cli(capsys, "run", "--config", "bad.yaml", "x.py")
    assert status == 2 and "bad.yaml' is not valid YAML at line 2" in err
    with pytest.raises(SystemExit):
        main(["run", "--devices", "0", "x.py"])
    assert "0 must be >= 1" in capsys.readouterr().err


def test_run_starts_two_processes_through_torchrun(tmp_path):
    """``python -m trainer run`` really launches: two workers with torchrun's variables and the launcher's."""
    Path("cfg.yaml").write_text("devices: 2\nenv: {EXTRA: from-config}\n")
    env = dict(os.environ, OUT_DIR=str(tmp_path / "out"))
    result = subprocess.run([sys.executable, "-m", "trainer", "run", "--config", "cfg.yaml", "--trainer.max_epochs", "2",
                             str(SCRIPTS / "report.py"), "a b"], env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    reports = [json.loads((tmp_path / "out" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [(r["RANK"], r["LOCAL_RANK"], r["WORLD_SIZE"]) for r in reports] == [("0", "0", "2"), ("1", "1", "2")]
    assert all(r["EXTRA"] == "from-config" and r["argv"] == ["a b"] for r in reports)
    assert json.loads(reports[0]["TRAINER_ARGS"]) == {"devices": 2, "max_epochs": 2}


def test_run_max_restarts_reaches_the_elastic_agent(tmp_path):
    env = dict(os.environ, OUT_DIR=str(tmp_path / "out"), FAIL_FIRST_ATTEMPT="1")
    command = [sys.executable, "-m", "trainer", "run", "--devices", "2", str(SCRIPTS / "report.py")]
    failed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert failed.returncode != 0 and not (tmp_path / "out").exists()
    restarted = subprocess.run(command[:4] + ["--max-restarts", "1"] + command[4:], env=env, capture_output=True,
                               text=True, timeout=120)  # fmt: skip
    assert restarted.returncode == 0, restarted.stderr
    reports = [json.loads((tmp_path / "out" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [r["TORCHELASTIC_RESTART_COUNT"] for r in reports] == ["1", "1"]


# ---------------------------------------------------------------------------------------------- slurm
def test_slurm_writes_the_sbatch_script(tmp_path, capsys):
    status, out, _ = cli(capsys, "slurm", str(SCRIPTS / "report.py"), "--nodes", "2", "--devices-per-node", "4",
                         "--time", "04:00:00", "--partition", "p", "--account", "a", "--trainer.max_epochs", "3",
                         "--sbatch=--qos=high", "--", "--lr", "0.1")  # fmt: skip
    assert status == 0 and "sbatch report.sbatch" in out
    text = Path("report.sbatch").read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --time=04:00:00", "#SBATCH --partition=p", "#SBATCH --account=a",
                 "#SBATCH --signal=USR1@90", "#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --qos=high"):  # fmt: skip
        assert line in text.splitlines()
    assert f"srun --kill-on-bad-exit=1 {sys.executable} {SCRIPTS / 'report.py'} --lr 0.1" in text
    variables = re.search(r"export TRAINER_ARGS='(.*)'", text).group(1)
    assert json.loads(variables) == {"devices": 4, "num_nodes": 2, "accelerator": "gpu", "max_epochs": 3}


def test_slurm_cpu_and_config_defaults(tmp_path, capsys):
    Path("cfg.yaml").write_text("num_nodes: 3\ndevices: 2\nenv: {EXTRA: 'x y'}\n")
    status, _, _ = cli(capsys, "slurm", str(SCRIPTS / "report.py"), "--config", "cfg.yaml", "--accelerator", "cpu",
                       "--signal", "SIGUSR2@30", "--no-requeue", "-o", "job.sh")  # fmt: skip
    text = Path("job.sh").read_text()
    assert status == 0 and "#SBATCH --nodes=3" in text and "#SBATCH --ntasks-per-node=2" in text
    assert "gpus-per-node" not in text and "--requeue" not in text and "#SBATCH --signal=USR2@30" in text
    assert "export EXTRA='x y'" in text and f"export TRAINER_CONFIG={Path('cfg.yaml').resolve()}" in text


def test_slurm_misuse(tmp_path, capsys, monkeypatch):
    script = str(SCRIPTS / "report.py")
    status, _, err = cli(capsys, "slurm", script, "--time", "4h")
    assert status == 2 and "--time '4h' is not a SLURM time limit" in err
    status, _, err = cli(capsys, "slurm", script, "--signal", "B:USR1@90")
    assert status == 2 and "'B:' signals only the batch shell" in err
    status, _, err = cli(capsys, "slurm", script, "--signal", "NOPE@3")
    assert status == 2 and "--signal 'NOPE@3' is not understood" in err
    status, _, err = cli(capsys, "slurm", script, "--devices-per-node", "2", "--trainer.devices", "1")
    assert status == 2 and "--trainer.devices 1 contradicts the launch's devices=2" in err
    status, _, err = cli(capsys, "slurm", "missing.py")
    assert status == 2 and "does not exist" in err
    monkeypatch.setenv("PATH", str(tmp_path))
    status, _, err = cli(capsys, "slurm", script, "--submit")
    assert status == 2 and "--submit needs `sbatch`, which is not on PATH" in err


# ---------------------------------------------------------------------------------------------- env
def test_env_reports_versions_devices_and_cluster(capsys, monkeypatch):
    monkeypatch.setenv("TRAINER_ARGS", '{"devices": 2}')
    status, out, _ = cli(capsys, "env", "--json")
    info = json.loads(out)
    assert status == 0 and info["trainer"] and info["torch"] and "gloo" in info["backends"]
    assert "auto" in info["strategies"] and info["environment"]["TRAINER_ARGS"] == '{"devices": 2}'
    assert "name" in info["cluster"]
    status, out, _ = cli(capsys, "env")
    assert status == 0 and out.startswith("trainer")


def test_env_inside_a_torchrun_job_reports_its_ranks(tmp_path):
    result = subprocess.run([sys.executable, "-m", "trainer", "run", "--module", "trainer", "env", "--json"],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    cluster = json.loads(result.stdout)["cluster"]
    assert (cluster["name"], cluster["world_size"], cluster["global_rank"]) == ("TorchElasticEnvironment", 1, 0)

"""ft_ddp / ft_hsdp set-up: misuse is refused with a message saying what to change, and nothing of torchft is
imported until a fault-tolerant strategy sets up (these need no torchft)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from trainer.strategies import ConfigurationError, FaultTolerantStrategy


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"min_replicas": 0}, "min_replicas=0 must be a whole number >= 1"),
    ({"mode": "async"}, "mode='async' is not known"),
    ({"sync_every": 0}, "sync_every=0"),
    ({"ft_timeout": -1}, "ft_timeout=-1 must be a positive number of seconds"),
])  # fmt: skip
def test_bad_options_are_refused_naming_them(kwargs, words):
    with pytest.raises(ConfigurationError, match=words):
        FaultTolerantStrategy(**kwargs)


def test_a_group_without_its_id_or_lighthouse_is_told_where_they_come_from(monkeypatch):
    for name in ("REPLICA_GROUP_ID", "NUM_REPLICA_GROUPS", "TORCHFT_LIGHTHOUSE"):
        monkeypatch.delenv(name, raising=False)
    strategy = FaultTolerantStrategy()
    with pytest.raises(ConfigurationError, match="REPLICA_GROUP_ID.*--replica-groups"):
        strategy.replica_id
    with pytest.raises(ConfigurationError, match="TORCHFT_LIGHTHOUSE.*trainer lighthouse"):
        strategy.lighthouse
    with pytest.raises(ConfigurationError, match="replica id 3 is not below the number of replica groups \\(2\\)"):
        FaultTolerantStrategy(replica_id=3, num_replica_groups=2).num_replica_groups
    monkeypatch.setenv("REPLICA_GROUP_ID", "one")
    with pytest.raises(ConfigurationError, match="REPLICA_GROUP_ID='one' must be a whole number"):
        FaultTolerantStrategy().replica_id


def test_each_group_reads_its_own_shard():
    strategy = FaultTolerantStrategy(replica_id=1, num_replica_groups=3)
    assert strategy.distributed_sampler_kwargs == {"num_replicas": 3, "rank": 1}  # one process per group here


def test_choosing_ft_ddp_imports_no_torchft_until_it_sets_up():
    code = ("import sys, trainer; from trainer import Trainer; Trainer(strategy='ft_ddp', accelerator='cpu', "
            "devices=1, logger=False); print(sorted(m for m in sys.modules if m.startswith('torchft')))")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(("argv", "words"), [
    (["--replica-groups", "0"], "--replica-groups 0 must be at least 1"),
    (["--replica-groups", "2", "--min-replicas", "3"], "--min-replicas 3 must be between 1 and --replica-groups 2"),
    (["--min-replicas", "2"], "--min-replicas and --lighthouse-port go with --replica-groups N"),
    (["--replica-groups", "2", "--num-nodes", "2", "--main-address", "node0"], "one `trainer run` per group"),
])  # fmt: skip
def test_trainer_run_refuses_replica_group_misuse(argv, words, capsys):
    from pathlib import Path

    from trainer.cli import main

    script = str(Path(__file__).parent / "scripts" / "ft_group.py")
    assert main(["run", *argv, script]) == 2
    assert words in capsys.readouterr().err

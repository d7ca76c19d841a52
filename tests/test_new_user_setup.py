"""What a new user meets first: the README's set-up, `trainer --version`, `trainer config` next to a file they wrote,
the launching page's list of commands, a pipeline split named the short way, and DeepSpeed's build folder."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from trainer import ConfigurationError, __version__
from trainer.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[1]


def test_readme_says_how_to_use_the_environment_make_installed():
    readme = (ROOT / "README.md").read_text()
    assert "source .venv/bin/activate" in readme and ".venv/bin/trainer" in readme


def test_trainer_version():
    result = subprocess.run([sys.executable, "-m", "trainer", "--version"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"trainer {__version__} ") and f"torch {torch.__version__}" in result.stdout


def test_config_never_replaces_an_existing_file_unless_forced(tmp_path, capsys):
    path = tmp_path / "trainer.yaml"
    hand_written = "devices: 2\nmodel: {hidden: 512}  # written by hand\n"
    path.write_text(hand_written)
    assert main(["config", "--yes", "-o", str(path), "--devices", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trainer config: error: {path} exists") and "--force" in err and "-o FILE" in err
    assert path.read_text() == hand_written
    assert main(["config", "--yes", "-o", str(path), "--devices", "1", "--force"]) == 0
    assert "devices: 1" in path.read_text()


def test_launching_page_lists_every_command():
    page = (ROOT / "docs" / "launching.md").read_text()
    words = {4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}
    assert f"has {words[len(COMMANDS)]} commands" in page
    for command in COMMANDS:
        assert f"| `trainer {command.replace('_', '-')}" in page, command


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn, self.mlp = nn.Linear(8, 8), nn.Linear(8, 8)


class GPT(nn.Module):
    """nanoGPT's module names: transformer.{wte, wpe, drop, h.0..h.7, ln_f}, lm_head."""

    def __init__(self) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(16, 8), wpe=nn.Embedding(8, 8), drop=nn.Dropout(),
                                              h=nn.ModuleList(Block() for _ in range(8)), ln_f=nn.LayerNorm(8)))  # fmt: skip
        self.lm_head = nn.Linear(8, 16)


def test_pipeline_boundaries_named_by_their_tail_get_the_full_paths():
    from trainer.strategies.nd.pipeline_stages import module_stages

    with pytest.raises(ConfigurationError) as caught:
        module_stages(GPT(), ["h.2", "h.4", "h.6"])
    assert str(caught.value).endswith("did you mean ['transformer.h.2', 'transformer.h.4', 'transformer.h.6']?")


def test_pipeline_suggestion_lists_exactly_the_boundaries_needed():
    from trainer.strategies.nd.pipeline_stages import module_stages

    with pytest.raises(ConfigurationError) as caught:
        module_stages(GPT(), ["first", "second", "third"])
    suggested = eval(re.search(r"e\.g\. (\[.*?\])", str(caught.value)).group(1))  # noqa: S307 - our own message
    assert len(suggested) == 3 and all(name.startswith("transformer.h.") for name in suggested), suggested
    assert max(module_stages(GPT(), suggested).values()) == 3  # the suggestion works as given: 4 stages


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_makefile_and_tests_build_torch_extensions_in_the_same_private_folder():
    env = {k: v for k, v in os.environ.items() if k != "TORCH_EXTENSIONS_DIR"}
    result = subprocess.run(["make", "-s", "--eval=print-ext: ; @echo $(TORCH_EXTENSIONS_DIR)", "print-ext",
                             f"VENV={sys.prefix}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    made = result.stdout.strip()
    assert made == str(Path(sys.prefix).resolve() / "torch_extensions"), result
    conftest = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, 'tests'); import conftest, os; "
                               "print(os.environ['TORCH_EXTENSIONS_DIR'])"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
    assert Path(conftest.stdout.strip()).resolve() == Path(made), conftest.stderr


def test_a_lock_left_by_a_killed_extension_build_is_removed(tmp_path):
    from trainer.strategies.data_parallel.deepspeed import STALE_LOCK_SECONDS, remove_stale_build_locks

    killed, running = tmp_path / "deepspeed_shm_comm" / "lock", tmp_path / "other_op" / "lock"
    for lock in (killed, running):
        lock.parent.mkdir()
        lock.touch()
    old = time.time() - STALE_LOCK_SECONDS - 60
    os.utime(killed, (old, old))
    assert remove_stale_build_locks(str(tmp_path)) == [str(killed)]
    assert not killed.exists() and running.exists()  # a build in progress keeps its lock

"""Experiment files: Trainer.from_config, unknown keys, bad YAML, and defaults from a launcher."""
from __future__ import annotations

import json
import warnings

import pytest

from trainer.strategies.errors import ConfigurationError
from trainer import Trainer
from trainer.config.yaml_config import ENV_ARGS, ENV_CONFIG, load_config

QUIET = dict(enable_progress_bar=False, enable_model_summary=False, logger=False, enable_checkpointing=False)


def write(path, text):
    path.write_text(text)
    return path


def test_from_config_builds_the_trainer_from_the_trainer_section(tmp_path):
    cfg = write(tmp_path / "exp.yaml", """
devices: 1
trainer:
  max_epochs: 3
  accumulate_grad_batches: 2
  gradient_clip_val: 0.5
  accelerator: cpu
model: {hidden: 8}
""")
    trainer = Trainer.from_config(cfg, **QUIET)
    assert (trainer.max_epochs, trainer.accumulate_grad_batches, trainer.gradient_clip_val) == (3, 2, 0.5)
    assert load_config(cfg).model == {"hidden": 8}


def test_precedence_defaults_then_file_then_launcher_flags(tmp_path, monkeypatch):
    cfg = write(tmp_path / "exp.yaml", "trainer: {max_epochs: 3, max_steps: 7}\n")
    monkeypatch.setenv(ENV_ARGS, json.dumps({"max_steps": 5}))
    trainer = Trainer.from_config(cfg, max_epochs=1, min_epochs=1, **QUIET)
    assert (trainer.max_epochs, trainer.min_epochs, trainer.max_steps) == (3, 1, 5)


def test_class_path_entries_are_built(tmp_path):
    cfg = write(tmp_path / "exp.yaml", """
trainer:
  callbacks:
    - class_path: trainer.callbacks.Callback
""")
    from trainer.callbacks import Callback

    trainer = Trainer.from_config(cfg, **QUIET)
    assert sum(type(cb) is Callback for cb in trainer.callbacks) == 1


def test_unknown_keys_list_the_valid_ones(tmp_path):
    with pytest.raises(ConfigurationError, match=r"unknown key 'max_epoch'. Did you mean 'max_epochs'\?.*Valid keys: .*precision"):
        Trainer.from_config(write(tmp_path / "a.yaml", "trainer: {max_epoch: 3}\n"))
    with pytest.raises(ConfigurationError, match=r"unknown key 'nodes'. Did you mean 'num_nodes'\?.*Valid keys: num_nodes, devices"):
        load_config(write(tmp_path / "b.yaml", "nodes: 2\n"))
    with pytest.raises(ConfigurationError, match=r"unknown key 'max_epochs'.*Trainer arguments go under 'trainer:'"):
        load_config(write(tmp_path / "c.yaml", "max_epochs: 2\n"))


def test_bad_yaml_names_file_line_and_column(tmp_path):
    cfg = write(tmp_path / "bad.yaml", "trainer:\n  max_epochs: 3\n   precision: 16\n")
    with pytest.raises(ConfigurationError, match=r"bad.yaml' is not valid YAML at line 3, column \d+"):
        load_config(cfg)
    with pytest.raises(ConfigurationError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigurationError, match="top level must be a mapping"):
        load_config(write(tmp_path / "list.yaml", "- 1\n- 2\n"))


def test_wrong_types_are_named(tmp_path):
    with pytest.raises(ConfigurationError, match=r"devices='two' must be an int >= 1"):
        load_config(write(tmp_path / "a.yaml", "devices: two\n"))
    with pytest.raises(ConfigurationError, match=r"'trainer' must be a mapping"):
        load_config(write(tmp_path / "b.yaml", "trainer: 3\n"))
    with pytest.raises(ConfigurationError, match=r"devices=2 \(launch\) and trainer.devices=1 disagree"):
        Trainer.from_config(write(tmp_path / "c.yaml", "devices: 2\ntrainer: {devices: 1}\n"))
    with pytest.raises(ConfigurationError, match="class_path 'nowhere.Thing' cannot be imported"):
        Trainer.from_config(write(tmp_path / "d.yaml", "trainer: {callbacks: [{class_path: nowhere.Thing}]}\n"))


def test_a_launched_process_takes_the_launchers_settings_as_defaults(tmp_path, monkeypatch):
    cfg = write(tmp_path / "exp.yaml", "trainer: {max_epochs: 4, accelerator: cpu}\n")
    monkeypatch.setenv(ENV_CONFIG, str(cfg))
    monkeypatch.setenv(ENV_ARGS, json.dumps({"max_steps": 9}))
    trainer = Trainer(**QUIET)
    assert (trainer.max_epochs, trainer.max_steps) == (4, 9)
    with pytest.warns(UserWarning, match=r"launcher set Trainer max_steps=9 .* script passes max_steps=2"):
        trainer = Trainer(max_steps=2, **QUIET)
    assert trainer.max_steps == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Trainer.from_config(**QUIET).max_steps == 9  # from_config merges once: no warning

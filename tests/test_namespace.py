"""The framework lives under one namespace, ``trainer``: a user's own ``callbacks.py``, ``loggers.py`` or
``strategies.py`` cannot shadow it, the distribution installs no top-level name but ``trainer``, and in a source
checkout the short names are aliases of the very same modules."""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIBLINGS = ("callbacks", "loggers", "strategies")


def _run(code: str, cwd: Path, timeout: int = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the checkout, after the script's own folder (as a user has it)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_a_users_own_callbacks_loggers_and_strategies_files_do_not_break_a_fit(tmp_path):
    for name in SIBLINGS:
        (tmp_path / f"{name}.py").write_text(f"MINE = '{name}'\n")
    code = (
        "import callbacks, loggers, strategies\n"
        "import torch\n"
        "from trainer import Trainer, TrainModule\n"
        "from trainer.callbacks import ModelCheckpoint\n"
        "from trainer.loggers import CSVLogger\n"
        "class M(TrainModule):\n"
        "    def __init__(self):\n        super().__init__(); self.l = torch.nn.Linear(2, 1)\n"
        "    def training_step(self, batch, batch_idx):\n        return self.l(batch[0]).pow(2).mean()\n"
        "    def configure_optimizers(self):\n        return torch.optim.SGD(self.parameters(), lr=0.1)\n"
        "data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2)), batch_size=4)\n"
        "t = Trainer(max_epochs=1, logger=CSVLogger('logs'), callbacks=[ModelCheckpoint()],\n"
        "            enable_progress_bar=False, enable_model_summary=False)\n"
        "t.fit(M(), data)\n"
        "assert (callbacks.MINE, loggers.MINE, strategies.MINE) == ('callbacks', 'loggers', 'strategies')\n"
        "print('steps', t.global_step)\n"
    )
    result = _run(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "steps 2" in result.stdout


def test_config_class_paths_find_a_users_own_module_first_and_our_old_short_names_too(tmp_path):
    (tmp_path / "callbacks.py").write_text("from trainer.callbacks import Callback\nclass Mine(Callback):\n    pass\n")
    (tmp_path / "exp.yaml").write_text(
        "trainer:\n  callbacks:\n    - class_path: callbacks.Mine\n"
        "    - class_path: callbacks.EarlyStopping\n      init_args: {monitor: val_loss}\n"
        "    - class_path: trainer.callbacks.Timer\n"
    )
    code = (
        "from trainer import Trainer\n"
        "t = Trainer.from_config('exp.yaml', logger=False, enable_progress_bar=False)\n"
        "print(sorted(type(cb).__module__ + '.' + type(cb).__name__ for cb in t.callbacks))\n"
    )
    result = _run(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "'callbacks.Mine'" in result.stdout  # the user's own module, as written
    assert "'trainer.callbacks.early_stopping.EarlyStopping'" in result.stdout  # the old short name, read as ours
    assert "'trainer.callbacks.timer.Timer'" in result.stdout


def test_the_short_names_in_a_checkout_are_the_same_modules_not_copies():
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n    import callbacks\nexcept DeprecationWarning as w:\n    assert 'trainer.callbacks' in str(w); print('warned')\n"
        "warnings.simplefilter('ignore')\n"
        "import strategies.data_parallel.ddp, trainer.strategies.data_parallel.ddp\n"
        "from callbacks.model_checkpoint import ModelCheckpoint as A\n"
        "from trainer.callbacks import ModelCheckpoint as B\n"
        "from loggers import CSVLogger as C\n"
        "from trainer.loggers.csv_logger import CSVLogger as D\n"
        "assert A is B and C is D and strategies.data_parallel.ddp is trainer.strategies.data_parallel.ddp\n"
        "assert A.__module__ == 'trainer.callbacks.model_checkpoint'\n"
    )
    result = _run(code, ROOT)
    assert result.returncode == 0, result.stderr
    assert "warned" in result.stdout


def test_the_framework_imports_itself_only_through_the_trainer_namespace():
    bare = []
    for top in ("trainer", *SIBLINGS):
        for path in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) and not node.level else [])
                bare += [f"{path.relative_to(ROOT)}: {n}" for n in names if n and n.split(".")[0] in SIBLINGS]
    assert not bare, "import these as trainer.<name>:\n" + "\n".join(bare)


@pytest.mark.timeout(300)
def test_the_wheel_installs_only_the_trainer_package_under_our_own_distribution_name(tmp_path):
    source = tmp_path / "source"  # a copy: building writes build/ and *.egg-info beside the sources
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "*.egg-info", "__pycache__", "logs", "runs", "lightning_logs", ".pytest_cache"))
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(source)],
        capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob("*.whl")
    assert wheel.name.startswith("trainwright-")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"trainer", "trainwright"}, tops  # trainwright: the alias for projects with their own trainer.py
    for sibling in SIBLINGS:
        assert f"trainer/{sibling}/__init__.py" in names
    assert "trainer/strategies/launch/environments/__init__.py" in names  # nested packages come along
    assert "trainer/py.typed" in names


def test_import_trainer_loads_no_heavy_optional_module():
    """``import trainer`` stays cheap (benchmarks/import_time.py's target): Dynamo, inductor, DTensor, tensorboard and
    the other heavy parts load when a run uses them, never at import (a decorator applied at import time did); so do
    the cluster libraries (Ray, submitit, Kubernetes' client, YAML for ``trainer k8s``)."""
    code = (
        "import sys, torch\nbefore = set(sys.modules)\nimport trainer\n"
        "heavy = ['torch._dynamo', 'torch._inductor', 'torch.distributed.tensor', 'tensorboard', 'torchmetrics', 'rich',\n"
        "         'ray', 'submitit', 'kubernetes', 'yaml']\n"
        "print([m for m in heavy if m in sys.modules and m not in before])\n"
    )
    result = _run(code, ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout


def test_a_project_with_its_own_trainer_py_imports_the_framework_as_trainwright(tmp_path):
    """Fabric's "build your own trainer" example: the user's trainer.py imports the framework; the script imports
    the user's trainer.py. ``trainwright`` is the framework (the same modules), ``trainer`` stays the user's."""
    (tmp_path / "trainer.py").write_text(
        "from trainwright.fabric import Fabric\n\n"
        "class MyCustomTrainer:\n"
        "    def __init__(self):\n"
        "        self.fabric = Fabric(accelerator='cpu', devices=1)\n"
    )
    code = (
        "import sys\n"
        "from trainer import MyCustomTrainer\n"
        "import trainer, trainwright\n"
        "from trainwright.callbacks import ModelCheckpoint\n"
        "from trainwright import Trainer\n"
        "from trainwright.demos import BoringModel\n"
        "assert trainer.__file__.endswith('trainer.py') and hasattr(trainer, 'MyCustomTrainer')\n"
        "assert type(MyCustomTrainer().fabric).__module__ == 'trainer.fabric.fabric'\n"
        "assert sys.modules['trainwright.fabric'] is sys.modules['trainer.fabric'] and trainwright.Trainer is Trainer\n"
        "Trainer(accelerator='cpu', max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,\n"
        "        enable_model_summary=False).fit(BoringModel())\n"
        "print('ok')\n"
    )
    result = _run(code, tmp_path)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr


def test_trainwright_is_the_trainer_package_itself():
    code = ("import trainwright, trainer\nfrom trainwright.fabric import Fabric\nimport trainer.fabric\n"
            "assert trainwright is trainer and Fabric is trainer.fabric.Fabric\n"
            "assert trainer.fabric.__spec__.name == 'trainer.fabric'\nprint('ok')\n")  # fmt: skip
    result = _run(code, ROOT)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr

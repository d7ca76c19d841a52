"""examples/hf/run_clm.py (transformers' run_clm_no_trainer, tiny, only the import changed) runs on the Engine, and
its saved folder loads with ``from_pretrained`` in a process without this framework, giving the same eval loss."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from test_ddp_processes import clean_env
from test_examples import EXAMPLES, run_example

pytest.importorskip("transformers", reason="transformers is not installed (the hf extra, installed by make test)")
pytest.importorskip("datasets", reason="datasets is not installed (the data extra, installed by make test)")

EXAMPLE = EXAMPLES / "hf" / "run_clm.py"



def test_only_the_import_names_this_framework():
    imports = [line for line in EXAMPLE.read_text().splitlines() if line.startswith(("from ", "import ")) and "trainer" in line]
    assert imports == ["from trainer.accelerate import Accelerator", "from trainer.accelerate.utils import set_seed"]


@pytest.mark.timeout(300)
def test_run_clm_trains_saves_state_and_its_folder_loads_with_from_pretrained(tmp_path):
    out = run_example("hf/run_clm.py", "--output_dir", str(tmp_path / "out"), cwd=tmp_path)
    losses = [float(x) for x in re.findall(r"^step \d+: loss ([0-9.]+)$", out, re.MULTILINE)]
    evals = [float(x) for x in re.findall(r"eval_loss: ([0-9.]+)$", out, re.MULTILINE)]
    assert len(losses) == 24 and len(evals) == 2  # 2 epochs x 12 optimizer steps (accumulating 2 batches)
    assert evals[1] < evals[0] and sum(losses[-4:]) < sum(losses[:4])
    assert (tmp_path / "out" / "epoch_0").is_dir() and (tmp_path / "out" / "epoch_1").is_dir()  # save_state
    check = f"""
import sys, torch
from transformers import AutoModelForCausalLM, default_data_collator
assert "trainer" not in sys.modules
model = AutoModelForCausalLM.from_pretrained({str(tmp_path / 'out')!r}).eval()
print("loaded", model.lm_head.weight is model.transformer.wte.weight)
"""
    env = {k: v for k, v in clean_env().items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0 and "loaded True" in done.stdout, done.stderr[-3000:]

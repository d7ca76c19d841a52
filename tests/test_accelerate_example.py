"""examples/accelerate_nlp.py (Accelerate's nlp_example.py with only its imports changed) runs in one process and
in two (`trainer run --devices 2`, as `accelerate launch --num_processes 2`), evaluating every sample once."""
from __future__ import annotations

import ast
import re
import sys

import pytest

from test_examples import EXAMPLES, run_example
from launching import finish, start
from test_ddp_processes import clean_env

EXAMPLE = EXAMPLES / "accelerate_nlp.py"


def epochs(output: str) -> list[dict]:
    return [ast.literal_eval(line) for line in re.findall(r"^epoch \d+: (\{.*\})$", output, re.MULTILINE)]


def test_only_the_imports_name_this_framework():
    imports = [line for line in EXAMPLE.read_text().splitlines() if line.startswith(("from ", "import ")) and "trainer" in line]
    assert imports == ["from trainer.accelerate import Accelerator, DistributedType",
                       "from trainer.accelerate.utils import set_seed"]  # fmt: skip


@pytest.mark.timeout(300)
def test_one_process(tmp_path):
    results = epochs(run_example("accelerate_nlp.py", "--cpu", cwd=tmp_path))
    assert len(results) == 3 and all(result["samples"] == 100 for result in results)
    assert results[-1]["accuracy"] > 0.75  # chance is 0.5


@pytest.mark.timeout(300)
def test_two_processes(tmp_path):
    command = [sys.executable, "-m", "trainer", "run", "--devices", "2", str(EXAMPLE), "--cpu"]
    output = finish(start(command, clean_env(), tmp_path), 240)
    results = epochs(output)  # printed by rank 0 only
    # 100 samples: 2 rounds of 2 batches of 32, less the 28 repeated to even out the last round
    assert len(results) == 3 and all(result["samples"] == 100 for result in results)
    assert results[-1]["accuracy"] > 0.7

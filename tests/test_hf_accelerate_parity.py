"""examples/hf/run_clm.py (transformers' run_clm_no_trainer, tiny: ``get_scheduler``, ``accelerator.accumulate``,
``save_state``, ``unwrap_model(...).save_pretrained(save_function=accelerator.save)``) run twice, as it is on
``trainer.accelerate`` and as a copy whose only change is the import going back to the real ``accelerate``: the
per-step losses, the eval losses and the saved folders are bit-identical, in one process and in two (gloo)."""
from __future__ import annotations

import re
import socket
import sys
from pathlib import Path

import pytest
import torch

from launching import run
from test_ddp_processes import clean_env

pytest.importorskip("transformers", reason="transformers is not installed (the hf extra, installed by make test)")
pytest.importorskip("datasets", reason="datasets is not installed (the data extra, installed by make test)")
pytest.importorskip("accelerate", reason="accelerate is not installed (the peers extra, installed by make test)")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hf" / "run_clm.py"
TIMEOUT_S = 240  # one run takes ~20 s here
OURS_IMPORTS = ("from trainer.accelerate import Accelerator", "from trainer.accelerate.utils import set_seed")
REAL_IMPORTS = ("from accelerate import Accelerator", "from accelerate.utils import set_seed")


def _with_real_accelerate(directory: Path) -> Path:
    """The copy a user makes to go back: the example with only its two imports switched to ``accelerate``."""
    text = EXAMPLE.read_text()
    for ours, real in zip(OURS_IMPORTS, REAL_IMPORTS):
        assert text.count(ours + "\n") == 1, f"{EXAMPLE} no longer imports {ours!r}"
        text = text.replace(ours + "\n", real + "\n")
    copy = directory / "run_clm_accelerate.py"
    copy.write_text(text)
    return copy


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(tmp_path: Path) -> dict[str, str]:
    # HF_HOME in tmp: no accelerate config file of this machine's user is read by `accelerate launch`. Both sides on
    # CPU processes, also on a machine with GPUs (the comparison is of the loops, not of kernels).
    return clean_env(HF_HOME=str(tmp_path / "hf_home"), HF_DATASETS_CACHE=str(tmp_path / "datasets_cache"),
                     CUDA_VISIBLE_DEVICES="")  # fmt: skip


def _metrics(output: str) -> tuple[list[str], list[str]]:
    """The printed per-step losses (``repr`` of the float: exact) and the per-epoch eval losses."""
    losses = re.findall(r"^step \d+: loss (\S+)$", output, re.MULTILINE)
    evals = re.findall(r"eval_loss: (\S+)$", output, re.MULTILINE)
    return losses, evals


def _assert_same_folders(ours: Path, real: Path) -> None:
    """Both folders load with ``from_pretrained``, with the same weights bit for bit and the same logits."""
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(ours).eval()
    b = AutoModelForCausalLM.from_pretrained(real).eval()
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    different = [name for name in sa if not torch.equal(sa[name], sb[name])]
    assert not different, f"weights differ from Accelerate's: {different}"
    tokens = torch.arange(32).reshape(2, 16) % a.config.vocab_size
    with torch.no_grad():
        assert torch.equal(a(tokens).logits, b(tokens).logits)
    for epoch in (0, 1):  # save_state ran in both (each in its own format)
        assert (ours / f"epoch_{epoch}").is_dir() and (real / f"epoch_{epoch}").is_dir()


@pytest.mark.timeout(2 * TIMEOUT_S + 60)
def test_one_process_gives_accelerates_losses_and_folder_bit_for_bit(tmp_path):
    env = _env(tmp_path)
    real_script = _with_real_accelerate(tmp_path)
    ours = run([sys.executable, str(EXAMPLE), "--output_dir", str(tmp_path / "ours")], TIMEOUT_S, env, tmp_path)
    real = run([sys.executable, str(real_script), "--output_dir", str(tmp_path / "real")], TIMEOUT_S, env, tmp_path)
    (losses, evals), (real_losses, real_evals) = _metrics(ours), _metrics(real)
    assert len(real_losses) == 24 and len(real_evals) == 2  # 2 epochs x 12 updates (accumulating 2 batches)
    assert losses == real_losses and evals == real_evals
    _assert_same_folders(tmp_path / "ours", tmp_path / "real")


@pytest.mark.timeout(2 * TIMEOUT_S + 60)
def test_two_processes_trainer_run_gives_accelerate_launchs_losses_and_folder(tmp_path):
    """``trainer run --devices 2`` against ``accelerate launch --num_processes 2``. On a CPU machine Accelerate's
    ``--cpu`` launches one process (or mpirun); ``--multi_gpu`` with ``ACCELERATE_USE_CPU`` is its torchrun + gloo."""
    env = _env(tmp_path)
    real_script = _with_real_accelerate(tmp_path)
    ours = run([sys.executable, "-m", "trainer", "run", "--devices", "2", str(EXAMPLE),
                "--output_dir", str(tmp_path / "ours")], TIMEOUT_S, env, tmp_path)  # fmt: skip
    real = run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", str(_free_port()), str(real_script), "--output_dir", str(tmp_path / "real")],
               TIMEOUT_S, dict(env, ACCELERATE_USE_CPU="true"), tmp_path)  # fmt: skip
    (losses, evals), (real_losses, real_evals) = _metrics(ours), _metrics(real)
    assert len(real_losses) == 12 and len(real_evals) == 2  # each rank reads half of the batches
    assert losses == real_losses and evals == real_evals
    _assert_same_folders(tmp_path / "ours", tmp_path / "real")

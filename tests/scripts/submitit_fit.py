"""What the submitit test submits: ``scripts/train.py`` run as a function in each task of a submitit SLURM job."""
import runpy
import sys
from pathlib import Path

TRAIN = Path(__file__).resolve().parent / "train.py"


def fit(*argv: str) -> None:
    """Run ``train.py ARGV`` in this process (each SLURM task's Trainer joins the job through SLURM's variables)."""
    sys.argv = [str(TRAIN), *argv]
    runpy.run_path(str(TRAIN), run_name="__main__")

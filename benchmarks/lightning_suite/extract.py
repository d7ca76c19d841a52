"""Step 1: take Lightning's test package out of a git checkout or bare mirror at a tag."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

from files import HALVES, TEST_PACKAGE

#: Where the test package sits in Lightning's repository.
REPO_TESTS_DIR = "tests/" + TEST_PACKAGE


def extract_tests(repo: Path, tag: str, dest: Path) -> Path:
    """Write ``tests/tests_pytorch`` of ``repo`` at ``tag`` under ``dest`` (replacing what was there).

    Returns the extracted package folder, ``dest / "tests_pytorch"``. The whole package is taken (a few MB):
    Lightning's own conftest and helpers import from across it, and the baseline run needs them as they are.
    """
    try:
        blob = subprocess.run(
            ["git", "-C", str(repo), "archive", "--format=tar", tag, REPO_TESTS_DIR],
            check=True,
            capture_output=True,
        ).stdout
    except subprocess.CalledProcessError as err:
        raise SystemExit(f"git archive of {REPO_TESTS_DIR} at {tag!r} in {repo} failed: {err.stderr.decode().strip()}")
    package = dest / TEST_PACKAGE
    if package.exists():
        shutil.rmtree(package)
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if parts[:2] != ("tests", TEST_PACKAGE):
                continue
            member.name = str(Path(*parts[1:]))
            tar.extract(member, dest, filter="data")
    missing = [f for f in HALVES if not (package / f).is_file()]
    if missing:
        raise SystemExit(f"{tag!r} lacks measured files: {missing}")
    return package

"""The reference documentation covers every public Trainer argument, method and property and every
TrainModule hook, and the README opens with the two set-up commands."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

from trainer.callbacks.callback import CALLBACK_HOOKS
from trainer import Trainer, TrainModule

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = (ROOT / "docs" / "reference.md").read_text()


def _documented_names() -> set[str]:
    return set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)", REFERENCE))


def _slash_names() -> set[str]:
    # "on_validation_start/end()" documents on_validation_start and on_validation_end
    names = set()
    for stem, tails in re.findall(r"`(on_[a-z_]+?_)(start|end)/(?:start|end)", REFERENCE):
        names.update({stem + "start", stem + "end"})
    return names


def test_every_trainer_argument_is_documented():
    documented = _documented_names()
    arguments = [p for p in inspect.signature(Trainer.__init__).parameters if p != "self"]
    missing = [a for a in arguments if a not in documented]
    assert not missing, f"Trainer arguments missing from docs/reference.md: {missing}"


def test_every_public_trainer_method_and_property_is_documented():
    documented = _documented_names()
    public = [name for name, _ in inspect.getmembers(Trainer) if not name.startswith("_")]
    missing = [name for name in public if name not in documented]
    assert not missing, f"Trainer members missing from docs/reference.md: {missing}"


def test_every_module_hook_is_documented():
    documented = _documented_names() | _slash_names()
    module_hooks = [h for h in CALLBACK_HOOKS if hasattr(TrainModule, h)]
    missing = [h for h in module_hooks if h not in documented]
    assert not missing, f"TrainModule hooks missing from docs/reference.md: {missing}"


def test_readme_opens_with_the_two_setup_commands():
    readme = (ROOT / "README.md").read_text()
    head = readme[:800]
    assert "make demo" in head and "make test" in head


def test_relative_links_in_readme_and_docs_point_to_existing_files():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, f"broken links: {broken}"


# ---------------------------------------------------------------------------------------------- every Python block runs
import pytest  # noqa: E402

from docs_blocks import Runner, all_blocks, missing_need, needs_cuda, run_plain, script_of  # noqa: E402

BLOCKS = all_blocks()
BLOCK_TIMEOUT = 120.0  # each block is CPU-sized (a few seconds); this bounds a hang on a loaded machine


@pytest.fixture(scope="module")
def block_runner():
    runner = Runner()
    yield runner
    runner.close()


def test_docs_have_python_blocks_and_every_fragment_names_an_earlier_block():
    assert len(BLOCKS) >= 20
    dangling = [f"{b.name}: '# fragment: continues {b.continues}' matches no earlier block's first line or heading"
                for b in BLOCKS if b.continues is not None and b.previous is None]  # fmt: skip
    assert not dangling, "\n".join(dangling)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_python_block_runs_as_written(block, block_runner, tmp_path):
    """Each block runs as a reader would paste it (with the blocks it says it continues first), in a fresh folder."""
    if block.continues is not None and block.previous is None:
        pytest.fail(f"{block.name} continues '{block.continues}', which is no earlier block of {block.page}")
    reason = missing_need(block)
    if reason:
        pytest.skip(reason)
    run = run_plain if needs_cuda(block) else block_runner.run
    status, timed_out, output = run(script_of(block), tmp_path, BLOCK_TIMEOUT)
    assert not timed_out, f"{block.name} ran over {BLOCK_TIMEOUT:.0f} s:\n{output[-3000:]}"
    assert status == 0, (f"{block.name} failed (exit status {status}). Make it self-contained (imports, toy data), "
                         f"or mark it '# fragment: continues <an earlier block's heading or first line>' or "
                         f"'# needs: cuda' (tests/docs_blocks.py lists the markers):\n{output[-3000:]}")  # fmt: skip

"""Steps 1-3: build the two test trees under the work folder.

``<work>/lightning/tests_pytorch``: Lightning's package as it is at the tag (its conftest and helpers), for the
baseline run on Lightning. ``<work>/ours/tests_pytorch``: the measured files renamed (rename.py), with our
conftest and helper shims (shims/) in place of Lightning's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import rename
from extract import extract_tests
from files import HALVES, TEST_PACKAGE
from measure import write_ini

SHIMS = Path(__file__).resolve().parent / "shims"


def build_trees(repo: Path, tag: str, work: Path, doc: Path, rebuild: tuple[str, ...] = ("lightning", "ours"),
                ) -> tuple[Path, Path, list[rename.Rule]]:  # fmt: skip
    """Extract and rename the trees named in ``rebuild`` (the Lightning one also when it is not there yet: the
    classification reads it); returns (lightning tree, ours tree, the rename rules)."""
    lightning_tree, ours_tree = work / "lightning", work / "ours"
    original = lightning_tree / TEST_PACKAGE
    if "lightning" in rebuild or not original.is_dir():
        extract_tests(repo, tag, lightning_tree)
        write_ini(lightning_tree)
    rules = rename.rules_from_doc(doc)
    if "ours" not in rebuild:
        return lightning_tree, ours_tree, rules

    package = ours_tree / TEST_PACKAGE
    if package.exists():
        shutil.rmtree(package)
    (package / "helpers").mkdir(parents=True)
    shutil.copy(SHIMS / "package_init.py", package / "__init__.py")
    shutil.copy(SHIMS / "conftest_ours.py", package / "conftest.py")
    shutil.copy(SHIMS / "_lt_guard.py", package / "_lt_guard.py")
    for helper in (SHIMS / "helpers").glob("*.py"):
        shutil.copy(helper, package / "helpers" / helper.name)
    for test_file in HALVES:
        for parent in Path(test_file).parents:  # the sub-packages' __init__.py files
            if parent != Path("."):
                init = package / parent / "__init__.py"
                init.parent.mkdir(parents=True, exist_ok=True)
                init.touch()
        rename.rename_file(original / test_file, package / test_file, rules)
    write_ini(ours_tree)
    rename.write_rules(rules, work / "rename_rules.json")
    return lightning_tree, ours_tree, rules

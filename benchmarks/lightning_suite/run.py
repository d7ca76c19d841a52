"""Re-run PyTorch Lightning's own test files on this framework after the documented rename, and measure.

    python benchmarks/lightning_suite/run.py                 # both runs, then the report
    python benchmarks/lightning_suite/run.py --side ours     # only ours (the baseline's last results are reused)
    python benchmarks/lightning_suite/run.py --report-only   # rebuild the report from the XML already there

See README.md beside this file for what the figures mean.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from documented import documented_names  # noqa: E402
from files import HALVES  # noqa: E402
from measure import Side, run_side  # noqa: E402
from prepare import build_trees  # noqa: E402
from report import build_rows, write_report  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
LIGHTNING_URL = "https://github.com/Lightning-AI/pytorch-lightning.git"


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", type=Path, default=None,
                   help="a Lightning git checkout or bare mirror holding the tag (default: a shallow clone of the tag "
                        f"from {LIGHTNING_URL} into <work>/../lightning-<tag>-src, made once)")  # fmt: skip
    p.add_argument("--tag", default="2.6.5", help="Lightning tag whose tests run (default 2.6.5)")
    p.add_argument("--framework", type=Path, default=REPO_ROOT, help="framework checkout to test (default: this repo)")
    p.add_argument("--work", type=Path, default=None, help="work folder (default /tmp/lt/<tag>)")
    p.add_argument("--results", type=Path, default=Path("/tmp/lt/results"), help="where summary.md/results.json go")
    p.add_argument("--python-ours", default=sys.executable, help="interpreter with torch + the framework's deps")
    p.add_argument("--python-lightning", default="/tmp/plvenv/bin/python", help="interpreter with lightning==<tag>")
    p.add_argument("--test-deps", type=Path, default=Path("/tmp/lt/test_deps"),
                   help="folder of test-only packages for our side (pip install --target; e.g. jsonargparse)")
    p.add_argument("--side", choices=("both", "ours", "lightning"), default="both", help="which run(s) to do")
    p.add_argument("--files", nargs="*", default=None, help="only these files (paths under tests_pytorch/)")
    p.add_argument("--timeout", type=int, default=60, help="per-test timeout in seconds")
    p.add_argument("--file-timeout", type=int, default=2400, help="per-file limit in seconds (then it is killed)")
    p.add_argument("--jobs", type=int, default=1, help="files run at once per side")
    p.add_argument("--report-only", action="store_true", help="only rebuild the report from existing XML")
    return p.parse_args(argv)


def lightning_repo(repo: Path | None, tag: str, work: Path) -> Path:
    """The Lightning checkout the tests are read from: ``--repo`` as given, else a shallow clone of ``tag`` (made
    once, beside the work folder)."""
    if repo is not None:
        if not ((repo / ".git").exists() or (repo / "HEAD").is_file()):
            raise SystemExit(f"--repo {repo}: not a git checkout or bare mirror (no .git, no HEAD). Pass a Lightning "
                             f"checkout that has the tag {tag}, or leave --repo out to clone it from {LIGHTNING_URL}.")  # fmt: skip
        return repo
    clone = work.parent / f"lightning-{tag}-src"
    if not (clone / ".git").exists():
        print(f"cloning Lightning {tag} from {LIGHTNING_URL} into {clone} (pass --repo to use a checkout of yours)")
        subprocess.run(["git", "clone", "--quiet", "--depth", "1", "--branch", tag, LIGHTNING_URL, str(clone)],
                       check=True)  # fmt: skip
    return clone


def _git_head(path: Path) -> str:
    out = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    return (out.stdout.strip() or "unknown") + (" (with uncommitted changes)" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    """Build the trees, run the side(s), write the report; returns 0."""
    args = _args(argv)
    work = args.work or Path("/tmp/lt") / args.tag
    files = args.files or list(HALVES)
    unknown = [f for f in files if f not in HALVES]
    if unknown:
        raise SystemExit(f"not measured files: {unknown}; choose from {list(HALVES)}")
    doc = args.framework / "docs" / "migrating_from_lightning.md"
    chosen = [] if args.report_only else ["lightning", "ours"] if args.side == "both" else [args.side]
    needs_sources = bool(chosen) or not (work / "lightning").is_dir()
    args.repo = lightning_repo(args.repo, args.tag, work) if needs_sources else args.repo
    lightning_tree, ours_tree, rules = build_trees(args.repo, args.tag, work, doc, tuple(chosen))
    sides = {
        "lightning": Side("lightning", args.python_lightning, lightning_tree, ()),
        "ours": Side("ours", args.python_ours, ours_tree,
                     (str(args.framework.resolve()), *([str(args.test_deps)] if args.test_deps.is_dir() else []))),
    }
    out = {name: work / "junit" / name for name in sides}
    def header() -> list[str]:
        lines = [f"- Lightning tests: `{args.repo}` at `{args.tag}`; rename rules: `{work / 'rename_rules.json'}` "
                 f"({len(rules)} rules read from `{doc.name}`); report made {time.strftime('%Y-%m-%d %H:%M')}"]
        for name, folder in out.items():
            runs = [json.loads(p.read_text()) for p in sorted(folder.glob("*.run.json"))]
            if runs:
                ended = sorted(r["ended"] for r in runs)
                whats = "; ".join(sorted({r["what"] for r in runs}))
                timeouts = "/".join(sorted({str(r["timeout"]) for r in runs}))
                lines.append(f"- {name}: {len(runs)} files run on {whats}, ended {ended[0]} to {ended[-1]}, "
                             f"per-test timeout {timeouts}s")  # fmt: skip
        return lines

    lock = threading.Lock()

    def report() -> None:
        with lock:
            _report()

    def _report() -> None:
        rows, missing, pending = build_rows(lightning_tree, out["lightning"], out["ours"], rules, documented_names(doc))
        write_report(rows, missing, pending, args.results, header())
        print(f"[report] {args.results / 'summary.md'}", file=sys.stderr, flush=True)

    if not args.report_only:
        threads = []
        for name in chosen:  # the two runs go side by side; the report is rewritten as each ends
            def work_side(side: Side = sides[name]) -> None:
                what = (f"framework `{args.framework}` at {_git_head(args.framework)}" if side.name == "ours"
                        else f"`{side.python}`")  # fmt: skip
                run_side(side, files, out[side.name], args.timeout, args.file_timeout, args.jobs, what)
                report()

            threads.append(threading.Thread(target=work_side))
            threads[-1].start()
        for t in threads:
            t.join()
    else:
        report()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

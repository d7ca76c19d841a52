"""Step 7: read both runs' junit XML, join them with the classification, write results.json and summary.md.

A test *counts* when it is public (classify.py) and passed on Lightning; it *passes* when it also passed on ours.
A failure on ours is put in one category:

* ``text-only``: the same exception/warning type came, only its message differs (``pytest.raises(match=...)``
  failing with "Regex pattern did not match", or ``pytest.warns(match=...)`` failing while a warning of the
  expected category was emitted);
* ``missing name``: an ``ImportError``/``AttributeError`` on a public name, or a ``TypeError`` for an unexpected
  keyword argument (a Lightning argument we do not take); also a test that uses a module-level import the
  framework lacks (shims/_lt_guard.py), whatever its outcome;
* ``behaviour``: anything else (an assertion, another exception, a timeout, a skip on ours).

Each failure also notes a Lightning name its error mentions that the doc lists as partly/not supported
(documented.py), a triage hint that the difference may be a deliberate one.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import classify
import rename
from documented import documented_in
from files import HALVES, TEST_PACKAGE
from measure import junit_path


@dataclass
class Outcome:
    """What one side's run said about one test."""

    status: str  # passed / failed / skipped / missing (not in the run's XML)
    error: str = ""  # "ExcType: first line of the message"
    message: str = ""  # the whole exception message (not written out)
    text: str = ""  # the message and the traceback (not written out)


@dataclass
class Row:
    """One test in results.json."""

    file: str
    half: str
    id: str
    public: bool
    private_reasons: list[str]
    lightning: str
    ours: str
    counted: bool
    ours_pass: bool
    category: str
    error: str
    documented: str  # a partly/not-supported Lightning name of the doc that the error mentions (documented.py)


def _first_line(message: str) -> str:
    line = next((ln.strip() for ln in message.splitlines() if ln.strip()), "")
    return line[:300]


def read_junit(xml: Path, test_file: str) -> tuple[dict[str, Outcome], str | None]:
    """Outcomes by test id (``name[params]`` or ``Class::name[params]``), and the file's collection error."""
    if not xml.is_file():
        return {}, None
    module = f"{TEST_PACKAGE}.{test_file.removesuffix('.py').replace('/', '.')}"
    outcomes: dict[str, Outcome] = {}
    collect_error = None
    try:
        root = ET.parse(xml).getroot()
    except ET.ParseError as err:
        return {}, f"unreadable junit XML: {err}"
    for case in root.iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        problems = [e for e in case if e.tag in ("failure", "error")]
        if classname == module:
            test_id = name
        elif classname.startswith(module + "."):
            test_id = f"{classname[len(module) + 1 :]}::{name}"
        else:  # a collection error is reported as a test named after the module
            if problems:
                e = problems[0]
                collect_error = _first_line(e.get("message", "") or e.text or "collection error")
            continue
        if problems:
            e = problems[0]
            message = e.get("message", "") or ""
            if message.startswith("assert "):  # pytest drops the type of a bare assert's message
                message = f"AssertionError: {message}"
            outcomes[test_id] = Outcome("failed", _first_line(message) or _first_line(e.text or ""), message,
                                        f"{message}\n{e.text or ''}")  # fmt: skip
        elif any(e.tag == "skipped" for e in case):
            skip = next(e for e in case if e.tag == "skipped")
            outcomes[test_id] = Outcome("skipped", _first_line(skip.get("message", "")))
        else:
            outcomes[test_id] = Outcome("passed")
    return outcomes, collect_error


_WARN_TYPES = re.compile(r"No warnings of type \((.*?)\)")
_CLASS = re.compile(r"<class '([\w.]+)'>")
_MISSING_ATTR = re.compile(r"has no attribute '(\w+)'")


def categorise(outcome: Outcome) -> str:
    """``text-only``, ``missing name`` or ``behaviour`` for a test that did not pass on ours."""
    text, error = outcome.text, outcome.error
    if "Regex pattern did not match" in text:
        return "text-only"
    warned = _WARN_TYPES.search(text)
    if warned and "Emitted warnings:" in text:
        emitted = text.split("Emitted warnings:", 1)[1]
        expected = [c.rsplit(".", 1)[-1] for c in _CLASS.findall(warned.group(1))]
        if any(re.search(rf"\b{re.escape(c)}\(", emitted) for c in expected):
            return "text-only"
    if error.startswith(("ImportError", "ModuleNotFoundError")):
        return "missing name"
    attr = _MISSING_ATTR.search(error)
    if error.startswith("AttributeError") and attr and not attr.group(1).startswith("_"):
        return "missing name"
    if error.startswith("TypeError") and "unexpected keyword argument" in error:
        return "missing name"
    return "behaviour"


def _group_key(category: str, error: str) -> str:
    """Failures that differ only in values (numbers, quoted or bracketed literals, paths) share a group."""
    if category == "text-only":  # one group per kind: raises(match=) or warns(match=)
        return re.sub(r"\d+", "N", error.split(" Expected regex:")[0].split(" Regex:")[0])
    if category == "missing name":  # the name is the information
        return error[:160]
    for pattern, mask in ((r"0x[0-9a-f]+", "0x…"), (r"/tmp/\S*", "/tmp/…"), (r"'[^']*'|\"[^\"]*\"", "'…'"),
                          (r"\{[^{}]*\}|\([^()]*\)|\[[^\[\]]*\]", "(…)"), (r"\b\d+(\.\d+)?\b", "N")):  # fmt: skip
        error = re.sub(pattern, mask, error)
    return error[:160]


def _one_line(text: str, limit: int = 400) -> str:
    return " ".join(text.split())[:limit]


def _missing_names(results: Path) -> set[str]:
    """The names shims/_lt_guard.py recorded as missing, over the last run of every measured file (a log left by
    anything else in the folder, e.g. an older ad-hoc run, is not read)."""
    names = set()
    for test_file in HALVES:
        log = junit_path(results, test_file).with_suffix(".missing.jsonl")
        if log.is_file():
            names |= {json.loads(line)["name"] for line in log.read_text().splitlines() if line.strip()}
    return names


def build_rows(lightning_tree: Path, lightning_results: Path, ours_results: Path, rules: list[rename.Rule],
               doc_names: set[str]) -> tuple[list[Row], set[str], dict[str, str]]:  # fmt: skip
    """Every test of every measured file, joined across the two runs; also the missing names and the
    files whose baseline has not run yet (with why)."""
    missing = _missing_names(ours_results)
    pending: dict[str, str] = {}
    rows: list[Row] = []
    for test_file, half in HALVES.items():
        source = (lightning_tree / TEST_PACKAGE / test_file).read_text()
        classes = classify.classify_source(source)
        imports = classify.import_paths(source)
        base, base_collect = read_junit(junit_path(lightning_results, test_file), test_file)
        ours, ours_collect = read_junit(junit_path(ours_results, test_file), test_file)
        if not base:
            pending[test_file] = base_collect or "baseline not run yet"
        # Lightning's ids, renamed as the source was, are the ids of the renamed files.
        base_by_ours_id = {rename.apply_rules(i, rules): o for i, o in base.items()}
        ids = list(base_by_ours_id) if base else list(ours)
        ids += [i for i in ours if i not in base_by_ours_id and base]
        for test_id in ids:
            func = test_id.split("[", 1)[0]
            cls = classes.get(func) or classes.get(rename.apply_rules(func, rules))
            public = cls.public if cls else True
            lightning = base_by_ours_id.get(test_id, Outcome("missing" if base else "pending"))
            mine = ours.get(test_id) or Outcome("failed", f"collection: {ours_collect}" if ours_collect
                                                else "not collected on ours")  # fmt: skip
            lacking = sorted(
                rename.apply_rules(imports[a], rules)
                for a in (cls.imports_used if cls else ())
                if rename.apply_rules(imports[a], rules) in missing
            )
            ours_pass = mine.status == "passed" and not lacking
            if ours_pass:
                category, error = "", ""
            elif lacking:
                category, error = "missing name", f"ImportError: the framework lacks {', '.join(lacking)}"
            elif mine.status == "skipped":
                category, error = "behaviour", f"skipped on ours: {mine.error}"
            else:
                category, error = categorise(mine), mine.error
                if category == "text-only":  # keep the expected pattern and the actual message
                    error = _one_line(mine.message)
            counted = public and lightning.status in ("passed", "pending")
            rows.append(Row(test_file, half, test_id, public, cls.reasons if cls else [], lightning.status,
                            mine.status, counted, ours_pass, category, error,
                            "" if category in ("", "text-only") else documented_in(error, doc_names)))  # fmt: skip
    return rows, missing, pending


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.0f}%" if b else "-"


def write_report(rows: list[Row], missing: set[str], pending: dict[str, str], out: Path, header: list[str]) -> str:
    """Write ``results.json`` and ``summary.md`` under ``out``; returns the summary text."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")

    lines = ["# Lightning's own tests on the framework", "", *header, ""]
    if pending:
        lines += [f"**Baseline pending for {len(pending)} file(s)**: there every public test counts (not yet "
                  "filtered by Lightning's own pass); figures will drop/rise when the baseline lands.", ""]  # fmt: skip
    counted = [r for r in rows if r.counted]
    lines += ["## Totals (counted = public and passing on Lightning)", "",
              "| half | counted | passed | % | text-only | missing name | behaviour | % with text-only | documented |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for half in ("loop", "logging", None):
        sel = [r for r in counted if half is None or r.half == half]
        cats = Counter(r.category for r in sel if not r.ours_pass)
        ok = sum(r.ours_pass for r in sel)
        doc = sum(bool(r.documented) for r in sel if not r.ours_pass)
        lines.append(f"| {half or '**all**'} | {len(sel)} | {ok} | {_pct(ok, len(sel))} | {cats['text-only']} | "
                     f"{cats['missing name']} | {cats['behaviour']} | {_pct(ok + cats['text-only'], len(sel))} | {doc} |")
    lines += ["", "## Per file", "",
              "| file | half | tests | public | counted | passed | % | text-only | missing | behaviour |",
              "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for test_file, half in HALVES.items():
        sel = [r for r in rows if r.file == test_file]
        cnt = [r for r in sel if r.counted]
        ok = sum(r.ours_pass for r in cnt)
        cats = Counter(r.category for r in cnt if not r.ours_pass)
        mark = " (baseline pending)" if test_file in pending else ""
        lines.append(f"| {test_file}{mark} | {half} | {len(sel)} | {sum(r.public for r in sel)} | {len(cnt)} | {ok} "
                     f"| {_pct(ok, len(cnt))} | {cats['text-only']} | {cats['missing name']} | {cats['behaviour']} |")
    failing = [r for r in counted if not r.ours_pass]
    by_type = Counter((r.category, r.error.split(":", 1)[0][:60]) for r in failing)
    lines += ["", "## Counted failures by category and exception type", "", "| n | category | type |", "|---|---|---|"]
    lines += [f"| {n} | {cat} | `{typ}` |" for (cat, typ), n in by_type.most_common()]
    groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in failing:
        groups[(r.category, _group_key(r.category, r.error))].append(r)
    lines += ["", "## Failure groups (counted tests failing on ours, largest first)", "",
              "| n | category | error (type: first line) | documented | tests |", "|---|---|---|---|---|"]  # fmt: skip
    for (category, error), members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        names = ", ".join(f"{m.file.rsplit('/', 1)[-1]}::{m.id}" for m in members[:4])
        more = f" (+{len(members) - 4})" if len(members) > 4 else ""
        doc = ", ".join(sorted({f"`{m.documented}`" for m in members if m.documented}))
        lines.append(f"| {len(members)} | {category} | `{error.replace('|', '/')}` | {doc} | {names}{more} |")
    text_only = [r for r in failing if r.category == "text-only"]
    if text_only:
        lines += ["", "## Text-only differences (expected pattern, actual message)", ""]
        lines += [f"- `{r.file.rsplit('/', 1)[-1]}::{r.id}`: {r.error.replace('|', '/')}" for r in text_only]
    if missing:
        lines += ["", "## Names the renamed files import that the framework lacks", ""]
        lines += [f"- `{name}`" for name in sorted(missing)]
    extra = [r for r in rows if r.public and r.lightning != "passed" and r.ours_pass and not pending]
    lines += ["", f"Not counted: {sum(not r.public for r in rows)} private tests, "
              f"{sum(r.public and r.lightning not in ('passed', 'pending') for r in rows)} public tests that do not "
              f"pass on Lightning here (skipped/failed), of which {len(extra)} pass on ours.", ""]  # fmt: skip
    text = "\n".join(lines)
    (out / "summary.md").write_text(text)
    return text

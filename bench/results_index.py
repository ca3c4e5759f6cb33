"""bench/results/README.md, written from the result files in bench/results/ themselves.

Every result is a JSON file (or a folder with a report.json) that says what it is (`what`), the command that made it
(`command`, `commands`, or `meta.command`), where it ran (`device`, `devices`, `meta.device`, else the card prefix of
its name) and, where a README or doc quotes it, the statement (`claim`) and its number(s) (`figure`). Other files
(plots, samples) belong to the JSON whose name they extend. The bench scripts write `what`, `command`, `device` and
`commit` themselves (bench/harness.py; pipeline/report.py for the job benchmark), and a rerun over a file keeps its
`claim` and `figure`. The README is never edited by hand:

    python bench/results_index.py            # write bench/results/README.md
    python bench/results_index.py --check    # exit 1 when it differs from what would be written

tests/test_results_index.py runs the check, so a result without a command or a hand edit fails the tests.
"""
from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
README = "README.md"
FOLDER_REPORT = "report.json"
COMMAND_KEYS = ("command", "commands")
DEVICE_KEYS = ("device", "devices", "gpu", "machine")
# a card's model as the device keys spell it ("NVIDIA H100 80GB HBM3", "NVIDIA H200"): one capital, three digits
CARD_NAME = re.compile(r"\b([A-Z]\d{3})\b")
CPU_WORD = re.compile(r"\bcpu\b", re.IGNORECASE)
# the file-name prefix of a GPU run: the card, and "xN" when it used N cards of one host (h200x2_)
CARD_PREFIX = re.compile(r"^([a-z]\d{3})(?:x(\d+))?_")

HEADER = """\
# bench/results: the files behind the figures we quote

Written from the files themselves by `make results-index` (`python bench/results_index.py`);
`tests/test_results_index.py` fails when this page differs from what the script writes: edit the files, not this page.

- Each result is a JSON file (or a folder with a report.json) holding `what`, the command that made it (`command`,
  `commands` or `meta.command`), a `commit`, and where a README or doc quotes it, `claim` and `figure`. Plots and
  samples sit beside the JSON whose name they extend.
- Names start with the card: `h100_`, `h200_`, `h200x2_` (two H200s of one host); CPU runs start with `cpu_` or end
  with `_cpu`. The card column reads a `device` / `devices` / `meta.device` key first, so it follows the rows where
  they came from another card than the name says.
- Commit: the file's `commit` key, else the last commit that wrote the file, which changes when the file is
  committed: give a new file a `commit` key.
- GPU runs go through the device tool; `$OUT` is the folder it brings back. It takes 64 MiB of tracked tree a call,
  less than the checkout with every checkpoint: move `models/ocria-tiny-fp8` and `models/ocria-tiny-nvfp4` out of the
  checkout for the call and back after. Where fla is installed, its wheels came first: `python3 -m pip install -q
  --no-index --no-deps --no-compile --target /tmp/site .gpu/wheels/*.whl && export PYTHONPATH=/tmp/site`.
- What each engine choice bought: `docs/decisions.md`; ocria-tiny's training and reading quality:
  `research/ocria_tiny/results/`.
"""


@dataclass(frozen=True)
class Entry:
    """One result: its JSON (path relative to bench/results), the files that belong to it, and what the index says."""
    name: str
    companions: tuple[str, ...]
    what: str
    command: str
    card: str
    commit: str
    claims: tuple[tuple[str, str], ...]


def _text(value) -> str:
    """A key's value as one line: a list joined by '; ', a dict as 'key: value; ...'."""
    if value is None:
        return ""
    if isinstance(value, str):
        return " ".join(value.split())
    if isinstance(value, list):
        return "; ".join(t for t in (_text(v) for v in value) if t)
    if isinstance(value, dict):
        return "; ".join(f"{k}: {t}" for k, t in ((k, _text(v)) for k, v in value.items()) if t)
    return str(value)


def _strings(value) -> list[str]:
    """Every string value inside a key's value (dict values and list items too, not dict keys)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _scopes(data: dict) -> list[dict]:
    """Where index keys live: the top level, then `meta` (the benchmarks that write meta + results)."""
    meta = data.get("meta")
    return [data, meta] if isinstance(meta, dict) else [data]


def command_of(data: dict) -> str:
    """The command that made the file; with the device tool's own command line after it where the file keeps that
    apart (`device_command`)."""
    for scope in _scopes(data):
        for key in COMMAND_KEYS:
            if _text(scope.get(key)):
                device = _text(scope.get("device_command"))
                return _text(scope[key]) + (f"; on the device: {device}" if device else "")
    # a file its writer rewrites row by row (one row per setup) keeps each row's own command
    for rows in data.values():
        if isinstance(rows, list) and rows and all(isinstance(r, dict) and _text(r.get("command")) for r in rows):
            return "; ".join(_text(r["command"]) for r in rows)
    return ""


def card_of(data: dict, name: str) -> str:
    """The card from the file's device keys (every card model named there, and CPU when a part ran on the CPU),
    else from its name's prefix; '' when neither says."""
    texts = [s for scope in _scopes(data) for key in DEVICE_KEYS for s in _strings(scope.get(key))]
    cards = sorted({m for t in texts for m in CARD_NAME.findall(t)})
    if any(CPU_WORD.search(t) for t in texts):
        cards.append("CPU")
    if cards:
        return ", ".join(cards)
    stem = name.split("/")[0].removesuffix(".json")
    match = CARD_PREFIX.match(stem)
    if match:
        card = match.group(1).upper()
        return f"{match.group(2)} x {card}" if match.group(2) else card
    if stem.startswith("cpu_") or stem.endswith("_cpu"):
        return "CPU"
    return ""


def last_commit(path: Path) -> str:
    """The last commit that wrote `path`, or 'uncommitted'."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%h", "--", str(path)], cwd=ROOT, capture_output=True,
                             text=True, check=False).stdout.strip()
    except OSError:
        out = ""
    return out or "uncommitted"


def commit_of(data: dict, path: Path) -> str:
    for scope in _scopes(data):
        if isinstance(scope.get("commit"), str) and scope["commit"].strip():
            return scope["commit"].strip()
    return last_commit(path)


def claims_of(data: dict) -> tuple[tuple[str, str], ...]:
    """(claim, figure) pairs: `claim` and `figure` are each a string, or lists of the same length (one file behind
    several quoted figures)."""
    claim, figure = data.get("claim"), data.get("figure")
    if claim is None and figure is None:
        return ()
    claims = claim if isinstance(claim, list) else [claim]
    figures = figure if isinstance(figure, list) else [figure]
    if len(claims) != len(figures):
        raise ValueError(f"claim and figure differ in length ({len(claims)} vs {len(figures)})")
    return tuple((_text(c), _text(f)) for c, f in zip(claims, figures))


def result_files(results: Path) -> tuple[list[str], list[str]]:
    """(JSON results, other files), as paths relative to `results`: top-level *.json, and report.json of each
    folder holding one; every other file (the README aside) is a companion to place."""
    jsons, others = [], []
    for path in sorted(results.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(results).as_posix()
        if rel == README:
            continue
        top_json = "/" not in rel and rel.endswith(".json")
        folder_report = rel.count("/") == 1 and rel.endswith("/" + FOLDER_REPORT)
        (jsons if top_json or folder_report else others).append(rel)
    return jsons, others


def _owner(other: str, jsons: list[str]) -> str | None:
    """The JSON a companion file belongs to: its folder's report.json, else the JSON whose stem its own stem equals
    or extends by '_...' (the longest such)."""
    if "/" in other:
        report = other.split("/")[0] + "/" + FOLDER_REPORT
        return report if report in jsons else None
    stem = other.rsplit(".", 1)[0]
    owners = [j for j in jsons if "/" not in j and (stem == j[:-5] or stem.startswith(j[:-5] + "_"))]
    return max(owners, key=len) if owners else None


def collect(results: Path = RESULTS) -> tuple[list[Entry], list[str]]:
    """The index's entries, and the problems that keep it from being complete (a file without a command or a card,
    a file that is no JSON's and no folder's, a file that is not a JSON object)."""
    jsons, others = result_files(results)
    companions: dict[str, list[str]] = {j: [] for j in jsons}
    problems = []
    for other in others:
        owner = _owner(other, jsons)
        if owner is None:
            problems.append(f"{other}: belongs to no result JSON (name it <json stem>_... or put it in a folder "
                            f"with a {FOLDER_REPORT})")
        else:
            companions[owner].append(other)
    entries = []
    for name in jsons:
        path = results / name
        try:
            data = json.loads(path.read_text())
        except ValueError as e:
            problems.append(f"{name}: not JSON ({e})")
            continue
        if not isinstance(data, dict):
            problems.append(f"{name}: a JSON {type(data).__name__}, not an object with the index keys")
            continue
        try:
            claims = claims_of(data)
        except ValueError as e:
            problems.append(f"{name}: {e}")
            claims = ()
        what_scope = next((s for s in _scopes(data) if _text(s.get("what"))), {})
        entry = Entry(name=name, companions=tuple(companions[name]), what=_text(what_scope.get("what")),
                      command=command_of(data), card=card_of(data, name), commit=commit_of(data, path),
                      claims=claims)
        for key, value in (("what", entry.what), ("command", entry.command), ("card", entry.card)):
            if not value:
                problems.append(f"{name}: no {key}")
        entries.append(entry)
    return entries, problems


def _cell(text: str) -> str:
    return text.replace("|", "\\|") if text else "—"


def _code(text: str) -> str:
    """Inline code unless the text holds a backtick of its own (then plain: a code span could not hold it)."""
    if not text:
        return "—"
    return _cell(text) if "`" in text else "`" + _cell(text) + "`"


def _file_cell(entry: Entry) -> str:
    cell = "`" + entry.name + "`"
    if entry.companions:
        cell += " (with " + ", ".join("`" + c + "`" for c in entry.companions) + ")"
    return cell


def render(entries: list[Entry]) -> str:
    lines = [HEADER, "## Current figures", "",
             "The statements the README and docs quote, with the number(s) the file holds.", "",
             "| claim | figure | file | card | commit |", "|---|---|---|---|---|"]
    for entry in entries:
        for claim, figure in entry.claims:
            lines.append(f"| {_cell(claim)} | {_cell(figure)} | `{entry.name}` | {_cell(entry.card)} | "
                         f"{_cell(entry.commit)} |")
    lines += ["", "## Every file", "", "| file | what | card | commit | command |", "|---|---|---|---|---|"]
    for entry in entries:
        lines.append(f"| {_file_cell(entry)} | {_cell(entry.what)} | {_cell(entry.card)} | {_cell(entry.commit)} | "
                     f"{_code(entry.command)} |")
    return "\n".join(lines) + "\n"


def check(written: str, expected: str, label: str = "bench/results/README.md") -> str:
    """'' when the README is current, else one line saying how it differs."""
    if written == expected:
        return ""
    old, new = written.splitlines(), expected.splitlines()
    changed = [op for op in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes() if op[0] != "equal"]
    removed = sum(i2 - i1 for _, i1, i2, _, _ in changed)
    added = sum(j2 - j1 for _, _, _, j1, j2 in changed)
    first = changed[0][1] + 1 if changed else 1
    return (f"{label} is not what bench/results_index.py writes: {removed} line(s) to remove, {added} to add, "
            f"first at line {first}; run `make results-index`")


def _shown(path: Path) -> str:
    """A path as the messages show it: from the repository root when it is inside."""
    path = path.resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the README differs from what would be written")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the results folder (default bench/results)")
    args = ap.parse_args(argv)
    entries, problems = collect(args.results)
    readme = args.results / README
    label = _shown(readme)
    for problem in problems:
        print(f"{_shown(args.results)}/{problem}", file=sys.stderr)
    expected = render(entries)
    if args.check:
        diff = check(readme.read_text() if readme.is_file() else "", expected, label)
        if diff:
            print(diff, file=sys.stderr)
        return 1 if diff or problems else 0
    readme.write_text(expected)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""What every bench/ script writes around its numbers: the keys bench/results_index.py reads from a result file.

    meta = harness.result_meta(__file__, "what the file holds, one line", argv, device)
    harness.write_result(out, data, meta)          # a file written once
    results = harness.ResultFile(out, meta)        # a file rewritten after every row (a later failure keeps the rows)
    results.write(data)

The file starts with `what`, `command` (`python bench/x.py ARGS`, as it would be typed), `device` (the CUDA card's
name, or "cpu (<model>, N cores)") and `commit` (the checkout's HEAD, None where there is no git), then the script's
own keys; a key the script writes itself (its own `device`, say) keeps the script's value. A file that replaces one
holding `claim` / `figure` (the statement a README quotes, and its number) carries them over and says so: the figure
is the old run's, so both must be read again against the new numbers.

Standard library only; torch is imported only to name a CUDA device, so the CPU-only benches need none.
"""
from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from pathlib import Path

from pipeline.provenance import git_commit, quoted

ROOT = Path(__file__).resolve().parents[1]


def command_line(script: str | Path, argv: list | None = None) -> str:
    """`python bench/x.py ARGS`: the script from the repository root, its arguments (sys.argv[1:] unless given)
    quoted as a shell would need them."""
    path = Path(script).resolve()
    shown = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["python", shown, *map(str, args)])


def cpu_name() -> str:
    """"cpu (<model>, N cores)": the model from /proc/cpuinfo where there is one, the cores this process may use."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    model = model or platform.processor() or platform.machine()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    count = f"{cores} core{'s' if cores != 1 else ''}"
    return f"cpu ({model}, {count})" if model else f"cpu ({count})"


def device_name(device=None) -> str:
    """The card a run used, spelled so the results index finds it: a CUDA device's name ("NVIDIA H100 80GB HBM3"),
    cpu_name() for the CPU. `device` as the script holds it (None, "cpu", "cuda", "cuda:1", a torch.device); None:
    the first CUDA device where torch sees one, else the CPU."""
    kind = None if device is None else str(device)
    if kind is None or kind.startswith("cuda"):
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None and torch.cuda.is_available():
            return torch.cuda.get_device_name(kind)
    if kind is None or kind == "cpu":
        return cpu_name()
    return kind


def result_meta(script: str | Path, what: str, argv: list | None = None, device=None) -> dict:
    """The keys a result file starts with: what it holds, the command that made it, the card, the commit.
    `device` as device_name takes it, or a dict that describes the run's devices itself (kept as it is)."""
    return {"what": what, "command": command_line(script, argv),
            "device": device if isinstance(device, dict) else device_name(device), "commit": git_commit()}


class ResultFile:
    """One result JSON, written once or rewritten as rows come in: the carried keys, the meta, the data. What it
    carries is read before its first write, so later writes of the same run keep it too."""

    def __init__(self, path: str | Path, meta: dict):
        self.path = Path(path)
        self.meta = dict(meta)
        self.kept = None  # the replaced file's quoted keys, read at the first write

    def write(self, data: dict, **dumps) -> dict:
        """Writes {kept, meta, data} (json.dumps options in `dumps`, indent 1 unless given); returns it."""
        if self.kept is None:
            self.kept = quoted(self.path, lambda line: print(line, file=sys.stderr))
        out = {**self.kept, **self.meta, **data}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(out, **{"indent": 1, **dumps}) + "\n")
        return out


def write_result(path: str | Path, data: dict, meta: dict, **dumps) -> dict:
    """A result file written once (ResultFile.write)."""
    return ResultFile(path, meta).write(data, **dumps)

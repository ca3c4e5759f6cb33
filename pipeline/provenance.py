"""Where a result came from, for the files the job and the benchmarks write: the commit of the checkout that made it,
and what a README quotes from the file a new run replaces. Standard library only: the bench scripts import it on GPU
machines that have none of the job's packages."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what a README quotes from a result file (bench/results_index.py reads them): a rerun keeps them
QUOTED_KEYS = ("claim", "figure")


def git_commit(root: Path = ROOT) -> str | None:
    """The short HEAD of the checkout at `root`; None without git or a repository of its own there (a copy of the
    working tree, or one inside another repository)."""
    try:
        # safe.directory: a copy owned by another user (the device machine's) is still read
        proc = subprocess.run(["git", "-c", f"safe.directory={root}", "rev-parse", "--show-toplevel", "--short",
                               "HEAD"], cwd=root, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = proc.stdout.split()
    if proc.returncode or len(lines) != 2 or Path(lines[0]).resolve() != Path(root).resolve():
        return None
    return lines[1]


def quoted(path: Path, echo=None) -> dict:
    """The claim and figure of the result file at `path` that a new run is about to replace (none when there is no
    file or no JSON object there), said through `echo` when there are any: the figure is the old run's, so both are
    to be read again against the new numbers."""
    try:
        old = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    kept = {k: old[k] for k in QUOTED_KEYS if k in old} if isinstance(old, dict) else {}
    if kept and echo is not None:
        echo(f"{path}: kept {' and '.join(kept)} of the file this run replaces; the figure is the old run's: read "
             f"the claim again against the new numbers")
    return kept

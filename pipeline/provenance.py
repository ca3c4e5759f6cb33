"""Where a result came from, for the files the job and the benchmarks write: the commit of the checkout that made it.
Standard library only: the bench scripts import it on GPU machines that have none of the job's packages."""
from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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

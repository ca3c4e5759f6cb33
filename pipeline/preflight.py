"""The job's first check, before any of its packages is imported: that this Python has them.

`ray job submit` against a cluster started from another environment runs the entry point with that cluster's Python;
without this check the job ended in a raw ModuleNotFoundError from whichever import came first. Standard library
only, so it can run where nothing else can.
"""
from __future__ import annotations

import importlib.util
import sys

# module the job imports -> the requirement that provides it (pyproject.toml's dependencies). Not Ray: a cluster
# has its own, and a rerun with nothing to do finishes without importing it
JOB_MODULES = {
    "click": "click", "pydantic": "pydantic", "yaml": "pyyaml", "numpy": "numpy", "pyarrow": "pyarrow",
    "boto3": "boto3", "pymupdf": "pymupdf", "torch": "torch",
    "transformers": "transformers", "tokenizers": "tokenizers", "safetensors": "safetensors", "PIL": "pillow",
    "psutil": "psutil", "tqdm": "tqdm",
}
RUNTIME_ENV = "configs/runtime_env.yaml"


def missing_requirements(modules: dict[str, str] = JOB_MODULES) -> list[str]:
    """The requirements whose module this Python cannot find (found without importing them)."""
    return [req for name, req in modules.items() if importlib.util.find_spec(name) is None]


def require_job_packages(entry_point: str) -> None:
    """Exit with status 2 and one line naming what is missing and how to provide it, when anything is."""
    missing = missing_requirements()
    if not missing:
        return
    sys.stderr.write(
        f"Error: this Python ({sys.executable}) lacks the job's packages: {', '.join(missing)}. On a Ray cluster "
        f"started from another environment, submit with the project's runtime_env: ray job submit --working-dir . "
        f"--runtime-env {RUNTIME_ENV} -- python {entry_point} ...; locally, install the project: make setup\n")
    sys.exit(2)

"""Fixtures of the research tests: the product's fixtures (tests/conftest.py) plus synthetic-page pools and the
training config of ocria-tiny."""
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from tests.conftest import (CORPUS, require, s3_server, text_ckpt, tiny_checkpoint,  # noqa: E402,F401
                            tiny_tokenizer, vl_ckpt)

TRAIN_CONFIG = ROOT / "research" / "ocria_tiny" / "train_tiny.yaml"
STUDIES = ROOT / "research" / "ocria_tiny" / "studies"
# Overrides of train_tiny.yaml for the shipped ocria-tiny's pages: it was trained on pages drawn at 1,536 px with
# fonts of 20-36 px, the size its processor lets through.
SHIPPED_PAGES = ["image.target_longest_px=1536", "image.max_pixels=2359296", "data.font_px=[20.0,36.0]"]


def load_study(name: str):
    """research/ocria_tiny/studies/<name>.py as a module (the studies are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, STUDIES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_synth(folder: Path, heldout=None, train=None) -> Path:
    """A text-pool folder laid out as research/ocria_tiny/make_synthetic_pages.py writes .synth: the given pools
    (TextPool) and an empty fonts/ (PyMuPDF's built-in fonts only)."""
    (folder / "fonts").mkdir(parents=True, exist_ok=True)
    if heldout is not None:
        heldout.to_json_gz(folder / "pool_heldout.json.gz")
    if train is not None:
        train.to_json_gz(folder / "pool_train.json.gz")
    return folder


def shipped_pages_config(folder: Path) -> Path:
    """train_tiny.yaml with SHIPPED_PAGES, as a YAML file for the scripts that take --config."""
    import yaml

    from research.ocria_tiny.train_config import load_config

    path = folder / "shipped.yaml"
    path.write_text(yaml.safe_dump(load_config(TRAIN_CONFIG, SHIPPED_PAGES)))
    return path


@pytest.fixture(scope="session")
def licence_prose() -> list[str]:
    """Paragraphs of the system's licence texts: a real-text pool for the synthetic page generator. Debian and Ubuntu
    ship them; elsewhere the tests that need real prose skip and say so (under CI they fail)."""
    from research.ocria_tiny.synthetic import split_paragraphs

    licences = Path("/usr/share/common-licenses")
    require(licences.is_dir(), "/usr/share/common-licenses (Debian's licence texts, the text pool)")
    return [p for f in sorted(licences.iterdir()) if f.is_file() for p in split_paragraphs(f.read_text(errors="replace"))]

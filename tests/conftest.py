"""Shared fixtures: environment for offline runs, a tiny real-format checkpoint, a real S3-compatible server."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton: kernels run on CPU here
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # no IMDS probing for credentials
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import importlib.util  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus"
sys.path.insert(0, str(ROOT))


def require(present: bool, what: str) -> None:
    """Skip a test whose input is not on this machine, with the reason printed (make test runs pytest -rs); under CI
    (CI=true, where ../shared is checked out) fail instead, so a missing corpus cannot pass as skipped tests."""
    if present:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what} is missing, and CI=true: CI must provide it (check out ../shared next to this one)")
    pytest.skip(f"{what} is not on this machine")


def load_bench(name: str):
    """bench/<name>.py as a module (the bench folder is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# configs/train_tiny.yaml overrides for the shipped ocria-tiny's pages: run F2 (session 15) was trained on the final
# distribution drawn at 1,536 px, fonts 20-36 px (10-18 px at 768 px), the size its processor lets through
SHIPPED_PAGES = ["image.target_longest_px=1536", "image.max_pixels=2359296", "data.font_px=[20.0,36.0]"]


def write_synth(folder: Path, heldout=None, train=None) -> Path:
    """A text-pool folder laid out as jobs/make_synthetic_pages.py writes .synth: the given pools (TextPool) and an
    empty fonts/ (PyMuPDF's built-in fonts only)."""
    (folder / "fonts").mkdir(parents=True, exist_ok=True)
    if heldout is not None:
        heldout.to_json_gz(folder / "pool_heldout.json.gz")
    if train is not None:
        train.to_json_gz(folder / "pool_train.json.gz")
    return folder


def shipped_pages_config(folder: Path) -> Path:
    """configs/train_tiny.yaml with SHIPPED_PAGES, as a YAML file for the scripts that take --config."""
    import yaml

    from jobs.train_tiny import load_config

    path = folder / "shipped.yaml"
    path.write_text(yaml.safe_dump(load_config(ROOT / "configs" / "train_tiny.yaml", SHIPPED_PAGES)))
    return path


@pytest.fixture(scope="session")
def text_ckpt(tmp_path_factory, tiny_tokenizer):
    """A tiny random text-only checkpoint (qwen3_5_text, tied head) for the engine tests."""
    from engine.testing import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("txt"), vision=False, tie=True, tokenizer=tiny_tokenizer, seed=1)


@pytest.fixture(scope="session")
def vl_ckpt(tmp_path_factory, tiny_tokenizer):
    """A tiny random VL checkpoint (qwen3_5, untied head) for the engine tests."""
    from engine.testing import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("vl"), vision=True, tie=False, tokenizer=tiny_tokenizer, seed=2)


@pytest.fixture(scope="session")
def licence_prose() -> list[str]:
    """Paragraphs of the system's licence texts: a real-text pool for the synthetic page generator."""
    from pipeline.synthetic import split_paragraphs

    licences = Path("/usr/share/common-licenses")
    require(licences.is_dir(), "/usr/share/common-licenses (the licence texts)")
    return [p for f in sorted(licences.iterdir()) if f.is_file() for p in split_paragraphs(f.read_text(errors="replace"))]


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The BPE tokenizer engine.testing.build_checkpoint trains by default, trained once for tests that build several
    checkpoints."""
    from engine import hf_format
    from engine.testing import tokenizer_texts

    return hf_format.train_tokenizer(tokenizer_texts(), 600)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """The tiny random-weight Qwen3.5 VL checkpoint, built once per session in the real HF format."""
    from jobs.make_tiny_checkpoint import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-random", seed=0)


@pytest.fixture(scope="session")
def s3_server():
    """moto in server mode on 127.0.0.1: the job reaches it over HTTP through the same code path as real S3.
    Credentials go through the environment, as in production, so Ray workers started afterwards inherit them."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    yield f"http://{host}:{port}"
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def s3_client(s3_server):
    import boto3

    return boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")

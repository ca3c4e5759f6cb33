"""A quantized checkpoint through the job like any other: a bad one fails in prepare() (before Ray starts) with the
checkpoint's own message, a good one parses documents on a real local Ray and its page rows' model_id names it."""
import json
import shutil

import pytest
import torch

from engine.testing import build_checkpoint
from pipeline.config import ConfigError
from pipeline.job import prepare, run
from pipeline.output import OutputStore
from pipeline.quantize import quantize_checkpoint_job
from pipeline.storage import resolve
from test_job_ray import BACKEND, job_config, make_pdfs


@pytest.fixture(scope="module")
def fp8_ckpt(tmp_path_factory, tiny_tokenizer):
    root = tmp_path_factory.mktemp("q")
    src = build_checkpoint(root / "tiny", tokenizer=tiny_tokenizer, seed=9, dtype=torch.bfloat16)
    assert quantize_checkpoint_job(src, "fp8", root / "tiny-q", no_awq=True) == 0
    return src, root / "tiny-q"


def test_bad_quantized_checkpoint_fails_before_ray(fp8_ckpt, tmp_path):
    _, q = fp8_ckpt
    bad = tmp_path / "bad"
    shutil.copytree(q, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["quantization_config"]["config_groups"]["group_fp8"]["weights"]["num_bits"] = 4
    (bad / "config.json").write_text(json.dumps(cfg))
    make_pdfs(tmp_path / "in", 1)
    with pytest.raises(ConfigError, match=r"config_groups\.group_fp8\.weights\.strategy='channel' unsupported"):
        prepare(job_config(bad, [str(tmp_path / "in")], str(tmp_path / "out")))


@pytest.mark.ray
@pytest.mark.timeout(400)
def test_quantized_checkpoint_parses_and_is_named_in_rows(fp8_ckpt, tmp_path):
    src, q = fp8_ckpt
    make_pdfs(tmp_path / "in", 2, pages=1)
    cfg = job_config(q, [str(tmp_path / "in")], str(tmp_path / "out"))
    prep = prepare(cfg)
    run(prep, echo=lambda *_: None)
    pages = OutputStore(resolve(str(tmp_path / "out"), cfg.storage)).pages().to_pylist()
    assert len(pages) == 2 and all(p["backend"] == BACKEND and p["output_tokens"] > 0 for p in pages)
    ids = {p["model_id"] for p in pages}
    assert len(ids) == 1 and ids.pop().startswith("tiny-q-fp8-")

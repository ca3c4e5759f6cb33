"""The drafter shipped for models/ocria-tiny: it loads against its target, and on real blocks of a sample document
its greedy reads are plain decoding's, token for token, while drafts are accepted (more than 2 tokens a verify step
on these blocks in fp32; docs/speculative-decoding.md has the shipped drafter's figure)."""
from pathlib import Path

import pytest

from engine.interface import DEFAULT_PROMPT, SamplingParams
from engine.llm_engine import Engine
from pipeline.config import load_config
from pipeline.page_reading import block_reading, raster_options
from pipeline.rasterize import rasterize

ROOT = Path(__file__).resolve().parents[1]
TARGET, DRAFTER = ROOT / "models" / "ocria-tiny", ROOT / "models" / "ocria-tiny-drafter"


@pytest.fixture(scope="module")
def blocks():
    cfg = load_config(None, {"input": {"uris": ["x"]}, "model": {"checkpoint": str(TARGET)}})
    reading = block_reading(cfg, str(TARGET))
    doc = ROOT / "samples" / "report.pdf"
    _, _, page = next(iter(rasterize(doc.read_bytes(), str(doc), raster_options(cfg, str(TARGET)))))
    return reading.images(page.image)[:3]


@pytest.mark.slow  # ~2 min: the shipped drafter over every sample block, plain and speculative
def test_shipped_drafter_is_lossless_and_accepted_on_sample_blocks(blocks):
    reqs = [dict(request_id=f"b{i}", prompt=DEFAULT_PROMPT, image=im, sampling=SamplingParams(max_tokens=96))
            for i, im in enumerate(blocks)]
    opts = dict(device="cpu", dtype="float32", max_num_seqs=len(reqs))
    plain = Engine.from_checkpoint(str(TARGET), **opts).generate(reqs)
    spec = Engine.from_checkpoint(str(TARGET), speculative=dict(
        drafter=str(DRAFTER), num_speculative_tokens=15, max_batch=None),
                                 **opts).generate(reqs)
    assert [o.output_token_ids for o in spec] == [o.output_token_ids for o in plain]
    steps = sum(o.spec.steps for o in spec)
    tau = (sum(o.spec.accepted for o in spec) + steps) / steps
    assert tau > 2.0, f"the shipped drafter accepted {tau:.2f} tokens a step on sample blocks"

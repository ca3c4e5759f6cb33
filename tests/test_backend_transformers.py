"""TransformersBackend on the tiny random checkpoint, and engine.backends.load_backend."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from engine.backends import available_backends, load_backend
from engine.interface import PageRequest, SamplingParams
from engine.testing import build_tiny_checkpoint

from engine.backend_transformers import TransformersBackend


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-random", seed=0)


@pytest.fixture(scope="module")
def backend(ckpt):
    b = TransformersBackend(ckpt, device="cpu", dtype="float32", max_batch_size=8)
    yield b
    b.close()


def _page(h: int, w: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)


def _requests(max_tokens: int = 12) -> list[PageRequest]:
    sizes = [(300, 200), (120, 410), (64, 64)]  # different image token counts -> left padding
    return [
        PageRequest(f"page-{i}", _page(h, w, i), sampling=SamplingParams(max_tokens=max_tokens))
        for i, (h, w) in enumerate(sizes)
    ]


def _key(r):
    return (r.request_id, r.text, r.prompt_tokens, r.output_tokens, r.finish_reason, r.error)


@pytest.mark.slow
def test_batch_equals_one_by_one(backend):
    reqs = _requests()
    batched = backend.parse(reqs)
    single = [backend.parse([r])[0] for r in reqs]
    assert [_key(r) for r in batched] == [_key(r) for r in single]
    assert len({r.prompt_tokens for r in batched}) == 3
    assert all(r.finish_reason == "length" and r.output_tokens == 12 and r.text for r in batched)
    assert len({r.text for r in batched}) == 3  # the image matters
    for r in batched:
        assert 0 < r.ttft_s <= r.total_s and 0 <= r.decode_s <= r.total_s


def test_batches_split_by_max_batch_size(ckpt, backend):
    small = TransformersBackend(ckpt, max_batch_size=2)
    reqs = _requests()
    assert [_key(r) for r in small.parse(reqs)] == [_key(r) for r in backend.parse(reqs)]
    small.close()


def test_max_tokens_truncates_per_request(backend):
    reqs = _requests(max_tokens=10)
    reqs[1] = replace(reqs[1], sampling=SamplingParams(max_tokens=3))
    full, short = backend.parse(reqs), backend.parse([reqs[1]])[0]
    assert [r.output_tokens for r in full] == [10, 3, 10]
    assert all(r.finish_reason == "length" for r in full)
    assert _key(full[1]) == _key(short)


def test_stop_token_ends_generation(ckpt):
    b = TransformersBackend(ckpt)
    req = _requests(max_tokens=12)[0]
    free = b.parse([req])[0]
    # make the 4th generated token a stop token: generation must end there, text = the tokens before it
    model_in = b._prepare(0, req)
    out = b.model.generate(
        **b._batch_inputs([model_in]), generation_config=b._generation_config(SamplingParams(), 12)
    )[0, len(model_in.input_ids) :].tolist()
    b.eos_ids = [out[3]]
    stopped = b.parse([req])[0]
    assert free.text == b.tokenizer.decode(out, skip_special_tokens=True) and free.finish_reason == "length"
    first = out.index(out[3])  # the stop id may already occur earlier
    assert stopped.finish_reason == "stop"
    assert stopped.output_tokens == first + 1
    assert stopped.text == b.tokenizer.decode(out[:first], skip_special_tokens=True)
    b.close()


def test_beam_search_batched_matches_native_engine(ckpt, backend):
    """Beam requests batch apart from greedy ones, and read as the native engine's beam search reads them."""
    reqs = [replace(r, sampling=SamplingParams(max_tokens=12, num_beams=3)) for r in _requests()]
    greedy = _requests()[0]
    got = backend.parse(reqs + [greedy])
    native = load_backend("native", str(ckpt), device="cpu", dtype="float32", max_batch_size=12, num_blocks=128)
    want = native.parse(reqs)
    native.close()
    assert [_key(r) for r in got[:3]] == [_key(r) for r in want]
    assert _key(got[3]) == _key(backend.parse([greedy])[0])
    assert any(b.text != g.text for b, g in zip(got, backend.parse(_requests()))), "beams read like greedy"


def test_bad_request_fails_alone(backend):
    good = _requests()
    bad = [
        PageRequest("empty", np.zeros((0, 0, 3), np.uint8)),
        PageRequest("gray", np.zeros((50, 50), np.uint8)),
        PageRequest("float", np.zeros((50, 50, 3), np.float32)),
        PageRequest("too-wide", np.zeros((10, 3000, 3), np.uint8)),
        PageRequest("no-tokens", good[0].image, sampling=SamplingParams(max_tokens=0)),
        PageRequest("neg-temp", good[0].image, sampling=SamplingParams(temperature=-1.0)),
        PageRequest("loop-drop", good[0].image, sampling=SamplingParams(loop_drop_tokens=64)),
        PageRequest("loop-ban", good[0].image, sampling=SamplingParams(loop_ban_next=True)),
    ]
    mixed = [good[0], bad[0], good[1], *bad[1:], good[2]]
    results = backend.parse(mixed)
    assert [r.request_id for r in results] == [r.request_id for r in mixed]
    by_id = {r.request_id: r for r in results}
    for r in bad:
        res = by_id[r.request_id]
        assert res.finish_reason == "error" and res.error and res.text == "" and res.output_tokens == 0
    assert "empty" in by_id["empty"].error
    assert "H x W x 3 uint8" in by_id["gray"].error and "H x W x 3 uint8" in by_id["float"].error
    assert "aspect ratio" in by_id["too-wide"].error
    assert "max_tokens" in by_id["no-tokens"].error
    assert "native engine's" in by_id["loop-drop"].error and "native engine's" in by_id["loop-ban"].error
    assert [_key(by_id[r.request_id]) for r in good] == [_key(r) for r in backend.parse(good)]


def test_sampling_seeds_reproducible(backend):
    image = _page(200, 160, 7)

    def sampled(rid, seed, temperature=1.0, top_p=1.0, top_k=0):
        sp = SamplingParams(max_tokens=10, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
        return PageRequest(rid, image, sampling=sp)

    a, b, c, d, e = backend.parse(
        [sampled("a", 1), sampled("b", 1), sampled("c", 2), sampled("same-id", None), sampled("same-id", None)]
    )
    assert a.text == b.text and a.output_tokens == b.output_tokens == 10
    assert c.text != a.text
    assert d.text == e.text  # seed derived from the request id
    again = backend.parse([sampled("a", 1)])[0]
    assert again.text == a.text
    # a very peaked distribution behaves like greedy
    greedy = backend.parse([PageRequest("g", image, sampling=SamplingParams(max_tokens=10))])[0]
    assert backend.parse([sampled("t", 5, temperature=1e-4)])[0].text == greedy.text
    assert backend.parse([sampled("k", 5, top_k=1)])[0].text == greedy.text
    assert backend.parse([sampled("p", 5, top_p=1e-6)])[0].text == greedy.text


def test_construction_errors(tmp_path, ckpt):
    with pytest.raises(ValueError, match="checkpoint folder not found"):
        TransformersBackend(tmp_path / "nope")
    with pytest.raises(ValueError, match="config.json"):
        TransformersBackend(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="model_type='llama'"):
        TransformersBackend(tmp_path)
    with pytest.raises(ValueError, match="dtype"):
        TransformersBackend(ckpt, dtype="fp8")


def test_model_id_and_load_backend(ckpt, backend):
    assert backend.backend_id == "transformers"
    assert backend.model_id.startswith("tiny-random-") and len(backend.model_id) == len("tiny-random-") + 10
    assert "transformers" in available_backends()
    b = load_backend("transformers", str(ckpt), device="cpu", dtype="auto", max_batch_size=4)
    assert isinstance(b, TransformersBackend) and b.dtype.is_floating_point and b.max_batch_size == 4
    assert b.model_id == backend.model_id
    b.close()
    with pytest.raises(ValueError, match="unknown backend"):
        load_backend("vllm", str(ckpt))


def test_engine_imports_without_transformers():
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "import engine.backends, engine.backend_transformers, engine.hf_format\n"
        "assert 'transformers' not in engine.backends.available_backends()\n"
        "try:\n"
        "    engine.backends.load_backend('transformers', '.')\n"
        "except ValueError as e:\n"
        "    assert 'transformers' in str(e)\n"
        "else:\n"
        "    raise SystemExit('no error')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

"""Serving behaviour: sampling with per-request seeds, stop tokens, max tokens, context budget, abort, backend."""
import kernels.testing  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is compiled)
import numpy as np
import pytest
import torch

from engine.interface import PageRequest, SamplingParams
from engine.llm_engine import Engine, RequestRejected
from engine.sampler import filter_logits
from engine.testing import build_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("vl"), seed=6)


@pytest.fixture(scope="module")
def eng(ckpt):
    return Engine.from_checkpoint(ckpt, max_num_seqs=6, num_blocks=128, block_size=16, max_model_len=200)


def ids(n, seed):
    return np.random.default_rng(seed).integers(0, 500, n).tolist()


def test_filter_logits_top_k_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1], [0.1, 0.2, 0.3, 0.4]]))
    kept = filter_logits(logits, torch.tensor([2, 0]), torch.tensor([1.0, 0.6])).isfinite()
    assert kept.tolist() == [[True, True, False, False], [False, False, True, True]]
    kept = filter_logits(logits, torch.tensor([0, 0]), torch.tensor([0.01, 1.0])).isfinite()
    assert kept.tolist() == [[True, False, False, False], [True, True, True, True]]


def test_seeded_sampling_is_per_request(eng):
    sp = SamplingParams(max_tokens=12, temperature=1.0, seed=123)
    alone = eng.generate([dict(prompt_token_ids=ids(20, 0), sampling=sp, ignore_eos=True)])[0]
    crowd = eng.generate([dict(prompt_token_ids=ids(9, 1), sampling=SamplingParams(max_tokens=5, temperature=0.7)),
                          dict(prompt_token_ids=ids(20, 0), sampling=sp, ignore_eos=True),
                          dict(prompt_token_ids=ids(30, 2), sampling=SamplingParams(max_tokens=15, temperature=1.3))])
    assert crowd[1].output_token_ids == alone.output_token_ids
    other = eng.generate([dict(prompt_token_ids=ids(20, 0), sampling=SamplingParams(max_tokens=12, temperature=1.0,
                                                                                    seed=124), ignore_eos=True)])[0]
    assert other.output_token_ids != alone.output_token_ids
    greedy = eng.generate([dict(prompt_token_ids=ids(20, 0), sampling=SamplingParams(max_tokens=12), ignore_eos=True)])
    top1 = eng.generate([dict(prompt_token_ids=ids(20, 0), ignore_eos=True,
                              sampling=SamplingParams(max_tokens=12, temperature=1.0, top_k=1, seed=5))])
    assert top1[0].output_token_ids == greedy[0].output_token_ids
    assert alone.output_token_ids != greedy[0].output_token_ids


def test_stop_tokens_and_max_tokens(ckpt, eng):
    free = eng.generate([dict(prompt_token_ids=ids(15, 3), sampling=SamplingParams(max_tokens=10), ignore_eos=True)])[0]
    assert free.finish_reason == "length" and free.output_tokens == 10
    stop = free.output_token_ids[4]
    first = free.output_token_ids.index(stop)
    e2 = Engine.from_checkpoint(ckpt, num_blocks=32)
    e2.stop_token_ids = frozenset({stop})
    out = e2.generate([dict(prompt_token_ids=ids(15, 3), sampling=SamplingParams(max_tokens=10))])[0]
    assert out.finish_reason == "stop"
    assert out.output_token_ids == free.output_token_ids[:first + 1]
    assert out.text == e2.processor.decode(free.output_token_ids[:first])


def test_context_budget_rejection(eng):
    with pytest.raises(RequestRejected, match="exceeds the context budget max_model_len=200"):
        eng.add_request("too-long", prompt_token_ids=ids(150, 4), sampling=SamplingParams(max_tokens=60))
    outs = eng.generate([dict(prompt_token_ids=ids(150, 4), sampling=SamplingParams(max_tokens=60)),
                         dict(prompt_token_ids=ids(10, 5), sampling=SamplingParams(max_tokens=3))])
    assert outs[0].finish_reason == "error" and "max_model_len" in outs[0].error
    assert outs[1].finish_reason in ("stop", "length") and outs[1].output_tokens >= 1
    with pytest.raises(RequestRejected, match="token id outside"):
        eng.add_request("bad-token", prompt_token_ids=[10**6])


def test_abort_and_stats(eng):
    eng.add_request("keep", prompt_token_ids=ids(12, 6), sampling=SamplingParams(max_tokens=6), ignore_eos=True)
    eng.add_request("drop", prompt_token_ids=ids(12, 7), sampling=SamplingParams(max_tokens=50), ignore_eos=True)
    eng.step()
    eng.abort("drop")
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    assert [o.request_id for o in outs] == ["keep"]
    o = outs[0]
    assert o.prompt_tokens == 12 and o.output_tokens == 6
    assert o.ttft_s > 0 and o.decode_s > 0 and o.total_s >= o.ttft_s and o.decode_tokens_per_s > 0
    assert eng.block_manager.num_free == eng.block_manager.num_blocks  # everything released


def test_native_backend_parse(ckpt):
    from engine.backends import load_backend

    backend = load_backend("native", str(ckpt), device="cpu", dtype="float32", max_batch_size=3, num_blocks=64)
    assert backend.backend_id == "native" and backend.model_id.startswith(ckpt.name)
    rng = np.random.default_rng(0)
    reqs = [PageRequest("p0", rng.integers(0, 256, (90, 70, 3), dtype=np.uint8), sampling=SamplingParams(max_tokens=5)),
            PageRequest("bad", np.zeros((5, 5), dtype=np.uint8)),
            PageRequest("p1", rng.integers(0, 256, (300, 200, 3), dtype=np.uint8),
                        sampling=SamplingParams(max_tokens=4)),
            PageRequest("p2", rng.integers(0, 256, (50, 50, 3), dtype=np.uint8),
                        sampling=SamplingParams(max_tokens=7, temperature=0.8))]
    res = backend.parse(reqs)
    assert [r.request_id for r in res] == ["p0", "bad", "p1", "p2"]
    assert res[1].finish_reason == "error" and "uint8" in res[1].error
    for r, n in zip([res[0], res[2], res[3]], [5, 4, 7]):
        assert r.finish_reason in ("stop", "length") and 1 <= r.output_tokens <= n and r.prompt_tokens > 20
        assert isinstance(r.text, str)
    again = backend.parse([reqs[3]])[0]
    assert again.text == res[3].text  # seed derived from the request id
    backend.close()


def test_compact_uint8_patches_give_the_float_patches_results(eng):
    """Processor.page_inputs(compact=True) ships uint8 patches that the engine expands on its device: the same
    tokens and logits, bit for bit, as the transformers-format float patches."""
    img = np.random.default_rng(8).integers(0, 256, (150, 110, 3), dtype=np.uint8)
    reqs = []
    for compact in (False, True):
        ids_, pv, grids = eng.processor.page_inputs(img, "Read.", compact=compact)
        reqs.append(dict(prompt_token_ids=ids_, pixel_values=pv, image_grids=grids, keep_logits=True,
                         sampling=SamplingParams(max_tokens=6), ignore_eos=True))
    assert reqs[1]["pixel_values"].dtype == np.uint8 and reqs[0]["pixel_values"].dtype == np.float32
    full, compact = eng.generate(reqs)
    assert compact.output_token_ids == full.output_token_ids
    assert torch.equal(compact.logits, full.logits)
    bad = dict(reqs[1], pixel_values=reqs[1]["pixel_values"][:, :-1])
    with pytest.raises(RequestRejected, match="pixel_values shape"):
        eng.add_request("bad-width", **{k: v for k, v in bad.items() if k != "keep_logits"})


def test_padded_decode_rows_are_inert(ckpt):
    """Decode batches padded to CUDA-graph sizes (padding rows: no KV slot, no state slot, empty context) give the
    same tokens as unpadded ones; on CPU the padding is forced by setting the runner's sizes."""
    from engine.model_runner import graph_batch_sizes

    reqs = [dict(prompt_token_ids=ids(n, 20 + n), sampling=SamplingParams(max_tokens=8), ignore_eos=True)
            for n in (5, 17, 9)]
    plain = Engine.from_checkpoint(ckpt, max_num_seqs=8, num_blocks=64).generate(reqs)
    padded = Engine.from_checkpoint(ckpt, max_num_seqs=8, num_blocks=64)
    padded.runner.decode_sizes = graph_batch_sizes(8)  # 3 sequences run as a batch of 4, 2 as 2, ...
    assert padded.runner.decode_sizes[:3] == [1, 2, 4]
    out = padded.generate(reqs)
    assert [o.output_token_ids for o in out] == [o.output_token_ids for o in plain]


def test_native_backend_ignore_eos_generates_max_tokens(ckpt):
    """ignore_eos (a backend option, e.g. model.options in the job config) makes every page exactly max_tokens long:
    the fixed-length work of throughput benchmarks, whatever the random weights would stop at."""
    from engine.backends import load_backend

    rng = np.random.default_rng(1)
    reqs = [PageRequest(f"p{i}", rng.integers(0, 256, (64 + 16 * i, 48, 3), dtype=np.uint8),
                        sampling=SamplingParams(max_tokens=9)) for i in range(3)]
    backend = load_backend("native", str(ckpt), device="cpu", dtype="float32", max_batch_size=3, num_blocks=64,
                           ignore_eos=True)
    res = backend.parse(reqs)
    assert [(r.output_tokens, r.finish_reason) for r in res] == [(9, "length")] * 3
    backend.close()


def test_engine_loop_serves_concurrent_callers_like_one_batch(ckpt):
    """Callers on several threads share one engine loop: each gets its own requests' outputs, identical to one
    plain generate() of all of them (greedy, and sampled with per-request seeds)."""
    import threading

    from engine.engine_loop import EngineLoop

    reqs = {f"r{i}": dict(prompt_token_ids=ids(5 + 3 * i, 40 + i), ignore_eos=True,
                          sampling=SamplingParams(max_tokens=4 + i % 5, temperature=0.7 * (i % 2), seed=i))
            for i in range(10)}
    ref = {o.request_id: o.output_token_ids for o in Engine.from_checkpoint(ckpt, max_num_seqs=4, num_blocks=64)
           .generate([dict(r, request_id=k) for k, r in reqs.items()])}
    loop = EngineLoop(Engine.from_checkpoint(ckpt, max_num_seqs=4, num_blocks=64))
    got, errors = {}, []

    def caller(keys):
        try:
            futs = {k: loop.submit(k, **reqs[k]) for k in keys}
            got.update({k: f.result(timeout=120).output_token_ids for k, f in futs.items()})
        except Exception as e:  # noqa: BLE001  (reported by the assertion below)
            errors.append(e)

    threads = [threading.Thread(target=caller, args=(list(reqs)[i::3],)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not errors and got == ref
    assert loop.busy_s > 0
    rejected = loop.submit("bad", prompt_token_ids=[10**6]).result(timeout=60)
    assert rejected.finish_reason == "error" and "token id outside" in rejected.error
    loop.close()


def test_engine_loop_failure_reaches_every_waiting_caller(ckpt):
    from engine.engine_loop import EngineLoop

    eng = Engine.from_checkpoint(ckpt, max_num_seqs=4, num_blocks=64)

    def broken_step():
        raise RuntimeError("device lost")

    eng.step = broken_step
    loop = EngineLoop(eng)
    futs = [loop.submit(f"x{i}", prompt_token_ids=ids(6, i), sampling=SamplingParams(max_tokens=3)) for i in range(3)]
    for f in futs:
        with pytest.raises(RuntimeError, match="device lost"):
            f.result(timeout=60)
    with pytest.raises(RuntimeError, match="engine loop stopped"):
        loop.submit("late", prompt_token_ids=ids(6, 9)).result(timeout=60)


def test_native_backend_concurrent_parse_calls(ckpt):
    """Two threads call parse() at once (the pipeline's concurrent batches): each gets its own pages, in order, as
    a call on its own would; a bad page fails alone."""
    from concurrent.futures import ThreadPoolExecutor

    from engine.backends import load_backend

    rng = np.random.default_rng(3)
    batches = [[PageRequest(f"b{b}p{i}", rng.integers(0, 256, (40 + 24 * i, 56, 3), dtype=np.uint8),
                            sampling=SamplingParams(max_tokens=3 + i, temperature=0.5 * (i % 2))) for i in range(4)]
               for b in range(2)]
    batches[1][2] = PageRequest("b1bad", np.zeros((4, 4), dtype=np.uint8))
    backend = load_backend("native", str(ckpt), device="cpu", dtype="float32", max_batch_size=3, num_blocks=64)
    alone = [backend.parse(b) for b in batches]
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(backend.parse, batches))
    for a, t in zip(alone, together):
        assert [(r.request_id, r.text, r.output_tokens, r.finish_reason) for r in t] == \
            [(r.request_id, r.text, r.output_tokens, r.finish_reason) for r in a]
    assert together[1][2].finish_reason == "error" and "uint8" in together[1][2].error
    assert backend.busy_s > 0
    backend.close()


def test_engine_loop_request_that_breaks_add_request_fails_alone(ckpt):
    from engine.engine_loop import EngineLoop

    loop = EngineLoop(Engine.from_checkpoint(ckpt, max_num_seqs=4, num_blocks=64))
    bad = loop.submit("bad", prompt_token_ids=ids(6, 1), no_such_argument=1).result(timeout=60)
    assert bad.finish_reason == "error" and "TypeError" in bad.error
    good = loop.submit("good", prompt_token_ids=ids(6, 2), sampling=SamplingParams(max_tokens=3),
                       ignore_eos=True).result(timeout=60)
    assert good.finish_reason == "length" and good.output_tokens == 3
    loop.close()

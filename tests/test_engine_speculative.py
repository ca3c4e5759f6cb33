"""Speculative decoding with a DFlash drafter (engine/speculative.py): lossless against plain decoding, on CPU in
fp32 with tiny random checkpoints. A random drafter is almost never right (every step commits 1 token); an oracle
drafter proposing the target's own greedy continuation, with planted mistakes, makes long and partial acceptances
run the commit path."""
import kernels.testing  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is compiled)
import json

import numpy as np
import pytest
import torch

from engine.interface import SamplingParams
from engine.llm_engine import Engine
from engine.models.dflash import DrafterConfigError
from engine.options import DecodeTuning
from engine.spec_graphs import SpecGraphs
from engine.speculative import SpecDecoder
from engine.testing import write_random_drafter

BLOCK = 5


@pytest.fixture(scope="module", params=["dflash", "dflash2"])
def drafter(text_ckpt, tmp_path_factory, request):
    """A random DFlash drafter, and a DFlash2 one (its convolutions and candidate selector in every draft)."""
    return write_random_drafter(tmp_path_factory.mktemp("drafter"), text_ckpt, block_size=BLOCK, seed=3,
                                dflash2=request.param == "dflash2")


def ids(n, seed):
    return np.random.default_rng(seed).integers(0, 500, n).tolist()


REQS = [(12, 23), (70, 9), (5, 31), (33, 17)]  # (prompt tokens, max_tokens)


def requests(sp=None):
    return [dict(request_id=f"r{i}", prompt_token_ids=ids(n, i), ignore_eos=True,
                 sampling=sp or SamplingParams(max_tokens=m)) for i, (n, m) in enumerate(REQS)]


@pytest.fixture(scope="module")
def plain(text_ckpt):
    eng = Engine.from_checkpoint(text_ckpt, dtype="float32", max_num_seqs=4, num_blocks=64, block_size=8)
    return {o.request_id: o.output_token_ids for o in eng.generate(requests())}


def run_with_arrivals(eng, reqs, arrive_at):
    """Add reqs[i] before step arrive_at[i]; step to the end -> {request id: output}."""
    outs, step = {}, 0
    pending = sorted(zip(arrive_at, range(len(reqs))))
    while pending or eng.has_unfinished():
        while pending and pending[0][0] <= step:
            r = dict(reqs[pending.pop(0)[1]])
            eng.add_request(r.pop("request_id"), **r)
        for o in eng.step():
            outs[o.request_id] = o
        step += 1
    return outs


def test_greedy_with_random_drafter_equals_plain(text_ckpt, drafter, plain):
    """Joins mid-decode, chunked prefill (a 24-token budget) and per-request caps (max_tokens cuts blocks)."""
    eng = Engine.from_checkpoint(text_ckpt, dtype="float32", max_num_seqs=4, num_blocks=64, block_size=8,
                                 max_num_batched_tokens=24, speculative=dict(drafter=str(drafter)))
    outs = run_with_arrivals(eng, requests(), [0, 3, 4, 9])
    for rid, want in plain.items():
        o = outs[rid]
        assert o.output_token_ids == want, rid
        assert o.spec.steps > 0 and o.spec.drafted > 0
        assert o.spec.accepted == sum(o.spec.accepted_by_pos) and o.spec.drafted == sum(o.spec.drafted_by_pos)
        assert o.spec.steps + o.spec.accepted == len(want) - 1  # every output token but the prefill's
    assert eng.block_manager.num_free == eng.block_manager.num_blocks


@pytest.mark.parametrize("fold_after", [0, 3])
def test_batches_above_speculative_max_batch_decode_plainly(text_ckpt, drafter, plain, fold_after):
    """speculative max_batch=2: while 3-4 sequences decode the steps are plain (one step ahead of the device), once 2 or
    fewer are left they speculate, also right after a plain step still in flight; the outputs stay plain
    decoding's (requests arrive while others speculate: a plain step folds their pending GDN updates first)."""
    eng = Engine.from_checkpoint(text_ckpt, dtype="float32", max_num_seqs=4, num_blocks=64, block_size=8,
                                 speculative=dict(drafter=str(drafter), max_batch=2),
                                 tuning=DecodeTuning(spec_fold_after=fold_after))
    kinds = []
    launch_spec, launch = eng._launch_spec, eng._launch
    eng._launch_spec = lambda sched, *a: kinds.append(("spec", len(sched.seqs), eng._inflight is not None)) or \
        launch_spec(sched, *a)
    eng._launch = lambda sched: (kinds.append(("step", len(sched.seqs), sched.is_prefill)) or launch(sched))
    outs = run_with_arrivals(eng, requests(), [0, 0, 6, 6])
    for rid, want in plain.items():
        assert outs[rid].output_token_ids == want, rid
    # r0 and r1 speculate until r2 and r3 arrive; r1 (9 tokens) and r3 (17) end while 3-4 decode; r0 (23) and r2
    # (31) outlast them
    assert outs["r1"].spec.steps > 0 and outs["r3"].spec.steps == 0
    assert outs["r0"].spec.steps > 0 and outs["r2"].spec.steps > 0
    spec = [k for k in kinds if k[0] == "spec"]
    decode = [k for k in kinds if k[0] == "step" and not k[2]]
    assert spec and all(n <= 2 for _, n, _ in spec)
    assert any(n > 2 for _, n, _ in decode)
    assert any(after_plain for _, _, after_plain in spec)  # launched while a plain step was in flight
    assert eng.block_manager.num_free == eng.block_manager.num_blocks
    spec = dict(drafter=str(drafter))
    for bad, says in ((dict(speculative=dict(spec, max_batch=0)), r"speculative.max_batch=0: give an integer >= 1"),
                      (dict(speculative=spec, tuning=DecodeTuning(spec_fold_after=-1)),
                       "spec_fold_after=-1: give an integer >= 0"),
                      (dict(speculative=dict(spec, num_speculative_tokens=0)),
                       r"speculative.num_speculative_tokens=0: give an integer >= 1"),
                      (dict(speculative=dict(spec, max_batches=2)),
                       r"speculative.max_batches is not a speculation option \(did you mean max_batch\?\)")):
        with pytest.raises(ValueError, match=says):
            Engine.from_checkpoint(text_ckpt, dtype="float32", max_num_seqs=4, num_blocks=64, **bad)


class Oracle(SpecDecoder):
    """Test double of the drafter: proposes the target's own greedy continuation (from a plain run), wrong at one
    block position every third step, so blocks are accepted whole, in part, or not at all."""

    reference: dict = {}

    def propose(self, seqs, block, sampled, index, slots, block_tables, draft_ctx):
        S, T = block.shape
        drafts = torch.zeros(S, T - 1, dtype=torch.int64)
        for r, seq in enumerate(seqs):
            ref = self.reference[seq.request_id]
            start = len(seq) - 1 - seq.prompt_len  # output index of the block's first token
            for j in range(1, T):
                k = start + j
                drafts[r, j - 1] = ref[k] if k < len(ref) else 0
            if (start + r) % 3 == 0:
                m = (start * 7 + r) % (T - 1)
                drafts[r, m] = (drafts[r, m] + 1) % 500
        return drafts.to(block.device), None


def oracle_engine(text_ckpt, drafter, plain, static=True, **opts):
    """static: greedy steps through engine/spec_graphs' static buffers (padded batches, the scratch state slot), as
    the engine runs them unless enforce_eager; else the eager step."""
    eng = Engine.from_checkpoint(text_ckpt, dtype="float32", max_num_seqs=4, block_size=8,
                                 speculative=dict(drafter=str(drafter)), **opts)
    oracle = Oracle(eng.runner, eng.spec.drafter, eng.spec.T, 4)
    oracle.reference = plain
    if static:
        oracle.graphs = SpecGraphs(oracle, 4, eng.runner.cache.max_blocks_per_seq, eng.runner.scratch_slot,
                                   capture=False)
    eng.spec = oracle
    return eng


@pytest.mark.parametrize("fold_after", [0, 4])
@pytest.mark.parametrize("static", [True, False], ids=["static", "eager"])
def test_oracle_drafter_long_acceptances_equal_plain(text_ckpt, drafter, plain, static, fold_after):
    """Joins leave 1, 2, 3 or 4 sequences running: padded to 1, 2, 4, 4 rows on the static path. fold_after 4:
    accepted GDN updates stay pending over several steps before a verify writes the state back."""
    eng = oracle_engine(text_ckpt, drafter, plain, static=static, num_blocks=64,
                        tuning=DecodeTuning(spec_fold_after=fold_after))
    batches = []
    if static:
        run = eng.spec.graphs.run
        eng.spec.graphs.run = lambda plan: batches.append(len(plan.valid)) or run(plan)
    outs = run_with_arrivals(eng, requests(), [0, 2, 2, 5])
    assert (3 in batches) == static  # a batch padded to a larger size ran on the static path
    taus = []
    for rid, want in plain.items():
        o = outs[rid]
        assert o.output_token_ids == want, rid
        taus.append(o.spec.tau)
        # accepted blocks of every length were committed: whole ones and cut ones
        assert o.spec.accepted_by_pos[0] > 0 and o.spec.accepted < o.spec.drafted
    assert min(taus) > 2.0, taus


def test_preemption_with_speculation_equals_plain(text_ckpt, drafter, plain):
    """12 blocks of 8 tokens for four sequences growing by up to 31 tokens plus a 5-token block: decode preempts
    (with GDN updates pending in the preempted sequences' slots, which the next sequence there must not see)."""
    for eng in (Engine.from_checkpoint(text_ckpt, dtype="float32", max_num_seqs=4, num_blocks=14, block_size=8,
                                       speculative=dict(drafter=str(drafter))),
                oracle_engine(text_ckpt, drafter, plain, num_blocks=14, tuning=DecodeTuning(spec_fold_after=6))):
        outs = {o.request_id: o for o in eng.generate(requests())}
        assert sum(o.num_preemptions for o in outs.values()) > 0
        for rid, want in plain.items():
            assert outs[rid].output_token_ids == want, rid


def test_loop_guard_beam_and_opt_out_with_speculation(text_ckpt, drafter):
    """Beam search stays non-speculative beside speculative requests; loop_stop_tokens and
    num_speculative_tokens=0 give plain decoding's results."""
    def run(drafter_path):
        eng = Engine.from_checkpoint(text_ckpt, dtype="float32", max_num_seqs=6, num_blocks=64, block_size=8,
                                     speculative=dict(drafter=drafter_path))
        return eng.generate([
            dict(prompt_token_ids=ids(9, 20), sampling=SamplingParams(max_tokens=12, num_beams=2), ignore_eos=True),
            dict(prompt_token_ids=ids(11, 21), sampling=SamplingParams(max_tokens=40, loop_stop_tokens=4),
                 ignore_eos=True),
            dict(prompt_token_ids=ids(14, 22), sampling=SamplingParams(max_tokens=10, num_speculative_tokens=0),
                 ignore_eos=True)])
    want, got = run(None), run(str(drafter))
    for a, b in zip(want, got):
        assert a.output_token_ids == b.output_token_ids and a.finish_reason == b.finish_reason
    assert got[0].spec.steps == 0 and got[2].spec.drafted == 0 and got[1].spec.steps > 0


def test_slots_left_with_pending_updates_serve_later_sequences(text_ckpt, drafter, plain):
    """Speculative sequences end with GDN updates still pending in their slots (fold_after 6); the slots then serve
    new sequences, beam members among them (their states copied from the parent's), whose outputs must be plain
    decoding's: nothing pending in a slot may reach the next sequence there."""
    beam = dict(prompt_token_ids=ids(9, 20), sampling=SamplingParams(max_tokens=12, num_beams=3), ignore_eos=True)
    want = Engine.from_checkpoint(text_ckpt, dtype="float32", max_num_seqs=4, num_blocks=64,
                                  block_size=8).generate([beam])[0]
    eng = oracle_engine(text_ckpt, drafter, plain, num_blocks=64, tuning=DecodeTuning(spec_fold_after=6))
    first = {o.request_id: o for o in eng.generate(requests())}
    assert all(first[rid].output_token_ids == out for rid, out in plain.items())
    ring = eng.runner.gdn_ring
    assert int(ring.pos[:4, 1].max()) > 0  # pending updates left behind in the slots
    copies, copy_caches = [], eng.runner.copy_caches

    def checked_copy(src, dst, *blocks):  # a beam member's slot, once copied, holds nothing pending
        copy_caches(src, dst, *blocks)
        copies.append(ring.pos[dst, 1].tolist())
    eng.runner.copy_caches = checked_copy
    again = eng.generate([beam] + requests()[:2])
    assert copies and all(n == 0 for c in copies for n in c), copies
    assert again[0].output_token_ids == want.output_token_ids
    assert [o.output_token_ids for o in again[1:]] == [plain["r0"], plain["r1"]]


def test_drafter_for_another_target_is_refused(text_ckpt, tmp_path):
    d = write_random_drafter(tmp_path / "d", text_ckpt)
    cfg = json.loads((d / "config.json").read_text())
    for field, value, message in (("hidden_size", 32, "hidden_size=32"), ("vocab_size", 7, "vocab_size=7"),
                                  ("dflash_config", dict(cfg["dflash_config"], target_layer_ids=[1, 9]),
                                   "target_layer_ids"),
                                  ("dflash_config", dict(cfg["dflash_config"], mask_token_id=10**6), "mask_token_id"),
                                  ("num_target_layers", 36, "num_target_layers=36")):
        (d / "config.json").write_text(json.dumps(dict(cfg, **{field: value})))
        with pytest.raises(DrafterConfigError, match=message):
            Engine.from_checkpoint(text_ckpt, dtype="float32", num_blocks=16, speculative=dict(drafter=str(d)))
    (d / "config.json").write_text(json.dumps(dict(cfg, num_hidden_layers=3)))
    with pytest.raises(DrafterConfigError, match="missing"):
        Engine.from_checkpoint(text_ckpt, dtype="float32", num_blocks=16, speculative=dict(drafter=str(d)))


def test_oracle_drafter_on_the_triton_kernels(text_ckpt, drafter, plain, monkeypatch):
    """The same through the Triton kernels (interpreter): GDN verify token by token with its ring, advance and
    fold, paged attention, KV stores."""
    monkeypatch.setenv("OCRIA_FORCE_TRITON", "1")
    eng = oracle_engine(text_ckpt, drafter, plain, num_blocks=64, tuning=DecodeTuning(spec_fold_after=2))
    reqs = requests()[:2]
    outs = run_with_arrivals(eng, reqs, [0, 3])
    for r in reqs:
        o = outs[r["request_id"]]
        assert o.output_token_ids == plain[r["request_id"]] and o.spec.tau > 2.0


def test_sampling_with_speculation_runs_seeded(text_ckpt, drafter, plain):
    """Sampled requests go through rejection sampling: top_k=1 sampling gives greedy's tokens, a seed gives the
    same tokens twice, another seed other tokens."""
    eng = Engine.from_checkpoint(text_ckpt, dtype="float32", max_num_seqs=4, num_blocks=64, block_size=8,
                                 speculative=dict(drafter=str(drafter)))
    top1 = eng.generate([dict(r, sampling=SamplingParams(max_tokens=REQS[i][1], temperature=0.9, top_k=1, seed=i))
                         for i, r in enumerate(requests())])
    assert {o.request_id: o.output_token_ids for o in top1} == plain
    sp = SamplingParams(max_tokens=20, temperature=1.0, seed=7)
    a, b, c = (eng.generate([dict(prompt_token_ids=ids(15, 40), sampling=s, ignore_eos=True)])[0]
               for s in (sp, sp, SamplingParams(max_tokens=20, temperature=1.0, seed=8)))
    assert a.output_token_ids == b.output_token_ids != c.output_token_ids
    assert a.spec.steps > 0


def test_native_backend_with_a_drafter(vl_ckpt, tmp_path):
    """The pipeline's backend takes the drafter as an engine option (model.drafter, --drafter) and reports the
    speculation counts per page; its text is the plain backend's."""
    from engine.backends import load_backend
    from engine.interface import PageRequest

    drafter = write_random_drafter(tmp_path / "d", vl_ckpt, block_size=4)
    page = np.random.default_rng(0).integers(0, 256, (90, 70, 3), dtype=np.uint8)
    req = [PageRequest("p", page, sampling=SamplingParams(max_tokens=12))]
    results = []
    for d in (None, str(drafter)):
        backend = load_backend("native", str(vl_ckpt), device="cpu", dtype="float32", num_blocks=64,
                               speculative=dict(drafter=d))
        results.append(backend.parse(req)[0])
        backend.close()
    plain, spec = results
    assert spec.text == plain.text and spec.output_tokens == plain.output_tokens
    assert spec.spec.steps > 0 and spec.spec.drafted > 0 and plain.spec.steps == 0

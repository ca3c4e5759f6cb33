"""jobs/train_drafter.py (pipeline/train_drafter.py, engine/drafter_training.py) on the tiny random VL checkpoint: a few CPU steps on the target's own greedy answers to
page images given as PNG files; the loss falls and the drafter it writes loads in the engine and decodes losslessly."""
import json

import numpy as np
import pytest
import torch
from PIL import Image

from engine.models.dflash import load_dflash_config
from engine.config import load_config
from pipeline.train_drafter import TrainDrafterConfig, train


def write_pages(folder, n: int, seed: int):
    """n random page images of growing heights as PNG files p0.png .. (the first is the held-out one)."""
    folder.mkdir()
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (64 + 16 * i, 80, 3), dtype=np.uint8)).save(folder / f"p{i}.png")
    return folder


@pytest.mark.slow  # a drafter's collection and training, end to end
def test_train_drafter_smoke(tiny_checkpoint, tmp_path):
    pages = write_pages(tmp_path / "pages", 4, seed=0)
    cfg = TrainDrafterConfig(checkpoint=str(tiny_checkpoint), pages=str(pages), out=str(tmp_path / "drafter"),
                             max_tokens=24, num_layers=1, num_taps=2, block_size=4, anchors=12, gamma=4, lr=3e-3,
                             steps=30, pages_per_step=2, heldout=1, measure_blocks=[4], seed=0)
    log = train(cfg, echo=lambda *_: None)
    losses = log["losses"]
    assert len(losses) == 30 and np.mean(losses[-10:]) < 0.8 * np.mean(losses[:10]), (losses[:10], losses[-10:])
    dcfg = load_dflash_config(tmp_path / "drafter", load_config(tiny_checkpoint).text)
    assert dcfg.block_size == 4 and len(dcfg.target_layer_ids) == 2
    from safetensors import safe_open

    with safe_open(str(tmp_path / "drafter" / "model.safetensors"), "pt") as fh:  # bf16 by default: half the bytes
        assert {fh.get_tensor(n).dtype for n in fh.keys()} == {torch.bfloat16}
    (tau,) = log["heldout_tau"]
    assert tau["identical_to_plain"] and tau["verify_steps"] > 0 and tau["tau"] >= 1.0
    assert json.loads((tmp_path / "drafter" / "train_log.json").read_text())["steps"] == 30
    # bench/drafter_tau.py measures the same on a folder of images
    from conftest import load_bench

    out = tmp_path / "tau.json"
    load_bench("drafter_tau").main(["--checkpoint", str(tiny_checkpoint), "--drafter", str(tmp_path / "drafter"),
                                    "--pages", str(pages), "--prefix", "p0", "--block", "4", "--max-tokens", "24",
                                    "--check-plain", "--out", str(out)], standalone_mode=False)
    (row,) = json.loads(out.read_text())["rows"]
    assert row["identical_to_plain"] and row["pages"] == 1 and row["block_size"] == 4 and row["divergences"] == []
    # --init continues from that drafter: its architecture (the flags given differ) and its weights
    more = cfg.model_copy(update=dict(out=str(tmp_path / "more"), init=str(tmp_path / "drafter"), num_layers=2,
                                      block_size=8, steps=3, lr=1e-3, heldout=0, save_dtype="float32"))
    log2 = train(more, echo=lambda *_: None)
    assert log2["drafter"]["num_hidden_layers"] == 1 and log2["drafter"]["block_size"] == 4
    assert np.mean(log2["losses"]) < 0.8 * np.mean(losses[:10]), (log2["losses"], losses[:10])  # not a fresh start


@pytest.mark.slow  # a drafter's collection and training, end to end
def test_validation_keeps_the_best_drafter(tiny_checkpoint, tmp_path):
    """--val-pages: answers kept out of training, their loss and tau estimate measured every --val-every steps and
    at the end; the drafter written is the one with the highest tau estimate, the lowest loss among equals (a large
    lr makes later steps worse)."""
    from engine.llm_engine import Engine
    from engine.models.dflash import DFlashDrafter
    from engine.drafter_training import (
        EVERY_ANCHOR, accepted_drafts, block_loss, block_pass, collect, greedy_drafts, walk_tau)
    from pipeline.train_drafter import load_pages

    pages = write_pages(tmp_path / "pages", 4, seed=2)
    cfg = TrainDrafterConfig(checkpoint=str(tiny_checkpoint), pages=str(pages), out=str(tmp_path / "drafter"),
                             max_tokens=24, num_layers=1, num_taps=2, block_size=4, anchors=12, gamma=4, lr=0.3,
                             steps=9, pages_per_step=2, val_pages=1, val_every=3, save_dtype="float32", seed=0)
    log = train(cfg, echo=lambda *_: None)
    steps = [s for s, _ in log["val_losses"]]
    assert steps == [0, 3, 6, 9] and log["val_answers"] == 1 and log["answers"] == 3
    tau, loss = dict(log["val_tau_estimate"]), dict(log["val_losses"])
    best_step = max(steps, key=lambda s: (tau[s], -loss[s]))
    assert log["best_step"] == best_step and best_step < 9, (log["val_losses"], tau)  # the last is not the best here
    # the written drafter is that step's: its loss and tau estimate, recomputed from its file on the same anchors
    eng = Engine.from_checkpoint(str(tiny_checkpoint), dtype="float32", max_num_seqs=4, enforce_eager=True)
    d = DFlashDrafter.from_pretrained(tmp_path / "drafter", eng.cfg.text, torch.float32, "cpu")
    val = collect(eng, load_pages(pages)[:1], list(d.cfg.target_layer_ids), cfg.prompt, cfg.max_tokens)
    embed, head = eng.model.language_model.embed_tokens.weight, eng.model.head_weight
    with torch.no_grad():
        bp = block_pass(d, val, embed, head, EVERY_ANCHOR, None, "cpu")
        again = float(block_loss(d, val, embed, head, cfg.anchors, cfg.gamma, None, "cpu", out=bp))
    assert abs(again - loss[best_step]) < 1e-3 * max(1.0, loss[best_step]), (again, loss[best_step])
    tokens, steps = walk_tau(val, accepted_drafts(bp, greedy_drafts(d, bp)))
    assert abs(tokens / steps - tau[best_step]) < 1e-3


def test_collected_taps_equal_the_eager_recorders(tiny_checkpoint):
    """collect() answers through the engine's normal path, then computes the taps by teacher-forced prefills of many
    pages a step (engine/taps.prefill_taps); its answers, taps and soft labels must be those of the eager collection
    it replaced, whose recorder keeps the taps as the target answers (prompt in prefill, answer token by token in
    decode; bench/drafter_collect_bench.eager_collect). CPU fp32: the same answers, probabilities within 1e-5 and
    taps within 1e-5 of their layer's largest magnitude (rows computed in other chunks than the eager run's, or in
    decode there, differ by fp32 rounding: ~1e-5 absolute at every element of taps up to ~6, so an element near
    zero can be off by more than 1e-5 of itself), with pages packed into one prefill step and pages longer than a
    step's token budget cut into chunks."""
    from conftest import load_bench

    from engine.llm_engine import Engine
    from engine.taps import prefill_taps
    from engine.drafter_training import collect

    rng = np.random.default_rng(1)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((48, 64), (128, 160), (64, 96))]
    layers, budget = [1, 3], 24
    eager = Engine.from_checkpoint(str(tiny_checkpoint), dtype="float32", max_num_seqs=3, enforce_eager=True)
    old = load_bench("drafter_collect_bench").eager_collect(eager, images, layers, "Read.", max_tokens=12,
                                                             soft_top_k=5)
    engine = Engine.from_checkpoint(str(tiny_checkpoint), dtype="float32", max_num_seqs=3)
    steps, run = [], engine.runner.run_prefill_taps

    def spy(chunks, layer_ids, final=False):
        steps.append([(c.state_slot, c.start, len(c.token_ids)) for c in chunks])
        return run(chunks, layer_ids, final)

    engine.runner.run_prefill_taps = spy
    new = collect(engine, images, layers, "Read.", max_tokens=12, soft_top_k=5, tap_tokens=budget)
    assert [e.ids for e in new] == [e.ids for e in old] and len(new) == 3
    assert max(len(e.ids) - 1 for e in new) > budget and all(sum(n for *_, n in s) <= budget for s in steps)
    assert any(len(s) >= 2 for s in steps), steps  # pages packed into one forward
    assert any(start > 0 for s in steps for _, start, _ in s), steps  # a page continued from an earlier step
    for a, b in zip(old, new):
        for lid in layers:
            assert b.taps[lid].shape == (len(a.ids) - 1, a.taps[lid].shape[1])
            err = float((b.taps[lid] - a.taps[lid]).abs().max() / a.taps[lid].abs().max())
            assert err <= 1e-5, (lid, err)
        assert torch.equal(b.soft[1], a.soft[1])
        torch.testing.assert_close(b.soft[0], a.soft[0], rtol=1e-5, atol=1e-5)
    # without soft labels the forward stops after the last tapped layer: the layers after it never run, and the taps
    # are those of the whole forward
    ran = []
    engine.model.language_model.layers[3].register_forward_hook(lambda *_: ran.append(3))
    inputs = [engine.processor.page_inputs(im, "Read.", compact=True) for im in images]
    cut = prefill_taps(engine, [dict(token_ids=e.ids[:-1], pixel_values=p, image_grids=g)
                                for e, (_, p, g) in zip(new, inputs)], [1], token_budget=budget)
    assert not ran and [c.soft for c in cut] == [None] * 3
    for c, e in zip(cut, new):
        assert torch.equal(c.taps[1], e.taps[1])
    assert engine.block_manager.num_free == engine.block_manager.num_blocks  # the borrowed memory is given back
    assert engine.scheduler.states.num_free == 3


def test_collection_reports_where_its_time_went(tiny_checkpoint, tmp_path):
    """collect_groups' timings say where a collection's time went, per group and summed (collection_summary): the
    groups' images and wall seconds, their parts (waiting for pages, preprocessing, answering, tapping, other host
    work), none negative and adding up to the group's wall time, within the time measured around the calls; the
    start (the first group) apart from the steady part (the groups after it) with its images a second; the
    renderers' capacity. A second call with the same dict adds to it (drafter_scaling collects size by size). A
    drafter trained on answers collected before says how many pages they came from (not "None")."""
    import re
    import time

    from engine.drafter_training import PARTS, collect_groups, collection_summary
    from engine.llm_engine import Engine

    engine = Engine.from_checkpoint(str(tiny_checkpoint), dtype="float32", max_num_seqs=2)
    rng = np.random.default_rng(2)
    images = [rng.integers(0, 256, (48 + 16 * (i % 2), 64, 3), dtype=np.uint8) for i in range(5)]

    def slow_pages(ims):  # pages that take a while to come, as drawn ones do
        for im in ims:
            time.sleep(0.05)
            yield im

    timings, t = {}, time.perf_counter()
    examples, pages = collect_groups(engine, slow_pages(images[:3]), 2, [0, 1], "Read.", 6, timings=timings)
    more, more_pages = collect_groups(engine, slow_pages(images[3:]), 2, [0, 1], "Read.", 6, timings=timings)
    wall = time.perf_counter() - t
    assert pages + more_pages == 5 and len(examples) + len(more) <= 5
    groups = timings["groups"]
    assert [g["images"] for g in groups] == [2, 1, 2]
    for g in groups:
        assert all(g[k] >= 0 for k in PARTS), g
        assert sum(g[k] for k in PARTS) == pytest.approx(g["total_s"], abs=0.01), g
        assert g["pages_wait_s"] >= 0.05 * g["images"] - 0.01 and g["generate_s"] > 0 and g["taps_s"] > 0, g
    assert timings["pages_wait_s"] == pytest.approx(sum(g["pages_wait_s"] for g in groups), abs=0.01)  # not reset
    s = collection_summary(timings, target_load_s=1.5, render=dict(workers=2, pages=5, images=10, mb=1.0,
                                                                   render_s=2.5, first_page_s=0.7))
    assert s["images"] == 5 and s["groups"] == 3 and 0 < s["seconds"] <= wall + 0.01
    assert set(s["parts_s"]) == {k[:-2] for k in PARTS} == set(s["ms_per_image"])
    assert sum(s["parts_s"].values()) <= s["seconds"] + 0.05
    start, steady = s["start"], s["steady"]
    assert start["images"] == 2 and start["until_first_answers_s"] == pytest.approx(groups[0]["total_s"], abs=0.01)
    assert steady["images"] == 3 and steady["groups"] == 2
    assert steady["images_per_s"] == pytest.approx(3 / steady["seconds"], rel=0.02)
    assert sum(steady["parts_s"].values()) <= steady["seconds"] + 0.05 and start["excess_s"] is not None
    assert steady["detail"]["taps_steps"] >= 2 and steady["detail"]["decode_steps"] > 0
    assert s["render"]["capacity_pages_per_s"] == pytest.approx(4.0) and s["render"]["capacity_images_per_s"] == 8.0
    assert s["fla"] is False and "images/s" in s["line"] and "target load 1.5 s" in s["line"], s["line"]
    assert "first answers at" in s["line"] and "renderers 2 x 0.5 s a page" in s["line"], s["line"]
    # one group only: no steady part, the whole collection's ms an image
    one = collection_summary({"groups": groups[:1]})
    assert one["steady"] is None and one["start"]["excess_s"] is None and "ms an image" in one["line"]
    # a drafter trained on those answers: the pages given, or no page count, never "None"
    cfg = TrainDrafterConfig(checkpoint=str(tiny_checkpoint), out=str(tmp_path / "d"),
                             render="research.ocria_tiny.drafter_pages:block_images", render_pages=9, max_tokens=6,
                             num_layers=1, num_taps=2, block_size=4, anchors=4, gamma=4, steps=1, pages_per_step=2,
                             save_dtype="float32")
    for given, want in ((5, r"collected \d+ answers to 5 pages \("), (None, r"collected \d+ answers to the given pages")):
        lines = []
        log = train(cfg, echo=lines.append, collected=examples + more, collected_pages=given)
        line = next(x for x in lines if x.startswith("collected"))
        assert re.match(want, line) and "None" not in line and "before this run" in line, line
        assert log["train_pages"] == given


def test_collection_target_takes_the_prefill_token_budget(tiny_checkpoint, tmp_path):
    """prefill_tokens bounds the target's prefill steps while it answers (fewer, larger eager steps); unset, the
    engine's own budget; the batch and its grouped admission as the collection builds them."""
    from pipeline.train_drafter import config_target

    base = dict(checkpoint=str(tiny_checkpoint), out=str(tmp_path / "d"), collect_batch=8, pages=str(tmp_path))
    default = config_target(TrainDrafterConfig(**base))
    wide = config_target(TrainDrafterConfig(**base, prefill_tokens=4096))
    assert wide.runner.max_num_batched_tokens == 4096 != default.runner.max_num_batched_tokens
    assert wide.options.max_num_seqs == default.options.max_num_seqs == 8
    with pytest.raises(ValueError, match="prefill_tokens"):
        TrainDrafterConfig(**base, prefill_tokens=0)


def test_lr_factor_warms_up_then_cools_to_zero_by_steps_or_time():
    from pipeline.train_drafter import lr_factor

    assert lr_factor(0, 100, 0.0, None) < 0.3 < lr_factor(3, 100, 0.0, None) == pytest.approx(1.0, abs=0.01)
    assert lr_factor(50, 100, 0.0, None) == pytest.approx(0.5)
    assert lr_factor(99, 100, 0.0, None) < 0.01
    # bounded by time: halfway through the time is halfway down, whatever the step count says
    assert lr_factor(10, 10_000, 30.0, 60.0) == pytest.approx(0.5)
    assert lr_factor(10, 10_000, 60.0, 60.0) == pytest.approx(0.0)


def test_packed_training_forward_equals_each_page_alone():
    """block_loss packs pages into one forward: each block must see only its own page's context (positions from 0
    in every page), so the packed hidden states equal the pages' own, computed one at a time."""
    from engine.models.dflash import DFlashConfig, DFlashDrafter

    torch.manual_seed(0)
    cfg = DFlashConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0, vocab_size=50,
                       target_layer_ids=(0, 2), mask_token_id=49, block_size=4)
    drafter = DFlashDrafter(cfg)
    with torch.no_grad():
        for _, p in drafter.hf_named():
            p.normal_(0.0, 0.3)
    lengths, anchors = [7, 11], [torch.tensor([2, 5]), torch.tensor([0, 4, 9])]
    taps = [{lid: torch.randn(n, 32) for lid in (0, 2)} for n in lengths]
    blocks = [torch.randn(len(a), 4, 32) for a in anchors]
    alone = [drafter.train_hidden(t, b, a) for t, b, a in zip(taps, blocks, anchors)]
    order = [(0, 0), (1, 0), (0, 1), (1, 1), (1, 2)]  # (page, block): the pages' blocks interleaved
    packed = drafter.train_hidden({lid: torch.cat([t[lid] for t in taps]) for lid in (0, 2)},
                                  torch.stack([blocks[p][b] for p, b in order]),
                                  torch.stack([anchors[p][b] for p, b in order]),
                                  ctx_seq=torch.tensor([0] * 7 + [1] * 11),
                                  ctx_pos=torch.cat([torch.arange(7), torch.arange(11)]),
                                  block_seq=torch.tensor([p for p, _ in order]))
    torch.testing.assert_close(packed, torch.stack([alone[p][b] for p, b in order]), rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # a drafter's collection and training, end to end
def test_train_a_dflash2_drafter(tiny_checkpoint, tmp_path):
    """--dflash2: the convolutions and the selector train with the base loss; the drafter written is a DFlash2 one
    that loads, drafts through its selector and decodes losslessly."""
    from safetensors import safe_open

    pages = write_pages(tmp_path / "pages", 3, seed=1)
    cfg = TrainDrafterConfig(checkpoint=str(tiny_checkpoint), pages=str(pages), out=str(tmp_path / "d2"),
                             max_tokens=24, num_layers=1, num_taps=2, block_size=4, anchors=12, gamma=4, lr=3e-3,
                             steps=30, pages_per_step=2, heldout=1, measure_blocks=[4], seed=0, dflash2=True,
                             conv_group_size=16, selector_rank=8, selector_top_k=4, save_dtype="float32")
    log = train(cfg, echo=lambda *_: None)
    losses = log["losses"]
    assert np.mean(losses[-10:]) < 0.8 * np.mean(losses[:10]), (losses[:10], losses[-10:])
    dcfg = load_dflash_config(tmp_path / "d2", load_config(tiny_checkpoint).text)
    assert dcfg.dflash2 and dcfg.selector_top_k == 4
    with safe_open(str(tmp_path / "d2" / "model.safetensors"), "pt") as fh:
        proj = fh.get_tensor("layers.0.mlp_conv.kernel_projection.weight")
        succ = fh.get_tensor("candidate_selector.successor_codebook")
    assert proj.abs().sum() > 0, "the convolution's kernel projection starts at 0 and must have learnt"
    assert succ.std() != pytest.approx(0.02, rel=1e-3)
    (tau,) = log["heldout_tau"]
    assert tau["identical_to_plain"] and tau["verify_steps"] > 0


def test_selector_loss_puts_the_true_token_last_when_it_is_not_a_candidate():
    from engine.models.dflash import DFlashConfig, DFlashDrafter
    from engine.drafter_training import selector_ce

    cfg = DFlashConfig(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0, vocab_size=6,
                       target_layer_ids=(0,), mask_token_id=5, block_size=3, conv_kernel_size=2, conv_group_size=8,
                       selector_rank=2, selector_top_k=2)
    d = DFlashDrafter(cfg)  # the selector's codebooks start at 0: its scores are the unary logits
    logits = torch.tensor([[[0.0, 3.0, 2.0, 1.0, -1.0, -2.0], [5.0, 4.0, 0.0, 0.0, 0.0, 0.0]]])  # [1 block, 2, V]
    targets = torch.tensor([[3, 0]])  # position 0: 3 is not in the top 2 (1, 2); position 1: 0 is the top one
    ce = selector_ce(d, logits, torch.zeros(1, 2, 16), torch.tensor([4]), targets)
    want0 = torch.nn.functional.cross_entropy(torch.tensor([[3.0, 1.0]]), torch.tensor([1]))  # [cand 1, gold 3]
    want1 = torch.nn.functional.cross_entropy(torch.tensor([[5.0, 4.0]]), torch.tensor([0]))
    torch.testing.assert_close(ce, torch.stack([want0, want1])[None])


@pytest.mark.slow  # a drafter's collection and training, end to end
def test_soft_labels_distillation_and_the_tau_estimate(tiny_checkpoint, tmp_path, monkeypatch):
    """collect(soft_top_k) keeps the target's distribution at each answer token, whose top id is the greedy token
    it emitted; block_loss with distill=1 is the cross-entropy against those probabilities, with 0 the greedy one;
    accepted_drafts counts the leading positions a verify would accept; a training run with --distill logs a tau
    estimate at each validation."""
    import random

    from engine.llm_engine import Engine
    from engine.models.dflash import DFlashConfig, DFlashDrafter
    from engine.drafter_training import BlockPass, accepted_drafts, block_loss, block_pass, collect

    engine = Engine.from_checkpoint(str(tiny_checkpoint), dtype="float32", max_num_seqs=2, enforce_eager=True)
    rng = np.random.default_rng(5)
    images = [rng.integers(0, 256, (48 + 16 * i, 64, 3), dtype=np.uint8) for i in range(2)]
    examples = collect(engine, images, [0, 1], "Read.", max_tokens=10, soft_top_k=5)
    for ex in examples:
        probs, top = ex.soft
        n = len(ex.ids) - ex.prompt_len
        assert probs.shape == top.shape == (n, 5)
        torch.testing.assert_close(probs.sum(-1), torch.ones(n))
        assert top[:, 0].tolist() == ex.ids[ex.prompt_len:]  # greedy: the most likely token is the one emitted
    t = engine.cfg.text
    d = DFlashDrafter(DFlashConfig(hidden_size=t.hidden_size, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=t.num_attention_heads, num_key_value_heads=t.num_key_value_heads,
                                   head_dim=t.head_dim, rms_norm_eps=1e-6, rope_theta=10000.0, vocab_size=t.vocab_size,
                                   target_layer_ids=(0, 1), mask_token_id=t.vocab_size - 1, block_size=4))
    d.init_for_training(torch.Generator().manual_seed(0))
    embed, head = engine.model.language_model.embed_tokens.weight, engine.model.head_weight
    with torch.no_grad():
        bp = block_pass(d, examples, embed, head, 6, random.Random(0), "cpu")
        probs, top = bp.soft
        want = -(probs * bp.logits.log_softmax(-1).gather(-1, top)).sum(-1)
        w = torch.exp(-torch.arange(3, dtype=torch.float32) / 4.0)[None, :] * bp.valid
        soft = block_loss(d, examples, embed, head, 6, 4.0, None, "cpu", distill=1.0, out=bp)
        torch.testing.assert_close(soft, (want * w).sum() / w.sum())
        hard = block_loss(d, examples, embed, head, 6, 4.0, None, "cpu", out=bp)
        assert not torch.allclose(soft, hard)
    # accepted drafts: leading argmax matches, stopped by a miss or by the answer's end
    V = 7
    logits = torch.full((3, 4, V), -1.0)
    targets = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [5, 5, 5, 5]])
    for r, right in enumerate([[1, 1, 0, 1], [1, 1, 1, 1], [0, 1, 1, 1]]):
        for j, ok in enumerate(right):
            logits[r, j, targets[r, j] if ok else 0] = 1.0
    valid = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    bp = BlockPass(logits, None, None, targets, valid, None)
    assert accepted_drafts(bp).tolist() == [2.0, 3.0, 0.0]
    pages = write_pages(tmp_path / "pages", 4, seed=3)
    cfg = TrainDrafterConfig(checkpoint=str(tiny_checkpoint), pages=str(pages), out=str(tmp_path / "drafter"),
                             max_tokens=16, num_layers=1, num_taps=2, block_size=4, anchors=8, gamma=4, lr=3e-3,
                             steps=4, pages_per_step=2, val_pages=1, val_every=2, distill=0.5, distill_top_k=8)
    log = train(cfg, echo=lambda *_: None)
    assert [s for s, _ in log["val_tau_estimate"]] == [0, 2, 4]
    assert all(1.0 <= tau <= 4.0 for _, tau in log["val_tau_estimate"])
    # answers collected once can train several drafters: the target is not asked again
    import engine.drafter_training as td

    monkeypatch.setattr(td, "collect", lambda *a, **k: pytest.fail("collected answers were given"))
    again = train(cfg.model_copy(update=dict(out=str(tmp_path / "again"), val_pages=0, distill=1.0)),
                  echo=lambda *_: None, collected=examples)
    assert again["answers"] == len(examples) and len(again["losses"]) == 4


def test_walk_tau_steps_through_answers_as_the_engine_does():
    """A verify anchored at position i emits its accepted drafts + 1 and the next one anchors after them: over an
    answer whose first half the drafter knows and whose second it does not, tau is the answer's tokens over the
    steps taken, not 1 + the mean accepted over all anchors (which counts each position of the known run)."""
    from engine.drafter_training import Example, walk_tau

    # 17 answer tokens (one block per anchor 0 .. 16); block size 5: up to 4 drafts accepted
    acc = [4] * 8 + [0] * 9
    ex = Example(ids=list(range(3 + 17)), prompt_len=3, taps={})
    tokens, steps = walk_tau([ex], torch.tensor(acc, dtype=torch.float32))
    # anchors 1 (4 accepted) -> 6 (4) -> 11 (0) -> 12 -> ... -> 16 (0): 16 tokens after the prefill's, 8 steps
    assert (tokens, steps) == (16, 8)
    assert 1 + sum(acc) / len(acc) > 2.8 > tokens / steps
    # the answer's end cuts the last step: all drafts right everywhere -> 4 steps of 5, 5, 5 and 1 tokens
    assert walk_tau([ex], torch.tensor([4.0] * 17)) == (16, 4)
    # two answers: their tokens and steps add up; an answer of one token has no verify step
    short = Example(ids=[0, 1, 2, 9], prompt_len=3, taps={})
    assert walk_tau([short, ex], torch.tensor([0.0] + acc)) == (16, 8)


@pytest.mark.slow  # a drafter's collection and training, end to end
def test_tau_estimate_equals_the_engines_tau(tiny_checkpoint, tmp_path):
    """The walked tau estimate of a drafter on answers equals the tau the engine measures reading the same pages
    with it (CPU fp32: the engine's drafts are the training pass's). A drafter trained hard on two pages accepts
    runs of drafts there."""
    from engine.interface import SamplingParams
    from engine.llm_engine import Engine
    from engine.models.dflash import DFlashDrafter
    from engine.drafter_training import EVERY_ANCHOR, accepted_drafts, block_pass, collect, greedy_drafts, walk_tau

    pages = write_pages(tmp_path / "pages", 2, seed=4)
    cfg = TrainDrafterConfig(checkpoint=str(tiny_checkpoint), pages=str(pages), out=str(tmp_path / "drafter"),
                             max_tokens=20, num_layers=1, num_taps=2, block_size=4, anchors=32, gamma=4, lr=3e-3,
                             steps=60, pages_per_step=2, save_dtype="float32", seed=0)
    train(cfg, echo=lambda *_: None)
    eng = Engine.from_checkpoint(str(tiny_checkpoint), dtype="float32", max_num_seqs=2, enforce_eager=True)
    d = DFlashDrafter.from_pretrained(tmp_path / "drafter", eng.cfg.text, torch.float32, "cpu")
    from pipeline.train_drafter import load_pages

    images = load_pages(pages)
    answers = collect(eng, images, list(d.cfg.target_layer_ids), cfg.prompt, cfg.max_tokens)
    embed, head = eng.model.language_model.embed_tokens.weight, eng.model.head_weight
    with torch.no_grad():
        bp = block_pass(d, answers, embed, head, EVERY_ANCHOR, None, "cpu")
        tokens, steps = walk_tau(answers, accepted_drafts(bp, greedy_drafts(d, bp)))
    spec = Engine.from_checkpoint(str(tiny_checkpoint), dtype="float32", max_num_seqs=2,
                                  speculative=dict(drafter=str(tmp_path / "drafter"), num_speculative_tokens=3))
    outs = spec.generate([dict(request_id=f"p{i}", prompt=cfg.prompt, image=im,
                               sampling=SamplingParams(max_tokens=cfg.max_tokens)) for i, im in enumerate(images)])
    assert [o.output_token_ids for o in outs] == [ex.ids[ex.prompt_len:] for ex in answers]
    assert all(o.finish_reason == "length" for o in outs)  # no stop token: the engine and the walk end alike
    assert (tokens, steps) == (sum(o.spec.accepted + o.spec.steps for o in outs), sum(o.spec.steps for o in outs))
    assert tokens / steps > 1.5, tokens / steps  # runs of drafts accepted: the walk is tested on more than misses

"""The pieces of a DFlash drafter's training that need only torch and the engine: the target's answers to pages and
its tapped hidden states over them (collect), the packed forward over anchor blocks (block_pass), the loss
(block_loss, selector_ce), the drafts a greedy verify accepts and tau walked through answers (walk_tau), and tau
measured by the engine reading pages (measure_tau, tau_row, divergences). The training run that steps through
them (config, page sources, the loop) is jobs/train_drafter.py's, outside the engine."""
from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from engine.interface import SamplingParams, SpecStats
from engine.llm_engine import Engine
from engine.models.dflash import DFlashDrafter
from engine.taps import prefill_taps


@dataclass
class Example:
    ids: list[int]  # prompt + answer
    prompt_len: int
    taps: dict[int, torch.Tensor]  # target layer -> [len(ids) - 1, H] (the last token is never fed)
    soft: tuple[torch.Tensor, torch.Tensor] | None = None  # per answer token: the target's top-k probs, ids [n, k]



def collect(engine: Engine, images: list[np.ndarray], layer_ids, prompt: str, max_tokens: int,
            soft_top_k: int = 0, timings: dict | None = None, tap_tokens: int | None = None) -> list[Example]:
    """The target's greedy answers to the pages, then the tapped hidden states over each page's prompt and answer.

    1. The answers: one batched Engine.generate, the engine's normal path (CUDA graphs for decode where it has
       them); nothing is recorded while it decodes. Each page is preprocessed once, to the uint8 patches the engine
       expands on its device, as the job does.
    2. The taps: teacher-forced prefills of the pages' prompt + answer (the last answer token is never fed), many
       pages packed into each step of `tap_tokens` tokens (engine/taps.prefill_taps; default the engine's
       max_num_batched_tokens), the forward cut after the last tapped layer. soft_top_k: also the target's
       distribution at each answer token from the same prefill, its top soft_top_k probabilities renormalised
       (Example.soft; the forward then runs every layer and the LM head on the answer rows).

    timings: receives the seconds spent preprocessing, answering (generate) and tapping (taps_s: taps_host_s
    launching the packed prefills, taps_wait_s waiting for the device after), the host work after (host_s), the
    answering's prefill and decode steps with their host launch, device and waiting seconds, and the taps' steps and
    tokens. On CUDA the one sync added is after the taps (the caller's next step would wait there anyway)."""
    t0 = time.perf_counter()
    inputs = [engine.processor.page_inputs(image, prompt, compact=True) for image in images]
    t1 = time.perf_counter()
    recording, log = engine.record_steps, engine.step_log  # the caller's, given back after
    engine.record_steps, engine.step_log = timings is not None, []
    try:
        answers = engine.generate([dict(request_id=f"page-{n}", prompt_token_ids=ids, pixel_values=pixels,
                                        image_grids=grids, sampling=SamplingParams(max_tokens=max_tokens))
                                   for n, (ids, pixels, grids) in enumerate(inputs)])
    finally:
        engine.record_steps, (steps_run, engine.step_log) = recording, (engine.step_log, log)
    t2 = time.perf_counter()  # generate returns once every answer's tokens are on the host: the device is done
    kept = []
    for n, o in enumerate(answers):
        if o.finish_reason == "error":
            raise RuntimeError(f"page {n}: {o.error}")
        if len(o.output_token_ids) >= 2:  # the last answer token is never fed: one token leaves nothing to learn
            kept.append((o.prompt_token_ids + o.output_token_ids, len(o.prompt_token_ids), inputs[n]))
    tap_stats = {} if timings is not None else None
    t3 = time.perf_counter()
    taps = prefill_taps(engine, [dict(token_ids=ids[:-1], pixel_values=pixels, image_grids=grids,
                                      soft_from=prompt_len - 1) for ids, prompt_len, (_, pixels, grids) in kept],
                        layer_ids, token_budget=tap_tokens, soft_top_k=soft_top_k, stats=tap_stats)
    t4 = time.perf_counter()
    if timings is not None and engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    t5 = time.perf_counter()
    out = [Example(ids, prompt_len, t.taps, t.soft) for (ids, prompt_len, _), t in zip(kept, taps)]
    if timings is not None:  # where collecting went: the answers' steps of each kind, their launch and device seconds
        timings.update(images=len(images), answers=len(out), preprocess_s=round(t1 - t0, 3),
                       generate_s=round(t2 - t1, 3), taps_s=round(t5 - t3, 3), taps_host_s=round(t4 - t3, 3),
                       taps_wait_s=round(t5 - t4, 3), taps_steps=tap_stats.get("steps", 0),
                       taps_tokens=tap_stats.get("tokens", 0),
                       host_s=round((t3 - t2) + (time.perf_counter() - t5), 3))
        for kind, prefill in (("prefill", True), ("decode", False)):
            steps = [r for r in steps_run if r.is_prefill == prefill]
            timings.update({f"{kind}_steps": len(steps),
                            f"{kind}_launch_s": round(sum(r.t_launched - r.t_start for r in steps), 3),
                            f"{kind}_device_s": round(sum(r.device_s for r in steps), 3),
                            f"{kind}_wait_s": round(sum(r.wait_s for r in steps), 3)})
    return out


# the parts of a collection group's wall time (collect_groups' group records): they add up to its total_s
PARTS = ("pages_wait_s", "preprocess_s", "generate_s", "taps_s", "other_s")


def collect_groups(engine: Engine, images, group: int, layer_ids, prompt: str, max_tokens: int, soft_top_k: int = 0,
                   tap_tokens: int | None = None, timings: dict | None = None,
                   on_group=None) -> tuple[list[Example], int]:
    """collect() over the `images` iterator, `group` pages at a time (a drawn source renders the next group's pages
    meanwhile) -> (the examples, the pages read). timings: collect's, summed over the groups (added to what is there,
    so several calls can share one dict), pages_wait_s: the seconds spent waiting for pages (drawn ones not yet
    drawn; files are all read before), and `groups`: a record per group of its images, its wall seconds (total_s)
    and their PARTS, other_s being what the rest leave (collect's host work after the answers, on_group, this
    loop); collection_summary reads them. on_group(examples, pages): called after each group with the examples and
    pages so far, e.g. to stop a collection that will not fit in memory by raising before the rest is read."""
    examples, pages = [], 0
    while True:
        t = time.perf_counter()
        part = list(itertools.islice(images, group))
        waited = time.perf_counter() - t
        if timings is not None:
            timings["pages_wait_s"] = round(timings.get("pages_wait_s", 0) + waited, 3)
        if not part:
            break
        part_timings = {} if timings is not None else None
        examples += collect(engine, part, layer_ids, prompt, max_tokens, soft_top_k, part_timings, tap_tokens)
        pages += len(part)
        if on_group is not None:
            on_group(examples, pages)
        if timings is not None:
            for k, v in part_timings.items():
                timings[k] = round(timings.get(k, 0) + v, 3)
            record = dict(part_timings, pages_wait_s=round(waited, 3), total_s=round(time.perf_counter() - t, 3))
            record["other_s"] = round(max(0.0, record["total_s"] - sum(record.get(k, 0) for k in PARTS)), 3)
            timings.setdefault("groups", []).append(record)
    return examples, pages


def collection_summary(timings: dict, target_load_s: float | None = None, render: dict | None = None) -> dict:
    """Where a collection's time went, from collect_groups' timings: its images and wall seconds, their PARTS; the
    start (until the first group's answers: its pages' wait, which holds the renderers' start, and its collection,
    which holds the first prefills' compiles and autotuning; target_load_s, the engine's load and graph capture,
    before it) and what it cost beyond the steady rate (excess_s); the steady part (the groups after the first):
    images a second, the PARTS in seconds and in ms an image, and the answering's and taps' detail (host launch,
    device and wait seconds). render: RenderedPages.stats, with the renderers' capacity (pages and images a second
    their workers could draw). `line`: the one-line form the progress lines echo."""
    from engine.models.gdn_prefill import fla_available

    groups = timings.get("groups", [])
    detail = ("prefill_steps", "prefill_launch_s", "prefill_device_s", "prefill_wait_s", "decode_steps",
              "decode_launch_s", "decode_device_s", "decode_wait_s", "taps_steps", "taps_tokens", "taps_host_s",
              "taps_wait_s", "host_s")

    def totals(rows):
        images, seconds = sum(r["images"] for r in rows), sum(r["total_s"] for r in rows)
        parts = {k[:-2]: sum(r.get(k, 0) for r in rows) for k in PARTS}
        return {"groups": len(rows), "images": images, "seconds": round(seconds, 2),
                "images_per_s": round(images / seconds, 2) if seconds > 0 else None,
                "parts_s": {k: round(v, 2) for k, v in parts.items()},
                "ms_per_image": {k: round(1e3 * v / images, 2) if images else None for k, v in parts.items()},
                "detail": {k: round(sum(r.get(k, 0) for r in rows), 2) for k in detail}}

    summary = {"fla": fla_available(), "target_load_s": target_load_s, **totals(groups), "start": None,
               "steady": None, "render": None}
    if groups:
        first = groups[0]
        summary["start"] = {"until_first_answers_s": round(first["total_s"], 2), "images": first["images"],
                            "parts_s": {k[:-2]: round(first.get(k, 0), 2) for k in PARTS}, "excess_s": None,
                            "detail": {k: round(first.get(k, 0), 2) for k in detail}}
    if len(groups) > 1:
        steady = totals(groups[1:])
        summary["steady"] = steady
        if steady["images_per_s"]:
            summary["start"]["excess_s"] = round(first["total_s"] - first["images"] / steady["images_per_s"], 2)
    if render:
        r = dict(render)
        if r.get("pages") and r.get("render_s"):
            per_page = r["render_s"] / r["pages"]
            r.update(render_s_per_page=round(per_page, 3), capacity_pages_per_s=round(r["workers"] / per_page, 2),
                     capacity_images_per_s=round(r["workers"] / per_page * r["images"] / r["pages"], 2))
        summary["render"] = r
    summary["line"] = breakdown_line(summary)
    return summary


def breakdown_line(summary: dict) -> str:
    """collection_summary in one line: start, then the steady rate and its ms an image by part."""
    def parts(ms):
        return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in ms.items())

    text = []
    if summary.get("target_load_s") is not None:
        text.append(f"target load {summary['target_load_s']:.1f} s")
    start = summary.get("start")
    if start:
        p = start["parts_s"]
        text.append(f"first answers at {start['until_first_answers_s']:.1f} s ({start['images']} images; pages wait "
                    f"{p['pages_wait']:.1f}, generate {p['generate']:.1f}, taps {p['taps']:.1f}"
                    + (f"; {start['excess_s']:.1f} s over the steady rate" if start["excess_s"] is not None else "")
                    + ")")
    steady = summary.get("steady")
    if steady:
        d = steady["detail"]
        text.append(f"steady {steady['images']} images in {steady['seconds']:.1f} s, {steady['images_per_s']} "
                    f"images/s, ms an image: {parts(steady['ms_per_image'])} (seconds: prefill launch "
                    f"{d['prefill_launch_s']} in {d['prefill_steps']} steps, decode launch {d['decode_launch_s']} "
                    f"and wait {d['decode_wait_s']} in {d['decode_steps']}, taps launch {d['taps_host_s']} in "
                    f"{d['taps_steps']} and wait {d['taps_wait_s']})")
    else:
        text.append(f"{summary['images']} images in {summary['seconds']:.1f} s, ms an image: "
                    f"{parts(summary['ms_per_image'])}")
    r = summary.get("render")
    if r and r.get("capacity_images_per_s") is not None:
        text.append(f"renderers {r['workers']} x {r['render_s_per_page']} s a page: up to "
                    f"{r['capacity_images_per_s']} images/s (first page after {r['first_page_s']} s)")
    text.append(f"fla {summary['fla']}")
    return "; ".join(text)


@dataclass
class BlockPass:
    """One packed forward over random anchor blocks: the drafter's logits at block positions 1 .. B-1 [N, B-1, V]
    and hidden states, the blocks, their target tokens and which positions exist (inside the answer), and the
    target's soft labels there (probs, ids [N, B-1, k]) when the examples carry them."""
    logits: torch.Tensor
    hidden: torch.Tensor
    block: torch.Tensor
    targets: torch.Tensor
    valid: torch.Tensor
    soft: tuple[torch.Tensor, torch.Tensor] | None


def block_pass(drafter: DFlashDrafter, examples: list[Example], embed: torch.Tensor, head: torch.Tensor, anchors: int,
               rng: random.Random | None, device) -> BlockPass:
    """Random anchor blocks of the examples' answers (every anchor, in order and without rng, when an answer has no
    more than `anchors`), the examples packed into one forward (each block sees only its own page)."""
    B = drafter.cfg.block_size
    picks, ids, taps, seqs, pos, block_seq = [], [], [], [], [], []
    for n, ex in enumerate(examples):
        L = len(ex.ids)
        # an anchor is a verified token whose next token is an answer token: prompt_len - 1 .. L - 2
        choices = list(range(ex.prompt_len - 1, L - 1))
        chosen = choices if anchors >= len(choices) else sorted(rng.sample(choices, anchors))
        picks.append(torch.tensor(chosen, device=device))
        block_seq.append(torch.full((len(chosen),), n, device=device))
        ids.append(torch.tensor(ex.ids, device=device))
        taps.append(ex.taps)
        seqs.append(torch.full((L - 1,), n, device=device))
        pos.append(torch.arange(L - 1, device=device))
    block_rows, targets, valid, soft_p, soft_i = [], [], [], [], []
    for ex, p, t in zip(examples, picks, ids):
        block = torch.full((len(p), B), drafter.cfg.mask_token_id, dtype=torch.long, device=device)
        block[:, 0] = t[p]
        target_pos = p[:, None] + torch.arange(1, B, device=device)[None, :]  # [N, B-1]
        valid.append(target_pos < len(t))
        targets.append(t[target_pos.clamp(max=len(t) - 1)])
        block_rows.append(block)
        if ex.soft is not None:  # answer token j is ids[prompt_len + j]
            row = (target_pos.clamp(max=len(t) - 1) - ex.prompt_len).cpu()
            soft_p.append(ex.soft[0][row].to(device))
            soft_i.append(ex.soft[1][row].to(device))
    block, targets, valid = torch.cat(block_rows), torch.cat(targets), torch.cat(valid)
    ctx = {lid: torch.cat([t[lid] for t in taps]).to(device) for lid in taps[0]}
    hidden = drafter.train_hidden(ctx, F.embedding(block, embed), torch.cat(picks), ctx_seq=torch.cat(seqs),
                                  ctx_pos=torch.cat(pos), block_seq=torch.cat(block_seq))
    logits = hidden[:, 1:].float() @ head.float().T
    soft = (torch.cat(soft_p), torch.cat(soft_i)) if len(soft_p) == len(examples) else None
    return BlockPass(logits, hidden[:, 1:], block, targets, valid, soft)


def block_loss(drafter: DFlashDrafter, examples: list[Example], embed: torch.Tensor, head: torch.Tensor, anchors: int,
               gamma: float, rng: random.Random, device, selector_alpha: float = 1.0, distill: float = 0.0,
               out: BlockPass | None = None) -> torch.Tensor:
    """Decayed per-position cross-entropy over random anchor blocks (block_pass, or `out` if given): on the target's
    greedy token, or with distill > 0 that share on the target's own distribution (the examples' soft labels).
    With a DFlash2 selector, plus selector_alpha times its cross-entropy over the top-k candidates given the true
    token before each (the true token replacing the last candidate where it is not among them), same weights."""
    bp = out or block_pass(drafter, examples, embed, head, anchors, rng, device)
    B, V = drafter.cfg.block_size, bp.logits.shape[-1]
    ce = F.cross_entropy(bp.logits.reshape(-1, V), bp.targets.reshape(-1), reduction="none").view_as(bp.targets)
    if distill > 0:
        if bp.soft is None:
            raise ValueError("distill > 0 needs examples collected with soft labels (collect(soft_top_k=...))")
        probs, top = bp.soft
        soft_ce = -(probs * bp.logits.log_softmax(-1).gather(-1, top)).sum(-1)
        ce = (1 - distill) * ce + distill * soft_ce
    w = torch.exp(-torch.arange(B - 1, device=ce.device, dtype=torch.float32) / gamma)[None, :] * bp.valid
    loss = (ce * w).sum() / w.sum()
    if drafter.selector is not None:
        sel = selector_ce(drafter, bp.logits, bp.hidden, bp.block[:, 0], bp.targets)
        loss = loss + selector_alpha * (sel * w).sum() / w.sum()
    return loss


def greedy_drafts(drafter: DFlashDrafter, bp: BlockPass) -> torch.Tensor:
    """The drafts [N, B-1] a greedy speculative step would propose from this pass: the argmax at each position, or
    with a DFlash2 selector each draft picked among its position's top-k given the draft before it (the anchor
    first), as the engine picks them (DFlashDrafter.select)."""
    if drafter.selector is None:
        return bp.logits.argmax(-1)
    return drafter.select(bp.logits, bp.hidden, bp.block[:, 0])


def accepted_drafts(bp: BlockPass, drafts: torch.Tensor | None = None) -> torch.Tensor:
    """Per block, the drafts a greedy verify would accept: the leading positions where the draft (`drafts`, from
    greedy_drafts; the argmax if not given) is the target's own token. The drafter sees here what it sees when
    drafting (the context before the anchor, the whole block in one pass); walk_tau turns them into tau."""
    drafts = bp.logits.argmax(-1) if drafts is None else drafts
    match = (drafts == bp.targets) & bp.valid
    return match.int().cumprod(-1).sum(-1).float()


EVERY_ANCHOR = 1 << 30  # block_pass's `anchors` for a block at every answer position, in order


def walk_tau(examples: list[Example], accepted: torch.Tensor) -> tuple[int, int]:
    """(tokens, verify steps) of greedy speculative decoding through the examples' answers, from `accepted` (the
    drafts a verify accepts at each block of a block_pass with EVERY_ANCHOR: per example, one block per anchor
    position prompt_len - 1 .. len - 2, in order). The prefill gives an answer's first token; each verify step then
    anchors at the last token emitted and emits its accepted drafts + 1, as the engine steps; tau = tokens / steps.
    The mean over uniformly drawn anchors is not tau: it counts every position of a long accepted run as an anchor,
    where the engine steps over the run once."""
    acc, tokens, steps, first = accepted.long().tolist(), 0, 0, 0
    for ex in examples:
        n = len(ex.ids) - ex.prompt_len  # this example's blocks
        i = 1  # anchored at the answer's first token (the prefill's)
        while i < n:
            emitted = min(acc[first + i] + 1, n - i)  # n - i answer tokens follow: the last one ends the answer
            tokens, steps, i = tokens + emitted, steps + 1, i + emitted
        first += n
    return tokens, steps


def selector_ce(drafter: DFlashDrafter, logits: torch.Tensor, hidden: torch.Tensor, anchors: torch.Tensor,
                targets: torch.Tensor) -> torch.Tensor:
    """The candidate selector's cross-entropy at each block position [N, P]: over the top-k of the position's
    unary logits, the true token put in the last place where it is not among them, each position scored given the
    true token before it (the anchor at the first)."""
    unary = drafter.unary_logits(logits)
    k = min(drafter.cfg.selector_top_k, unary.shape[-1])
    cand_u, cand = unary.topk(k, -1)
    gold = targets[..., None]
    covered = (cand == gold).any(-1, keepdim=True)
    cand = torch.where(covered, cand, torch.cat([cand[..., :-1], gold], -1))
    cand_u = torch.where(covered, cand_u, torch.cat([cand_u[..., :-1], unary.gather(-1, gold)], -1))
    label = (cand == gold).int().argmax(-1)
    before = torch.cat([anchors[:, None], targets[:, :-1]], 1)
    scores = drafter.selector.score(cand, cand_u, hidden, before)
    return F.cross_entropy(scores.reshape(-1, k), label.reshape(-1), reduction="none").view_as(targets)


def measure_tau(checkpoint: str, drafter_dir: Path, images, prompt: str, max_tokens: int, blocks: list[int],
                device: str, dtype: str) -> list[dict]:
    """Greedy reads of `images` with the drafter at each verify block size: tau and acceptance by block position,
    plus whether the answers equal plain decoding's (they must)."""
    reqs = [dict(request_id=f"h{i}", prompt=prompt, image=im, sampling=SamplingParams(max_tokens=max_tokens))
            for i, im in enumerate(images)]
    opts = dict(device=device, dtype=dtype, max_num_seqs=min(64, len(images)))
    plain = Engine.from_checkpoint(checkpoint, **opts).generate(reqs)
    return [tau_row(plain, Engine.from_checkpoint(checkpoint, speculative=dict(
        drafter=str(drafter_dir), num_speculative_tokens=block - 1),
                                                   **opts).generate(reqs), block) for block in blocks]


def divergences(plain_engine, reqs, plain, spec) -> list[dict]:
    """Answers that differ: the first differing token and plain decoding's top-2 logit margin there, from the
    request read again alone with its logits kept. In bf16 a read alone need not equal the batched one (other
    reductions); `rerun_matches` says whether it did up to the differing token, i.e. whether the margin is the
    batched run's."""
    out = []
    for r, a, b in zip(reqs, plain, spec):
        if a.output_token_ids == b.output_token_ids:
            continue
        i = next((j for j, (x, y) in enumerate(zip(a.output_token_ids, b.output_token_ids)) if x != y),
                 min(len(a.output_token_ids), len(b.output_token_ids)))
        again = plain_engine.generate([dict(r, request_id="margin", keep_logits=True)])[0]
        top2 = again.logits[min(i, again.logits.shape[0] - 1)].float().topk(2).values
        out.append({"request": r["request_id"], "first_diff": i, "top2_margin": float(top2[0] - top2[1]),
                    "rerun_matches": again.output_token_ids[:i + 1] == a.output_token_ids[:i + 1]})
    return out


def tau_row(a, b, block: int) -> dict:
    """tau and acceptance by position of spec outputs b; a: plain outputs of the same requests (or None)."""
    spec = SpecStats.total(o.spec for o in b)
    return {"block_size": block, "pages": len(b), "tau": spec.tau,
            "verify_steps": spec.steps, "drafted": spec.drafted, "accepted": spec.accepted,
            "acceptance_by_position": [round(x, 4) for x in spec.acceptance_by_position()],
            "identical_to_plain": None if a is None else all(x.output_token_ids == y.output_token_ids
                                                             for x, y in zip(a, b)),
            "identical_pages": None if a is None else sum(x.output_token_ids == y.output_token_ids
                                                          for x, y in zip(a, b))}

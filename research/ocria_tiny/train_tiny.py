"""Train ocria-tiny, a small Qwen3.5-architecture VLM (HF `qwen3_5`), on synthetic pages -> markdown.

Two steps:
  # 1. on the CPU machine: tokenizer (BPE on synthetic markdown), processor files and config.json
  python -m research.ocria_tiny.train_tiny prepare --config research/ocria_tiny/train_tiny.yaml --synth .synth --model-dir models/ocria-tiny
  # 2. on one GPU, in runs of <= 10 min; --resume continues from the last run's checkpoint (weights + step + clock)
  python -m research.ocria_tiny.train_tiny train --config research/ocria_tiny/train_tiny.yaml --synth .synth --model-dir models/ocria-tiny \
      --out $OUT [--resume DIR] [--set train.batch_size=4 ...]

Pages are generated on the fly by data-loader workers (research.ocria_tiny.synthetic, seeded per page index), rendered by the
pipeline's rasterizer and preprocessed by the checkpoint's own image processor, so training sees exactly what
inference sees. The learning-rate schedule follows wall-clock time (train.total_train_s), so a run that is cut
short still ends its schedule, and resumed runs continue it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path


from research.ocria_tiny.encoding import (PromptBuilder, collate, encode_page, encoded_batch, load_image_processor,
                                           model_batch, model_inputs, noisy_answer_inputs)
from research.ocria_tiny.text_line_ctc import (
    CTC_CLASSES,
    TextLineCTC,
    ctc_chars,
    ctc_min_frames,
    greedy_cer,
)
from research.ocria_tiny.train_config import curriculum_stage, load_config, settings_config, stage_mixes, synth_config


def tokenizer_texts(pool, n_pages: int, seed: int) -> list[str]:
    """Markdown of synthetic pages without layout (the layout only drops trailing blocks): the tokenizer's corpus."""
    import random

    from research.ocria_tiny.synthetic import block_markdown, sample_block

    texts = []
    for i in range(n_pages):
        rng = random.Random(seed + i)
        texts.append("\n\n".join(block_markdown(sample_block(rng, pool, rng.randint(20, 80))) for _ in range(6)))
    return texts


def hf_config(cfg: dict, ids):
    from engine.hf_format import qwen3_5_config

    m = cfg["model"]
    t, v = dict(m["text"]), dict(m["vision"])
    rope = {
        "rope_type": "default",
        "rope_theta": t.pop("rope_theta"),
        "partial_rotary_factor": t.pop("partial_rotary_factor"),
        "mrope_section": t.pop("mrope_section"),
        "mrope_interleaved": True,
    }
    rotary_half = int(t["head_dim"] * rope["partial_rotary_factor"]) // 2
    if sum(rope["mrope_section"]) != rotary_half:
        raise ValueError(f"mrope_section must sum to head_dim*partial_rotary_factor/2 = {rotary_half}")
    if t["num_hidden_layers"] % 4:
        raise ValueError("num_hidden_layers must be a multiple of 4 (3 Gated DeltaNet layers per full-attention layer)")
    text = dict(
        t,
        vocab_size=m["vocab_size"],
        hidden_act="silu",
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        rope_parameters=rope,
        full_attention_interval=4,
        bos_token_id=None,
        eos_token_id=ids.endoftext,
        pad_token_id=ids.endoftext,
    )
    vision = dict(v, in_channels=3, out_hidden_size=t["hidden_size"], hidden_act="gelu_pytorch_tanh")
    return qwen3_5_config(text, vision, ids)


def set_image_sizes(cfg: dict, model_dir: Path) -> None:
    """Only the pixel budget (image.min_pixels, image.max_pixels) of an existing model folder's processor files is
    rewritten: tokenizer, config.json and normalisation stay, so a checkpoint trained with the folder stays valid at
    the new page size."""
    for name in ("preprocessor_config.json", "video_preprocessor_config.json"):
        path = model_dir / name
        proc = json.loads(path.read_text())
        proc["size"] = {"longest_edge": cfg["image"]["max_pixels"], "shortest_edge": cfg["image"]["min_pixels"]}
        path.write_text(json.dumps(proc, indent=2, sort_keys=True) + "\n")
    print(f"{model_dir}: pixels per image {cfg['image']['min_pixels']:,} .. {cfg['image']['max_pixels']:,}")


def prepare(cfg: dict, synth: Path, model_dir: Path) -> None:
    from engine.hf_format import train_tokenizer, write_processor_files
    from research.ocria_tiny.synthetic import TextPool

    pool = TextPool.from_json_gz(synth / "pool_train.json.gz")
    t0 = time.time()
    tok = train_tokenizer(tokenizer_texts(pool, cfg["data"]["tokenizer_pages"], cfg["data"]["seed"]),
                          cfg["model"]["vocab_size"])
    print(f"tokenizer: {tok.get_vocab_size()} tokens in {time.time() - t0:.1f}s")
    ids = write_processor_files(model_dir, tok, cfg["image"]["min_pixels"], cfg["image"]["max_pixels"],
                                cfg["model"]["vision"]["patch_size"], cfg["model"]["vision"]["spatial_merge_size"],
                                cfg["model"]["vision"]["temporal_patch_size"],
                                # mean 1.0 maps white paper to 0: blank patches then give the patch embedding no
                                # input, so the vision tower cannot grow a page-independent constant from them (the
                                # collapse seen in run 1, see research/ocria_tiny/commands.md)
                                cfg["image"].get("image_mean", 0.5), cfg["image"].get("image_std", 0.5))
    conf = hf_config(cfg, ids)
    conf.save_pretrained(model_dir)
    print("wrote", sorted(p.name for p in model_dir.iterdir()))


# ---------------------------------------------------------------- data



def page_stream(cfg: dict, synth: Path, model_dir: Path, start_index: int):
    """IterableDataset of encoded training pages; worker w of W makes pages start_index + w, + w + W, ..."""
    import torch

    class Pages(torch.utils.data.IterableDataset):
        def __iter__(self):
            from research.ocria_tiny.synthetic import TextPool, make_page

            info = torch.utils.data.get_worker_info()
            wid, nw = (info.id, info.num_workers) if info else (0, 1)
            pool = TextPool.from_json_gz(synth / "pool_train.json.gz")
            processor = load_image_processor(model_dir)
            builder = PromptBuilder(model_dir, cfg["prompt"])
            merge = cfg["model"]["vision"]["spatial_merge_size"]
            i = start_index + wid
            while True:
                page = make_page(cfg["data"]["seed"] + i, pool, synth_config(cfg, i, mix=True), synth / "fonts")
                yield encode_page(page.image, page.markdown, processor, builder, merge,
                                  cfg["data"]["max_answer_tokens"], page.lines)
                i += nw

    return Pages()


# ---------------------------------------------------------------- train (GPU)


def image_check_batches(cfg: dict, synth: Path, model_dir: Path, page_index: int, n: int = 8,
                        settings: dict | None = None) -> tuple[dict, dict]:
    """Held-out pages drawn like training page `page_index` (same curriculum stage) or with `settings`, collated
    twice: with their own images and text lines, and with each page's image replaced by the next page's (answers
    unchanged, no lines)."""
    from research.ocria_tiny.synthetic import TextPool, make_page

    pool = TextPool.from_json_gz(synth / "pool_heldout.json.gz")
    scfg = settings_config(cfg, settings) if settings else synth_config(cfg, page_index)
    pages = [make_page(cfg["data"]["heldout_seed"] + 500_000 + k, pool, scfg, synth / "fonts") for k in range(n)]
    processor, builder = load_image_processor(model_dir), PromptBuilder(model_dir, cfg["prompt"])
    merge, max_answer = cfg["model"]["vision"]["spatial_merge_size"], cfg["data"]["max_answer_tokens"]

    def batch(images, lines):
        items = [encode_page(im, p.markdown, processor, builder, merge, max_answer, ln)
                 for im, p, ln in zip(images, pages, lines)]
        return encoded_batch(items, builder, processor)

    true = batch([p.image for p in pages], [p.lines for p in pages])
    return true, batch([pages[(k + 1) % n].image for k in range(n)], [None] * n)


def image_use(model, true_batch: dict, swapped_batch: dict) -> dict:
    """Does the model read the image? img_gain: answer loss with swapped images minus with the true ones (0: the image
    is ignored). img_var: spread of the image embeddings over tokens relative to their size (-> 0: the vision tower
    emits a page-independent constant; 1e-4 in run 1's checkpoint)."""
    import torch

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    with torch.no_grad(), torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        true_batch = {k: v.to(device) for k, v in true_batch.items()}
        swapped_batch = {k: v.to(device) for k, v in swapped_batch.items()}
        loss_true = model(**model_inputs(true_batch)).loss.float().item()
        loss_swapped = model(**model_inputs(swapped_batch)).loss.float().item()
        feats = torch.cat(model.model.get_image_features(
            true_batch["pixel_values"], true_batch["image_grid_thw"]).pooler_output).float()
    model.train(was_training)
    spread = feats.std(0).pow(2).mean().sqrt() / feats.pow(2).mean().sqrt()
    return {"img_loss": round(loss_true, 4), "img_gain": round(loss_swapped - loss_true, 4), "img_var": round(spread.item(), 5)}


def param_groups(model, tc: dict) -> list[dict]:
    """AdamW groups: weight decay on matrices except embeddings; the vision tower's learning rate scaled by
    train.vision_lr_mult (lr_mult is applied by the training loop on top of the schedule)."""
    groups = {}
    for n, p in model.named_parameters():
        decay = p.ndim >= 2 and "embed" not in n
        mult = tc.get("vision_lr_mult", 1.0) if ".visual." in f".{n}" else 1.0
        g = groups.setdefault((decay, mult), {"params": [], "weight_decay": tc["weight_decay"] if decay else 0.0,
                                              "lr_mult": mult})
        g["params"].append(p)
    return list(groups.values())


def lr_at(elapsed: float, tc: dict) -> float:
    """The schedule: a cosine over the wall-clock training budget summed over all runs."""
    frac = min(1.0, elapsed / tc["total_train_s"])
    cos = tc["min_lr_ratio"] + (1 - tc["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * frac))
    return tc["lr"] * cos


def run_warmup(run_steps: int, tc: dict) -> float:
    """The factor on the schedule over a run's first `warmup_steps` steps. Every run warms up, a resumed one too: the
    optimizer's moments are not saved, and a fresh AdamW's first steps are full-sized whatever the gradient, which
    kicked a resumed model from loss ~0.45 to 1.2-2.4 (gradient norm ~100) at every resume (sessions 21-30's logs)."""
    return min(1.0, (run_steps + 1) / tc["warmup_steps"])


def save_checkpoint(model, out: Path, state: dict) -> None:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out, max_shard_size="15MB")  # device transfers return files <= 16 MiB
    model.to(torch.float32)
    (out / "generation_config.json").unlink(missing_ok=True)  # the model-dir one (stop on <|im_end|>) is authoritative
    (out / "train_state.json").write_text(json.dumps(state, indent=1))


def plot_loss(log: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in log], [r["loss"] for r in log], lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("train loss (token cross-entropy)")
    ax.set_title("ocria-tiny training loss")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def answer_chars(tokenizer, answer_ids: list[int]) -> list[int]:
    """CTC targets of an answer: the characters of its plain text (markdown markup is not on the page)."""
    from pipeline.text import markdown_to_text

    return ctc_chars(markdown_to_text(tokenizer.decode(answer_ids)))


class LineCTC:
    """Auxiliary character CTC loss on the vision tower's output for single-line pages (training only: its head is
    saved beside each checkpoint, never in the shipped model).

    Joint CTC/attention training: the decoder alone must discover which image token holds the next character before
    the vision tower gets any signal about glyphs, and from scratch that takes more steps than a run has (run C read
    layout but not characters after 6,000 steps, research/ocria_tiny/commands.md). CTC gives the vision tower a
    direct per-column reading loss: each page whose merged token grid has at most `max_rows` rows (a line of text)
    becomes a left-to-right sequence (the rows averaged per column), and a linear head turns each column into
    `subframes` CTC frames over characters, so one merged token (32 px) can hold several characters, as it must at
    small fonts. The targets are the characters of the answer's plain text. Characters, not BPE tokens: with token
    targets the CTC loss stayed at 3-5 nats in 2,000 steps; with characters the vision tower alone took held-out line
    CER from 0.92 to 0.62 in 1,000 CPU steps (research/ocria_tiny/results/vision_ctc_probe.log).

    `head_only_steps`: for that many losses the features are detached, as in TextLineCTC: a new head on a trained
    vision tower (a resumed run whose saved head is missing) learns to read before its gradients reach the tower."""

    HEAD_FILE = "line_ctc_head.pt"

    def __init__(self, model, tokenizer, weight: float, max_rows: int, merge: int, subframes: int, im_end: int,
                 head_only_steps: int = 0):
        import torch

        cfg = model.config
        self.tok, self.weight, self.max_rows, self.merge, self.subframes, self.im_end = (
            tokenizer, weight, max_rows, merge, subframes, im_end)
        self.head_only_steps = head_only_steps
        self.head = torch.nn.Linear(cfg.text_config.hidden_size, subframes * CTC_CLASSES).to(next(model.parameters()).device)
        self.features = None
        # the merged image tokens, as the model computes them inside its forward (no second vision pass)
        model.model.visual.register_forward_hook(lambda mod, args, out: setattr(self, "features", out.pooler_output))

    def parameters(self):
        return self.head.parameters()

    def frames(self, tokens):
        """(rows, cols, hidden) merged tokens of one line -> (cols * subframes, CTC_CLASSES) logits, left to right."""
        return self.head(tokens.float().mean(0)).reshape(-1, CTC_CLASSES)

    def targets(self, answer_ids: list[int]) -> list[int]:
        return answer_chars(self.tok, [i for i in answer_ids if i != self.im_end])

    def _line_sequences(self, grid_thw, labels):
        """(frame logits, target characters) of the batch's line pages, from the features of the last forward."""
        import torch

        feats, self.features = self.features, None
        if self.head_only_steps > 0:
            feats = feats.detach()
        rows_cols = (grid_thw[:, 1:] // self.merge).tolist()
        sizes = [r * c for r, c in rows_cols]
        seqs, targets = [], []
        for x, (rows, cols), lab in zip(torch.split(feats, sizes), rows_cols, labels.tolist()):
            chars = self.targets([i for i in lab if i != -100]) if rows <= self.max_rows else []
            # a page with more characters than its frames can emit (two short text lines in one token row, or
            # glyphs too small for ctc_subframes) has no alignment: leave it out rather than average in a zero
            if chars and cols * self.subframes >= ctc_min_frames(chars):
                seqs.append(self.frames(x.reshape(rows, cols, -1)))  # merged tokens are row-major
                targets.append(chars)
        return seqs, targets

    def loss(self, grid_thw, labels):
        """Mean CTC loss over the batch's line pages that CTC can align (None when there are none); call right after
        the forward."""
        import torch
        import torch.nn.functional as F

        seqs, targets = self._line_sequences(grid_thw, labels)
        self.head_only_steps = max(self.head_only_steps - 1, 0)
        if not seqs:
            return None
        logp = F.log_softmax(torch.nn.utils.rnn.pad_sequence(seqs), -1)  # (T, N, classes)
        flat = torch.tensor([c for t in targets for c in t], device=logp.device)
        return F.ctc_loss(logp, flat, [len(x) for x in seqs], [len(t) for t in targets], blank=0, zero_infinity=True)

    def reading_cer(self, model, batch: dict) -> float | None:
        """Character error rate of the CTC head's greedy reading of the batch's line pages: does the vision tower
        read, whatever the decoder does? None when the batch has no line page CTC can align."""
        import torch

        device = next(model.parameters()).device
        with torch.no_grad(), torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            model.model.get_image_features(batch["pixel_values"].to(device), batch["image_grid_thw"].to(device))
            seqs, targets = self._line_sequences(batch["image_grid_thw"], batch["labels"])
        return greedy_cer([x.argmax(-1).tolist() for x in seqs], targets) if seqs else None


def resume_head(aux, path: Path, device: str, alone_steps: int, name: str) -> None:
    """A resumed run's CTC head (LineCTC or TextLineCTC): the saved one when its shape fits, reading from the first
    step; else a new head (none saved, or its subframes changed) that first learns alone for `alone_steps` losses, so
    its random read-out's gradients do not reach the trained vision tower."""
    import torch

    saved = torch.load(path, map_location=device) if path.exists() else None
    if saved is not None and saved["weight"].shape == aux.head.weight.shape:
        aux.head.load_state_dict(saved)
        aux.head_only_steps = 0
        return
    aux.head_only_steps = alone_steps
    why = "none saved" if saved is None else f"saved for another shape {tuple(saved['weight'].shape)}"
    print(f"{name}: {why} in {path.parent}: a new head, alone for {alone_steps} steps", flush=True)


def optimizer_step(model, opt, batch: dict, autocast, grad_clip: float, ctc: LineCTC | None = None,
                   line_ctc: TextLineCTC | None = None, merge: int = 2):
    """One forward/backward/update; returns (loss, grad norm, line-page CTC loss or None, text-line CTC loss or None)
    as device tensors."""
    import torch

    with autocast:
        loss = model(**model_inputs(batch)).loss
        # under autocast: the text-line read-out is a large matmul (every column of every line on the page)
        lines = None if line_ctc is None else line_ctc.loss(batch["image_grid_thw"], batch["line_geom"],
                                                            batch["line_chars"], merge)
    aux = ctc.loss(batch["image_grid_thw"], batch["labels"]) if ctc is not None else None
    total = loss + (ctc.weight * aux if aux is not None else 0) + (line_ctc.weight * lines if lines is not None else 0)
    total.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss, gnorm, aux, lines


def profile_training(model, loader, processor, opt, autocast, tc: dict, device: str, out: Path, steps: int,
                     warmup: int = 5, ctc: LineCTC | None = None, line_ctc: TextLineCTC | None = None,
                     merge: int = 2) -> dict:
    """Where a training step's time goes: `warmup` steps, then `steps` steps timed with a device sync after each
    (the share spent waiting for the data loader vs computing) and profiled with torch.profiler. Writes
    out/train_profile.json and out/train_profile.txt (ops by self device time and by self CPU time). Only the
    profiled steps record events: a step at 1,536 px dispatches ~54 k ops (research/ocria_tiny/results/op_count_1536.json),
    and tables built from every step's events were the likely reason session 14's profile ran past its device call."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    it = iter(loader)
    wait_s, step_s, tokens = [], [], []
    warmup = max(warmup, 1)  # the profiler's own warm-up takes the last unrecorded step
    with profile(activities=activities, schedule=schedule(wait=warmup - 1, warmup=1, active=steps, repeat=1)) as prof:
        for i in range(warmup + steps):
            t0 = time.perf_counter()
            batch = next(it)
            t1 = time.perf_counter()
            batch = model_batch(batch, processor, device, non_blocking=True)
            optimizer_step(model, opt, batch, autocast, tc["grad_clip"], ctc, line_ctc, merge)
            sync()
            if i >= warmup:
                wait_s.append(t1 - t0)
                step_s.append(time.perf_counter() - t1)
                tokens.append(int(batch["attention_mask"].sum()))
            prof.step()
    sort_device = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort_device, row_limit=40, max_name_column_width=70)
    table_cpu = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70)
    (out / "train_profile.txt").write_text(f"by {sort_device} ({steps} profiled steps)\n{table}\nby self CPU time\n{table_cpu}")
    res = {"batch_size": tc["batch_size"], "steps": steps, "step_ms_median": round(statistics.median(step_s) * 1e3, 1),
           "data_wait_ms_median": round(statistics.median(wait_s) * 1e3, 1),
           "data_wait_share": round(sum(wait_s) / (sum(wait_s) + sum(step_s)), 3),
           "tokens_per_step": round(statistics.mean(tokens)), "steps_per_s": round(steps / (sum(wait_s) + sum(step_s)), 2),
           "recorded_steps": next((e.count for e in prof.key_averages() if e.key.startswith("ProfilerStep")), 0)}
    (out / "train_profile.json").write_text(json.dumps(res, indent=1))
    print(table, flush=True)
    print(json.dumps(res), flush=True)
    return res


def time_training(model, loader, processor, opt, autocast, tc: dict, device: str, out: Path, steps: int,
                  warmup: int = 5, ctc: LineCTC | None = None, line_ctc: TextLineCTC | None = None,
                  merge: int = 2) -> dict:
    """Pages per second of `steps` training steps after `warmup`, as training runs them: no profiler and no device
    sync between steps (one before, one after), which the profile's per-step timing has. Writes out/train_time.json;
    the first step's loss lets arms that start from the same weights and pages be compared."""
    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    it = iter(loader)
    first_loss = None
    for _ in range(warmup):
        batch = model_batch(next(it), processor, device, non_blocking=True)
        loss = optimizer_step(model, opt, batch, autocast, tc["grad_clip"], ctc, line_ctc, merge)[0]
        first_loss = loss.item() if first_loss is None else first_loss
    sync()
    wait_s, pages, tokens = 0.0, 0, 0
    t0 = time.perf_counter()
    for _ in range(steps):
        t1 = time.perf_counter()
        batch = next(it)
        wait_s += time.perf_counter() - t1
        pages += len(batch["input_ids"])
        tokens += int(batch["attention_mask"].sum())  # a host tensor: no sync
        batch = model_batch(batch, processor, device, non_blocking=True)
        loss = optimizer_step(model, opt, batch, autocast, tc["grad_clip"], ctc, line_ctc, merge)[0]
    sync()
    total = time.perf_counter() - t0
    res = {"batch_size": tc["batch_size"], "warmup_steps": warmup, "steps": steps,
           "pages_per_s": round(pages / total, 2), "step_ms_mean": round(total / steps * 1e3, 1),
           "data_wait_share": round(wait_s / total, 3), "tokens_per_step": round(tokens / steps),
           "first_loss": round(first_loss, 5), "last_loss": round(loss.item(), 5),
           "gdn_chunk": tc["gdn_chunk"], "rope_positions": tc["rope_positions"]}
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_time.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res), flush=True)
    return res


def train(cfg: dict, synth: Path, model_dir: Path, out: Path, resume: Path | None, device: str,
          resume_state: Path | None = None, profile_steps: int = 0, time_steps: int = 0) -> None:
    """Train (or profile, or time) for one run; the settings that select implementations are checked before anything
    loads."""
    import contextlib

    from transformers.models.qwen3_5 import modeling_qwen3_5

    from research.ocria_tiny.chunked_gdn import chunked_gdn_in

    tc = cfg["train"]
    if tc["vision_attention"] not in ("per_image", "packed"):
        raise ValueError(f"train.vision_attention must be per_image or packed, got {tc['vision_attention']!r}")
    if tc["gated_delta_rule"] not in ("transformers", "chunked"):
        raise ValueError(f"train.gated_delta_rule must be transformers or chunked, got {tc['gated_delta_rule']!r}")
    if tc["rope_positions"] not in ("loader", "transformers"):
        raise ValueError(f"train.rope_positions must be loader or transformers, got {tc['rope_positions']!r}")
    if not isinstance(tc["gdn_chunk"], int) or tc["gdn_chunk"] < 16 or tc["gdn_chunk"] % 16:
        raise ValueError(f"train.gdn_chunk must be a multiple of 16, got {tc['gdn_chunk']!r}")
    if not 0 <= tc["answer_token_noise"] < 1:
        raise ValueError(f"train.answer_token_noise is a share of answer tokens, 0 <= x < 1, "
                         f"got {tc['answer_token_noise']!r}")
    chunked = tc["gated_delta_rule"] == "chunked"
    with chunked_gdn_in(modeling_qwen3_5, tc["gdn_chunk"]) if chunked else contextlib.nullcontext():
        _train(cfg, synth, model_dir, out, resume, device, resume_state, profile_steps, time_steps)


def _train(cfg: dict, synth: Path, model_dir: Path, out: Path, resume: Path | None, device: str,
           resume_state: Path | None, profile_steps: int, time_steps: int) -> None:
    import torch
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    from research.ocria_tiny.packed_vision_attention import use_packed_vision_attention

    tc = cfg["train"]
    torch.manual_seed(cfg["data"]["seed"])
    out.mkdir(parents=True, exist_ok=True)
    if resume is not None:
        model = Qwen3_5ForConditionalGeneration.from_pretrained(resume, dtype=torch.float32)
        # state (step, page index, clock) and loss log sit beside the weights, or elsewhere (a shipped checkpoint)
        state_dir = resume_state or resume
        state = json.loads((state_dir / "train_state.json").read_text())
        state.pop("heldout_eval", None)
        state.pop("stage_eval", None)
        log_path = state_dir / "train_log.jsonl"
        log = [json.loads(x) for x in log_path.read_text().splitlines()] if log_path.exists() else []
    else:
        model = Qwen3_5ForConditionalGeneration(Qwen3_5Config.from_pretrained(model_dir))
        state = {"step": 0, "pages": 0, "elapsed_s": 0.0, "runs": 0}
        log = []
    model.to(device).train()
    if tc["vision_attention"] == "packed":
        use_packed_vision_attention(model)
    if device.startswith("cuda"):
        # cuDNN's SDPA builds an execution plan for every new sequence length: ~5 ms of host time per attention call
        # with our variable page sizes, most of a step (research/ocria_tiny/results/train_profile.txt). Flash attention
        # has no such set-up cost.
        torch.backends.cuda.enable_cudnn_sdp(False)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params / 1e6:.2f} M (vision {sum(p.numel() for p in model.model.visual.parameters()) / 1e6:.2f} M)", flush=True)
    # transformers takes fla's chunked gated delta rule (Triton, forward and backward) when fla is importable
    import importlib.util

    gdn = "fla" if importlib.util.find_spec("fla") else "torch (fla not installed)"
    if tc["gated_delta_rule"] == "chunked":
        gdn = "research.ocria_tiny.chunked_gdn (torch, 5 ops a chunk)"
    print(f"gated delta rule: {gdn}", flush=True)

    builder, processor = PromptBuilder(model_dir, cfg["prompt"]), load_image_processor(model_dir)
    merge = cfg["model"]["vision"]["spatial_merge_size"]
    n_plain = min(dataclasses.astuple(builder.ids))  # the special tokens follow the trained vocabulary
    loader = torch.utils.data.DataLoader(
        page_stream(cfg, synth, model_dir, state["pages"]),
        batch_size=tc["batch_size"],
        num_workers=tc["num_workers"],
        collate_fn=lambda items: collate(items, builder.ids.endoftext, builder.ids.image_pad,
                                         tc["rope_positions"] == "loader"),
        prefetch_factor=tc["prefetch_factor"] if tc["num_workers"] else None,
        pin_memory=device.startswith("cuda"),  # pageable host-to-device copies cost ~1 ms per tensor (profile)
        persistent_workers=False,
    )
    ctc = None
    if tc.get("ctc_weight", 0.0) > 0:
        ctc = LineCTC(model, builder.tok, tc["ctc_weight"], tc.get("ctc_max_rows", 3),
                      merge, tc.get("ctc_subframes", 4), builder.ids.im_end)
        if resume is not None:
            resume_head(ctc, resume / LineCTC.HEAD_FILE, device, tc["ctc_head_steps"], "line CTC head")
    line_ctc = None
    if tc["text_line_ctc_weight"] > 0:
        line_ctc = TextLineCTC(model, tc["text_line_ctc_weight"], tc["text_line_ctc_subframes"],
                               tc["text_line_ctc_head_steps"])
        if resume is not None:
            resume_head(line_ctc, resume / TextLineCTC.HEAD_FILE, device, tc["text_line_ctc_head_steps"],
                        "text-line CTC head")
    groups = param_groups(model, tc)
    if ctc is not None:
        groups.append({"params": list(ctc.parameters()), "weight_decay": 0.0, "lr_mult": 1.0})
    if line_ctc is not None:
        groups.append({"params": list(line_ctc.parameters()), "weight_decay": 0.0,
                       "lr_mult": tc["text_line_ctc_lr_mult"]})
    opt = torch.optim.AdamW(groups, lr=tc["lr"], betas=(0.9, 0.95), fused=device.startswith("cuda"))
    autocast = torch.autocast(device_type="cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16)
    if profile_steps or time_steps:
        # the schedule's rate where a run would start, not the peak: at the peak (1e-3) session 22's timed steps took
        # a resumed model's loss from 0.22 to 3.5 within 25 steps, a fresh optimizer's first steps being full-sized
        for g in opt.param_groups:
            g["lr"] = lr_at(state["elapsed_s"], tc) * g["lr_mult"]
    if profile_steps:
        out.mkdir(parents=True, exist_ok=True)
        profile_training(model, loader, processor, opt, autocast, tc, device, out, profile_steps, ctc=ctc,
                         line_ctc=line_ctc, merge=merge)
        return
    if time_steps:
        time_training(model, loader, processor, opt, autocast, tc, device, out, time_steps, ctc=ctc,
                      line_ctc=line_ctc, merge=merge)
        return
    check_every = tc.get("image_check_every", 0)
    checks = image_check_batches(cfg, synth, model_dir, state["pages"]) if check_every else None
    line_checks = checks[0] if checks else None  # where the CTC head's reading is checked
    if checks and ctc is not None and (mixes := stage_mixes(curriculum_stage(cfg, state["pages"]))):
        line_checks = image_check_batches(cfg, synth, model_dir, state["pages"], 16, settings=mixes[0])[0]  # its lines
    budget = min(tc["run_train_s"], tc["total_train_s"] - state["elapsed_s"])
    t_start = time.time()
    t_first = None  # the clock starts at the first batch: worker start-up is not training time
    run_steps = 0
    for batch in loader:
        if t_first is None:
            t_first = time.time()
            print(f"first batch after {t_first - t_start:.1f}s", flush=True)
        run_elapsed = time.time() - t_first
        if run_elapsed >= budget or 0 < tc.get("max_run_steps", 0) <= run_steps:
            break
        elapsed = state["elapsed_s"] + run_elapsed
        lr = lr_at(elapsed, tc) * run_warmup(run_steps, tc)
        for g in opt.param_groups:
            g["lr"] = lr * g["lr_mult"]
        batch = model_batch(batch, processor, device, non_blocking=True)
        batch["input_ids"] = noisy_answer_inputs(batch["input_ids"], batch["labels"], tc["answer_token_noise"], n_plain)
        loss, gnorm, aux, lines = optimizer_step(model, opt, batch, autocast, tc["grad_clip"], ctc, line_ctc, merge)
        state["step"] += 1
        state["pages"] += len(batch["input_ids"])
        run_steps += 1
        if state["step"] % tc["log_every"] == 0 or run_steps == 1:
            rec = {"step": state["step"], "loss": round(loss.item(), 4), "lr": lr, "gnorm": round(gnorm.item(), 3),
                   "elapsed_s": round(elapsed, 1), "pages": state["pages"], "tokens": int(batch["attention_mask"].sum())}
            if aux is not None:
                rec["ctc"] = round(aux.item(), 4)
            if lines is not None:
                rec["line_ctc"] = round(lines.item(), 4)
            if checks is not None and (state["step"] % check_every == 0 or run_steps == 1):
                rec |= image_use(model, *checks)
                if ctc is not None and (cer := ctc.reading_cer(model, line_checks)) is not None:
                    rec["ctc_cer"] = round(cer, 4)
                if line_ctc is not None and (cer := line_ctc.reading_cer(model, checks[0], merge)) is not None:
                    rec["line_ctc_cer"] = round(cer, 4)  # every line of the check pages
            log.append(rec)
            print(json.dumps(rec), flush=True)
    state["elapsed_s"] += time.time() - (t_first or time.time())
    state["runs"] += 1
    print(f"run done: {run_steps} steps, {state['pages']} pages total, {state['elapsed_s']:.0f}s trained in total", flush=True)
    del loader
    ckpt = out / "ckpt"
    save_checkpoint(model, ckpt, state)
    if ctc is not None:  # beside the model, not in it: the shipped checkpoint has no CTC head
        torch.save({k: v.cpu() for k, v in ctc.head.state_dict().items()}, ckpt / LineCTC.HEAD_FILE)  # loads anywhere
    if line_ctc is not None:
        torch.save({k: v.cpu() for k, v in line_ctc.head.state_dict().items()}, ckpt / TextLineCTC.HEAD_FILE)
    (ckpt / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    try:
        plot_loss(log, out / "loss.png")
    except ImportError as e:
        print(f"no loss plot: {e}")
    if tc["eval_pages"]:
        state |= quick_eval(model, cfg, synth, model_dir, device, state["pages"])
        (ckpt / "train_state.json").write_text(json.dumps(state, indent=1))
    print(json.dumps(state), flush=True)


def quick_eval(model, cfg: dict, synth: Path, model_dir: Path, device: str, page_index: int) -> dict:
    """Greedy-decode held-out synthetic pages with the weights just saved (bf16, as shipped). heldout_eval: pages of
    the final distribution; stage_eval: pages of training page `page_index`'s curriculum stage, while that is not
    the final one (reading progress where training is now: img_gain alone cannot tell reading from layout, run C)."""
    import torch

    from research.ocria_tiny.eval_ocr import HFPageReader, evaluate, heldout_pages

    model.to(torch.bfloat16)
    reader = HFPageReader(model_dir, device, model=model, prompt=cfg["prompt"])

    def run(index: int | None) -> dict:
        t0 = time.time()
        pages = heldout_pages(cfg["train"]["eval_pages"], cfg, synth, index)
        res = evaluate(pages, reader, False, 16, cfg["train"]["eval_max_new_tokens"])
        res.pop("per_page")
        res["seconds"] = round(time.time() - t0, 1)
        return res

    evals = {"heldout_eval": run(None)}
    if curriculum_stage(cfg, page_index) is not cfg["data"]:
        evals["stage_eval"] = run(page_index)
    return evals


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["prepare", "train"])
    ap.add_argument("--config", type=Path, default=Path("research/ocria_tiny/train_tiny.yaml"))
    ap.add_argument("--synth", type=Path, default=Path(".synth"))
    ap.add_argument("--model-dir", type=Path, default=Path("models/ocria-tiny"))
    ap.add_argument("--out", type=Path, default=Path("build/train_tiny"))
    ap.add_argument("--resume", type=Path, default=None, help="checkpoint folder to continue from")
    ap.add_argument("--image-sizes-only", action="store_true",
                    help="prepare: only set the pixel budget of --model-dir's processor files (image.min/max_pixels)")
    ap.add_argument("--resume-state", type=Path, default=None,
                    help="folder with train_state.json/train_log.jsonl when they are not in --resume")
    ap.add_argument("--device", default=None)
    ap.add_argument("--time-steps", type=int, default=0,
                    help="train: time this many steps (after 5 warm-up steps), write out/train_time.json, save nothing")
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="train: profile this many steps (after 5 warm-up steps), write out/train_profile.*, save nothing")
    ap.add_argument("--set", action="append", default=[], help="override a config key, e.g. train.batch_size=4")
    args = ap.parse_args(argv)
    cfg = load_config(args.config, args.set)
    if args.step == "prepare" and args.image_sizes_only:
        set_image_sizes(cfg, args.model_dir)
    elif args.step == "prepare":
        prepare(cfg, args.synth, args.model_dir)
    else:
        import torch

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        train(cfg, args.synth, args.model_dir, args.out, args.resume, device, args.resume_state, args.profile_steps,
              args.time_steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())

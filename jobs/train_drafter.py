"""Train a DFlash drafter for a target checkpoint by self-distillation: the target reads the given page images
greedily, and the drafter learns to predict blocks of the target's own answers from its tapped hidden states.

    python jobs/train_drafter.py --checkpoint models/ocria-tiny --pages PAGES --out DRAFTER [--block-size 8]

PAGES: a folder of PNG/JPEG images, or a Parquet file of rendered pages (the raster rows the pipeline writes:
image (raw RGB bytes), image_height, image_width). Recipe (DFlash; docs/speculative-decoding.md): per step, a page's
random anchors among its answer tokens; each anchor's block [anchor token, MASK x (B - 1)] sees the context before the
anchor and its own block; cross-entropy on positions 1 .. B-1 weighted exp(-(k - 1) / gamma). The target's embedding
and LM head are frozen and shared; only the drafter's layers, fc and norms train. Writes DRAFTER/ (config.json +
model.safetensors, the public DFlash layout) and DRAFTER/train_log.json (losses; with --heldout, tau measured on the
held-out pages by the engine at each --measure-block).
"""
from __future__ import annotations

import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click
import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.interface import DEFAULT_PROMPT, SamplingParams  # noqa: E402
from engine.llm_engine import Engine  # noqa: E402
from engine.models.dflash import DFlashConfig, DFlashDrafter, build_target_layer_ids  # noqa: E402


class TrainDrafterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    checkpoint: str
    pages: str
    out: str
    device: str = "cpu"
    prompt: str = DEFAULT_PROMPT
    max_tokens: int = Field(256, ge=2, description="answer tokens the target generates per page")
    num_layers: int = Field(2, ge=1)
    num_taps: int = Field(3, ge=1, description="target layers tapped (evenly spaced, DFlash's rule)")
    block_size: int = Field(8, ge=2)
    mask_token_id: int | None = Field(None, description="null = the target's pad token, else its last id")
    anchors: int = Field(32, ge=1, description="blocks per page per step")
    gamma: float = Field(4.0, gt=0, description="loss decay over block positions (4 for B 8, 7 for B 16)")
    lr: float = Field(1e-3, gt=0)
    steps: int = Field(200, ge=1)
    max_seconds: float | None = Field(None, gt=0, description="stop training after this much wall time")
    heldout: int = Field(0, ge=0, description="pages kept out of training; tau is measured on them")
    measure_blocks: list[int] = Field(default_factory=lambda: [8], description="block sizes tau is measured at")
    seed: int = 0


@dataclass
class Example:
    ids: list[int]  # prompt + answer
    prompt_len: int
    taps: dict[int, torch.Tensor]  # target layer -> [len(ids) - 1, H] (the last token is never fed)


class TapRecorder:
    """Stands in the model runner's drafter slot while the target generates one page at a time: keeps the tapped
    hidden states of every token the target computes, by the token's index (engine/model_runner calls
    new_taps / write_context on every forward)."""

    def __init__(self, layer_ids):
        self.layer_ids = list(layer_ids)
        self.rows: dict[int, dict[int, torch.Tensor]] = {}

    def new_taps(self) -> dict:
        return dict.fromkeys(self.layer_ids)

    def write_context(self, taps, slot_mapping, index) -> None:
        live = (slot_mapping >= 0).cpu()
        for row, i in enumerate(index.cpu().tolist()):
            if live[row]:
                self.rows[i] = {lid: taps[lid][row].float().cpu() for lid in self.layer_ids}

    def stacked(self, n: int) -> dict[int, torch.Tensor]:
        return {lid: torch.stack([self.rows[i][lid] for i in range(n)]) for lid in self.layer_ids}


def load_pages(path: str | Path) -> list[np.ndarray]:
    """RGB uint8 page images from a folder of images or a Parquet of raster rows."""
    from PIL import Image

    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
        if not files:
            raise click.UsageError(f"--pages {path}: no .png / .jpg images in the folder")
        return [np.asarray(Image.open(f).convert("RGB")) for f in files]
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        t = pq.read_table(path, columns=["image", "image_height", "image_width"]).to_pylist()
        return [np.frombuffer(r["image"], np.uint8).reshape(r["image_height"], r["image_width"], 3) for r in t
                if r["image"]]
    raise click.UsageError(f"--pages {path}: give a folder of images or a .parquet of raster rows")


def collect(engine: Engine, images: list[np.ndarray], layer_ids, prompt: str, max_tokens: int) -> list[Example]:
    """The target's greedy answers to each page and the tapped hidden states of prompt + answer."""
    out = []
    for n, image in enumerate(images):
        rec = TapRecorder(layer_ids)
        engine.runner.drafter = rec
        o = engine.generate([dict(request_id=f"page-{n}", prompt=prompt, image=image,
                                  sampling=SamplingParams(max_tokens=max_tokens))])[0]
        engine.runner.drafter = None
        if o.finish_reason == "error":
            raise RuntimeError(f"page {n}: {o.error}")
        ids = o.prompt_token_ids + o.output_token_ids
        if len(o.output_token_ids) >= 2:
            out.append(Example(ids, len(o.prompt_token_ids), rec.stacked(len(ids) - 1)))
    return out


def block_loss(drafter: DFlashDrafter, ex: Example, embed: torch.Tensor, head: torch.Tensor, anchors: int,
               gamma: float, rng: random.Random, device) -> torch.Tensor:
    """Decayed per-position cross-entropy over random anchor blocks of one page's answer."""
    B, L = drafter.cfg.block_size, len(ex.ids)
    # an anchor is a verified token whose next token is an answer token: prompt_len - 1 .. L - 2
    choices = list(range(ex.prompt_len - 1, L - 1))
    picks = torch.tensor(sorted(rng.sample(choices, min(anchors, len(choices)))), device=device)
    ids = torch.tensor(ex.ids, device=device)
    block = torch.full((len(picks), B), drafter.cfg.mask_token_id, dtype=torch.long, device=device)
    block[:, 0] = ids[picks]
    target_pos = picks[:, None] + torch.arange(1, B, device=device)[None, :]  # [N, B-1]
    valid = target_pos < L
    targets = ids[target_pos.clamp(max=L - 1)]
    taps = {k: v.to(device) for k, v in ex.taps.items()}
    hidden = drafter.train_hidden(taps, F.embedding(block, embed), picks)
    logits = hidden[:, 1:].float() @ head.float().T
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none").view_as(targets)
    w = torch.exp(-torch.arange(B - 1, device=device, dtype=torch.float32) / gamma)[None, :] * valid
    return (ce * w).sum() / w.sum()


def measure_tau(checkpoint: str, drafter_dir: Path, images, prompt: str, max_tokens: int, blocks: list[int],
                device: str) -> list[dict]:
    """Greedy reads of `images` with the drafter at each verify block size: tau and acceptance by block position,
    plus whether the answers equal plain decoding's (they must)."""
    reqs = [dict(request_id=f"h{i}", prompt=prompt, image=im, sampling=SamplingParams(max_tokens=max_tokens))
            for i, im in enumerate(images)]
    plain = Engine.from_checkpoint(checkpoint, device=device, max_num_seqs=4, dtype="float32").generate(reqs)
    return [tau_row(plain, Engine.from_checkpoint(checkpoint, device=device, max_num_seqs=4, dtype="float32",
                                                   drafter=str(drafter_dir), spec_block_size=block).generate(reqs),
                     block) for block in blocks]


def tau_row(a, b, block: int) -> dict:
    """tau and acceptance by position of spec outputs b; a: plain outputs of the same requests (or None)."""
    steps = sum(o.spec_steps for o in b)
    acc = sum(o.spec_accepted for o in b)
    width = max(len(o.spec_drafted_by_pos) for o in b)
    by_pos = [sum(o.spec_accepted_by_pos[j] for o in b if j < len(o.spec_accepted_by_pos)) /
              max(1, sum(o.spec_drafted_by_pos[j] for o in b if j < len(o.spec_drafted_by_pos))) for j in range(width)]
    return {"block_size": block, "pages": len(b), "tau": (acc + steps) / steps if steps else 0.0,
            "verify_steps": steps, "drafted": sum(o.spec_drafted for o in b), "accepted": acc,
            "acceptance_by_position": [round(x, 4) for x in by_pos],
            "identical_to_plain": None if a is None else all(x.output_token_ids == y.output_token_ids
                                                             for x, y in zip(a, b))}


def train(cfg: TrainDrafterConfig, echo=print) -> dict:
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    images = load_pages(cfg.pages)
    heldout, train_images = images[:cfg.heldout], images[cfg.heldout:]
    if not train_images:
        raise click.UsageError(f"--pages {cfg.pages}: {len(images)} pages, all held out (--heldout {cfg.heldout})")
    target = Engine.from_checkpoint(cfg.checkpoint, device=cfg.device, dtype="float32", max_num_seqs=1,
                                    enforce_eager=True)
    t = target.cfg.text
    layer_ids = build_target_layer_ids(t.num_hidden_layers, cfg.num_taps)
    mask = cfg.mask_token_id
    if mask is None:
        mask = target.processor.tokenizer.token_to_id("<|vision_pad|>") if target.processor is not None else None
        mask = t.vocab_size - 1 if mask is None else mask
    dcfg = DFlashConfig(hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                        num_hidden_layers=cfg.num_layers, num_attention_heads=t.num_attention_heads,
                        num_key_value_heads=t.num_key_value_heads, head_dim=t.head_dim, rms_norm_eps=t.rms_norm_eps,
                        rope_theta=10000.0, vocab_size=t.vocab_size, target_layer_ids=tuple(layer_ids),
                        mask_token_id=int(mask), block_size=cfg.block_size)
    t0 = time.perf_counter()
    examples = collect(target, train_images, layer_ids, cfg.prompt, cfg.max_tokens)
    echo(f"collected {len(examples)} answers ({sum(len(e.ids) - e.prompt_len for e in examples)} tokens) in "
         f"{time.perf_counter() - t0:.0f} s")
    if not examples:
        raise RuntimeError("the target answered no page with 2 or more tokens: nothing to train on")
    embed = target.model.language_model.embed_tokens.weight.detach().to(cfg.device)
    head = target.model.head_weight.detach().to(cfg.device)
    drafter = DFlashDrafter(dcfg, torch.float32, cfg.device)
    with torch.no_grad():  # Qwen3-style init; the norms start at 1
        for name, p in drafter.hf_named():
            if p.dim() == 2:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]))
    params = [p for _, p in drafter.hf_named()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, cfg.steps // 25)) * 0.5 * (1 + math.cos(math.pi * s / cfg.steps)))
    losses, t_train = [], time.perf_counter()
    for step in range(cfg.steps):
        ex = examples[step % len(examples)]
        loss = block_loss(drafter, ex, embed, head, cfg.anchors, cfg.gamma, rng, cfg.device)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if step % 25 == 0 or step == cfg.steps - 1:
            echo(f"step {step}: loss {losses[-1]:.4f}")
        if cfg.max_seconds and time.perf_counter() - t_train > cfg.max_seconds:
            echo(f"stopping at step {step}: --max-seconds {cfg.max_seconds} reached")
            break
    out = Path(cfg.out)
    drafter.save_pretrained(out, num_target_layers=t.num_hidden_layers)
    log = {"config": cfg.model_dump(), "drafter": dcfg.to_json(), "train_pages": len(train_images),
           "answers": len(examples), "answer_tokens": sum(len(e.ids) - e.prompt_len for e in examples),
           "steps": len(losses), "train_seconds": round(time.perf_counter() - t_train, 1), "losses": losses}
    (out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    if heldout:
        log["heldout_tau"] = measure_tau(cfg.checkpoint, out, heldout, cfg.prompt, cfg.max_tokens,
                                         cfg.measure_blocks, cfg.device)
        for r in log["heldout_tau"]:
            echo(f"held-out pages, block {r['block_size']}: tau {r['tau']:.2f} ({r['accepted']}/{r['drafted']} "
                 f"drafts accepted; answers identical to plain decoding: {r['identical_to_plain']})")
        (out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    return log


@click.command(context_settings={"show_default": True})
@click.option("--config", "config_path", type=click.Path(exists=True), help="YAML with TrainDrafterConfig fields")
@click.option("--checkpoint", help="target checkpoint folder")
@click.option("--pages", help="folder of page images or .parquet of raster rows")
@click.option("--out", help="drafter folder to write")
@click.option("--device")
@click.option("--max-tokens", type=int)
@click.option("--num-layers", type=int)
@click.option("--num-taps", type=int)
@click.option("--block-size", type=int)
@click.option("--anchors", type=int)
@click.option("--gamma", type=float)
@click.option("--lr", type=float)
@click.option("--steps", type=int)
@click.option("--max-seconds", type=float)
@click.option("--heldout", type=int)
@click.option("--measure-block", "measure_blocks", type=int, multiple=True)
@click.option("--seed", type=int)
def main(config_path, **flags):
    import yaml
    from pydantic import ValidationError

    data = yaml.safe_load(Path(config_path).read_text()) if config_path else {}
    data.update({k: (list(v) if isinstance(v, tuple) else v) for k, v in flags.items() if v not in (None, ())})
    try:
        cfg = TrainDrafterConfig(**data)
    except ValidationError as e:
        raise click.UsageError(str(e)) from None
    train(cfg, echo=click.echo)


if __name__ == "__main__":
    main()

"""Grow a trained qwen3_5 checkpoint (ocria-tiny) by decoder layers that start as the identity, so training can go on
from where it was with a deeper decoder instead of from scratch.

Each added block keeps the 3:1 pattern (three Gated DeltaNet layers, then one gated-attention layer) and goes after
the last layer, before the final norm. A new layer copies the weights of the checkpoint's last layer of its kind
(trained features to start from) with its output projections zeroed -- the mixer's out_proj / o_proj and the MLP's
down_proj -- so it adds exactly zero to the residual stream: the grown model computes what the original did until
training moves those projections.

    python -m research.ocria_tiny.grow_tiny --from build/run_e/call3/run/ckpt --out build/grown --blocks 1

Everything else in the folder (tokenizer, processor files, train_state.json, train_log.jsonl, line_ctc_head.pt) is
copied, so `research.ocria_tiny.train_tiny train --resume OUT` continues the run's page count and schedule.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

PATTERN = ("linear_attention", "linear_attention", "linear_attention", "full_attention")
ZEROED = {"linear_attention": ("linear_attn.out_proj.weight", "mlp.down_proj.weight"),
          "full_attention": ("self_attn.o_proj.weight", "mlp.down_proj.weight")}


def layer_prefix(weights: dict) -> str:
    """'model.language_model.layers.' (qwen3_5) or 'model.layers.' (qwen3_5_text)."""
    for prefix in ("model.language_model.layers.", "model.layers."):
        if any(k.startswith(prefix) for k in weights):
            return prefix
    raise ValueError("no decoder layers found: expected keys under model.language_model.layers. or model.layers.")


def grow(weights: dict, layer_types: list[str], blocks: int) -> tuple[dict, list[str]]:
    """(weights with `blocks` x PATTERN new identity layers appended, the new layer_types)."""
    if blocks < 1:
        raise ValueError(f"blocks must be >= 1, got {blocks}")
    prefix = layer_prefix(weights)
    n = len(layer_types)
    template = {kind: max(i for i, k in enumerate(layer_types) if k == kind) for kind in set(PATTERN)
                if kind in layer_types}
    missing = set(PATTERN) - set(template)
    if missing:
        raise ValueError(f"the checkpoint has no {sorted(missing)} layer to copy")
    out = dict(weights)
    new_types = list(layer_types)
    for j, kind in enumerate(PATTERN * blocks):
        src, dst = f"{prefix}{template[kind]}.", f"{prefix}{n + j}."
        for key, t in weights.items():
            if key.startswith(src):
                name = key[len(src):]
                out[dst + name] = t.new_zeros(t.shape) if name in ZEROED[kind] else t.clone()
        new_types.append(kind)
    return out, new_types


def load_weights(ckpt: Path) -> dict:
    from safetensors.torch import load_file

    from engine.checkpoint import safetensors_files

    weights = {}
    for f in safetensors_files(ckpt):
        weights |= load_file(f)
    return weights


def main(argv: list[str] | None = None) -> int:
    from safetensors.torch import save_file

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="src", type=Path, required=True, help="checkpoint folder (config.json + safetensors)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--blocks", type=int, default=1, help="blocks of 3 GDN + 1 attention layers to add")
    args = ap.parse_args(argv)
    config = json.loads((args.src / "config.json").read_text())
    text = config.get("text_config", config)
    weights, types = grow(load_weights(args.src), list(text["layer_types"]), args.blocks)
    text["layer_types"], text["num_hidden_layers"] = types, len(types)
    args.out.mkdir(parents=True, exist_ok=True)
    for f in args.src.iterdir():  # tokenizer, processor, run state, CTC head: everything but the weights
        if f.is_file() and not f.name.endswith((".safetensors", ".safetensors.index.json")) and f.name != "config.json":
            shutil.copy(f, args.out / f.name)
    (args.out / "config.json").write_text(json.dumps(config, indent=2))
    save_file(weights, args.out / "model.safetensors", metadata={"format": "pt"})
    params = sum(t.numel() for t in weights.values())
    size_mb = (args.out / "model.safetensors").stat().st_size / 1e6
    print(f"{len(types)} decoder layers ({types.count('full_attention')} attention), {params / 1e6:.2f} M parameters, "
          f"model.safetensors {size_mb:.1f} MB -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

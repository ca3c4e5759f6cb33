"""Build a tiny random-weight Qwen3.5 VL checkpoint in the real HF `qwen3_5` format.

    python jobs/make_tiny_checkpoint.py --out models/tiny-random --seed 0

The weights are random: generated text is not meaningful. It exists so that loaders, the native engine, the
transformers baseline and the pipeline can be tested end to end on CPU. Same seed (and Python/torch/transformers
versions) -> byte-identical files.
"""
from __future__ import annotations

import json
import math
import platform
import shutil
from pathlib import Path

import click
import torch

from engine import hf_format
from engine.model_runner import resolve_dtype

# Text for the tokenizer: docstrings of these stdlib modules (and their public members), in this order.
# Deterministic for a given Python version, and present on every machine.
TOKENIZER_TEXT_MODULES = (
    "json", "csv", "argparse", "collections", "textwrap", "string", "re", "pathlib", "functools", "itertools",
    "datetime", "decimal", "fractions", "statistics", "heapq", "bisect", "dataclasses", "enum", "typing",
    "email.message", "html", "zipfile", "tarfile", "logging", "unittest", "difflib", "calendar", "shutil",
    "subprocess", "socket",
)  # fmt: skip

VOCAB_SIZE = 1024  # 1014 learned BPE tokens + 10 Qwen special tokens (ids 1014..1023)
MIN_PIXELS = 64 * 64  # 4 merged image tokens at least
MAX_PIXELS = 256 * 256  # 64 merged image tokens at most: keeps CPU tests fast


def stdlib_docstrings(modules: tuple[str, ...] = TOKENIZER_TEXT_MODULES) -> list[str]:
    from engine.testing import module_docstrings

    return module_docstrings(modules, skip_reexports=True)


def tiny_config(ids: hf_format.SpecialTokenIds, vocab_size: int):

    text = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,  # layer_types: 3 Gated DeltaNet + 1 full attention (full_attention_interval 4)
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        tie_word_embeddings=True,  # as in Qwen3.5-4B: no lm_head.weight in the files
        # rotary dim = 32 * 0.25 = 8 -> 4 frequencies split T/H/W = 2/1/1
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
        bos_token_id=None,
        eos_token_id=ids.endoftext,
        pad_token_id=ids.endoftext,
    )
    vision = dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        in_channels=3,
        patch_size=16,
        spatial_merge_size=2,
        temporal_patch_size=2,
        out_hidden_size=64,  # = text hidden
        num_position_embeddings=64,  # 8 x 8 grid, bilinearly interpolated to each image
        hidden_act="gelu_pytorch_tanh",
    )
    return hf_format.qwen3_5_config(text, vision, ids)


@torch.no_grad()
def init_random_weights(model: torch.nn.Module, seed: int) -> None:
    """Random but well-scaled values for every parameter, including the norms that default to 0/1, so that a loader
    that mixes up (1 + w) and w, or drops a bias, changes the outputs. Activations stay O(1) through the tiny net."""
    gen = torch.Generator().manual_seed(seed)

    def normal(p: torch.Tensor, std: float, mean: float = 0.0) -> None:
        p.copy_(torch.randn(p.shape, generator=gen) * std + mean)

    def uniform(shape, lo: float, hi: float) -> torch.Tensor:
        return torch.rand(shape, generator=gen) * (hi - lo) + lo

    done: set[int] = set()
    for _, module in model.named_modules():
        kind = type(module).__name__
        own = dict(module.named_parameters(recurse=False))
        if not own:
            continue
        if kind.endswith("RMSNormGated"):  # plain weight, applied as w
            normal(own["weight"], 0.1, mean=1.0)
        elif kind.endswith("RMSNorm"):  # zero-centred weight, applied as (1 + w)
            normal(own["weight"], 0.1)
        elif isinstance(module, torch.nn.LayerNorm):
            normal(own["weight"], 0.1, mean=1.0)
            normal(own["bias"], 0.05)
        elif isinstance(module, (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv3d)):
            w = own["weight"]
            fan_in = w[0].numel()  # depthwise conv1d: kernel size; conv3d: C*T*P*P; linear: in_features
            normal(w, 1.0 / math.sqrt(fan_in))
            if "bias" in own:
                normal(own["bias"], 0.05)
        elif isinstance(module, torch.nn.Embedding):
            normal(own["weight"], 0.5)  # tied lm_head: logits std ~ 0.5 * sqrt(hidden) = 4, peaked but not one-hot
        elif kind.endswith("GatedDeltaNet"):
            # Per-step decay exp(-A * softplus(a + dt_bias)): A in [1, 16], softplus(dt_bias) log-uniform in
            # [1e-3, 1e-1] -> decays from ~0.2 to ~1, so the recurrent state carries information across tokens.
            own["A_log"].copy_(torch.log(uniform(own["A_log"].shape, 1.0, 16.0)))
            dt = torch.exp(uniform(own["dt_bias"].shape, math.log(1e-3), math.log(1e-1)))
            own["dt_bias"].copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        else:
            raise ValueError(f"init_random_weights: no rule for {kind} parameters {sorted(own)}; add one")
        done.update(id(p) for p in own.values())
    missing = [n for n, p in model.named_parameters() if id(p) not in done]
    if missing:
        raise ValueError(f"init_random_weights left parameters uninitialised: {missing}")


def build_tiny_checkpoint(out: str | Path, seed: int = 0, dtype: str = "bfloat16") -> Path:
    """Write the tiny checkpoint folder `out` (replaced if present). Returns its path."""
    from transformers import Qwen3_5ForConditionalGeneration

    torch_dtype = resolve_dtype(dtype, torch.device("cpu"))
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    tok = hf_format.train_tokenizer(stdlib_docstrings(), VOCAB_SIZE)
    ids = hf_format.special_token_ids(tok)
    config = tiny_config(ids, tok.get_vocab_size(with_added_tokens=True))

    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(config)
    init_random_weights(model, seed)
    model.to(torch_dtype)
    model.save_pretrained(out, safe_serialization=True)

    # After save_pretrained: these replace its generation_config.json with ours.
    hf_format.write_processor_files(out, tok, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    info = {
        "name": out.name,
        "random_weights": True,
        "note": "random weights: generated text is not meaningful",
        "seed": seed,
        "dtype": dtype,
        "builder": "jobs/make_tiny_checkpoint.py",
        "tokenizer_text": f"docstrings of python {platform.python_version()} stdlib modules {list(TOKENIZER_TEXT_MODULES)}",
        "vocab_size": config.text_config.vocab_size,
        "special_token_ids": {name: tok.token_to_id(name) for name, _ in hf_format.SPECIAL_TOKENS},
        "min_pixels": MIN_PIXELS,
        "max_pixels": MAX_PIXELS,
    }
    (out / "ocria_info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return out


@click.command()
@click.option("--out", required=True, type=click.Path(file_okay=False), help="checkpoint folder to (re)create")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--dtype", default="bfloat16", show_default=True, type=click.Choice(["bfloat16", "float32"]))
def main(out: str, seed: int, dtype: str) -> None:
    path = build_tiny_checkpoint(out, seed, dtype)
    for f in sorted(path.iterdir()):
        click.echo(f"{f.stat().st_size:>10}  {f}")


if __name__ == "__main__":
    main()

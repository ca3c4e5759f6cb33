"""Tiny random Qwen3.5 checkpoints in real HF format, for tests and CPU benchmarks (needs transformers).

Every parameter is randomised -- including the norms that default to 0/1 and the GDN decay parameters -- so that a
wrong (1 + w) vs w, a dropped bias or a mis-fused projection changes the outputs.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

TINY_TEXT = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=4096,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                     "mrope_section": [2, 1, 1], "mrope_interleaved": True},
    bos_token_id=None, pad_token_id=None,
)
TINY_VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3, patch_size=16,
                   spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=64)
TOKENIZER_MODULES = ("json", "argparse", "textwrap", "string", "re", "pathlib", "functools", "collections", "csv",
                     "logging", "dataclasses", "typing")


def tokenizer_texts() -> list[str]:
    import importlib
    import inspect

    texts = []
    for name in TOKENIZER_MODULES:
        mod = importlib.import_module(name)
        for obj in [mod] + [getattr(mod, k) for k in sorted(vars(mod)) if not k.startswith("_")]:
            doc = inspect.getdoc(obj)
            if doc:
                texts.append(doc)
    return texts


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if name.endswith("A_log"):
            p.copy_(torch.log(torch.rand(p.shape, generator=gen) * 3.5 + 0.5))
        elif name.endswith("dt_bias"):
            dt = torch.rand(p.shape, generator=gen) * 0.19 + 0.01
            p.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus: softplus(dt_bias) = dt
        elif "linear_attn.norm" in name or (p.dim() == 1 and leaf == "weight" and "visual" in name):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))  # plain-weight norms (gated RMSNorm, LayerNorm)
        elif p.dim() == 1:
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))  # (1 + w) RMSNorms and biases
        elif "embed_tokens" in name or "pos_embed" in name:
            p.copy_(0.5 * torch.randn(p.shape, generator=gen))
        else:
            fan_in = p[0].numel()
            p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))


def build_checkpoint(out: str | Path, *, vision: bool = True, tie: bool = False, vocab_size: int = 600,
                     seed: int = 0, dtype: torch.dtype = torch.float32, text_overrides: dict | None = None,
                     max_shard_size: str | None = None, tokenizer=None) -> Path:
    """Write a tiny qwen3_5 (vision) or qwen3_5_text checkpoint with tokenizer, chat template and preprocessor."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration, Qwen3_5TextConfig

    from engine import hf_format

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = tokenizer or hf_format.train_tokenizer(tokenizer_texts(), vocab_size)
    ids = hf_format.special_token_ids(tok)
    text = dict(TINY_TEXT, vocab_size=tok.get_vocab_size(with_added_tokens=True), tie_word_embeddings=tie,
                eos_token_id=ids.im_end, **(text_overrides or {}))
    torch.manual_seed(seed)
    if vision:
        model = Qwen3_5ForConditionalGeneration(hf_format.qwen3_5_config(text, TINY_VISION, ids, tie))
    else:
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**text))
    randomize(model, seed)
    if tie:
        model.tie_weights()
    model.to(dtype).save_pretrained(out, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    hf_format.write_processor_files(out, tok, min_pixels=32 * 32, max_pixels=256 * 256)
    return out

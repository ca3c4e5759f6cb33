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


def module_docstrings(modules, skip_reexports: bool = False) -> list[str]:
    """Docstrings of `modules` and their public members, in order: deterministic tokenizer text present on every
    machine. skip_reexports: a member defined in another module is left to that module."""
    import importlib
    import inspect

    texts = []
    for name in modules:
        mod = importlib.import_module(name)
        for obj in [mod] + [getattr(mod, k) for k in sorted(vars(mod)) if not k.startswith("_")]:
            if skip_reexports and obj is not mod and getattr(obj, "__module__", None) != mod.__name__:
                continue
            doc = inspect.getdoc(obj)
            if doc:
                texts.append(doc)
    return texts


def tokenizer_texts() -> list[str]:
    return module_docstrings(TOKENIZER_MODULES)


def _gdn_param(name: str, shape, gen: torch.Generator) -> torch.Tensor | None:
    """A_log and dt_bias drawn from their working ranges (fp32); None for every other tensor."""
    if name.endswith("A_log"):
        return torch.log(torch.rand(shape, generator=gen) * 3.5 + 0.5)
    if name.endswith("dt_bias"):
        dt = torch.rand(shape, generator=gen) * 0.19 + 0.01
        return dt + torch.log(-torch.expm1(-dt))  # inverse softplus: softplus(dt_bias) = dt
    return None


def _normal_params(name: str, shape: tuple[int, ...]) -> tuple[float, float]:
    """(mean, std) of the normal a tensor is drawn from."""
    if "linear_attn.norm" in name or (len(shape) == 1 and name.endswith(".weight") and "visual" in name):
        return 1.0, 0.1  # plain-weight norms (gated RMSNorm, LayerNorm)
    if len(shape) == 1:
        return 0.0, 0.1  # (1 + w) RMSNorms and biases
    if "embed_tokens" in name or "pos_embed" in name:
        return 0.0, 0.5
    return 0.0, 1.0 / math.sqrt(math.prod(shape[1:]))  # 1 / sqrt(fan_in)


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        special = _gdn_param(name, p.shape, gen)
        if special is not None:
            p.copy_(special)
            continue
        mean, std = _normal_params(name, tuple(p.shape))
        p.copy_(mean + std * torch.randn(p.shape, generator=gen))


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


def _tiled(n: int, block: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """n values: `block` repeated (a memcpy per repeat), so any size costs about what writing it costs."""
    block = block[:n].to(dtype)
    out = torch.empty(n, dtype=dtype)
    k, b = divmod(n, block.numel())
    if k:
        out[: k * block.numel()].view(k, -1).copy_(block.expand(k, -1))
    if b:
        out[k * block.numel():].copy_(block[:b])
    return out


def random_tensor(name: str, shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator,
                  block_size: int = (1 << 20) + 7) -> torch.Tensor:
    """One tensor with randomize()'s per-name scales, built directly in `dtype` from a block of seeded normals
    tiled over it (weights repeat with a period of ~1M values: fine for throughput, not for anything learnt)."""
    n = math.prod(shape)
    special = _gdn_param(name, shape, gen)
    if special is not None:
        return special.to(dtype)
    mean, std = _normal_params(name, tuple(shape))
    block = torch.randn(min(n, block_size), generator=gen) * std + mean
    return _tiled(n, block, dtype).view(shape)


def write_random_checkpoint(out: str | Path, text: dict, vision: dict, *, min_pixels: int, max_pixels: int,
                            tokenizer_vocab: int = 1024, seed: int = 0, dtype: torch.dtype = torch.bfloat16,
                            shard_bytes: int = 2_000_000_000, note: str | None = None) -> Path:
    """A random-weight qwen3_5 (vision) checkpoint of any shape in the real HF format, written fast: no model is
    built; every tensor named and shaped by engine.checkpoint.expected_tensors is made directly in `dtype`
    (random_tensor) and saved in shards of about `shard_bytes` with an index. The Qwen3.5-4B shape (8.4 GB bf16)
    takes about as long as the disk needs to write it. The tokenizer is a small BPE (`tokenizer_vocab` ids, special
    tokens last); the text vocab stays `text['vocab_size']` (ids past the tokenizer decode to nothing)."""
    import json

    from safetensors.torch import save_file

    from engine import hf_format
    from engine.checkpoint import expected_tensors
    from engine.config import load_config

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = hf_format.train_tokenizer(tokenizer_texts(), tokenizer_vocab)
    ids = hf_format.special_token_ids(tok)
    n_tok = tok.get_vocab_size(with_added_tokens=True)
    text = dict(text, vocab_size=max(text["vocab_size"], n_tok), eos_token_id=ids.im_end, pad_token_id=ids.endoftext,
                bos_token_id=None)
    config = hf_format.qwen3_5_config(text, vision, ids, tie_word_embeddings=text.get("tie_word_embeddings", True))
    config.dtype = str(dtype).removeprefix("torch.")
    config.save_pretrained(out)
    hf_format.write_processor_files(out, tok, min_pixels=min_pixels, max_pixels=max_pixels)

    shapes = expected_tensors(load_config(out))
    item = torch.empty((), dtype=dtype).element_size()
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = math.prod(shape) * item
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    gen = torch.Generator().manual_seed(seed)
    weight_map = {}
    for i, names in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: random_tensor(n, shapes[n], dtype, gen) for n in names}, str(out / fname),
                  metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, fname))
    total = sum(math.prod(s) for s in shapes.values()) * item
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, sort_keys=True) + "\n")
    info = {"name": out.name, "random_weights": True, "seed": seed, "dtype": config.dtype,
            "builder": "engine.testing.write_random_checkpoint", "parameters": total // item,
            "note": note or "random weights: generated text is not meaningful",
            "min_pixels": min_pixels, "max_pixels": max_pixels}
    (out / "ocria_info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return out


def write_random_drafter(out: str | Path, target, *, num_layers: int = 2, num_taps: int = 2,
                         block_size: int = 4, mask_token_id: int | None = None, seed: int = 0,
                         dtype: torch.dtype = torch.float32) -> Path:
    """A random-weight DFlash drafter for a target (checkpoint folder or engine.config.TextConfig), in the public
    DFlash layout (config.json with dflash_config, model.safetensors): the target's hidden size and vocabulary,
    `num_taps` evenly spaced target layers, Qwen3 layers of the target's attention shape. mask_token_id defaults to
    the target's last token id."""
    from engine.config import TextConfig, load_config
    from engine.models.dflash import DFlashConfig, DFlashDrafter, build_target_layer_ids

    t = target if isinstance(target, TextConfig) else load_config(target).text
    cfg = DFlashConfig(
        hidden_size=t.hidden_size, intermediate_size=t.intermediate_size, num_hidden_layers=num_layers,
        num_attention_heads=t.num_attention_heads, num_key_value_heads=t.num_key_value_heads, head_dim=t.head_dim,
        rms_norm_eps=t.rms_norm_eps, rope_theta=10000.0, vocab_size=t.vocab_size,
        target_layer_ids=tuple(build_target_layer_ids(t.num_hidden_layers, num_taps)),
        mask_token_id=t.vocab_size - 1 if mask_token_id is None else mask_token_id, block_size=block_size)
    model = DFlashDrafter(cfg, torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.hf_named():
            mean, std = (1.0, 0.1) if p.dim() == 1 else (0.0, 1.0 / math.sqrt(p.shape[1]))
            p.copy_(mean + std * torch.randn(p.shape, generator=gen))
    return model.to(dtype).save_pretrained(out, num_target_layers=t.num_hidden_layers)

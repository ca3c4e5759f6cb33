"""Tiny random Qwen3.5 checkpoints in real HF format, for tests and CPU benchmarks (needs transformers).

Every parameter is randomised -- including the norms that default to 0/1 and the GDN decay parameters -- so that a
wrong (1 + w) vs w, a dropped bias or a mis-fused projection changes the outputs.
"""
from __future__ import annotations

import json
import math
import platform
import shutil
from pathlib import Path

import torch

from engine import hf_format

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
                         dtype: torch.dtype = torch.float32, dflash2: bool = False) -> Path:
    """A random-weight DFlash drafter for a target (checkpoint folder or engine.config.TextConfig), in the public
    DFlash layout (config.json with dflash_config, model.safetensors): the target's hidden size and vocabulary,
    `num_taps` evenly spaced target layers, Qwen3 layers of the target's attention shape. mask_token_id defaults to
    the target's last token id. dflash2: with DFlash2's convolutions (two taps, groups of 8 channels) and candidate
    selector (rank 8, top 4), their weights random too (the convolutions near the identity)."""
    from engine.config import TextConfig, load_config
    from engine.models.dflash import DFlashConfig, DFlashDrafter, build_target_layer_ids

    t = target if isinstance(target, TextConfig) else load_config(target).text
    cfg = DFlashConfig(
        hidden_size=t.hidden_size, intermediate_size=t.intermediate_size, num_hidden_layers=num_layers,
        num_attention_heads=t.num_attention_heads, num_key_value_heads=t.num_key_value_heads, head_dim=t.head_dim,
        rms_norm_eps=t.rms_norm_eps, rope_theta=10000.0, vocab_size=t.vocab_size,
        target_layer_ids=tuple(build_target_layer_ids(t.num_hidden_layers, num_taps)),
        mask_token_id=t.vocab_size - 1 if mask_token_id is None else mask_token_id, block_size=block_size,
        **(dict(conv_kernel_size=2, conv_group_size=8, selector_rank=8, selector_top_k=4) if dflash2 else {}))
    model = DFlashDrafter(cfg, torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.hf_named():
            mean, std = (1.0, 0.1) if p.dim() == 1 else (0.0, 1.0 / math.sqrt(p.shape[-1]))
            if name.endswith("base_kernel"):
                mean = torch.zeros(p.shape)
                mean[:, 0] = 1.0
            p.copy_(mean + std * torch.randn(p.shape, generator=gen))
    return model.to(dtype).save_pretrained(out, num_target_layers=t.num_hidden_layers)


# ---------------------------------------------------------------- the random-weight fallback model (make run, tests)

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
    return module_docstrings(modules, skip_reexports=True)


def tiny_config(ids, vocab_size: int):
    """The random-weight fallback model's config: TINY_TEXT / TINY_VISION with a tied head, as in Qwen3.5-4B."""
    text = dict(TINY_TEXT, vocab_size=vocab_size, hidden_act="silu", tie_word_embeddings=True,
                eos_token_id=ids.endoftext, pad_token_id=ids.endoftext)
    vision = dict(TINY_VISION, hidden_act="gelu_pytorch_tanh")
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

    from engine.model_runner import resolve_dtype

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
        "builder": "jobs/make_tiny_checkpoint.py (engine.testing.build_tiny_checkpoint)",
        "tokenizer_text": f"docstrings of python {platform.python_version()} stdlib modules {list(TOKENIZER_TEXT_MODULES)}",
        "vocab_size": config.text_config.vocab_size,
        "special_token_ids": {name: tok.token_to_id(name) for name, _ in hf_format.SPECIAL_TOKENS},
        "min_pixels": MIN_PIXELS,
        "max_pixels": MAX_PIXELS,
    }
    (out / "ocria_info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return out

"""Checkpoint inspection (headers only) and weight loading with projection fusion.

inspect_checkpoint() reads config.json and the safetensors headers -- never tensor data -- and checks every
tensor name and shape against what the config implies, so a malformed checkpoint fails before any GPU work.
load_weights() streams tensors into an engine model, fusing q/k/v, gate/up, GDN qkv+z and b+a.
"""
from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import torch

from engine.config import ModelConfig, load_config


class CheckpointError(ValueError):
    pass


# HF tensor name fragment -> (our fused parameter fragment, shard index). Order of shards = order in the fused weight.
FUSED_SHARDS = {
    "self_attn.q_proj.": ("self_attn.qkv_proj.", 0),
    "self_attn.k_proj.": ("self_attn.qkv_proj.", 1),
    "self_attn.v_proj.": ("self_attn.qkv_proj.", 2),
    "mlp.gate_proj.": ("mlp.gate_up_proj.", 0),
    "mlp.up_proj.": ("mlp.gate_up_proj.", 1),
    # all four GDN input projections read the same normed input: one GEMM [qkv | z | b | a]
    "linear_attn.in_proj_qkv.": ("linear_attn.in_proj.", 0),
    "linear_attn.in_proj_z.": ("linear_attn.in_proj.", 1),
    "linear_attn.in_proj_b.": ("linear_attn.in_proj.", 2),
    "linear_attn.in_proj_a.": ("linear_attn.in_proj.", 3),
}
# Tensors present in official checkpoints that no forward pass of ours reads.
IGNORED_PREFIXES = ("mtp.",)

_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
# The decoder projections a quantization_config may quantize (engine/quant_config.py); other Linear modules of the
# HF model (vision tower, lm_head) must be left out of it.
QUANTIZABLE = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "in_proj_qkv", "in_proj_z",
               "in_proj_b", "in_proj_a", "out_proj")
_VISION_LINEARS = ("attn.qkv", "attn.proj", "linear_fc1", "linear_fc2")


def text_prefix(cfg: ModelConfig) -> str:
    return "model.language_model." if cfg.model_type == "qwen3_5" else "model."


def expected_tensors(cfg: ModelConfig, text_only: bool = False) -> dict[str, tuple[int, ...]]:
    """Every HF tensor name the config implies, with its shape (lm_head only when untied; a quantized module's
    tensors in place of its weight)."""
    return {name: shape for name, (shape, _) in tensor_specs(cfg, text_only).items()}


def quantized_modules(cfg: ModelConfig, text_only: bool = False) -> dict:
    """HF module name -> QuantScheme for every module the checkpoint's quantization_config quantizes (raises naming
    the module when it quantizes one the engine runs in bf16 only)."""
    if cfg.quant is None:
        return {}
    if cfg.text.tie_word_embeddings and cfg.quant.scheme_for("lm_head"):
        raise CheckpointError("module lm_head: quantized by quantization_config, but the head is tied to the "
                              "embedding, which stays bf16: add 'lm_head' to quantization_config.ignore")
    out = {}
    for name in _bf16_tensors(cfg, text_only):
        module = name.removesuffix(".weight")
        leaf = module.rsplit(".", 1)[-1]
        linear = leaf in QUANTIZABLE or module == "lm_head" or module.endswith(_VISION_LINEARS)
        if not name.endswith(".weight") or not linear:
            continue
        scheme = cfg.quant.scheme_for(module)
        if scheme is None:
            continue
        if leaf not in QUANTIZABLE or module.startswith("model.visual."):
            raise CheckpointError(f"module {module}: quantized by quantization_config.config_groups.{scheme.group}, "
                                  "but the engine runs the vision tower and lm_head in bf16 only: add it to "
                                  "quantization_config.ignore (e.g. 're:.*visual.*', 'lm_head')")
        out[module] = scheme
    return out


def tensor_specs(cfg: ModelConfig, text_only: bool = False) -> dict[str, tuple[tuple[int, ...], tuple | None]]:
    """HF tensor name -> (shape, allowed safetensors dtypes, None meaning any float) for the whole checkpoint."""
    from engine.quant_config import quantized_tensor_specs

    plain = _bf16_tensors(cfg, text_only)
    out: dict = {}
    quant = quantized_modules(cfg, text_only)
    for name, shape in plain.items():
        module = name.removesuffix(".weight")
        if module in quant:
            out.update(quantized_tensor_specs(module, shape[0], shape[1], quant[module]))
        else:
            out[name] = (shape, None)
    return out


def _bf16_tensors(cfg: ModelConfig, text_only: bool = False) -> dict[str, tuple[int, ...]]:
    """Every HF tensor name of the unquantized checkpoint with its shape."""
    t = cfg.text
    p = text_prefix(cfg)
    H = t.hidden_size
    out: dict[str, tuple[int, ...]] = {p + "embed_tokens.weight": (t.vocab_size, H), p + "norm.weight": (H,)}
    if not t.tie_word_embeddings:
        out["lm_head.weight"] = (t.vocab_size, H)
    for i, kind in enumerate(t.layer_types):
        lp = f"{p}layers.{i}."
        out[lp + "input_layernorm.weight"] = (H,)
        out[lp + "post_attention_layernorm.weight"] = (H,)
        out[lp + "mlp.gate_proj.weight"] = (t.intermediate_size, H)
        out[lp + "mlp.up_proj.weight"] = (t.intermediate_size, H)
        out[lp + "mlp.down_proj.weight"] = (H, t.intermediate_size)
        if kind == "full_attention":
            a = lp + "self_attn."
            out[a + "q_proj.weight"] = (t.num_attention_heads * t.head_dim * 2, H)
            out[a + "k_proj.weight"] = (t.num_key_value_heads * t.head_dim, H)
            out[a + "v_proj.weight"] = (t.num_key_value_heads * t.head_dim, H)
            out[a + "o_proj.weight"] = (H, t.num_attention_heads * t.head_dim)
            out[a + "q_norm.weight"] = (t.head_dim,)
            out[a + "k_norm.weight"] = (t.head_dim,)
        else:
            g = lp + "linear_attn."
            hv = t.linear_num_value_heads
            out[g + "in_proj_qkv.weight"] = (t.gdn_conv_dim, H)
            out[g + "in_proj_z.weight"] = (t.gdn_value_dim, H)
            out[g + "in_proj_b.weight"] = (hv, H)
            out[g + "in_proj_a.weight"] = (hv, H)
            out[g + "conv1d.weight"] = (t.gdn_conv_dim, 1, t.linear_conv_kernel_dim)
            out[g + "dt_bias"] = (hv,)
            out[g + "A_log"] = (hv,)
            out[g + "norm.weight"] = (t.linear_value_head_dim,)
            out[g + "out_proj.weight"] = (H, t.gdn_value_dim)
    if cfg.vision is not None and not text_only:
        v = cfg.vision
        D = v.hidden_size
        vp = "model.visual."
        out[vp + "patch_embed.proj.weight"] = (D, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
        out[vp + "patch_embed.proj.bias"] = (D,)
        out[vp + "pos_embed.weight"] = (v.num_position_embeddings, D)
        for i in range(v.depth):
            b = f"{vp}blocks.{i}."
            for n in ("norm1", "norm2"):
                out[b + n + ".weight"] = (D,)
                out[b + n + ".bias"] = (D,)
            out[b + "attn.qkv.weight"] = (3 * D, D)
            out[b + "attn.qkv.bias"] = (3 * D,)
            out[b + "attn.proj.weight"] = (D, D)
            out[b + "attn.proj.bias"] = (D,)
            out[b + "mlp.linear_fc1.weight"] = (v.intermediate_size, D)
            out[b + "mlp.linear_fc1.bias"] = (v.intermediate_size,)
            out[b + "mlp.linear_fc2.weight"] = (D, v.intermediate_size)
            out[b + "mlp.linear_fc2.bias"] = (D,)
        M = D * v.spatial_merge_size**2
        out[vp + "merger.norm.weight"] = (D,)
        out[vp + "merger.norm.bias"] = (D,)
        out[vp + "merger.linear_fc1.weight"] = (M, M)
        out[vp + "merger.linear_fc1.bias"] = (M,)
        out[vp + "merger.linear_fc2.weight"] = (v.out_hidden_size, M)
        out[vp + "merger.linear_fc2.bias"] = (v.out_hidden_size,)
    return out


@dataclass(frozen=True)
class TensorEntry:
    file: Path
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    config: ModelConfig
    tensors: dict[str, TensorEntry]  # only the tensors we load (ignored ones dropped)
    model_id: str
    text_only: bool

    @property
    def files(self) -> list[Path]:
        return sorted({e.file for e in self.tensors.values()})


def read_safetensors_header(path: Path) -> tuple[dict, bytes]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw_len = f.read(8)
        if len(raw_len) != 8:
            raise CheckpointError(f"{path.name}: too short to be a safetensors file")
        (n,) = struct.unpack("<Q", raw_len)
        if n > size - 8 or n > 100_000_000:
            raise CheckpointError(f"{path.name}: corrupt safetensors header length {n}")
        blob = f.read(n)
    try:
        header = json.loads(blob)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path.name}: safetensors header is not valid JSON ({e})") from e
    data_len = size - 8 - n
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        if end > data_len:
            raise CheckpointError(f"{path.name}: tensor {name} extends past the end of the file (truncated download?)")
    return header, blob


def safetensors_files(root: Path) -> list[Path]:
    """The checkpoint's weight files: the shards its index names (all present), else every *.safetensors."""
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (root / n).is_file()]
        if missing:
            raise CheckpointError(f"{root}: shard(s) listed in model.safetensors.index.json are missing: {missing}")
        return [root / n for n in names]
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{root}: no *.safetensors files")
    return files


def weight_sample(path: Path, data_start: int, windows: int = 16, width: int = 4096) -> bytes:
    """`windows` evenly spaced `width`-byte pieces of a safetensors file's tensor data (all of it when smaller): enough
    for the model id to tell two trainings of one architecture apart, where headers and sizes are identical."""
    data = path.stat().st_size - data_start
    with open(path, "rb") as f:
        if data <= windows * width:
            f.seek(data_start)
            return f.read()
        pieces = []
        for i in range(windows):
            f.seek(data_start + (data - width) * i // (windows - 1))
            pieces.append(f.read(width))
    return b"".join(pieces)


def inspect_checkpoint(path: str | Path, text_only: bool = False, require_tokenizer: bool = True) -> CheckpointInfo:
    """Validate a checkpoint folder from config.json and safetensors headers; of the tensor data only a sample for
    the model id is read (64 KiB a file)."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"{root}: checkpoint folder not found")
    cfg = load_config(root)
    text_only = text_only or cfg.vision is None
    if require_tokenizer and not (root / "tokenizer.json").is_file():
        raise CheckpointError(f"{root}: tokenizer.json missing (the engine tokenizes with the checkpoint's own files)")

    digest = hashlib.sha256((root / "config.json").read_bytes())
    found: dict[str, TensorEntry] = {}
    for f in safetensors_files(root):
        header, blob = read_safetensors_header(f)
        digest.update(blob)
        digest.update(str(f.stat().st_size).encode())
        digest.update(weight_sample(f, 8 + len(blob)))
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            if name in found:
                raise CheckpointError(f"tensor {name} appears in both {found[name].file.name} and {f.name}")
            found[name] = TensorEntry(f, tuple(meta["shape"]), meta["dtype"])

    specs = tensor_specs(cfg, text_only)
    expected = {name: shape for name, (shape, _) in specs.items()}
    ignored = IGNORED_PREFIXES + (("model.visual.",) if text_only else ())
    tie = cfg.text.tie_word_embeddings
    kept: dict[str, TensorEntry] = {}
    extra = []
    for name, e in found.items():
        if name.startswith(ignored) or (tie and name == "lm_head.weight"):
            continue  # a tied checkpoint may still store the head; the embedding is the source of truth
        if name not in expected:
            extra.append(name)
            continue
        if e.shape != expected[name]:
            raise CheckpointError(f"tensor {name}: shape {list(e.shape)} in {e.file.name}, "
                                  f"config implies {list(expected[name])}")
        allowed = specs[name][1]
        if (allowed is None and e.dtype not in _ST_DTYPES) or (allowed is not None and e.dtype not in allowed):
            raise CheckpointError(f"tensor {name}: unsupported dtype {e.dtype} in {e.file.name}"
                                  + (f" (quantization_config implies {' or '.join(allowed)})" if allowed else ""))
        kept[name] = e
    quant = quantized_modules(cfg, text_only)
    for name in extra:
        module = name.rpartition(".")[0]
        if module in quant and name.endswith(".weight") and quant[module].weights == "nvfp4":
            raise CheckpointError(f"tensor {name}: stored unquantized, but quantization_config.config_groups."
                                  f"{quant[module].group} quantizes {module} (NVFP4 stores weight_packed, "
                                  "weight_scale, weight_global_scale): fix the config's targets/ignore or the weights")
    if extra:
        raise CheckpointError(f"unexpected tensor(s) not implied by config.json: {', '.join(sorted(extra)[:5])}"
                              + (f" (+{len(extra) - 5} more)" if len(extra) > 5 else ""))
    missing = sorted(set(expected) - set(kept))
    if missing:
        raise CheckpointError(f"missing tensor(s): {', '.join(missing[:5])}"
                              + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""))
    # a quantized checkpoint says so in its id even when its folder is named like the bf16 one
    label = f"-{cfg.quant.label}" if cfg.quant is not None and cfg.quant.label not in root.name else ""
    model_id = f"{root.name}{label}-{digest.hexdigest()[:10]}"
    return CheckpointInfo(root, cfg, kept, model_id, text_only)


def iter_checkpoint_tensors(info: CheckpointInfo) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for name, e in info.tensors.items():
        by_file.setdefault(e.file, []).append(name)
    for f, names in sorted(by_file.items()):
        with safe_open(str(f), framework="pt", device="cpu") as h:
            for name in names:
                yield name, h.get_tensor(name)


def hf_name_to_param(name: str, cfg: ModelConfig) -> tuple[str, int | None]:
    """HF tensor name -> (our parameter name, shard index in a fused weight or None)."""
    p = text_prefix(cfg)
    if name == "lm_head.weight":
        return "lm_head.weight", None
    if name.startswith("model.visual."):
        local = "visual." + name[len("model.visual."):]
        if local == "visual.patch_embed.proj.weight":
            return "visual.patch_embed.weight", None
        if local == "visual.patch_embed.proj.bias":
            return "visual.patch_embed.bias", None
        return local, None
    if not name.startswith(p):
        raise CheckpointError(f"tensor {name}: not under {p!r}")
    local = "language_model." + name[len(p):]
    for frag, (fused, idx) in FUSED_SHARDS.items():
        if frag in local:
            return local.replace(frag, fused), idx
    return local, None


def load_weights(model: torch.nn.Module, cfg: ModelConfig, tensors: Iterable[tuple[str, torch.Tensor]],
                 expected: dict[str, tuple[int, ...]] | None = None) -> None:
    """Copy HF-named tensors into `model` (see engine.models.qwen3_5.Qwen3_5Model), fusing shards.

    Every parameter of the model must be written exactly once per shard; anything else raises naming the tensor.
    """
    params = dict(model.named_parameters())
    written: dict[str, set] = {}
    quant = quantized_modules(cfg)
    qtensors: dict[str, dict[str, torch.Tensor]] = {}  # quantized HF module -> its tensors by local name
    for name, tensor in tensors:
        if name.startswith(IGNORED_PREFIXES) or (cfg.text.tie_word_embeddings and name == "lm_head.weight"):
            continue  # a tied head is the embedding (an in-memory HF model also lists it)
        module, _, local = name.rpartition(".")
        if module in quant:
            if expected is not None and name not in expected:
                raise CheckpointError(f"unexpected tensor {name}")
            if expected is not None and tuple(tensor.shape) != expected[name]:
                raise CheckpointError(f"tensor {name}: shape {list(tensor.shape)}, config implies "
                                      f"{list(expected[name])}")
            qtensors.setdefault(module, {})[local] = tensor
            continue
        if expected is not None and name not in expected:
            raise CheckpointError(f"unexpected tensor {name}")
        if expected is not None and tuple(tensor.shape) != expected[name]:
            raise CheckpointError(f"tensor {name}: shape {list(tensor.shape)}, config implies {list(expected[name])}")
        pname, shard = hf_name_to_param(name, cfg)
        if pname not in params:
            raise CheckpointError(f"tensor {name}: no parameter {pname} in the engine model")
        param = params[pname]
        with torch.no_grad():
            if shard is None:
                src = tensor.reshape(param.shape) if tensor.numel() == param.numel() else tensor
                if src.shape != param.shape:
                    raise CheckpointError(f"tensor {name}: shape {list(tensor.shape)} does not fit {pname} "
                                          f"{list(param.shape)}")
                param.copy_(src)
            else:
                sizes = param.shard_sizes
                start = sum(sizes[:shard])
                if tensor.shape[0] != sizes[shard] or tuple(tensor.shape[1:]) != tuple(param.shape[1:]):
                    raise CheckpointError(f"tensor {name}: shape {list(tensor.shape)} does not fit shard {shard} of "
                                          f"{pname} (rows {sizes[shard]}, width {list(param.shape[1:])})")
                param[start:start + sizes[shard]].copy_(tensor)
        written.setdefault(pname, set()).add(shard)
    if cfg.text.tie_word_embeddings and "lm_head.weight" in params:
        raise CheckpointError("internal: tied model must not own an lm_head parameter")
    if quant:
        _install_quantized(model, cfg, quant, qtensors, params, written)
    missing = []
    for pname, param in params.items():
        n_shards = len(getattr(param, "shard_sizes", [None]))
        got = written.get(pname, set())
        if len(got) != n_shards:
            missing.append(pname)
    if missing:
        raise CheckpointError(f"parameters not written by the checkpoint: {', '.join(missing[:5])}")


def _install_quantized(model, cfg: ModelConfig, quant: dict, qtensors: dict, params: dict, written: dict) -> None:
    """Replace each projection weight with quantized shards by a QuantWeight (all shards quantized alike) or a
    SplitWeight (row blocks of different kinds; the bf16 shards were copied into the parameter already)."""
    from engine.models.quant_linear import PlainWeight, QuantWeight, SplitWeight
    from engine.quant_config import quantized_tensor_specs

    by_param: dict[str, dict[int | None, str]] = {}
    for module, scheme in quant.items():
        pname, shard = hf_name_to_param(module + ".weight", cfg)
        if pname not in params:
            raise CheckpointError(f"module {module}: no parameter {pname} in the engine model")
        got = qtensors.get(module, {})
        need = {n.rpartition(".")[2] for n in quantized_tensor_specs(module, 16, 16, scheme)}
        if set(got) != need:
            raise CheckpointError(f"module {module}: quantized tensors {sorted(got)} given, quantization_config "
                                  f"implies {sorted(need)}")
        by_param.setdefault(pname, {})[shard] = module
        written.setdefault(pname, set()).add(shard)
    for pname, shards in by_param.items():
        param = params[pname]
        sizes = getattr(param, "shard_sizes", [param.shape[0]])
        blocks, start = [], 0
        for i, rows in enumerate(sizes):
            module = shards.get(i if hasattr(param, "shard_sizes") else None)
            if module is None:
                block = PlainWeight(param.data[start:start + rows].clone())
            else:
                s = quant[module]
                block = QuantWeight.from_tensors(s.weights, qtensors[module], s.runs_w8a8, param.device)
                if block.shape != (rows, param.shape[1]):
                    raise CheckpointError(f"module {module}: quantized weight is {list(block.shape)}, the engine "
                                          f"expects {[rows, param.shape[1]]}")
            if blocks and isinstance(block, QuantWeight) and block.same_kind(blocks[-1][-1]):
                blocks[-1].append(block)
            elif blocks and isinstance(block, PlainWeight) and isinstance(blocks[-1][-1], PlainWeight):
                blocks[-1].append(block)
            else:
                blocks.append([block])
            start += rows
        merged = [QuantWeight.concat(b) if isinstance(b[0], QuantWeight)
                  else PlainWeight(torch.cat([p.weight for p in b])) for b in blocks]
        owner = model.get_submodule(pname.rsplit(".", 1)[0])
        delattr(owner, "weight")
        owner.weight = merged[0] if len(merged) == 1 else SplitWeight(merged)

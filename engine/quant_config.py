"""A checkpoint's `quantization_config` in the compressed-tensors layout (what llm-compressor writes and vLLM reads),
parsed without compressed-tensors itself (it needs pydantic; the engine must import without it).

Supported (anything else raises a ConfigError naming the config field, or a CheckpointError naming the module):
  * quant_method "compressed-tensors", quantization_status "compressed" (or absent), no kv_cache_scheme, no
    sparsity or transform config;
  * FP8 weights: num_bits 8, type float, symmetric, strategy "channel" (or "tensor"), format "float-quantized":
    tensors `weight` (float8_e4m3fn [N, K]) and `weight_scale` ([N, 1], or [1] per tensor); activations either
    dynamic per token (num_bits 8, float, strategy "token", dynamic true) or none (weight-only);
  * NVFP4 weights: num_bits 4, type float, symmetric, strategy "tensor_group", group_size 16, format
    "nvfp4-pack-quantized": `weight_packed` (uint8 [N, K/2], two E2M1 codes a byte, low nibble first),
    `weight_scale` (float8_e4m3fn [N, K/16]) and `weight_global_scale` (fp32 [1]); W = e2m1 * weight_scale /
    weight_global_scale. Activations none (NVFP4A16) or NVFP4 (num_bits 4, float, tensor_group, group 16, dynamic
    "local", tensor `input_global_scale` [1]): those run weight-only here, as vLLM does on Hopper (no FP4 tensor
    cores; docs/quantization.md);
  * quantized modules only in the text decoder's projections; the vision tower and lm_head stay unquantized.
Targets and ignore entries follow compressed-tensors: "re:<regex>" matched with re.match against the module's full
name (e.g. "model.language_model.layers.0.mlp.down_proj"), else the exact name or the module class ("Linear").
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from engine.config import ConfigError

FP8, NVFP4 = "fp8", "nvfp4"
FORMATS = {FP8: "float-quantized", NVFP4: "nvfp4-pack-quantized"}
NVFP4_GROUP = 16
F8 = "F8_E4M3"
FLOAT_SCALES = ("F32", "BF16", "F16")


@dataclass(frozen=True)
class QuantScheme:
    weights: str  # FP8 or NVFP4
    act: str | None  # None (weight-only), "fp8_token" (dynamic per token), "nvfp4" (stored; run weight-only here)
    per_tensor: bool = False  # FP8 with one weight scale for the tensor
    group: str = ""  # config group name, for messages

    @property
    def runs_w8a8(self) -> bool:
        return self.weights == FP8 and self.act == "fp8_token"


@dataclass(frozen=True)
class QuantConfig:
    groups: tuple[tuple[str, tuple[str, ...], QuantScheme], ...]  # (name, targets, scheme)
    ignore: tuple[str, ...]

    def scheme_for(self, module: str, cls: str = "Linear") -> QuantScheme | None:
        """The scheme of the one group whose targets match `module` (None when ignored or unmatched)."""
        if any(_match(t, module, cls) for t in self.ignore):
            return None
        hits = [(name, s) for name, targets, s in self.groups if any(_match(t, module, cls) for t in targets)]
        if len(hits) > 1:
            raise ConfigError(f"quantization_config: module {module} matches config groups "
                              f"{', '.join(n for n, _ in hits)}; each module may belong to one group only")
        return hits[0][1] if hits else None

    @property
    def label(self) -> str:
        """A short name of the precisions used, for model ids: "fp8", "nvfp4" or "fp8+nvfp4"."""
        return "+".join(sorted({s.weights for _, _, s in self.groups}))


def _match(target: str, name: str, cls: str) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name or target == cls


def _dtype_name(v) -> str:
    return str(v).removeprefix("torch.") if v is not None else ""


def _check_args(args: dict, where: str, allowed: dict[str, tuple]) -> None:
    for key, ok in allowed.items():
        v = args.get(key)
        if v not in ok:
            raise ConfigError(f"quantization_config.{where}.{key}={v!r} unsupported (supported: "
                              f"{', '.join(repr(o) for o in ok)})")
    if args.get("block_structure"):
        raise ConfigError(f"quantization_config.{where}.block_structure={args['block_structure']!r} unsupported "
                          "(block-wise FP8 is not implemented; use strategy 'channel')")


def _parse_group(name: str, g: dict, default_format: str | None) -> tuple[tuple[str, ...], QuantScheme]:
    where = f"config_groups.{name}"
    if not isinstance(g, dict):
        raise ConfigError(f"quantization_config.{where} must be an object with targets/weights")
    targets = g.get("targets")
    if not targets or not isinstance(targets, list):
        raise ConfigError(f"quantization_config.{where}.targets must be a non-empty list of module names/patterns")
    w = g.get("weights")
    if not isinstance(w, dict):
        raise ConfigError(f"quantization_config.{where}.weights is missing: activation-only quantization is "
                          "unsupported")
    if g.get("output_activations") is not None:
        raise ConfigError(f"quantization_config.{where}.output_activations unsupported (must be null)")
    bits = w.get("num_bits")
    common = dict(type=("float",), symmetric=(True, None), dynamic=(False, None), actorder=(None, "static", "weight"))
    if bits == 8:
        _check_args(w, where + ".weights", dict(common, strategy=("channel", "tensor"), group_size=(None,)))
        kind = FP8
    elif bits == 4:
        _check_args(w, where + ".weights", dict(common, strategy=("tensor_group",), group_size=(NVFP4_GROUP,)))
        sd = _dtype_name(w.get("scale_dtype"))
        if sd not in ("", "float8_e4m3fn"):
            raise ConfigError(f"quantization_config.{where}.weights.scale_dtype={sd!r} unsupported (NVFP4 block "
                              "scales are float8_e4m3fn; MXFP4's E8M0 is not supported)")
        kind = NVFP4
    else:
        raise ConfigError(f"quantization_config.{where}.weights.num_bits={bits!r} unsupported (8: FP8, 4: NVFP4)")
    fmt = g.get("format") or default_format
    if fmt != FORMATS[kind]:
        raise ConfigError(f"quantization_config.{where}.format={fmt!r} unsupported for {kind} weights "
                          f"(expected {FORMATS[kind]!r})")
    a = g.get("input_activations")
    act = None
    if a is not None:
        if kind == FP8:
            _check_args(a, where + ".input_activations", dict(num_bits=(8,), type=("float",), symmetric=(True, None),
                                                               strategy=("token",), dynamic=(True,)))
            act = "fp8_token"
        else:
            _check_args(a, where + ".input_activations", dict(num_bits=(4,), type=("float",), symmetric=(True, None),
                                                               strategy=("tensor_group",), group_size=(NVFP4_GROUP,),
                                                               dynamic=("local",)))
            act = "nvfp4"
    return tuple(targets), QuantScheme(kind, act, w.get("strategy") == "tensor", name)


def parse_quant_config(qc) -> QuantConfig:
    """config.json's quantization_config -> QuantConfig (see the module docstring for what is supported)."""
    if not isinstance(qc, dict):
        raise ConfigError("config.json: quantization_config must be an object")
    method = qc.get("quant_method")
    if method != "compressed-tensors":
        raise ConfigError(f"config.json: quantization_config.quant_method={method!r} unsupported "
                          "(expected 'compressed-tensors')")
    status = qc.get("quantization_status")
    if status not in (None, "compressed"):
        raise ConfigError(f"quantization_config.quantization_status={status!r} unsupported (expected 'compressed': "
                          "save the model with compressed weights)")
    for key in ("kv_cache_scheme", "sparsity_config", "transform_config"):
        if qc.get(key):
            raise ConfigError(f"quantization_config.{key} unsupported (must be null or empty)")
    groups = qc.get("config_groups")
    if not groups or not isinstance(groups, dict):
        raise ConfigError("quantization_config.config_groups must be a non-empty object")
    fmt = qc.get("format")
    if fmt not in (None, "mixed-precision", *FORMATS.values()):
        raise ConfigError(f"quantization_config.format={fmt!r} unsupported (expected one of "
                          f"{', '.join(FORMATS.values())} or mixed-precision)")
    default = None if fmt == "mixed-precision" else fmt
    parsed = tuple((name, *_parse_group(name, g, default)) for name, g in groups.items())
    ignore = qc.get("ignore") or []
    if not isinstance(ignore, list):
        raise ConfigError("quantization_config.ignore must be a list")
    return QuantConfig(parsed, tuple(ignore))


def quantized_tensor_specs(module: str, N: int, K: int, s: QuantScheme) -> dict[str, tuple[tuple[int, ...], tuple]]:
    """The tensors a quantized module stores: name -> (shape, allowed safetensors dtypes)."""
    if s.weights == FP8:
        return {module + ".weight": ((N, K), (F8,)),
                module + ".weight_scale": ((1,) if s.per_tensor else (N, 1), FLOAT_SCALES)}
    if K % NVFP4_GROUP:
        raise ConfigError(f"module {module}: NVFP4 needs an input width divisible by {NVFP4_GROUP}, it has {K} "
                          f"(quantization_config.config_groups.{s.group})")
    out = {module + ".weight_packed": ((N, K // 2), ("U8",)),
           module + ".weight_scale": ((N, K // NVFP4_GROUP), (F8,)),
           module + ".weight_global_scale": ((1,), ("F32",))}
    if s.act == "nvfp4":
        out[module + ".input_global_scale"] = ((1,), ("F32",))
    return out


def quant_config_dict(groups: dict[str, tuple[list[str], str, bool]], ignore: list[str]) -> dict:
    """A compressed-tensors quantization_config for config.json. groups: name -> (targets, FP8 | NVFP4,
    activations quantized: FP8 dynamic per token / NVFP4 W4A4 with input_global_scale)."""
    def args(kind, strategy, **extra):
        return dict(num_bits=8 if kind == FP8 else 4, type="float", symmetric=True, strategy=strategy,
                    dynamic=False, group_size=None, block_structure=None, actorder=None, observer="minmax",
                    observer_kwargs={}, **extra)

    cg, kinds = {}, set()
    for name, (targets, kind, with_act) in groups.items():
        kinds.add(kind)
        if kind == FP8:
            w = args(FP8, "channel")
            a = dict(args(FP8, "token"), dynamic=True, observer=None) if with_act else None
        else:
            w = dict(args(NVFP4, "tensor_group"), group_size=NVFP4_GROUP, scale_dtype="torch.float8_e4m3fn",
                     zp_dtype="torch.float8_e4m3fn")
            a = dict(w, dynamic="local", observer="static_minmax") if with_act else None
        cg[name] = dict(targets=list(targets), weights=w, input_activations=a, output_activations=None,
                        format=FORMATS[kind])
    return dict(quant_method="compressed-tensors", quantization_status="compressed",
                format=FORMATS[kinds.pop()] if len(kinds) == 1 else "mixed-precision", config_groups=cg,
                ignore=list(ignore), kv_cache_scheme=None, global_compression_ratio=None)

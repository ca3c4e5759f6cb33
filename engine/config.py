"""Model configuration parsed from a checkpoint's config.json (qwen3_5 VL or qwen3_5_text).

Only the fields our engine needs; anything we cannot run raises a ConfigError naming the field.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.quant_config import QuantConfig


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class TextConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    layer_types: tuple[str, ...]
    rope_theta: float
    partial_rotary_factor: float
    mrope_section: tuple[int, int, int]
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...] = ()

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def gdn_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def gdn_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def gdn_conv_dim(self) -> int:
        return 2 * self.gdn_key_dim + self.gdn_value_dim

    @property
    def full_attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "full_attention"]

    @property
    def linear_attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "linear_attention"]


@dataclass(frozen=True)
class VisionConfig:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    in_channels: int
    patch_size: int
    spatial_merge_size: int
    temporal_patch_size: int
    out_hidden_size: int
    num_position_embeddings: int
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size**2


@dataclass(frozen=True)
class ModelConfig:
    model_type: str  # "qwen3_5" (vision + text) or "qwen3_5_text"
    text: TextConfig
    vision: VisionConfig | None = None
    image_token_id: int | None = None
    video_token_id: int | None = None
    vision_start_token_id: int | None = None
    vision_end_token_id: int | None = None
    torch_dtype: str = "float32"
    quant: "QuantConfig | None" = None  # engine/quant_config.py: which decoder projections are FP8 / NVFP4
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def has_vision(self) -> bool:
        return self.vision is not None


def _need(d: dict, key: str, where: str):
    if key not in d or d[key] is None:
        raise ConfigError(f"config.json: missing required field {where}{key}")
    return d[key]


def _as_id_tuple(v) -> tuple[int, ...]:
    if v is None:
        return ()
    if isinstance(v, int):
        return (v,)
    return tuple(int(x) for x in v)


def parse_text_config(d: dict, where: str = "") -> TextConfig:
    n_layers = int(_need(d, "num_hidden_layers", where))
    n_heads = int(_need(d, "num_attention_heads", where))
    hidden = int(_need(d, "hidden_size", where))
    layer_types = d.get("layer_types")
    if layer_types is None:
        interval = int(d.get("full_attention_interval", 4))
        layer_types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n_layers)]
    if len(layer_types) != n_layers:
        raise ConfigError(f"config.json: {where}layer_types has {len(layer_types)} entries, num_hidden_layers is {n_layers}")
    for t in layer_types:
        if t not in ("linear_attention", "full_attention"):
            raise ConfigError(f"config.json: {where}layer_types has unsupported entry {t!r}")
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"config.json: {where}hidden_act={act!r} unsupported (expected 'silu')")
    if d.get("attention_bias", False):
        raise ConfigError(f"config.json: {where}attention_bias=true is unsupported")

    rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ConfigError(f"config.json: {where}rope_parameters.rope_type={rope_type!r} unsupported (expected 'default')")
    theta = float(rope.get("rope_theta", d.get("rope_theta", 10000.0)))
    prf = float(rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 0.25)))
    section = tuple(int(x) for x in rope.get("mrope_section", (11, 11, 10)))
    head_dim = int(d.get("head_dim") or hidden // n_heads)
    if len(section) != 3 or sum(section) * 2 != int(head_dim * prf):
        raise ConfigError(
            f"config.json: {where}rope_parameters.mrope_section={list(section)} must have 3 entries summing to "
            f"rotary_dim/2 = {int(head_dim * prf) // 2}")
    hk, hv = int(_need(d, "linear_num_key_heads", where)), int(_need(d, "linear_num_value_heads", where))
    if hv % hk:
        raise ConfigError(f"config.json: {where}linear_num_value_heads={hv} not divisible by linear_num_key_heads={hk}")
    nkv = int(_need(d, "num_key_value_heads", where))
    if n_heads % nkv:
        raise ConfigError(f"config.json: {where}num_attention_heads={n_heads} not divisible by num_key_value_heads={nkv}")
    return TextConfig(
        vocab_size=int(_need(d, "vocab_size", where)),
        hidden_size=hidden,
        intermediate_size=int(_need(d, "intermediate_size", where)),
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=nkv,
        head_dim=head_dim,
        linear_num_key_heads=hk,
        linear_num_value_heads=hv,
        linear_key_head_dim=int(_need(d, "linear_key_head_dim", where)),
        linear_value_head_dim=int(_need(d, "linear_value_head_dim", where)),
        linear_conv_kernel_dim=int(d.get("linear_conv_kernel_dim", 4)),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
        layer_types=tuple(layer_types),
        rope_theta=theta,
        partial_rotary_factor=prf,
        mrope_section=section,  # type: ignore[arg-type]
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        eos_token_ids=_as_id_tuple(d.get("eos_token_id")),
    )


def parse_vision_config(d: dict) -> VisionConfig:
    where = "vision_config."
    act = d.get("hidden_act", "gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise ConfigError(f"config.json: vision_config.hidden_act={act!r} unsupported (expected 'gelu_pytorch_tanh')")
    if d.get("deepstack_visual_indexes"):
        raise ConfigError("config.json: vision_config.deepstack_visual_indexes is non-empty (deepstack is not qwen3_5)")
    rope = d.get("rope_parameters") or {}
    cfg = VisionConfig(
        depth=int(_need(d, "depth", where)),
        hidden_size=int(_need(d, "hidden_size", where)),
        intermediate_size=int(_need(d, "intermediate_size", where)),
        num_heads=int(_need(d, "num_heads", where)),
        in_channels=int(d.get("in_channels", 3)),
        patch_size=int(d.get("patch_size", 16)),
        spatial_merge_size=int(d.get("spatial_merge_size", 2)),
        temporal_patch_size=int(d.get("temporal_patch_size", 2)),
        out_hidden_size=int(_need(d, "out_hidden_size", where)),
        num_position_embeddings=int(_need(d, "num_position_embeddings", where)),
        rope_theta=float(rope.get("rope_theta", 10000.0)),
    )
    side = int(round(cfg.num_position_embeddings**0.5))
    if side * side != cfg.num_position_embeddings:
        raise ConfigError(f"config.json: vision_config.num_position_embeddings={cfg.num_position_embeddings} is not a square")
    return cfg


def parse_config(raw: dict) -> ModelConfig:
    from dataclasses import replace

    cfg = _parse_model(raw)
    qc = raw.get("quantization_config")
    if qc is None and isinstance(raw.get("text_config"), dict):
        qc = raw["text_config"].get("quantization_config")
    if qc is None:
        return cfg
    from engine.quant_config import parse_quant_config

    return replace(cfg, quant=parse_quant_config(qc))


def _parse_model(raw: dict) -> ModelConfig:
    mt = raw.get("model_type")
    if mt == "qwen3_5":
        text_raw = dict(_need(raw, "text_config", ""))
        # The composite model ties its head by the top-level flag; eos may live at either level.
        if raw.get("tie_word_embeddings") is not None:
            text_raw["tie_word_embeddings"] = raw["tie_word_embeddings"]
        if text_raw.get("eos_token_id") is None:
            text_raw["eos_token_id"] = raw.get("eos_token_id")
        text = parse_text_config(text_raw, "text_config.")
        vision = parse_vision_config(_need(raw, "vision_config", ""))
        if vision.out_hidden_size != text.hidden_size:
            raise ConfigError(f"config.json: vision_config.out_hidden_size={vision.out_hidden_size} != "
                              f"text_config.hidden_size={text.hidden_size}")
        return ModelConfig(
            model_type=mt, text=text, vision=vision,
            image_token_id=int(raw.get("image_token_id", 248056)),
            video_token_id=int(raw.get("video_token_id", 248057)),
            vision_start_token_id=int(raw.get("vision_start_token_id", 248053)),
            vision_end_token_id=int(raw.get("vision_end_token_id", 248054)),
            torch_dtype=str(raw.get("dtype") or raw.get("torch_dtype") or text_raw.get("dtype") or "float32"),
            raw=raw,
        )
    if mt == "qwen3_5_text":
        return ModelConfig(model_type=mt, text=parse_text_config(raw),
                           torch_dtype=str(raw.get("dtype") or raw.get("torch_dtype") or "float32"), raw=raw)
    raise ConfigError(f"config.json: model_type={mt!r} unsupported (expected 'qwen3_5' or 'qwen3_5_text')")


CONTEXT_CAP = 8192  # the engine's context when the checkpoint's positions allow more (KV cache per sequence)


def default_max_model_len(text: TextConfig) -> int:
    """The engine's context (prompt + answer tokens) unless EngineOptions.max_model_len says otherwise."""
    return min(text.max_position_embeddings, CONTEXT_CAP)


def load_config(checkpoint_dir: str | Path) -> ModelConfig:
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        raise ConfigError(f"{path}: not found (is {checkpoint_dir} an HF checkpoint folder?)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: invalid JSON ({e})") from e
    return parse_config(raw)

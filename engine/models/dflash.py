"""DFlash block-diffusion drafter: a few Qwen3 decoder layers that draft a block of tokens in one pass.

Context: the target's hidden states at `target_layer_ids` (outputs of those decoder layers), concatenated and fused
by `fc` + `hidden_norm`; every draft layer projects that shared context with its own k/v projections (k_norm, rotary
at the token's index in the sequence) and keeps it in a paged KV cache laid out like the target's (same block
tables, same slots), written by every target forward. A draft pass runs the block [last token, MASK x (B - 1)] at
indices start .. start + B - 1 through the layers; each block query sees the context before `start` and the whole
block (bidirectional). The output at block position k predicts the token at start + k; position 0 is dropped. No
embedding or LM head of its own: the target's are used.

HF layout (the public DFlash drafters'): config.json with the Qwen3 fields and `dflash_config` {target_layer_ids,
mask_token_id, block_size}; safetensors with fc.weight [H, n H], hidden_norm.weight, norm.weight and
layers.i.{input_layernorm, post_attention_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm,
mlp.{gate,up,down}_proj}.weight (a leading "model." is accepted). Rotary positions are the token's index in its
sequence (for image prompts too): the drafters trained by jobs/train_drafter.py use the same. Sliding-window layers are
refused at load.

DFlash2 (dflash_config conv_kernel_size, conv_group_size, selector_rank, selector_top_k): a grouped dynamic
convolution wraps each layer's attention and MLP (layers.i.{attention,mlp}_conv.{base_kernel,
kernel_projection.weight}), and a candidate selector (candidate_selector.{hidden_projection.weight,
predecessor_codebook, successor_codebook}) picks each draft among the top-k given the draft before it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine import ops
from engine.config import TextConfig
from engine.models.dflash_glue import DraftGlue, rotary
from engine.models.dflash_glue import norm as rms_norm  # Qwen3's RMSNorm (plain weight, not 1 + w), in fp32
from engine.rope import apply_rotary, inv_frequencies


class DrafterConfigError(ValueError):
    """A drafter checkpoint that cannot serve this target (the message names the field)."""


@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    block_size: int
    # DFlash2 (all or none): the two-tap grouped dynamic convolution around each sublayer, the top-k selector
    conv_kernel_size: int = 0
    conv_group_size: int = 16
    selector_rank: int = 0
    selector_top_k: int = 16
    output_multiplier: float | None = None  # the selector's unary logits: x * m, then cap * tanh(x / cap)
    final_logit_softcapping: float | None = None

    @property
    def dflash2(self) -> bool:
        return self.conv_kernel_size > 0

    def to_json(self, num_target_layers: int | None = None) -> dict:
        """config.json contents in the public DFlash (DFlash2) layout."""
        d = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_act": "silu",
             "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
             "num_hidden_layers": self.num_hidden_layers, "num_attention_heads": self.num_attention_heads,
             "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
             "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta, "vocab_size": self.vocab_size,
             "attention_bias": False, "tie_word_embeddings": False, "block_size": self.block_size,
             "dflash_config": {"target_layer_ids": list(self.target_layer_ids), "mask_token_id": self.mask_token_id,
                               "block_size": self.block_size}}
        if self.dflash2:
            d["architectures"] = ["DFlash2DraftModel"]
            d["dflash_config"].update(conv_kernel_size=self.conv_kernel_size, conv_group_size=self.conv_group_size,
                                      selector_rank=self.selector_rank, selector_top_k=self.selector_top_k)
            for key in ("output_multiplier", "final_logit_softcapping"):
                if getattr(self, key) is not None:
                    d["dflash_config"][key] = getattr(self, key)
        if num_target_layers is not None:
            d["num_target_layers"] = num_target_layers
        return d


def build_target_layer_ids(num_target_layers: int, num_taps: int) -> list[int]:
    """DFlash's default taps: evenly spaced from layer 1 to layer L - 3 (one tap: the middle layer)."""
    if num_taps == 1:
        return [num_target_layers // 2]
    return [round(1 + i * (num_target_layers - 4) / (num_taps - 1)) for i in range(num_taps)]


def load_dflash_config(folder: str | Path, target: TextConfig) -> DFlashConfig:
    """config.json of a drafter folder, checked against the target; raises DrafterConfigError naming the field."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise DrafterConfigError(f"drafter {folder}: no config.json (pass a DFlash drafter folder, or none)")
    raw = json.loads(path.read_text())
    dcfg = raw.get("dflash_config")
    if not isinstance(dcfg, dict):
        raise DrafterConfigError(f"{path}: no dflash_config (target_layer_ids, mask_token_id, block_size): not a "
                                 f"DFlash drafter")

    def need(d, key, where):
        if key not in d:
            raise DrafterConfigError(f"{path}: {where}{key} missing")
        return d[key]

    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    theta = raw.get("rope_theta", rope.get("rope_theta", 1e6))
    heads = need(raw, "num_attention_heads", "")
    cfg = DFlashConfig(
        hidden_size=need(raw, "hidden_size", ""), intermediate_size=need(raw, "intermediate_size", ""),
        num_hidden_layers=need(raw, "num_hidden_layers", ""), num_attention_heads=heads,
        num_key_value_heads=raw.get("num_key_value_heads", heads),
        head_dim=raw.get("head_dim") or need(raw, "hidden_size", "") // heads,
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6), rope_theta=float(theta), vocab_size=need(raw, "vocab_size", ""),
        target_layer_ids=tuple(int(i) for i in need(dcfg, "target_layer_ids", "dflash_config.")),
        mask_token_id=int(need(dcfg, "mask_token_id", "dflash_config.")),
        block_size=int(dcfg.get("block_size", raw.get("block_size", 0))),
        conv_kernel_size=int(dcfg.get("conv_kernel_size") or 0), conv_group_size=int(dcfg.get("conv_group_size") or 16),
        selector_rank=int(dcfg.get("selector_rank") or 0), selector_top_k=int(dcfg.get("selector_top_k") or 16),
        output_multiplier=dcfg.get("output_multiplier"), final_logit_softcapping=dcfg.get("final_logit_softcapping"))
    layer_types = raw.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        raise DrafterConfigError(f"{path}: layer_types {layer_types}: only full-attention draft layers are supported")
    checks = [
        ("hidden_size", cfg.hidden_size, target.hidden_size),
        ("vocab_size", cfg.vocab_size, target.vocab_size),
    ]
    if "num_target_layers" in raw:
        checks.append(("num_target_layers", raw["num_target_layers"], target.num_hidden_layers))
    for field, got, want in checks:
        if got != want:
            raise DrafterConfigError(f"{path}: {field}={got} does not match the target's {want}: this drafter was "
                                     f"made for another model")
    bad = [i for i in cfg.target_layer_ids if not 0 <= i < target.num_hidden_layers]
    if not cfg.target_layer_ids or bad:
        raise DrafterConfigError(f"{path}: dflash_config.target_layer_ids {list(cfg.target_layer_ids)} must name "
                                 f"layers of the target (0 .. {target.num_hidden_layers - 1})")
    if not 0 <= cfg.mask_token_id < target.vocab_size:
        raise DrafterConfigError(f"{path}: dflash_config.mask_token_id={cfg.mask_token_id} is outside the target's "
                                 f"vocabulary (0 .. {target.vocab_size - 1})")
    if cfg.block_size < 2:
        raise DrafterConfigError(f"{path}: dflash_config.block_size={cfg.block_size} must be >= 2")
    if bool(cfg.conv_kernel_size) != bool(cfg.selector_rank):
        missing = "selector_rank" if cfg.conv_kernel_size else "conv_kernel_size"
        raise DrafterConfigError(f"{path}: dflash_config.{missing} missing: a DFlash2 drafter has both the dynamic "
                                 f"convolution (conv_kernel_size) and the candidate selector (selector_rank)")
    if cfg.dflash2 and (cfg.conv_kernel_size > cfg.block_size or cfg.hidden_size % cfg.conv_group_size):
        raise DrafterConfigError(f"{path}: dflash_config.conv_kernel_size={cfg.conv_kernel_size} must not exceed "
                                 f"block_size={cfg.block_size}, and conv_group_size={cfg.conv_group_size} must divide "
                                 f"hidden_size={cfg.hidden_size}")
    return cfg


def expected_drafter_tensors(cfg: DFlashConfig) -> dict[str, tuple[int, ...]]:
    H, I, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    out = {"fc.weight": (H, len(cfg.target_layer_ids) * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        out.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                    p + "self_attn.q_proj.weight": (nh * hd, H), p + "self_attn.k_proj.weight": (nkv * hd, H),
                    p + "self_attn.v_proj.weight": (nkv * hd, H), p + "self_attn.o_proj.weight": (H, nh * hd),
                    p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                    p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                    p + "mlp.down_proj.weight": (H, I)})
        if cfg.dflash2:
            K, groups = cfg.conv_kernel_size, H // cfg.conv_group_size
            for conv in ("attention_conv", "mlp_conv"):
                out.update({p + f"{conv}.base_kernel": (2, K, H),
                            p + f"{conv}.kernel_projection.weight": (2 * K * groups, H)})
    if cfg.dflash2:
        r, V = cfg.selector_rank, cfg.vocab_size
        out.update({"candidate_selector.hidden_projection.weight": (r, H),
                    "candidate_selector.predecessor_codebook": (V, r), "candidate_selector.successor_codebook": (V, r)})
    return out


class GroupedConv(nn.Module):
    """DFlash2's two-tap grouped dynamic causal convolution over the rows of each block (taps never reach before a
    block's first row): out[i, c] = sum_t (base[side, t, c] + delta[i, side, t, c // group]) x[i - t, c]. delta is
    predicted from the sublayer's input at row i (kernel_projection), one set for the input side (prepare) and one
    for the output side (finish). Starts as the identity: base tap 0 = 1, the projection 0."""

    def __init__(self, hidden: int, taps: int, group: int, **factory):
        super().__init__()
        self.taps, self.group = taps, group
        base = torch.zeros(2, taps, hidden, **factory)
        base[:, 0] = 1.0
        self.base_kernel = nn.Parameter(base)
        self.kernel_projection = nn.Linear(hidden, 2 * taps * (hidden // group), bias=False, **factory)
        nn.init.zeros_(self.kernel_projection.weight)

    def convolve(self, x: torch.Tensor, w: torch.Tensor, block: int) -> torch.Tensor:
        """x [R, H] (rows in blocks of `block`), w [R, taps, H] -> [R, H]."""
        H = x.shape[-1]
        xb, wb = x.view(-1, block, H), w.view(-1, block, self.taps, H)
        out = wb[:, :, 0] * xb
        for t in range(1, self.taps):
            out = out + wb[:, :, t] * F.pad(xb[:, :-t], (0, 0, t, 0))
        return out.view(-1, H)

    def prepare(self, x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The sublayer's input convolved, and the kernels its output gets (finish)."""
        R, H = x.shape
        delta = self.kernel_projection(x).view(R, 2, self.taps, H // self.group).repeat_interleave(self.group, -1)
        w = self.base_kernel[None] + delta
        return self.convolve(x, w[:, 0], block), w[:, 1]

    def finish(self, y: torch.Tensor, w: torch.Tensor, block: int) -> torch.Tensor:
        return self.convolve(y, w, block)


class CandidateSelector(nn.Module):
    """DFlash2's candidate selector: at each block position the top-k draft tokens b are scored
    U(b) + <A[a] * P h, B[b]> given the token a chosen before them (the verified token at the first position), so a
    draft follows from the one before it. A, B: predecessor / successor codebooks [V, rank]; P: hidden -> rank."""

    def __init__(self, hidden: int, vocab: int, rank: int, **factory):
        super().__init__()
        self.hidden_projection = nn.Linear(hidden, rank, bias=False, **factory)
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab, rank, **factory))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab, rank, **factory))

    def score(self, candidates: torch.Tensor, unary: torch.Tensor, hidden: torch.Tensor,
              predecessors: torch.Tensor) -> torch.Tensor:
        """candidates [..., k] token ids, unary [..., k], hidden [..., H], predecessors [...] -> [..., k] (fp32)."""
        state = self.predecessor_codebook[predecessors].float() * self.hidden_projection(hidden).float()
        return unary.float() + (self.successor_codebook[candidates].float() * state[..., None, :]).sum(-1)


class DraftLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig, **factory):
        super().__init__()
        H, I, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
        self.nh, self.nkv, self.hd, self.eps = cfg.num_attention_heads, cfg.num_key_value_heads, hd, cfg.rms_norm_eps
        self.input_layernorm = nn.Parameter(torch.ones(H, **factory))
        self.post_attention_layernorm = nn.Parameter(torch.ones(H, **factory))
        self.q_proj = nn.Linear(H, self.nh * hd, bias=False, **factory)
        self.k_proj = nn.Linear(H, self.nkv * hd, bias=False, **factory)
        self.v_proj = nn.Linear(H, self.nkv * hd, bias=False, **factory)
        self.o_proj = nn.Linear(self.nh * hd, H, bias=False, **factory)
        self.q_norm = nn.Parameter(torch.ones(hd, **factory))
        self.k_norm = nn.Parameter(torch.ones(hd, **factory))
        self.gate_proj = nn.Linear(H, I, bias=False, **factory)
        self.up_proj = nn.Linear(H, I, bias=False, **factory)
        self.down_proj = nn.Linear(I, H, bias=False, **factory)
        conv = (lambda: GroupedConv(H, cfg.conv_kernel_size, cfg.conv_group_size, **factory)) if cfg.dflash2 else None
        self.attention_conv = conv() if conv else None
        self.mlp_conv = conv() if conv else None

    @torch.no_grad()
    def fuse_projections(self) -> None:
        """The q, k, v projections become row views of one [q | k | v] weight, gate and up of one [gate | up]
        weight: one GEMM each at inference. Views, so the parameters (training, saving) and the fused weights stay
        one and the same memory; fused again if something replaced the parameters (e.g. .to())."""
        for name, parts in (("qkv_weight", (self.q_proj, self.k_proj, self.v_proj)),
                            ("gate_up_weight", (self.gate_proj, self.up_proj))):
            fused = self.__dict__.get(name)
            if fused is not None and parts[0].weight.data_ptr() == fused.data_ptr():
                continue
            fused = torch.cat([m.weight.data for m in parts])
            row = 0
            for m in parts:
                n = m.weight.shape[0]
                m.weight.data = fused[row:row + n]
                row += n
            setattr(self, name, fused)

    def query(self, x, cos, sin):
        q = rms_norm(self.q_proj(x).view(-1, self.nh, self.hd), self.q_norm, self.eps)
        return apply_rotary(q, cos, sin)

    def key_value(self, x, cos, sin):
        """k (normed, rotated), v [N, nkv, hd] of hidden rows x (block rows or the fused context)."""
        k = rms_norm(self.k_proj(x).view(-1, self.nkv, self.hd), self.k_norm, self.eps)
        return apply_rotary(k, cos, sin), self.v_proj(x).view(-1, self.nkv, self.hd)

    def attention_input(self, h, block: int):
        """Block rows h [R, H] -> (the attention's input, the kernels its output gets: None without DFlash2)."""
        x = rms_norm(h, self.input_layernorm, self.eps)
        return self.attention_conv.prepare(x, block) if self.attention_conv is not None else (x, None)

    def attention_output(self, h, o, w, block: int):
        """The residual stream after attention: o [R, nh * hd] the heads' output."""
        o = self.o_proj(o)
        return h + (self.attention_conv.finish(o, w, block) if w is not None else o)

    def mlp(self, h, block: int):
        x = rms_norm(h, self.post_attention_layernorm, self.eps)
        if self.mlp_conv is None:
            return h + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        x, w = self.mlp_conv.prepare(x, block)
        return h + self.mlp_conv.finish(self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)), w, block)


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: DFlashConfig, dtype: torch.dtype = torch.float32, device="cpu"):
        super().__init__()
        factory = dict(dtype=dtype, device=device)
        self.cfg = cfg
        H = cfg.hidden_size
        self.fc = nn.Linear(len(cfg.target_layer_ids) * H, H, bias=False, **factory)
        self.hidden_norm = nn.Parameter(torch.ones(H, **factory))
        self.layers = nn.ModuleList(DraftLayer(cfg, **factory) for _ in range(cfg.num_hidden_layers))
        self.norm = nn.Parameter(torch.ones(H, **factory))
        self.selector = (CandidateSelector(H, cfg.vocab_size, cfg.selector_rank, **factory) if cfg.dflash2
                         else None)
        self.register_buffer("inv_freq", inv_frequencies(cfg.head_dim, cfg.rope_theta, device), persistent=False)
        self.scale = cfg.head_dim ** -0.5
        self.k_cache = self.v_cache = torch.empty(0)
        self.glue = DraftGlue()  # inference's element-wise steps (compiled on CUDA by engine/model_runner)

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, folder: str | Path, target: TextConfig, dtype: torch.dtype, device) -> DFlashDrafter:
        from safetensors import safe_open

        cfg = load_dflash_config(folder, target)
        files = sorted(Path(folder).glob("*.safetensors"))
        if not files:
            raise DrafterConfigError(f"drafter {folder}: no *.safetensors weights")
        want = expected_drafter_tensors(cfg)
        got = {}
        for f in files:
            with safe_open(str(f), "pt") as fh:
                for name in fh.keys():
                    got[name.removeprefix("model.")] = fh.get_tensor(name)
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        wrong = [f"{n} {tuple(got[n].shape)} (want {want[n]})" for n in want if n in got and tuple(got[n].shape) != want[n]]
        if missing or extra or wrong:
            raise DrafterConfigError(
                f"drafter {folder}: tensors do not match its config: missing {missing[:4]}, unexpected {extra[:4]}, "
                f"misshaped {wrong[:4]}")
        model = cls(cfg, dtype, device)
        model.load_named(got)
        return model

    @torch.no_grad()
    def init_for_training(self, generator: torch.Generator | None = None) -> None:
        """Qwen3-style start: projections N(0, 1/fan_in), norms 1; DFlash2's convolutions the identity (base tap 0 = 1,
        kernel projections 0) and the selector's codebooks N(0, 0.02)."""
        for name, p in self.hf_named():
            if name.endswith("kernel_projection.weight"):
                p.zero_()
            elif name.endswith("base_kernel"):
                p.zero_()
                p[:, 0] = 1.0
            elif name.endswith("_codebook"):
                p.copy_(0.02 * torch.randn(p.shape, generator=generator).to(p))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=generator).to(p) / p.shape[1] ** 0.5)
            else:
                p.fill_(1.0)

    def load_named(self, tensors: dict[str, torch.Tensor]) -> None:
        params = dict(self.hf_named())
        with torch.no_grad():
            for name, t in tensors.items():
                params[name].copy_(t.to(params[name].dtype))

    def hf_named(self):
        """(HF name, parameter) pairs in the public layout."""
        yield "fc.weight", self.fc.weight
        yield "hidden_norm.weight", self.hidden_norm
        yield "norm.weight", self.norm
        for i, layer in enumerate(self.layers):
            p = f"layers.{i}."
            yield p + "input_layernorm.weight", layer.input_layernorm
            yield p + "post_attention_layernorm.weight", layer.post_attention_layernorm
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                yield p + f"self_attn.{n}.weight", getattr(layer, n).weight
            yield p + "self_attn.q_norm.weight", layer.q_norm
            yield p + "self_attn.k_norm.weight", layer.k_norm
            for n in ("gate_proj", "up_proj", "down_proj"):
                yield p + f"mlp.{n}.weight", getattr(layer, n).weight
            for n in ("attention_conv", "mlp_conv"):
                if (conv := getattr(layer, n)) is not None:
                    yield p + f"{n}.base_kernel", conv.base_kernel
                    yield p + f"{n}.kernel_projection.weight", conv.kernel_projection.weight
        if self.selector is not None:
            yield "candidate_selector.hidden_projection.weight", self.selector.hidden_projection.weight
            yield "candidate_selector.predecessor_codebook", self.selector.predecessor_codebook
            yield "candidate_selector.successor_codebook", self.selector.successor_codebook

    def save_pretrained(self, folder: str | Path, num_target_layers: int | None = None,
                        dtype: torch.dtype | None = None) -> Path:
        """config.json + model.safetensors, the weights in `dtype` (default: as they are)."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(self.cfg.to_json(num_target_layers), indent=2) + "\n")
        save_file({n: p.detach().to(dtype or p.dtype).contiguous().cpu() for n, p in self.hf_named()},
                  str(folder / "model.safetensors"), metadata={"format": "pt"})
        return folder

    # ------------------------------------------------------------------ caches (engine)
    def kv_bytes_per_block(self, block_size: int, dtype: torch.dtype) -> int:
        c = self.cfg
        return 2 * c.num_hidden_layers * block_size * c.num_key_value_heads * c.head_dim * torch.finfo(dtype).bits // 8

    def alloc_kv(self, num_blocks: int, block_size: int) -> None:
        c = self.cfg
        shape = (c.num_hidden_layers, num_blocks, block_size, c.num_key_value_heads, c.head_dim)
        dt, dev = self.fc.weight.dtype, self.fc.weight.device
        self.k_cache = torch.zeros(shape, dtype=dt, device=dev)
        self.v_cache = torch.zeros(shape, dtype=dt, device=dev)

    def new_taps(self) -> dict:
        return dict.fromkeys(self.cfg.target_layer_ids)

    def rotary(self, index: torch.Tensor):
        return rotary(index, self.inv_freq, self.fc.weight)

    def fuse(self, taps: dict, norm=rms_norm) -> torch.Tensor:
        """Tapped target hidden states {layer id: [N, H]} -> the fused context [N, H] (norm: the RMSNorm to use,
        e.g. inference's compiled one)."""
        feats = torch.cat([taps[i] for i in self.cfg.target_layer_ids], dim=-1).to(self.fc.weight.dtype)
        return norm(F.linear(feats, self.fc.weight), self.hidden_norm, self.cfg.rms_norm_eps)

    @torch.no_grad()
    def fuse_projections(self) -> None:
        for layer in self.layers:
            layer.fuse_projections()

    def use_glue(self, glue: DraftGlue) -> None:
        """Inference's element-wise steps from `glue` (the model runner's compiled one on CUDA)."""
        self.glue = glue

    @torch.no_grad()
    def write_context(self, taps: dict, slot_mapping: torch.Tensor, index: torch.Tensor) -> None:
        """Store the context K/V of N target tokens (their taps) at their KV slots (slot < 0: skipped)."""
        self.fuse_projections()
        g, c = self.glue, self.cfg
        ctx = self.fuse(taps, norm=g.norm)
        cos, sin = g.rotary(index, self.inv_freq, ctx)
        for i, layer in enumerate(self.layers):
            kv = F.linear(ctx, layer.qkv_weight[layer.nh * layer.hd:])
            k, v = g.kv_heads(kv, layer.k_norm, cos, sin, c.rms_norm_eps, layer.nkv, layer.hd)
            ops.store_kvcache(k, v, self.k_cache[i], self.v_cache[i], slot_mapping)

    @torch.no_grad()
    def draft_hidden(self, embeds: torch.Tensor, index: torch.Tensor, slot_mapping: torch.Tensor,
                     block_tables: torch.Tensor, context_lens: torch.Tensor, block: int) -> torch.Tensor:
        """Block rows [N, H] (target embeddings of [last, MASK...], N / block blocks of `block` rows) -> final hidden
        [N, H]. Each row's block K/V are stored at its slot first (past the context: a later context write replaces
        them), then every row attends to its first context_lens slots: the context plus its whole block. The same
        math as the training pass's modules, the projections fused and the element-wise steps in self.glue."""
        self.fuse_projections()
        g, eps = self.glue, self.cfg.rms_norm_eps
        h = embeds.to(self.fc.weight.dtype)
        cos, sin = g.rotary(index, self.inv_freq, h)
        delta = None
        for i, layer in enumerate(self.layers):
            if delta is None:
                x = g.norm(h, layer.input_layernorm, eps)
            else:
                h, x = g.add_norm(h, delta, layer.input_layernorm, eps)
            x, w = layer.attention_conv.prepare(x, block) if layer.attention_conv is not None else (x, None)
            q, k, v = g.qkv_heads(F.linear(x, layer.qkv_weight), layer.q_norm, layer.k_norm, cos, sin, eps,
                                  layer.nh, layer.nkv, layer.hd)
            ops.store_kvcache(k, v, self.k_cache[i], self.v_cache[i], slot_mapping)
            o = ops.paged_decode_attention(q, self.k_cache[i], self.v_cache[i], block_tables, context_lens, self.scale,
                                           rows_per_seq=block)
            delta = layer.o_proj(o.reshape(h.shape[0], -1))
            if w is not None:
                delta = layer.attention_conv.finish(delta, w, block)
            h, x = g.add_norm(h, delta, layer.post_attention_layernorm, eps)
            x, w = layer.mlp_conv.prepare(x, block) if layer.mlp_conv is not None else (x, None)
            delta = layer.down_proj(ops.silu_mul(F.linear(x, layer.gate_up_weight)))
            if w is not None:
                delta = layer.mlp_conv.finish(delta, w, block)
        return g.add_norm(h, delta, self.norm, eps)[1]

    def select(self, draft_logits: torch.Tensor, hidden: torch.Tensor, anchors: torch.Tensor, pick=None):
        """DFlash2's drafts for blocks of draft logits [N, P, V] (hidden [N, P, H]): each chosen among its position's
        top-k given the draft before it (`anchors` [N], the verified tokens, first) -> drafts [N, P] (int64). The
        argmax of the selector's scores, or pick(j, candidates [N, k], scores [N, k]) -> [N] indices into the
        candidates (e.g. draws for sampled rows)."""
        N, P, V = draft_logits.shape
        cand_logits, cand = self.unary_logits(draft_logits).topk(min(self.cfg.selector_top_k, V), -1)
        drafts = torch.empty(N, P, dtype=torch.int64, device=draft_logits.device)
        prev = anchors
        for j in range(P):
            scores = self.selector.score(cand[:, j], cand_logits[:, j], hidden[:, j], prev)  # [N, k]
            chosen = scores.argmax(-1) if pick is None else pick(j, cand[:, j], scores)
            prev = drafts[:, j] = cand[:, j].gather(1, chosen[:, None])[:, 0]
        return drafts

    def unary_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The selector's view of the draft logits (fp32): scaled by output_multiplier, soft-capped."""
        x = logits.float()
        if self.cfg.output_multiplier is not None:
            x = x * self.cfg.output_multiplier
        if self.cfg.final_logit_softcapping is not None:
            x = torch.tanh(x / self.cfg.final_logit_softcapping) * self.cfg.final_logit_softcapping
        return x

    # ------------------------------------------------------------------ training (dense, differentiable)
    def train_hidden(self, ctx_taps: dict, block_embeds: torch.Tensor, anchors: torch.Tensor,
                     ctx_seq: torch.Tensor | None = None, ctx_pos: torch.Tensor | None = None,
                     block_seq: torch.Tensor | None = None) -> torch.Tensor:
        """Sequences packed together: taps {layer: [L, H]} of their L tokens (token l is position ctx_pos[l] of
        sequence ctx_seq[l], positions unique within a sequence; default one sequence, positions 0 .. L-1);
        block_embeds [N, B, H] of N blocks [token at anchor, MASK...] of sequence block_seq[n] (default 0); anchors
        [N] (positions). Block n sees its sequence's context before its anchor and its own block (DFlash's training
        mask) -> final hidden [N, B, H].

        Attention is computed per sequence, not over the packed rows: the P sequences' contexts are laid out as
        [P, Lmax] by position and their blocks as [P, A, B] (A: the most blocks of one sequence), each block row
        scoring its sequence's context and its own block in one softmax, so the cost grows with the pages' own
        lengths rather than with the square of everything packed."""
        N, B, H = block_embeds.shape
        L = next(iter(ctx_taps.values())).shape[0]
        dev = block_embeds.device
        ctx_pos = torch.arange(L, device=dev) if ctx_pos is None else ctx_pos
        ctx_seq = torch.zeros(L, dtype=torch.long, device=dev) if ctx_seq is None else ctx_seq
        block_seq = torch.zeros(N, dtype=torch.long, device=dev) if block_seq is None else block_seq
        P = int(max(ctx_seq.max(), block_seq.max())) + 1
        Lmax = int(ctx_pos.max()) + 1
        counts = torch.bincount(block_seq, minlength=P)
        A = int(counts.max())
        order = torch.argsort(block_seq, stable=True)
        rank = torch.empty_like(block_seq)
        rank[order] = torch.arange(N, device=dev) - (torch.cumsum(counts, 0) - counts)[block_seq[order]]
        filled = torch.zeros(P, Lmax, dtype=torch.bool, device=dev)
        filled[ctx_seq, ctx_pos] = True
        anchor_pad = torch.zeros(P, A, dtype=anchors.dtype, device=dev)
        anchor_pad[block_seq, rank] = anchors
        ctx_allow = filled[:, None, :] & (torch.arange(Lmax, device=dev)[None, None, :] < anchor_pad[:, :, None])

        dt = self.fc.weight.dtype
        fused = self.fuse(ctx_taps)
        ctx = fused.new_zeros(P, Lmax, H)
        ctx[ctx_seq, ctx_pos] = fused
        ctx = ctx.view(P * Lmax, H)
        ctx_cos, ctx_sin = self.rotary(torch.arange(Lmax, device=dev).repeat(P))
        h = block_embeds.new_zeros(P, A, B, H, dtype=dt)
        h[block_seq, rank] = block_embeds.to(dt)
        h = h.view(P * A * B, H)
        cos, sin = self.rotary((anchor_pad[:, :, None] + torch.arange(B, device=dev)).reshape(-1))
        nkv, hd = self.cfg.num_key_value_heads, self.cfg.head_dim
        group = self.cfg.num_attention_heads // nkv
        for layer in self.layers:
            x, w = layer.attention_input(h, B)
            q = layer.query(x, cos, sin).view(P, A, B, nkv, group, hd)
            kc, vc = (t.view(P, Lmax, nkv, hd) for t in layer.key_value(ctx, ctx_cos, ctx_sin))
            kb, vb = (t.view(P, A, B, nkv, hd) for t in layer.key_value(x, cos, sin))
            sc = torch.einsum("pabkgd,plkd->pabkgl", q, kc) * self.scale
            sb = torch.einsum("pabkgd,packd->pabkgc", q, kb) * self.scale
            sc = sc.masked_fill(~ctx_allow[:, :, None, None, None, :], float("-inf"))
            prob = torch.softmax(torch.cat([sc, sb], -1).float(), -1).to(q.dtype)
            o = (torch.einsum("pabkgl,plkd->pabkgd", prob[..., :Lmax], vc)
                 + torch.einsum("pabkgc,packd->pabkgd", prob[..., Lmax:], vb))
            h = layer.mlp(layer.attention_output(h, o.reshape(P * A * B, -1), w, B), B)
        return rms_norm(h, self.norm, self.cfg.rms_norm_eps).view(P, A, B, H)[block_seq, rank]

"""Qwen3.5 text decoder on a flat packed batch: Gated DeltaNet layers, gated full-attention layers, SwiGLU MLPs.

Every layer reads the step's StepMetadata; caches (paged KV for attention, per-sequence conv + recurrent state
slots for GDN) are tensors the model runner allocates and each layer binds (`bind_kv_cache`, `bind_state`); how a
step runs (kernels, glue, launches) comes whole from `TextModel.use(DecodePath)`. Projections are fused at load time.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine import ops
from engine.config import TextConfig
from engine.models.gdn_prefill import conv1d_prefill_varlen, delta_rule_prefill
from engine.models.glue import Glue
from engine.models.layers import DecodePath, DecodeProjections, fused_weight, param
from engine.models.quant_linear import wants_fp8_input
from engine.step_metadata import StepMetadata


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + w)."""

    pdl = False  # launched with programmatic dependent launch (DecodePath.pdl)

    def __init__(self, dim: int, eps: float, **factory):
        super().__init__()
        self.eps = eps
        self.weight = param(dim, **factory)

    def use(self, path: DecodePath) -> None:
        self.pdl = path.pdl

    def forward(self, x, residual=None):
        return ops.rmsnorm(x, self.weight, self.eps, residual, pdl=self.pdl)


class MLP(nn.Module):
    def __init__(self, cfg: TextConfig, **factory):
        super().__init__()
        self.gate_up_proj = nn.Module()
        self.gate_up_proj.weight = fused_weight([cfg.intermediate_size] * 2, cfg.hidden_size, **factory)
        self.down_proj = nn.Module()
        self.down_proj.weight = param(cfg.hidden_size, cfg.intermediate_size, **factory)
        self.proj = DecodeProjections()

    def use(self, path: DecodePath) -> None:
        self.proj = path.proj

    def forward(self, x, x_fp8=None, out_dtype=None):
        return self.proj.mlp(x, self.gate_up_proj.weight, self.down_proj.weight, x_fp8, out_dtype)

    def takes_fp8_input(self, rows: int) -> bool:
        """gate_up runs FP8 W8A8 at `rows`: the norm before it may hand over its output quantized (kernels/fp8_quant)."""
        return wants_fp8_input(self.gate_up_proj.weight, rows)


class GatedAttention(nn.Module):
    """Full attention with a per-head output gate: q_proj rows are [q_h | gate_h] per head; q/k RMSNorm; partial
    rotary; GQA; paged KV cache."""

    def __init__(self, cfg: TextConfig, **factory):
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.scale = self.hd**-0.5
        H = cfg.hidden_size
        self.qkv_proj = nn.Module()
        self.qkv_proj.weight = fused_weight([self.nh * self.hd * 2, self.nkv * self.hd, self.nkv * self.hd], H, **factory)
        self.o_proj = nn.Module()
        self.o_proj.weight = param(H, self.nh * self.hd, **factory)
        self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps, **factory)
        self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps, **factory)
        self.k_cache = self.v_cache = torch.empty(0)
        self.kv_scales = None  # an FP8 cache's (k_scale, v_scale) rows (kernels/paged_attention)
        self.glue = Glue()
        self.proj = DecodeProjections()

    fused_inputs = False  # decode: one kernel for q/k norm + rotary + KV store (DecodePath.fused_attention_decode)
    pdl = False  # decode kernels launched with programmatic dependent launch (DecodePath.pdl)

    def use(self, path: DecodePath) -> None:
        self.glue, self.proj, self.pdl = path.glue, path.proj, path.pdl
        self.fused_inputs = path.fused_attention_decode

    def bind_kv_cache(self, k_cache: torch.Tensor, v_cache: torch.Tensor, scales=None) -> None:
        """This layer's [blocks, block_size, kv heads, head_dim] K and V pages (views of the runner's cache), and an
        FP8 cache's (k_scale, v_scale) rows; empty tensors unbind them."""
        self.k_cache, self.v_cache, self.kv_scales = k_cache, v_cache, scales

    def forward(self, x, meta: StepMetadata, cos, sin):
        if self.fused_inputs and not meta.is_prefill:
            return self._decode_fused_inputs(x, meta, cos, sin)
        q, k, v, gate = self.glue.attention_inputs(self.proj.linear(x, self.qkv_proj.weight), self.q_norm.weight,
                                                   self.k_norm.weight, cos, sin, self.q_norm.eps, self.nh, self.nkv,
                                                   self.hd)
        ops.store_kvcache(k, v, self.k_cache, self.v_cache, meta.slot_mapping, scales=self.kv_scales)
        if meta.is_prefill:
            o = self._prefill_attention(q, meta)
        else:
            o = ops.paged_decode_attention(q, self.k_cache, self.v_cache, meta.block_tables, meta.context_lens,
                                           self.scale, pdl=self.pdl, rows_per_seq=meta.verify_len or 1,
                                           scales=self.kv_scales)
        return self.proj.linear(self.glue.gated_output(o, gate), self.o_proj.weight)

    def _decode_fused_inputs(self, x, meta: StepMetadata, cos, sin):
        qkv = self.proj.linear(x, self.qkv_proj.weight)
        q = ops.fused_attn_decode_inputs(qkv, self.q_norm.weight, self.k_norm.weight, cos, sin, self.q_norm.eps,
                                         self.nh, self.nkv, self.hd, self.k_cache, self.v_cache, meta.slot_mapping,
                                         scales=self.kv_scales, pdl=self.pdl)
        o = ops.paged_decode_attention(q, self.k_cache, self.v_cache, meta.block_tables, meta.context_lens, self.scale,
                                       pdl=self.pdl, rows_per_seq=meta.verify_len or 1, scales=self.kv_scales)
        gate = qkv[:, :self.nh * 2 * self.hd].view(-1, self.nh, 2 * self.hd)[..., self.hd:]  # a view, no copy
        return self.proj.linear(self.glue.gated_output(o, gate).reshape(qkv.shape[0], -1), self.o_proj.weight)

    def _prefill_attention(self, q, meta: StepMetadata):
        """Each sequence's chunk attends causally to its whole cached context (earlier chunks + itself)."""
        k_all = self.k_cache.view(-1, self.nkv, self.hd)[meta.kv_gather_slots]
        v_all = self.v_cache.view(-1, self.nkv, self.hd)[meta.kv_gather_slots]
        if self.kv_scales is not None:  # FP8 rows back to the model's dtype for SDPA
            k_all, v_all = (ops.dequantize_kv_ref(c, s.view(-1, self.nkv)[meta.kv_gather_slots], q.dtype)
                            for c, s in ((k_all, self.kv_scales[0]), (v_all, self.kv_scales[1])))
        outs, qs, ks = [], 0, 0
        for n, kv in zip(meta.query_lens, meta.kv_lens):
            qi = q[qs:qs + n].transpose(0, 1)[None]  # [1, heads, n, D]: 4-D so fused SDPA kernels apply
            ki, vi = k_all[ks:ks + kv].transpose(0, 1)[None], v_all[ks:ks + kv].transpose(0, 1)[None]
            if kv == n:
                o = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=self.scale, enable_gqa=True)
            else:  # query i sits at absolute position kv - n + i
                mask = torch.ones(n, kv, dtype=torch.bool, device=q.device).tril(kv - n)
                o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=self.scale, enable_gqa=True)
            outs.append(o[0].transpose(0, 1))
            qs += n
            ks += kv
        return torch.cat(outs, 0)


class GatedDeltaNet(nn.Module):
    """Linear-attention mixer: one fused in_proj (qkv | z | b | a), causal depthwise conv + SiLU over qkv, gated delta
    rule with per-value-head decay exp(g) and write strength beta, gated RMSNorm, out_proj."""

    def __init__(self, cfg: TextConfig, **factory):
        super().__init__()
        self.hk, self.hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_dim, self.value_dim, self.conv_dim = cfg.gdn_key_dim, cfg.gdn_value_dim, cfg.gdn_conv_dim
        self.eps = cfg.rms_norm_eps
        H = cfg.hidden_size
        self.in_proj = nn.Module()  # [qkv | z | b | a] fused
        self.in_proj.weight = fused_weight([self.conv_dim, self.value_dim, self.hv, self.hv], H, **factory)
        self.conv1d = nn.Module()
        self.conv1d.weight = param(self.conv_dim, cfg.linear_conv_kernel_dim, **factory)
        fp32 = dict(factory, dtype=torch.float32)  # decay parameters stay fp32
        self.dt_bias = param(self.hv, **fp32)
        self.A_log = param(self.hv, **fp32)
        self.norm = nn.Module()
        self.norm.weight = param(self.dv, **factory)
        self.out_proj = nn.Module()
        self.out_proj.weight = param(H, self.value_dim, **factory)
        self.conv_state = self.ssm_state = torch.empty(0)
        self.glue = Glue()
        self.proj = DecodeProjections()
        # speculative verify (engine/speculative.SpecDecoder): the block's conv inputs [max seqs, T, conv_dim], and
        # this layer's ring of pending updates with its write-back threshold (engine/gdn_ring.GdnRing)
        self.kept_x = None
        self.ring = None
        self.fold_after = 0

    pdl = False  # decode kernels launched with programmatic dependent launch (DecodePath.pdl)

    def use(self, path: DecodePath) -> None:
        self.glue, self.proj, self.pdl = path.glue, path.proj, path.pdl

    def bind_state(self, conv_state: torch.Tensor, ssm_state: torch.Tensor) -> None:
        """This layer's state slots (views of the runner's pools): conv [slots, conv_dim, kernel - 1] and recurrent
        [slots, value heads, key dim, value dim]."""
        self.conv_state, self.ssm_state = conv_state, ssm_state

    def bind_verify(self, kept_x: torch.Tensor, ring, fold_after: int) -> None:
        """What a speculative verify writes besides the state: the block's conv inputs [max seqs, T, conv_dim] for
        the commit, and this layer's ring of pending updates with its write-back threshold (engine/gdn_ring)."""
        self.kept_x, self.ring, self.fold_after = kept_x, ring, fold_after

    def forward(self, x, meta: StepMetadata, cos=None, sin=None):
        projected = self.proj.linear(x, self.in_proj.weight)
        N = projected.shape[0]
        qkv, z, ba = projected.split([self.conv_dim, self.value_dim, 2 * self.hv], dim=-1)
        if meta.verify_len:
            o = self._verify(qkv, ba, meta)
            o = ops.gated_rmsnorm(o, z.reshape(N, self.hv, self.dv), self.norm.weight, self.eps)
            return self.proj.linear(o.reshape(N, self.value_dim), self.out_proj.weight)
        if meta.is_prefill:
            g, beta = self.glue.gdn_gates(ba, self.A_log, self.dt_bias)
            y = conv1d_prefill_varlen(qkv, self.conv1d.weight, self.conv_state, meta.state_slots, meta.query_lens)
        else:
            y = ops.causal_conv1d_update(qkv, self.conv_state, self.conv1d.weight, meta.state_idx, "silu", pdl=self.pdl)
        q, k, v = y.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(N, self.hk, self.dk)
        k = k.reshape(N, self.hk, self.dk)
        v = v.reshape(N, self.hv, self.dv)
        if meta.is_prefill:
            o = delta_rule_prefill(q, k, v, g, beta, self.ssm_state, meta)
        else:
            # the gates are computed inside the recurrent kernel from the raw [b | a] projections
            o = ops.gdn_recurrent(q[:, None], k[:, None], v[:, None], ba[:, None, self.hv:], ba[:, None, :self.hv],
                                  self.ssm_state, meta.state_idx, raw_gates=(self.A_log, self.dt_bias),
                                  pdl=self.pdl)[:, 0]
        o = ops.gated_rmsnorm(o, z.reshape(N, self.hv, self.dv), self.norm.weight, self.eps, pdl=self.pdl)
        return self.proj.linear(o.reshape(N, self.value_dim), self.out_proj.weight)


    def _verify(self, qkv, ba, meta: StepMetadata):
        """A block of T tokens per sequence against the conv state and the recurrent state with its pending tokens
        (kernels/gdn_verify); the block's conv inputs go to self.kept_x for the commit, its updates to the ring."""
        T = meta.verify_len
        S = qkv.shape[0] // T
        x = qkv.view(S, T, self.conv_dim)
        y = ops.causal_conv1d_verify(x, self.conv_state, self.conv1d.weight, meta.state_idx, keep=self.kept_x[:S, :T])
        q, k, v = y.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        ba = ba.view(S, T, 2 * self.hv)
        o = ops.gdn_verify(q.reshape(S, T, self.hk, self.dk), k.reshape(S, T, self.hk, self.dk),
                           v.reshape(S, T, self.hv, self.dv), ba[..., self.hv:], ba[..., :self.hv], self.ssm_state,
                           meta.state_idx, self.ring, self.fold_after, raw_gates=(self.A_log, self.dt_bias))
        return o.view(S * T, self.hv, self.dv)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TextConfig, kind: str, **factory):
        super().__init__()
        self.kind = kind
        if kind == "full_attention":
            self.self_attn = GatedAttention(cfg, **factory)
        else:
            self.linear_attn = GatedDeltaNet(cfg, **factory)
        self.mlp = MLP(cfg, **factory)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **factory)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **factory)

    @property
    def mixer(self) -> nn.Module:
        return self.self_attn if self.kind == "full_attention" else self.linear_attn

    def forward(self, x, residual, meta, cos, sin):
        if residual is None:
            residual = x
            h = self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm(x, residual)
        h = self.mixer(h, meta, cos, sin)
        if self.mlp.takes_fp8_input(h.shape[0]):  # RMSNorm + residual add + per-token FP8 quantization in one kernel
            norm = self.post_attention_layernorm
            q, scale, residual = ops.rmsnorm_quant_fp8(h, norm.weight, norm.eps, residual)
            return self.mlp(None, (q, scale), h.dtype), residual
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class TextModel(nn.Module):
    def __init__(self, cfg: TextConfig, dtype: torch.dtype, device):
        super().__init__()
        factory = dict(dtype=dtype, device=device)
        self.cfg = cfg
        self.embed_tokens = nn.Module()
        self.embed_tokens.weight = param(cfg.vocab_size, cfg.hidden_size, **factory)
        self.layers = nn.ModuleList(DecoderLayer(cfg, kind, **factory) for kind in cfg.layer_types)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **factory)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.embed_tokens.weight)

    def use(self, path: DecodePath) -> None:
        """Every norm, mixer and MLP runs its steps the way `path` says (each takes its own parts of it)."""
        for m in self.modules():
            if isinstance(m, (RMSNorm, MLP, GatedAttention, GatedDeltaNet)):
                m.use(path)

    def forward(self, x: torch.Tensor, meta: StepMetadata, cos, sin, taps: dict | None = None,
                num_layers: int | None = None) -> torch.Tensor | None:
        """taps: {layer id: None} to fill with those layers' output hidden states (a drafter's context).
        num_layers: run only the first num_layers layers and return None (no final norm): a caller that wants only
        taps skips the layers after the last one it taps (their caches are then left unwritten)."""
        residual = None
        for i, layer in enumerate(self.layers if num_layers is None else self.layers[:num_layers]):
            x, residual = layer(x, residual, meta, cos, sin)
            if taps is not None and i in taps:
                taps[i] = x + residual
        if num_layers is not None:
            return None
        x, _ = self.norm(x, residual)
        return x

"""ModelRunner: owns the model weights, the caches and the forward passes.

Prefill steps run eagerly on a packed batch of chunks. Decode steps run from static input buffers and, on CUDA,
replay a CUDA graph captured for the next padded batch size.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from engine import ops
from engine.config import ModelConfig
from engine.gdn_ring import GdnRing
from engine.models.glue import Glue
from engine.models.layers import DecodePath, DecodeProjections
from engine.models.qwen3_5 import Qwen3_5Model
from engine.options import RunnerConfig
from engine.step_metadata import DecodeInputs, PrefillChunk, build_prefill_metadata, to_device

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} unsupported; use one of auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def graph_batch_sizes(max_batch: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, 65, 16)) + list(range(96, 513, 32))
    return [s for s in sizes if s < max_batch] + [max_batch]


@dataclass
class CacheConfig:
    block_size: int
    num_blocks: int
    max_num_seqs: int  # GDN state slots
    max_model_len: int

    @property
    def max_blocks_per_seq(self) -> int:
        return math.ceil(self.max_model_len / self.block_size)


class ModelRunner:
    def __init__(self, model: Qwen3_5Model, cfg: ModelConfig, config: RunnerConfig, drafter=None):
        """config: the engine's options resolved for the device (engine/options.py); drafter: a speculative
        DFlashDrafter (engine/models/dflash.py), whose context KV shares the target's block tables and is written by
        every target forward from the tapped hidden states."""
        self.model, self.cfg, self.config, self.drafter = model, cfg, config, drafter
        self.device, self.dtype = config.device, config.dtype
        # the attention KV cache's dtype: the model's, or FP8 E4M3 rows with a scale each (kernels/paged_attention)
        self.kv_dtype = config.kv_dtype
        tuning, device = config.tuning, config.device
        compiled = config.compile_glue and device.type == "cuda"
        model.use(DecodePath(
            proj=DecodeProjections.for_model(self._projection_weights(), tuning.pdl, tuning.swiglu_epilogue)
            if tuning.gemv else DecodeProjections(),
            glue=self._compiled_glue() if compiled else Glue(), pdl=tuning.pdl,
            fused_attention_decode=tuning.fused_attention_decode))
        if compiled and drafter is not None:
            drafter.use_glue(self._compiled_draft_glue())
        t = cfg.text
        self.attn_layers = [model.language_model.layers[i].self_attn for i in t.full_attention_layers]
        self.gdn_layers = [model.language_model.layers[i].linear_attn for i in t.linear_attention_layers]
        self.block_size = config.block_size
        self.max_num_batched_tokens = config.max_num_batched_tokens
        max_num_seqs = config.max_num_seqs
        # with a drafter, one state slot past max_num_seqs: the padding rows of captured speculative steps write
        # there (engine/spec_graphs)
        self.scratch_slot = max_num_seqs if drafter is not None else None
        slots = max_num_seqs + (drafter is not None)
        self._alloc_states(slots, config.state_dtype)
        # speculative steps' pending GDN updates (engine/gdn_ring.GdnRing); allocated before the KV cache takes what
        # memory is left
        self.gdn_ring = GdnRing(self, config.verify_len, tuning.spec_fold_after) if drafter is not None else None
        num_blocks = config.num_blocks
        if num_blocks is None:
            num_blocks = self._blocks_from_budget(max_num_seqs, config.max_model_len, config.kv_cache_memory_gb,
                                                  config.gpu_memory_utilization)
        self.cache = CacheConfig(self.block_size, num_blocks, max_num_seqs, config.max_model_len)
        self._alloc_kv(num_blocks)
        self.decode_inputs = DecodeInputs(max_num_seqs, self.cache.max_blocks_per_seq, device)
        # The last sampled token of every state slot: decode steps read their input ids from here on the device,
        # so the host can launch step t + 1 before it has seen step t's tokens.
        self.next_tokens = torch.zeros(slots, dtype=torch.int64, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.graph_logits: dict[int, torch.Tensor] = {}
        self.decode_sizes: list[int] = []  # decode batches are padded up to one of these (the captured sizes)
        if config.cuda_graphs and device.type == "cuda":
            try:
                self.capture_decode_graphs()
            except Exception as e:  # noqa: BLE001  (run eagerly rather than not at all; say so loudly)
                warnings.warn(f"CUDA graph capture failed, decode runs eagerly: {e!r}")
                self.graphs.clear()
                self.graph_logits.clear()
                self.decode_sizes = []
                torch.cuda.synchronize(device)

    @torch.no_grad()  # as in the forward passes: grad mode is part of the compiled code's guards
    def _checked(self, eager, compiled, calls, what: str):
        """`compiled` if each of its functions matches `eager`'s on calls(n, rand) -> [(name, args)] for n = 1 and 5
        rows (size 1 is specialised by the compiler; 5 compiles the dynamic-size kernels), else `eager`, loudly."""
        gen = torch.Generator(device=self.device).manual_seed(0)

        def rand(*shape, dtype=self.dtype):
            return torch.randn(*shape, generator=gen, device=self.device, dtype=torch.float32).to(dtype)

        try:
            for n in (1, 5):
                for name, args in calls(n, rand):
                    got, want = getattr(compiled, name)(*args), getattr(eager, name)(*args)
                    for x, y in zip(got if isinstance(got, tuple) else (got,),
                                    want if isinstance(want, tuple) else (want,)):
                        torch.testing.assert_close(x.float(), y.float(), atol=2e-2, rtol=2e-2)
        except Exception as e:  # noqa: BLE001  (compiler unavailable or wrong: fall back, loudly)
            warnings.warn(f"torch.compile of {what} failed, running them eagerly: {e!r}")
            return eager
        return compiled

    def _compiled_glue(self, backend: str = "inductor") -> Glue:
        """torch.compile'd glue, checked against the eager functions on small inputs; eager if either fails."""
        t, eager = self.cfg.text, Glue(False)

        def calls(n, rand):
            qkv = rand(n, (2 * t.num_attention_heads + 2 * t.num_key_value_heads) * t.head_dim)
            args = (qkv, rand(t.head_dim) * 0.1, rand(t.head_dim) * 0.1, rand(n, t.rotary_dim), rand(n, t.rotary_dim),
                    t.rms_norm_eps, t.num_attention_heads, t.num_key_value_heads, t.head_dim)
            q, _, _, gate = eager.attention_inputs(*args)
            return [("attention_inputs", args), ("gated_output", (q, gate)),
                    ("gdn_gates", (rand(n, 2 * t.linear_num_value_heads),
                                   rand(t.linear_num_value_heads, dtype=torch.float32),
                                   rand(t.linear_num_value_heads, dtype=torch.float32)))]
        return self._checked(eager, Glue(True, backend), calls, "the glue ops")

    def _compiled_draft_glue(self, backend: str = "inductor"):
        """The drafter's glue torch.compile'd, checked against the eager functions on small inputs; eager if it
        fails (engine/models/dflash_glue.py)."""
        from engine.models.dflash_glue import DraftGlue

        c, dt = self.drafter.cfg, self.drafter.fc.weight.dtype
        H, nh, nkv, hd, eps = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rms_norm_eps

        def calls(n, rand):
            cos, sin = rand(n, hd, dtype=dt), rand(n, hd, dtype=dt)
            return [("norm", (rand(n, H, dtype=dt), rand(H, dtype=dt), eps)),
                    ("add_norm", (rand(n, H, dtype=dt), rand(n, H, dtype=dt), rand(H, dtype=dt), eps)),
                    ("qkv_heads", (rand(n, (nh + 2 * nkv) * hd, dtype=dt), rand(hd, dtype=dt), rand(hd, dtype=dt),
                                   cos, sin, eps, nh, nkv, hd)),
                    ("kv_heads", (rand(n, 2 * nkv * hd, dtype=dt), rand(hd, dtype=dt), cos, sin, eps, nkv, hd)),
                    ("rotary", (torch.arange(n, device=self.device) + 7, self.drafter.inv_freq, rand(1, dtype=dt)))]
        return self._checked(DraftGlue(False), DraftGlue(True, backend), calls, "the drafter's glue")

    def _projection_weights(self) -> list[torch.Tensor]:
        """Every weight a decode step multiplies by (the split-K workspace is sized from them)."""
        names = ("gate_up_proj", "down_proj", "qkv_proj", "o_proj", "in_proj", "out_proj")
        return [m.weight for n, m in self.model.language_model.named_modules() if n.rsplit(".", 1)[-1] in names] + \
            [self.model.head_weight]

    # ------------------------------------------------------------------ caches
    @property
    def kv_fp8(self) -> bool:
        return self.kv_dtype == ops.KV_FP8

    def kv_bytes_per_block(self) -> int:
        t = self.cfg.text
        elt = torch.finfo(self.kv_dtype).bits // 8 + (4 / t.head_dim if self.kv_fp8 else 0)  # + an fp32 scale a row
        drafter = self.drafter.kv_bytes_per_block(self.block_size, self.dtype) if self.drafter is not None else 0
        return int(2 * len(self.attn_layers) * self.block_size * t.num_key_value_heads * t.head_dim * elt) + drafter

    def _alloc_states(self, slots: int, state_dtype: torch.dtype) -> None:
        t = self.cfg.text
        n = len(self.gdn_layers)
        self.conv_state = torch.zeros(n, slots, t.gdn_conv_dim, t.linear_conv_kernel_dim - 1, dtype=self.dtype,
                                      device=self.device)
        self.ssm_state = torch.zeros(n, slots, t.linear_num_value_heads, t.linear_key_head_dim,
                                     t.linear_value_head_dim, dtype=state_dtype, device=self.device)
        for i, layer in enumerate(self.gdn_layers):
            layer.bind_state(self.conv_state[i], self.ssm_state[i])

    def _alloc_kv(self, num_blocks: int) -> None:
        t = self.cfg.text
        shape = (len(self.attn_layers), num_blocks, self.block_size, t.num_key_value_heads, t.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.kv_dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.kv_dtype, device=self.device)
        self.kv_scales = [torch.ones(shape[:4], dtype=torch.float32, device=self.device) for _ in range(2)] \
            if self.kv_fp8 else None
        for i, layer in enumerate(self.attn_layers):
            layer.bind_kv_cache(self.k_cache[i], self.v_cache[i],
                                (self.kv_scales[0][i], self.kv_scales[1][i]) if self.kv_fp8 else None)
        if self.drafter is not None:
            self.drafter.alloc_kv(num_blocks, self.block_size)

    @torch.no_grad()
    def copy_caches(self, src_slots: torch.Tensor, dst_slots: torch.Tensor, src_blocks: torch.Tensor,
                    dst_blocks: torch.Tensor) -> None:
        """GDN state rows src_slots -> dst_slots and KV blocks src_blocks -> dst_blocks (device index tensors; a
        source may also be a destination: everything is read before anything is written)."""
        kv = [self.k_cache, self.v_cache] + (self.kv_scales if self.kv_fp8 else [])
        for cache, src, dst in [(self.conv_state, src_slots, dst_slots), (self.ssm_state, src_slots, dst_slots)] + \
                [(c.view(torch.uint8) if c.dtype == ops.KV_FP8 else c, src_blocks, dst_blocks) for c in kv]:
            ops.copy_rows(cache, src, dst)  # on the GPU, rows whose source is themselves are not moved
        if self.gdn_ring is not None:  # beams never speculate: a copy carries the source's empty ring
            self.gdn_ring.pos[dst_slots] = self.gdn_ring.pos[src_slots]

    def _blocks_from_budget(self, max_num_seqs, max_model_len, kv_gb, utilization) -> int:
        """KV blocks that fit the budget, capped at what max_num_seqs full-length sequences could ever use."""
        useful = max_num_seqs * math.ceil(max_model_len / self.block_size) + 1
        per_block = self.kv_bytes_per_block()
        if kv_gb is not None:
            budget = int(kv_gb * 2**30)
        elif self.device.type == "cuda":
            budget = self._profile_free_cuda_memory(utilization)
        else:
            budget = 1 * 2**30
        n = min(useful, budget // per_block)
        if n < 2:
            raise RuntimeError(f"KV cache budget {budget / 2**20:.1f} MiB holds fewer than 2 blocks of "
                               f"{per_block / 2**20:.2f} MiB; lower max_num_seqs or raise the memory budget")
        return n

    def _profile_free_cuda_memory(self, utilization: float) -> int:
        """Run the largest prefill once with a throwaway cache; what is left under `utilization` goes to KV."""
        T = self.max_num_batched_tokens
        self._alloc_kv(math.ceil(T / self.block_size) + 1)
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        chunk = PrefillChunk(token_ids=[0] * T, positions=_text_positions(0, T), start=0,
                             block_table=list(range(math.ceil(T / self.block_size))), state_slot=0)
        self.run_prefill([chunk], logits_rows=[T - 1])
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        kv_tmp = sum(c.numel() * c.element_size() for c in [self.k_cache, self.v_cache] + (self.kv_scales or []))
        del self.k_cache, self.v_cache
        self.kv_scales = None
        for layer in self.attn_layers:
            layer.bind_kv_cache(torch.empty(0), torch.empty(0))
        self.conv_state.zero_()
        self.ssm_state.zero_()
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(self.device).total_memory
        return max(0, int(total * utilization) - (peak - kv_tmp))

    # ------------------------------------------------------------------ forward passes
    def _prefill_inputs(self, chunks: list[PrefillChunk], start_event=None):
        """A packed prefill step's metadata and input embeddings [N, H]; the chunks' GDN state made ready (zeroed
        for sequences starting now, pending speculative updates folded or dropped)."""
        meta = build_prefill_metadata(chunks, self.block_size, self.device)
        if start_event is not None:
            start_event.record()
        if self.gdn_ring is not None:  # what a speculative step left pending: dropped for new sequences
            self.gdn_ring.forget(c.state_slot for c in chunks if c.start == 0)
            self.gdn_ring.fold(c.state_slot for c in chunks if c.start > 0)
        if meta.fresh_state_idx is not None:  # sequences starting now begin from zero GDN state
            self.conv_state[:, meta.fresh_state_idx] = 0
            self.ssm_state[:, meta.fresh_state_idx] = 0
        ids = to_device([t for c in chunks for t in c.token_ids], torch.int64, self.device)
        x = self.model.embed(ids)
        row = 0
        for c in chunks:
            for off, rows in (c.embed_overrides or ()):
                x[row + off: row + off + rows.shape[0]] = rows.to(x.dtype)
            row += len(c.token_ids)
        return meta, x

    @torch.no_grad()
    def run_prefill_taps(self, chunks: list[PrefillChunk], layer_ids, final: bool = False):
        """Packed prefill of `chunks` keeping the output hidden states of the layers `layer_ids` (the drafter's slot,
        if any, is left alone) -> ({layer id: [N, H]} over the flat token rows, the final normed hidden states
        [N, H] if `final` else None). Without `final` the forward stops after the last tapped layer: the layers after
        it are not run and their caches stay unwritten (engine/taps.py: the chunks' sequences are dropped after)."""
        meta, x = self._prefill_inputs(chunks)
        taps = dict.fromkeys(layer_ids)
        hidden = self.model(x, meta, taps, None if final else max(layer_ids) + 1)
        return taps, hidden

    @torch.no_grad()
    def run_prefill(self, chunks: list[PrefillChunk], logits_rows: list[int], start_event=None) -> torch.Tensor:
        """Packed prefill of `chunks`; returns logits [len(logits_rows), V] (fp32) for those flat token rows.
        start_event (CUDA) is recorded once the inputs are queued, just before the forward pass."""
        meta, x = self._prefill_inputs(chunks, start_event)
        taps = self.drafter.new_taps() if self.drafter is not None else None
        hidden = self.model(x, meta, taps)
        if taps is not None:
            index = np.concatenate([np.arange(c.start, c.start + len(c.token_ids)) for c in chunks])
            self.drafter.write_context(taps, meta.slot_mapping, to_device(index, torch.int64, self.device))
        idx = to_device(logits_rows, torch.int64, self.device)
        return self.model.compute_logits(hidden[idx]).float()

    def _decode_forward(self, padded: int) -> torch.Tensor:
        meta = self.decode_inputs.metadata(padded)
        x = self.model.embed(self.next_tokens[meta.state_idx.clamp(min=0)])
        taps = self.drafter.new_taps() if self.drafter is not None else None
        hidden = self.model(x, meta, taps)
        if taps is not None:  # each row's token sits at index context_len - 1
            self.drafter.write_context(taps, meta.slot_mapping, meta.context_lens.long() - 1)
        return self.model.compute_logits(hidden)

    @torch.no_grad()
    def run_decode(self, positions, slot_mapping, state_idx, context_lens, block_tables,
                   start_event=None, row_owners=None) -> torch.Tensor:
        """One token (the slot's last sampled one, from self.next_tokens) for each of B sequences -> logits [B, V]
        (fp32). Nothing here waits for the device. start_event (CUDA) is recorded just before the forward pass."""
        B = len(positions)
        if self.gdn_ring is not None:  # speculative steps' pending GDN updates go into the states first
            self.gdn_ring.fold(state_idx)
        padded = next((s for s in self.decode_sizes if s >= B), B)
        self.decode_inputs.fill(positions, slot_mapping, state_idx, context_lens, block_tables, padded, row_owners)
        if start_event is not None:
            start_event.record()
        if padded in self.graphs:
            self.graphs[padded].replay()
            logits = self.graph_logits[padded]
        else:
            logits = self._decode_forward(padded)
        return logits[:B].float()

    @torch.no_grad()
    def capture_decode_graphs(self) -> None:
        sizes = graph_batch_sizes(self.cache.max_num_seqs)
        self.decode_sizes = sizes
        pool = None
        for bs in reversed(sizes):
            # padding rows everywhere: kernels skip them, so capture touches no cache or state
            self.decode_inputs.fill([], [], [], [], [], bs)
            self._decode_forward(bs)  # warm up / compile Triton kernels outside capture
            torch.cuda.synchronize(self.device)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                self.graph_logits[bs] = self._decode_forward(bs)
            pool = g.pool() if pool is None else pool
            self.graphs[bs] = g
        torch.cuda.synchronize(self.device)


def _text_positions(start: int, n: int) -> np.ndarray:
    return np.broadcast_to(np.arange(start, start + n), (3, n)).copy()

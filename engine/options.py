"""What an engine is built with, one object per concern, each handed down whole.

  * EngineOptions: what a user sets (vLLM / nano-vllm names): batch and cache sizes, memory, precisions of the
    caches, and speculation as one SpeculativeConfig. Checked before anything loads (and by the job before Ray
    starts, engine/backends).
  * DecodeTuning: how the decode path runs (kernel choices and internal constants, each on where it measured faster:
    docs/decisions.md). Not a user option: the engine uses DEFAULT_TUNING; benchmarks and tests may pass another.
  * RunnerConfig: both resolved for one device (defaults filled in, PDL only where the GPU has it): what
    engine.model_runner.ModelRunner takes.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields

import torch

STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
KV_DTYPES = {"auto": None, "fp8": torch.float8_e4m3fn}


def _check_ints(obj, specs) -> None:
    """specs: (field, least value, whether None is allowed, what it means)."""
    for name, least, optional, meaning in specs:
        value = getattr(obj, name)
        if value is None and optional:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name}={value!r}: give an integer >= {least} ({meaning})")


@dataclass(frozen=True)
class DecodeTuning:
    fused_attention_decode: bool = True  # q/k norm + rotary + KV store in one launch (kernels/fused_attn_decode)
    gemv: bool = True  # projections of <= 16 rows through kernels/small_m_linear instead of cuBLAS
    pdl: bool = True  # programmatic dependent launch where the GPU has it (sm_90+)
    swiglu_epilogue: bool = True  # the gate_up GEMV applies SwiGLU to its own output: no SwiGLU kernel
    # accepted tokens whose GDN updates stay pending (engine/gdn_ring) before a verify writes the state back; 0:
    # written back at every verify that has any
    spec_fold_after: int = 0
    # new prompts start only when this many can start together (or all that wait) while others decode: fewer, larger
    # prefill steps where each step's host cost is fixed (eager drafter collection); 1: as soon as a seat is free
    prefill_min_seqs: int = 1

    def check(self) -> None:
        _check_ints(self, (
            ("spec_fold_after", 0, False, "0: the state is written back at every verify that has pending updates"),
            ("prefill_min_seqs", 1, False, "1: a prompt starts as soon as a seat is free")))


DEFAULT_TUNING = DecodeTuning()


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (docs/speculative-decoding.md). A verify step takes num_speculative_tokens + 1 tokens per
    sequence (its verify_len, the name the engine uses down to the kernels).

    max_batch: the largest decode batch that speculates (None: any); a larger one decodes plainly, one step ahead of
    the device (a verify pass multiplies the batch's rows by verify_len, which stops paying once the GEMMs are
    compute-bound). 64: at the 4B shape with the shipped drafter's acceptance (tau ~3.1-3.3, 7 drafts) speculation
    gave 1.19x plain tok/s at batch 64 and 0.99x at 128 (bench/results/h200_spec_decode.json); a drafter with a
    higher tau pays at larger batches (tau ~5.6: 1.53x at 128)."""
    drafter: str | None = None  # a DFlash drafter folder (engine/models/dflash.py); None or "none": off
    num_speculative_tokens: int | None = None  # drafts per verify step (None: the drafter's block_size - 1)
    max_batch: int | None = 64

    @classmethod
    def of(cls, value) -> SpeculativeConfig | None:
        """From a config mapping (YAML, keyword arguments); ValueError naming a key it does not have, with the
        nearest one it does."""
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"speculative={value!r}: give a mapping of {', '.join(f.name for f in fields(cls))}")
        names = [f.name for f in fields(cls)]
        for key in value:
            if key not in names:
                close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
                raise ValueError(f"speculative.{key} is not a speculation option"
                                 + (f" (did you mean {close[0]}?)" if close else f" (give {', '.join(names)})"))
        return cls(**value)

    @property
    def on(self) -> bool:
        return self.drafter not in (None, "", "none")

    def check(self) -> None:
        try:
            _check_ints(self, (
                ("num_speculative_tokens", 1, True, "a verify step needs >= 1 draft (None: the drafter's)"),
                ("max_batch", 1, True, "None: every batch speculates")))
        except ValueError as e:
            raise ValueError(f"speculative.{e}") from None


@dataclass(frozen=True)
class EngineOptions:
    max_num_seqs: int = 64
    max_model_len: int | None = None  # default engine.config.default_max_model_len
    max_num_batched_tokens: int | None = None  # default 8192 on CUDA, 2048 on CPU
    block_size: int = 32
    num_blocks: int | None = None  # default: sized from the memory budget
    kv_cache_memory_gb: float | None = None
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False  # no CUDA graphs
    compile: bool = True  # torch.compile the element-wise glue ops (CUDA only)
    text_only: bool = False
    # the GDN recurrent state pool (50 MB a sequence at the 4B shape in fp32, read and written by every decode step);
    # "bfloat16" halves that traffic and memory, the state stepped in fp32 and rounded once a step
    gdn_state_dtype: str = "float32"
    # the attention KV cache: "auto" (the model's dtype) or "fp8" (E4M3 rows, a scale per token and kv head: half
    # the KV bytes a decode step reads and the cache's memory)
    kv_cache_dtype: str = "auto"
    # speculative decoding (a SpeculativeConfig, or its mapping): None, or one without a drafter, is off
    speculative: SpeculativeConfig | None = None

    def __post_init__(self):
        object.__setattr__(self, "speculative", SpeculativeConfig.of(self.speculative))

    def check(self) -> None:
        """ValueError naming an option whose value no engine can take: the engine checks before it loads anything,
        the job (engine/backends.check_options) before Ray starts."""
        if self.speculative is not None:
            self.speculative.check()
        if self.gdn_state_dtype not in STATE_DTYPES:
            raise ValueError(f"gdn_state_dtype={self.gdn_state_dtype!r}: give one of {', '.join(STATE_DTYPES)}")
        if self.kv_cache_dtype not in KV_DTYPES:
            raise ValueError(f"kv_cache_dtype={self.kv_cache_dtype!r}: give one of {', '.join(KV_DTYPES)}")
        if self.speculates and self.gdn_state_dtype != "float32":
            raise ValueError(f"gdn_state_dtype={self.gdn_state_dtype!r} with a drafter: the speculative GDN verify "
                             "steps a float32 state only (use gdn_state_dtype: float32, or no drafter)")

    @property
    def speculates(self) -> bool:
        return self.speculative is not None and self.speculative.on


# engine options that no longer exist -> what a config that still sets one should know (docs/decisions.md has why)
_TUNING = "decode-path tuning is internal (engine/options.DecodeTuning; docs/decisions.md has its measurements)"
REMOVED_OPTIONS = {
    "spec_chunk_verify": "the GDN verify runs token by token only (the chunk form was no faster in the 4B step)",
    "fused_decode": "the attention layers' fused decode is always on; the GDN layers decode through their per-op "
                    "kernels (the fused GDN decode kernel was slower)",
    "fused_attention_decode": _TUNING, "decode_gemv": _TUNING, "decode_pdl": _TUNING, "swiglu_epilogue": _TUNING,
    "spec_fold_after": _TUNING, "prefill_min_seqs": _TUNING,
    "drafter": "speculation is one mapping, speculative: {drafter: PATH, num_speculative_tokens: N, max_batch: N} "
               "(the job sets its drafter from model.drafter / --drafter)",
    "spec_block_size": "speculative: {num_speculative_tokens: N} gives N drafts a step (a block of N + 1 tokens)",
    "spec_max_batch": "speculative: {max_batch: N}",
}


@dataclass(frozen=True)
class RunnerConfig:
    """EngineOptions and DecodeTuning resolved for one device: every size known, PDL only where it runs."""
    device: torch.device
    dtype: torch.dtype
    max_num_seqs: int
    max_model_len: int
    max_num_batched_tokens: int
    block_size: int
    num_blocks: int | None
    kv_cache_memory_gb: float | None
    gpu_memory_utilization: float
    cuda_graphs: bool
    compile_glue: bool
    state_dtype: torch.dtype
    kv_dtype: torch.dtype  # the model's dtype, or FP8 (kernels/paged_attention)
    verify_len: int | None  # tokens a speculative verify step takes per sequence, when a drafter is loaded
    tuning: DecodeTuning = field(default=DEFAULT_TUNING)

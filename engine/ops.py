"""The engine's one door to the kernels package: each name dispatches to kernels/<op>.py, which runs Triton on CUDA
tensors and its torch reference elsewhere (CPU)."""
from kernels._common import pdl_supported, use_triton
from kernels.conv1d_update import causal_conv1d_update
from kernels.copy_rows import copy_rows
from kernels.fp8_quant import quant_fp8_per_token, rmsnorm_quant_fp8, silu_mul_quant_fp8
from kernels.fused_attn_decode import fused_attn_decode_inputs
from kernels.gated_rmsnorm import gated_rmsnorm
from kernels.gdn_recurrent import gates_from_raw, gdn_recurrent, l2norm_ref
from kernels.gdn_verify import causal_conv1d_verify, conv_state_commit, gdn_fold, gdn_ring_advance, gdn_verify
from kernels.paged_attention import dequantize_kv_ref, paged_decode_attention, store_kvcache
from kernels.quant_linear import FP8 as KV_FP8  # noqa: F401 (a dtype: not in __all__)
from kernels.quant_linear import FP8_GEMV_MAX_M, NVFP4_GEMV_MAX_M  # noqa: F401 (numbers: not in __all__)
from kernels.quant_linear import (
    dequant_fp8_ref, dequant_nvfp4_ref, fp8_linear, fp8_matmul, nvfp4_linear, nvfp4_matmul, quant_workspace_size)
from kernels.rmsnorm import rmsnorm
from kernels.silu_mul import silu_mul
from kernels.small_m_linear import MAX_M  # noqa: F401 (a number: not in __all__)
from kernels.small_m_linear import SplitKWorkspace, linear_silu_mul, small_m_linear, workspace_size

# The ops (callables); the row bounds MAX_M, FP8_GEMV_MAX_M and NVFP4_GEMV_MAX_M are numbers, imported by name.
__all__ = ["SplitKWorkspace", "causal_conv1d_update", "causal_conv1d_verify", "conv_state_commit", "copy_rows",
           "dequant_fp8_ref", "dequantize_kv_ref", "dequant_nvfp4_ref", "fp8_linear", "fp8_matmul",
           "fused_attn_decode_inputs", "gated_rmsnorm", "gates_from_raw", "gdn_fold", "gdn_recurrent",
           "gdn_ring_advance", "gdn_verify", "l2norm_ref", "linear_silu_mul", "nvfp4_linear", "nvfp4_matmul",
           "paged_decode_attention", "pdl_supported", "quant_fp8_per_token", "quant_workspace_size", "rmsnorm",
           "rmsnorm_quant_fp8", "silu_mul", "silu_mul_quant_fp8", "small_m_linear", "store_kvcache", "use_triton",
           "workspace_size"]

"""The engine's one door to the kernels package: each name dispatches to kernels/<op>.py, which runs Triton on CUDA
tensors and its torch reference elsewhere (CPU)."""
from kernels._common import pdl_supported, use_triton
from kernels.conv1d_update import causal_conv1d_update
from kernels.copy_rows import copy_rows
from kernels.fp8_quant import quant_fp8_per_token, rmsnorm_quant_fp8, silu_mul_quant_fp8
from kernels.fused_attn_decode import fused_attn_decode_inputs
from kernels.fused_gdn_decode import fused_gdn_decode
from kernels.gated_rmsnorm import gated_rmsnorm
from kernels.gdn_recurrent import gdn_recurrent, l2norm_ref
from kernels.paged_attention import paged_decode_attention, store_kvcache
from kernels.quant_linear import MAX_M as MAX_QUANT_GEMV_M  # a number, so not in __all__ (the names of ops)
from kernels.quant_linear import (
    dequant_fp8_ref, dequant_nvfp4_ref, fp8_linear, fp8_matmul, nvfp4_linear, nvfp4_matmul)
from kernels.rmsnorm import rmsnorm
from kernels.silu_mul import silu_mul
from kernels.small_m_linear import linear_silu_mul, small_m_linear

__all__ = ["causal_conv1d_update", "copy_rows", "dequant_fp8_ref", "dequant_nvfp4_ref", "fp8_linear", "fp8_matmul",
           "fused_attn_decode_inputs", "fused_gdn_decode", "gated_rmsnorm", "gdn_recurrent", "l2norm_ref",
           "linear_silu_mul", "nvfp4_linear", "nvfp4_matmul", "paged_decode_attention", "pdl_supported",
           "quant_fp8_per_token", "rmsnorm", "rmsnorm_quant_fp8", "silu_mul", "silu_mul_quant_fp8", "small_m_linear",
           "store_kvcache", "use_triton"]

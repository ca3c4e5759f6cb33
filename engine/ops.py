"""The engine's one door to the kernels package: each name dispatches to kernels/<op>.py, which runs Triton on CUDA
tensors and its torch reference elsewhere (CPU)."""
from kernels._common import pdl_supported, use_triton
from kernels.conv1d_update import causal_conv1d_update
from kernels.copy_rows import copy_rows
from kernels.fused_attn_decode import fused_attn_decode_inputs
from kernels.fused_gdn_decode import fused_gdn_decode
from kernels.gated_rmsnorm import gated_rmsnorm
from kernels.gdn_recurrent import gdn_recurrent, l2norm_ref
from kernels.gdn_verify import causal_conv1d_verify, conv_state_commit, gdn_commit, gdn_verify
from kernels.paged_attention import paged_decode_attention, store_kvcache
from kernels.rmsnorm import rmsnorm
from kernels.silu_mul import silu_mul
from kernels.small_m_linear import linear_silu_mul, small_m_linear

__all__ = ["causal_conv1d_update", "causal_conv1d_verify", "conv_state_commit", "copy_rows", "fused_attn_decode_inputs", "fused_gdn_decode", "gated_rmsnorm",
           "gdn_commit", "gdn_recurrent", "gdn_verify", "l2norm_ref", "linear_silu_mul", "paged_decode_attention", "pdl_supported", "store_kvcache",
           "rmsnorm", "silu_mul", "small_m_linear", "use_triton"]

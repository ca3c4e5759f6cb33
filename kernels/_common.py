"""Helpers shared by the op modules: dispatch rule and launch-size arithmetic."""
import os

import torch
import triton
import triton.language as tl


def use_triton(x: torch.Tensor) -> bool:
    """Triton on CUDA tensors; elsewhere the torch reference, unless OCRIA_FORCE_TRITON=1 (tests under TRITON_INTERPRET)."""
    return x.is_cuda or os.environ.get("OCRIA_FORCE_TRITON") == "1"


def interpreted() -> bool:
    """Whether Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1)."""
    from triton import knobs

    return bool(knobs.runtime.interpret)


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (host metadata, no sync); 132 (H100/H200) elsewhere, so launch
    heuristics pick the same configurations on CPU (interpreter tests) as on the target GPU."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def check(cond: bool, msg: str) -> None:
    """Shape/dtype validation on host-known metadata only (never on tensor values)."""
    if not cond:
        raise ValueError(msg)


def require_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    check(t.stride(-1) == 1, f"{name}: last dimension must be contiguous (stride 1), got strides {tuple(t.stride())}")


def output(out, shape, dtype, device, name="out"):
    """A caller-provided output buffer (checked) or a fresh one; lets CUDA-graph callers keep static buffers."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    check(tuple(out.shape) == tuple(shape) and out.dtype == dtype,
          f"{name} must be {dtype} {tuple(shape)}, got {out.dtype} {tuple(out.shape)}")
    return out


def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch needs an NVIDIA GPU of compute capability 9.0 (Hopper) or later (ROCm devices
    also report as "cuda", with capabilities of their own)."""
    return device.type == "cuda" and torch.version.hip is None and torch.cuda.get_device_capability(device)[0] >= 9


def pdl_launch(pdl: bool) -> dict:
    """The launch arguments of a kernel that starts with pdl_enter(PDL); pdl is on or off (a bool, or 0/1)."""
    check(pdl in (0, 1), f"pdl must be a bool (or 0/1), got {pdl!r}")
    check(not pdl or not interpreted(), "pdl (programmatic dependent launch) needs a GPU, not the Triton interpreter")
    return dict(PDL=bool(pdl), launch_pdl=bool(pdl))


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """Programmatic dependent launch (sm_90+; the kernel launched with launch_pdl=True): the kernel may start while
    the one before it finishes. Wait for that kernel to complete (its outputs are our inputs, and it may still read
    what we write), then let the next PDL launch start early in turn. The overlap hides the launch and ramp-up.
    Relies on every program of a PDL-launched kernel calling this before it returns and before any memory access
    other than reads of constant data (kernels/small_m_linear prefetches its weights first)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def cast_rtne(x, dtype: tl.constexpr):
    """fp32 -> dtype with round-to-nearest-even. For bf16 the rounding is done on the bits: GPUs round this way
    anyway, but the CPU interpreter truncates, which would make its results drift from the GPU's and the reference."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)

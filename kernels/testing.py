"""Helpers for the kernel tests (CPU, Triton interpreter). Import this module before any kernels op module:
TRITON_INTERPRET is read when @triton.jit decorates a kernel, i.e. when the op module is first imported."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

TOLERANCES = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1e-2, atol=1e-2),
              torch.float16: dict(rtol=1e-3, atol=1e-3)}


def require_interpreted(kernel) -> None:
    """Fail clearly when a kernel module was imported before TRITON_INTERPRET=1 was set (it then needs a GPU)."""
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(kernel, InterpretedFunction):
        raise RuntimeError(
            f"{getattr(kernel, '__name__', kernel)} was compiled for a GPU: a kernels module was imported before "
            "TRITON_INTERPRET=1 was set. Set it at the top of tests/conftest.py (before any engine/kernels import).")


def poisoned(shape, dtype, fill=float("nan")) -> torch.Tensor:
    """An output buffer full of NaN so that any element the kernel fails to write shows up."""
    return torch.full(shape, fill, dtype=dtype)


def assert_close(actual, expected, dtype=None, **overrides) -> None:
    assert not actual.isnan().any(), f"{int(actual.isnan().sum())} NaN elements (unwritten or invalid) in output"
    tol = dict(TOLERANCES[dtype or expected.dtype])
    tol.update(overrides)
    torch.testing.assert_close(actual.float(), expected.float(), **tol)


def assert_dispatches_to_triton(monkeypatch, triton_fn: str, op, *args, returns=None) -> None:
    """With OCRIA_FORCE_TRITON=1, `op(*args)` calls the Triton implementation `triton_fn` ("module.name") exactly
    once (it is replaced by a recorder returning `returns`)."""
    monkeypatch.setenv("OCRIA_FORCE_TRITON", "1")
    calls = []
    monkeypatch.setattr(triton_fn, lambda *a, **kw: calls.append(1) or returns)
    op(*args)
    assert calls == [1]

"""Row copies that skip rows staying in place (beam search's cache copy): Triton (interpreter) vs the index_select +
index_copy reference, with chains, swaps, repeated sources and rows left alone."""
import pytest
import torch

from kernels.testing import assert_dispatches_to_triton, require_interpreted  # sets TRITON_INTERPRET first
from kernels.copy_rows import _copy_rows_kernel, copy_rows, copy_rows_ref, copy_rows_triton


def pairs(S: int, P: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """P distinct destinations; about half their sources are themselves, the rest any row (so a destination is
    often another pair's source)."""
    g = torch.Generator().manual_seed(seed)
    dst = torch.randperm(S, generator=g)[:P]
    src = torch.where(torch.rand(P, generator=g) < 0.5, dst, torch.randint(S, (P,), generator=g))
    return src, dst


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,P,block", [((3, 7, 5, 3), 5, 16), ((2, 11, 37), 9, 32), ((1, 4, 300), 4, 128)])
def test_triton_matches_ref(shape, P, block, dtype):
    require_interpreted(_copy_rows_kernel)
    cache = torch.randn(shape, generator=torch.Generator().manual_seed(P)).to(dtype)
    src, dst = pairs(shape[1], P, seed=shape[1])
    expected = copy_rows_ref(cache.clone(), src, dst)
    got = copy_rows_triton(cache.clone(), src, dst, block=block)
    assert torch.equal(got, expected)
    assert not torch.equal(expected, cache)  # something did move


def test_chain_and_swap_read_old_rows():
    require_interpreted(_copy_rows_kernel)
    cache = torch.arange(6, dtype=torch.float32).view(1, 6, 1).repeat(2, 1, 3)
    # 0 <- 1 <- 2 (a chain), 3 <-> 4 (a swap), 5 stays
    src, dst = torch.tensor([1, 2, 4, 3, 5]), torch.tensor([0, 1, 3, 4, 5])
    out = copy_rows_triton(cache.clone(), src, dst, block=2)
    assert out[:, :, 0].tolist() == [[1, 2, 2, 4, 3, 5]] * 2


def test_dispatch_and_errors(monkeypatch):
    with pytest.raises(ValueError, match="src and dst must be"):
        copy_rows_ref(torch.zeros(1, 4, 2), torch.tensor([0, 1]), torch.tensor([1]))
    assert_dispatches_to_triton(monkeypatch, "kernels.copy_rows.copy_rows_triton", copy_rows, torch.zeros(1, 3, 2),
                                torch.tensor([0]), torch.tensor([1]))


def test_copy_benchmark_runs_and_checks(tmp_path, monkeypatch):
    """bench/beam_search_bench.py copy at tiny shapes (the H200 run's script): both ways agree, and it says so."""
    import json

    from conftest import load_bench

    beam_search_bench = load_bench("beam_search_bench")
    monkeypatch.setenv("OCRIA_FORCE_TRITON", "1")
    beam_search_bench.main(["copy", "--out", str(tmp_path), "--device", "cpu", "--tiny-shapes", "--rows", "5",
                            "--blocks-per-member", "2", "--iters", "1", "--stay-shares", "0,0.6"])
    result = json.loads((tmp_path / "beam_copy.json").read_text())
    assert [r["identical"] for r in result["results"]] == [True, True]
    assert result["results"][0]["members_moved"] > result["results"][1]["members_moved"]

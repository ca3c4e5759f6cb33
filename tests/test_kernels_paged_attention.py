"""Paged decode attention and the KV-cache writer: Triton (interpreter) vs reference, reference vs dense SDPA."""
import pytest
import torch
import torch.nn.functional as F

from kernels.testing import assert_close, poisoned, require_interpreted  # sets TRITON_INTERPRET first
from kernels.paged_attention import (_paged_decode_partition_kernel, dequantize_kv_ref, gather_kv_ref,
                                     paged_decode_attention, paged_decode_attention_ref, paged_decode_attention_triton,
                                     pick_partition_size, quantize_kv_ref, store_kvcache, store_kvcache_ref,
                                     store_kvcache_triton)
from kernels.quant_linear import FP8

CONTEXT_LENS = [1, 7, 33, 0]  # the last row is CUDA-graph padding


def make_cache(block_size, D, Hq=6, Hkv=2, lens=CONTEXT_LENS, dtype=torch.float32, seed=0, extra_blocks=1):
    """Random q and caches; each sequence gets shuffled physical blocks (+extra table columns filled with -1)."""
    gen = torch.Generator().manual_seed(seed)
    B = len(lens)
    per_seq = -(-max(lens) // block_size) + extra_blocks
    num_blocks = B * per_seq + 3
    block_tables = torch.randperm(num_blocks, generator=gen)[: B * per_seq].view(B, per_seq).int()
    for b, n in enumerate(lens):
        block_tables[b, -(-n // block_size) + 1:] = -1  # unused entries may hold anything
    k_cache = torch.randn(num_blocks, block_size, Hkv, D, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, Hkv, D, generator=gen).to(dtype)
    q = torch.randn(B, Hq, D, generator=gen).to(dtype)
    return q, k_cache, v_cache, block_tables, torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("D,block_size", [(48, 4), (80, 16)])
@pytest.mark.parametrize("partition_size", [None, 16])
def test_triton_matches_ref(D, block_size, partition_size, dtype):
    require_interpreted(_paged_decode_partition_kernel)
    q, k_cache, v_cache, block_tables, lens = make_cache(block_size, D, dtype=dtype, seed=D + block_size)
    scale = D ** -0.5
    ref = paged_decode_attention_ref(q, k_cache, v_cache, block_tables, lens, scale)
    out = paged_decode_attention_triton(q, k_cache, v_cache, block_tables, lens, scale, out=poisoned(q.shape, dtype),
                                        partition_size=partition_size, block_n=16)
    assert_close(out, ref, dtype)
    assert torch.equal(out[3], torch.zeros_like(out[3])), "padding row (context_len 0) must output zeros"


def test_many_partitions_and_group_of_one():
    """More partitions than the reduce kernel's tile (16), MHA (Hq == Hkv), max_context_len bound below capacity."""
    lens = [300, 17, 129]
    q, k_cache, v_cache, block_tables, lens_t = make_cache(8, 32, Hq=2, Hkv=2, lens=lens, seed=3, extra_blocks=4)
    ref = paged_decode_attention_ref(q, k_cache, v_cache, block_tables, lens_t, 0.2)
    out = paged_decode_attention_triton(q, k_cache, v_cache, block_tables, lens_t, 0.2, out=poisoned(q.shape, q.dtype),
                                        max_context_len=300, partition_size=16, block_n=16)
    assert_close(out, ref)


def test_real_head_dim_and_group():
    """D = 256, 4 query heads per kv head (4B model layout), bf16, default launch heuristics."""
    q, k_cache, v_cache, block_tables, lens = make_cache(16, 256, Hq=4, Hkv=1, lens=[70, 5], dtype=torch.bfloat16, seed=9)
    ref = paged_decode_attention_ref(q, k_cache, v_cache, block_tables, lens, 256 ** -0.5)
    out = paged_decode_attention_triton(q, k_cache, v_cache, block_tables, lens, 256 ** -0.5)
    assert_close(out, ref, torch.bfloat16)


@pytest.mark.parametrize("block_size", [4, 16])
def test_ref_matches_dense_sdpa(block_size):
    Hq, Hkv, D = 6, 2, 24
    q, k_cache, v_cache, block_tables, lens = make_cache(block_size, D, Hq=Hq, Hkv=Hkv, seed=block_size)
    ref = paged_decode_attention_ref(q, k_cache, v_cache, block_tables, lens, D ** -0.5)
    for b, n in enumerate(CONTEXT_LENS):
        if n == 0:
            assert torch.equal(ref[b], torch.zeros_like(ref[b]))
            continue
        k = gather_kv_ref(k_cache, block_tables[b], n).transpose(0, 1)  # [Hkv, n, D]
        v = gather_kv_ref(v_cache, block_tables[b], n).transpose(0, 1)
        dense = F.scaled_dot_product_attention(q[b][:, None], k.repeat_interleave(Hq // Hkv, 0),
                                               v.repeat_interleave(Hq // Hkv, 0))[:, 0]
        torch.testing.assert_close(ref[b], dense, rtol=1e-5, atol=1e-5)


def test_gather_matches_explicit_block_walk():
    _, k_cache, _, block_tables, _ = make_cache(4, 8, seed=2)
    n = 7
    walk = torch.cat([k_cache[block_tables[1, i]] for i in range(2)])[:n]  # blocks 0,1 hold tokens 0..7
    assert torch.equal(gather_kv_ref(k_cache, block_tables[1], n), walk)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_kvcache_triton_matches_ref(dtype):
    gen = torch.Generator().manual_seed(4)
    num_blocks, block_size, Hkv, D, N = 5, 4, 3, 40, 6
    k_cache = torch.randn(num_blocks, block_size, Hkv, D, generator=gen).to(dtype)
    v_cache = torch.randn_like(k_cache)
    kv = torch.randn(N, 2, Hkv, D, generator=gen).to(dtype)  # k, v as strided views of one tensor
    k, v = kv[:, 0], kv[:, 1]
    slots = torch.tensor([3, -1, 17, 0, -1, 19], dtype=torch.int64)
    kc_ref, vc_ref, kc_tri, vc_tri = k_cache.clone(), v_cache.clone(), k_cache.clone(), v_cache.clone()
    store_kvcache_ref(k, v, kc_ref, vc_ref, slots)
    store_kvcache_triton(k, v, kc_tri, vc_tri, slots)
    assert torch.equal(kc_tri, kc_ref) and torch.equal(vc_tri, vc_ref)
    assert torch.equal(kc_tri[4, 1], k[2]) and torch.equal(vc_tri[4, 3], v[5])
    flat_new, flat_old = kc_tri.view(-1, Hkv, D), k_cache.view(-1, Hkv, D)
    others = [s for s in range(num_blocks * block_size) if s not in (3, 17, 0, 19)]
    assert torch.equal(flat_new[others], flat_old[others]), "slots not in slot_mapping were modified"


def test_store_then_attend_roundtrip():
    """Writing a sequence token by token through store_kvcache, then attending, equals dense attention."""
    gen = torch.Generator().manual_seed(8)
    Hq, Hkv, D, block_size, n = 4, 2, 16, 4, 10
    k_cache = torch.zeros(6, block_size, Hkv, D)
    v_cache = torch.zeros_like(k_cache)
    table = torch.tensor([[5, 2, 0]], dtype=torch.int32)
    k, v = torch.randn(n, Hkv, D, generator=gen), torch.randn(n, Hkv, D, generator=gen)
    slots = torch.tensor([int(table[0, t // block_size]) * block_size + t % block_size for t in range(n)])
    store_kvcache_triton(k, v, k_cache, v_cache, slots)
    q = torch.randn(1, Hq, D, generator=gen)
    out = paged_decode_attention_triton(q, k_cache, v_cache, table, torch.tensor([n], dtype=torch.int32), 0.25)
    dense = F.scaled_dot_product_attention(q[0][:, None], k.transpose(0, 1).repeat_interleave(2, 0),
                                           v.transpose(0, 1).repeat_interleave(2, 0), scale=0.25)[:, 0]
    assert_close(out[0], dense)


def test_partition_heuristic():
    assert pick_partition_size(1, 4, 4096, 32, 132) == 64  # B=1: ~2 programs per SM -> 64 partitions x 4 heads
    assert pick_partition_size(64, 4, 4096, 32, 132) == 4096  # big batch: one partition, no reduce pass
    assert pick_partition_size(1, 4, 100, 64, 132) == 128  # never below 2 * block_n


def test_dispatch(monkeypatch):
    q, k_cache, v_cache, block_tables, lens = make_cache(4, 16)
    monkeypatch.setenv("OCRIA_FORCE_TRITON", "1")
    calls = []
    monkeypatch.setattr("kernels.paged_attention.paged_decode_attention_triton", lambda *a, **kw: calls.append("attn"))
    monkeypatch.setattr("kernels.paged_attention.store_kvcache_triton", lambda *a, **kw: calls.append("store"))
    paged_decode_attention(q, k_cache, v_cache, block_tables, lens, 0.25)
    store_kvcache(k_cache[0], v_cache[0], k_cache, v_cache, torch.zeros(4, dtype=torch.int64))
    assert calls == ["attn", "store"]


def test_bad_inputs_raise_clear_errors():
    q, k_cache, v_cache, block_tables, lens = make_cache(4, 16)
    with pytest.raises(ValueError, match="dtypes differ"):
        paged_decode_attention_triton(q.to(torch.bfloat16), k_cache, v_cache, block_tables, lens, 0.25)
    with pytest.raises(ValueError, match="multiple of block_n"):
        paged_decode_attention_triton(q, k_cache, v_cache, block_tables, lens, 0.25, partition_size=24, block_n=16)
    with pytest.raises(ValueError, match="slot_mapping"):
        store_kvcache_triton(k_cache[0], v_cache[0], k_cache, v_cache, torch.zeros(3, dtype=torch.int64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,Hq,Hkv,D,tile,partition", [(5, 6, 2, 40, None, None), (5, 8, 2, 40, 16, 16),
                                                        (3, 4, 1, 24, 16, None), (9, 4, 2, 16, 16, 16)])
def test_block_rows_read_their_sequence_together(T, Hq, Hkv, D, tile, partition, dtype):
    """A speculative block: runs of T rows per sequence, row t seeing its sequence's first ctx + t keys (the rows of
    a verify pass), run 2 cut short after 2 live rows (padding rows: length 0) and a whole padding run. The rows of
    a run share one block table (the kernel reads the run's first row's), and a tile of (row, head) pairs smaller
    than a run splits it over programs; every row must equal plain per-row attention (the reference)."""
    require_interpreted(_paged_decode_partition_kernel)
    gen = torch.Generator().manual_seed(T * D + Hq)
    bs, starts = 4, [9, 30, 1, 0]
    S = len(starts)
    per_seq = 12
    num_blocks = S * per_seq + 2
    tables = torch.randperm(num_blocks, generator=gen)[:S * per_seq].view(S, per_seq).int()
    lens = []
    for s, c in enumerate(starts):
        live = 0 if c == 0 else (2 if s == 1 else T)
        lens += [c + t if t < live else 0 for t in range(T)]
    lens = torch.tensor(lens, dtype=torch.int32)
    rows_tables = tables.repeat_interleave(T, 0).contiguous()
    rows_tables[lens == 0] = -1  # a padding row's table is never read: the run's first row's is
    rows_tables[::T] = tables  # ... which is its sequence's
    k_cache = torch.randn(num_blocks, bs, Hkv, D, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, bs, Hkv, D, generator=gen).to(dtype)
    q = torch.randn(S * T, Hq, D, generator=gen).to(dtype)
    ref = paged_decode_attention_ref(q, k_cache, v_cache, tables.repeat_interleave(T, 0), lens, D ** -0.5)
    out = paged_decode_attention_triton(q, k_cache, v_cache, rows_tables, lens, D ** -0.5, rows_per_seq=T,
                                        max_tile_rows=tile, partition_size=partition, block_n=16,
                                        out=poisoned(q.shape, dtype))
    assert_close(out, ref, dtype)
    assert torch.equal(out[lens == 0], torch.zeros_like(out[lens == 0])), "padding rows output zeros"


def test_block_rows_must_come_in_whole_runs():
    q, k_cache, v_cache, block_tables, lens = make_cache(4, 16)
    with pytest.raises(ValueError, match="rows_per_seq=3"):
        paged_decode_attention_triton(q, k_cache, v_cache, block_tables, lens, 0.25, rows_per_seq=3)


def test_tile_sizes_keep_a_decode_rows_whole_group():
    """Decoding holds a row's whole group of query heads in one program whatever its size; a block's pairs are
    tiled up to the cap."""
    from kernels.paged_attention import block_m

    assert block_m(1, 4) == 16 and block_m(1, 48, max_rows=32) == 64
    assert block_m(16, 4, max_rows=32) == 32 and block_m(3, 2) == 16 and block_m(16, 4) == 64


def test_decode_with_a_large_group_at_head_dim_256():
    """40 query heads on one kv head at head dim 256: a decode row's whole group in one program (a block's tiles
    are capped at 32 pairs there, a decode row's are not)."""
    require_interpreted(_paged_decode_partition_kernel)
    q, k_cache, v_cache, block_tables, lens = make_cache(16, 256, Hq=40, Hkv=1, lens=[37, 3], seed=11)
    ref = paged_decode_attention_ref(q, k_cache, v_cache, block_tables, lens, 256 ** -0.5)
    out = paged_decode_attention_triton(q, k_cache, v_cache, block_tables, lens, 256 ** -0.5,
                                        out=poisoned(q.shape, q.dtype))
    assert_close(out, ref)


# ------------------------------------------------------------------------------------------------------ FP8 KV

def fp8_cache(block_size, D, Hq=6, Hkv=2, lens=CONTEXT_LENS, seed=0):
    """make_cache's bf16 caches quantized row by row (quantize_kv_ref), with their scales."""
    q, k_cache, v_cache, bt, lens_t = make_cache(block_size, D, Hq, Hkv, lens, torch.bfloat16, seed)
    (k8, ks), (v8, vs) = (quantize_kv_ref(c.flatten(0, 1)) for c in (k_cache * 3, v_cache))  # k: a wider range
    shape = k_cache.shape
    return q, k8.view(shape), v8.view(shape), (ks.view(shape[:3]), vs.view(shape[:3])), bt, lens_t


@pytest.mark.parametrize("D,block_size,rows", [(48, 4, 1), (80, 16, 1), (64, 8, 3)])
def test_fp8_cache_triton_matches_ref(D, block_size, rows):
    """FP8 rows and their scales: the kernel (decode, and a verify block of 3 rows) against the reference, and the
    reference against attention over the dequantized rows in fp32 (so the scales are applied where they belong)."""
    require_interpreted(_paged_decode_partition_kernel)
    lens = [1, 7, 33, 0] if rows == 1 else [5, 6, 7, 20, 21, 22]
    q, k8, v8, scales, bt, lens_t = fp8_cache(block_size, D, lens=lens, seed=D)
    if rows > 1:  # runs of `rows` query rows share their first row's block table
        bt = bt[::rows].repeat_interleave(rows, dim=0)
    scale = D ** -0.5
    ref = paged_decode_attention_ref(q, k8, v8, bt, lens_t, scale, scales=scales)
    out = paged_decode_attention_triton(q, k8, v8, bt, lens_t, scale, out=poisoned(q.shape, q.dtype), block_n=16,
                                        partition_size=16, rows_per_seq=rows, scales=scales)
    assert_close(out, ref, torch.bfloat16)
    deq = paged_decode_attention_ref(q.float(), dequantize_kv_ref(k8, scales[0], torch.float32),
                                     dequantize_kv_ref(v8, scales[1], torch.float32), bt, lens_t, scale)
    assert_close(ref.float(), deq, torch.bfloat16)


def test_fp8_store_kernel_matches_ref_and_round_trips():
    """The writer quantizes each (token, head) row with its own scale: the kernel's bits equal the reference's,
    padding slots write nothing, and the stored rows come back within E4M3's half-ulp (2^-4 relative) of the input."""
    require_interpreted(_paged_decode_partition_kernel)
    gen = torch.Generator().manual_seed(5)
    N, H, D, blocks, bs = 6, 2, 40, 5, 4
    k = (torch.randn(N, H, D, generator=gen) * torch.logspace(-3, 2, H)[None, :, None]).to(torch.bfloat16)
    v = torch.randn(N, H, D, generator=gen).to(torch.bfloat16)
    slots = torch.tensor([3, -1, 0, 17, 9, 10], dtype=torch.int32)
    outs = []
    for store in (store_kvcache_ref, store_kvcache_triton):
        caches = [torch.zeros(blocks, bs, H, D, dtype=FP8) for _ in range(2)]
        scales = tuple(torch.full((blocks, bs, H), -1.0) for _ in range(2))
        store(k, v, *caches, slots, scales=scales)
        outs.append((caches, scales))
    (c_ref, s_ref), (c_tri, s_tri) = outs
    for a, b in zip(c_ref + list(s_ref), c_tri + list(s_tri)):
        assert torch.equal(a.view(torch.uint8) if a.dtype == FP8 else a, b.view(torch.uint8) if b.dtype == FP8 else b)
    live = slots >= 0
    at = (slots[live].long() // bs, slots[live].long() % bs)
    back = dequantize_kv_ref(c_ref[0][at], s_ref[0][at], torch.float32)
    want = k[live].float()
    assert ((back - want).abs() <= want.abs().amax(-1, keepdim=True) * 2 ** -4 + 1e-30).all()
    assert (s_ref[0] == -1).sum() == (blocks * bs - int(live.sum())) * H  # untouched slots keep their scales


def test_fp8_cache_needs_scales_and_plain_cache_refuses_them():
    q, k8, v8, scales, bt, lens = fp8_cache(4, 16, lens=[3, 2])
    with pytest.raises(ValueError, match="needs scales"):
        paged_decode_attention_ref(q, k8, v8, bt, lens, 0.25)
    q, kc, vc, bt, lens = make_cache(4, 16, lens=[3, 2])
    with pytest.raises(ValueError, match="scales are for a float8_e4m3fn cache"):
        paged_decode_attention_ref(q, kc, vc, bt, lens, 0.25, scales=scales)

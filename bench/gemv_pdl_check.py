"""On the GPU: a chain of decode GEMVs at the Qwen3.5-4B shapes (out_proj -> gate_up with the SwiGLU epilogue ->
down -> in_proj, each reading the one before's output, all sharing one split-K workspace) captured in a CUDA graph
with programmatic dependent launch off and on: the outputs must be bit-identical and finite, after several replays
(the split-K counters re-armed every time), and within MAX_REL_ERR of the same chain through the torch references
(so a GEMV wrong the same way with and without PDL fails too). PDL only changes when each kernel starts; the kernel
tests cannot check that, as the interpreter has no griddepcontrol. For M in 1, 3, 8, 16, bf16. Prints a table,
writes --out JSON, exits 1 on any failure.

    python3 bench/gemv_pdl_check.py --out $OUT/gemv_pdl_check.json       # GPU machine
    python3 bench/gemv_pdl_check.py --tiny --out /tmp/check.json         # CPU smoke run (PDL off only)
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import harness  # noqa: E402
from kernels import small_m_linear as sml

REAL = dict(hidden=2560, inter=9216, in_proj=12352)
TINY = dict(hidden=64, inter=96, in_proj=80)
# max |chain - reference chain| / max |reference chain|: each bf16 GEMV differs from its reference by its summation
# order only (one rounding step), four of them in a row
MAX_REL_ERR = 0.03


def chain_inputs(M, s, dtype, device, seed):
    """x [M, hidden] and the four weights: out_proj, gate_up, down, in_proj."""
    gen = torch.Generator().manual_seed(seed)
    H, I = s["hidden"], s["inter"]
    ws = [(torch.randn(*shape, generator=gen) * shape[1] ** -0.5).to(device, dtype)
          for shape in ((H, H), (2 * I, H), (H, I), (s["in_proj"], H))]
    return torch.randn(M, H, generator=gen).to(device, dtype), ws


def reference_chain(x, ws):
    h = sml.small_m_linear_ref(x, ws[0])
    h = sml.linear_silu_mul_ref(h, ws[1])
    return sml.small_m_linear_ref(sml.small_m_linear_ref(h, ws[2]), ws[3])


def pdl_chain(x, ws, device, pdl):
    """out_proj -> gate_up (SwiGLU) -> down -> in_proj, each reading the one before's output, in one CUDA graph."""
    workspace = sml.small_m_linear_workspace(max(w.shape[0] for w in ws), device)
    launch = dict(workspace=workspace, pdl=pdl) if pdl else dict(workspace=workspace)

    def step():
        h = sml.small_m_linear(x, ws[0], **launch)
        h = sml.linear_silu_mul(h, ws[1], **launch)
        h = sml.small_m_linear(h, ws[2], **launch)
        return sml.small_m_linear(h, ws[3], **launch)

    if device != "cuda":
        return step()
    step()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(3):  # replays must keep giving the same bits (split-K counters re-armed every time)
        graph.replay()
    torch.cuda.synchronize()
    return out.clone()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke run: PDL off only)")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes, dtype = (TINY if args.tiny else REAL), torch.bfloat16
    pdl_settings = (False, True) if device == "cuda" else (False,)
    rows = []
    where = "in a CUDA graph" if device == "cuda" else "eager"
    for M in (1, 3, 8, 16):
        x, ws = chain_inputs(M, shapes, dtype, device, seed=100 + M)
        outs = [pdl_chain(x, ws, device, p) for p in pdl_settings]
        same = all(torch.equal(outs[0], o) for o in outs[1:])
        ref = reference_chain(x, ws).float()
        rel_err = ((outs[0].float() - ref).abs().max() / ref.abs().max()).item()
        rows.append(dict(check=f"chain with pdl={pdl_settings} {where}", M=M, identical=bool(same),
                         rel_err_vs_ref=round(rel_err, 5),
                         ok=bool(same and torch.isfinite(outs[0]).all().item() and rel_err <= MAX_REL_ERR)))
    for r in rows:
        print(f"{r['check']:45s} M={r['M']:2d} identical={r['identical']} rel_err={r['rel_err_vs_ref']:.5f} ok={r['ok']}")
    meta = harness.result_meta(
        __file__, f"a chain of 4 decode GEMVs ({'tiny' if args.tiny else '4B'} shapes, bf16) {where} with PDL "
        f"{' and '.join('on' if p else 'off' for p in pdl_settings)}, M = 1, 3, 8, 16: outputs identical, finite and "
        f"within max_rel_err of the torch references", argv, device)
    harness.write_result(args.out, dict(dtype=str(dtype), shapes=shapes, max_rel_err=MAX_REL_ERR, rows=rows), meta)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

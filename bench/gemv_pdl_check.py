"""On the GPU, before timing them: the decode GEMV's input prologues and PDL modes against their torch references at
the Qwen3.5-4B shapes (the kernel tests run these paths only in the CPU interpreter).

  * rmsnorm_linear (+ residual; one pass where K is not split), also with the SwiGLU epilogue (gate_up);
  * gated_rmsnorm_linear (GDN out_proj), silu_mul_linear (down_proj);
  * a chain of GEMVs captured in a CUDA graph with pdl = 0, 1 and 2 (mode 2: the next launch triggered before the
    wait): the outputs must be bit-identical, each GEMV reading the one before's output and sharing one split-K
    workspace.
For M in 1, 3, 8, 16, bf16. A prologue passes when its output is finite, no further from the same computation in
fp32 (the reference run on fp32 copies of the inputs) than 2x the bf16 reference's own distance plus 1e-3 (the
one-pass RMSNorm rounds at other points than the reference, so the two bf16 results may differ by an ulp or two), and
any new residual it writes equals the reference's bit for bit. Prints a table, writes --out JSON, exits 1 on any
failure.

    python3 bench/gemv_prologue_check.py --out $OUT/gemv_prologue_check.json       # GPU machine
    python3 bench/gemv_prologue_check.py --tiny --out /tmp/check.json             # CPU smoke run (references only)
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels import small_m_linear as sml

REAL = dict(hidden=2560, inter=9216, in_proj=12352, heads=32, head_dim=128)
TINY = dict(hidden=64, inter=96, in_proj=80, heads=4, head_dim=16)


def cases(M, s, dtype, device, gen):
    """(name, triton thunk, reference thunk(dtype)), each returning a tuple of tensors; the reference thunk runs on
    copies of the inputs in the given dtype."""
    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device, dtype)

    H, I, D, nh = s["hidden"], s["inter"], s["head_dim"], s["heads"]
    x, res, nw = rand(M, H, scale=3), rand(M, H, scale=3), rand(H, scale=0.2)
    w_in, w_gu = rand(s["in_proj"], H, scale=H ** -0.5), rand(2 * I, H, scale=H ** -0.5)
    w_down = rand(H, I, scale=I ** -0.5)
    o, z, gw, w_out = rand(M, nh, D), rand(M, nh, D), 1 + rand(D, scale=0.2), rand(H, nh * D, scale=(nh * D) ** -0.5)
    gate_up = rand(M, 2 * I, scale=2)

    def ref(fn, *args, **kw):
        return lambda dt: fn(*(a.to(dt) if torch.is_tensor(a) else a for a in args),
                             **{k: v.to(dt) if torch.is_tensor(v) else v for k, v in kw.items()})

    def one(fn):  # single-output ops as 1-tuples
        return lambda *a, **k: (fn(*a, **k),)

    return [
        ("rmsnorm_linear+residual", lambda: sml.rmsnorm_linear(x, nw, 1e-6, w_in, residual=res),
         ref(sml.rmsnorm_linear_ref, x, nw, 1e-6, w_in, residual=res)),
        ("rmsnorm_linear+residual swiglu", lambda: sml.rmsnorm_linear(x, nw, 1e-6, w_gu, residual=res, swiglu=True),
         ref(sml.rmsnorm_linear_ref, x, nw, 1e-6, w_gu, residual=res, swiglu=True)),
        ("gated_rmsnorm_linear", lambda: (sml.gated_rmsnorm_linear(o, z, gw, 1e-6, w_out),),
         ref(one(sml.gated_rmsnorm_linear_ref), o, z, gw, 1e-6, w_out)),
        ("silu_mul_linear", lambda: (sml.silu_mul_linear(gate_up, w_down),),
         ref(one(sml.silu_mul_linear_ref), gate_up, w_down)),
    ]


def pdl_chain(M, s, dtype, device, gen, pdl):
    """out_proj -> gate_up (SwiGLU) -> down -> in_proj, each reading the one before's output, in one CUDA graph."""
    H, I = s["hidden"], s["inter"]
    ws = [(torch.randn(*shape, generator=gen) * shape[1] ** -0.5).to(device, dtype)
          for shape in ((H, H), (2 * I, H), (H, I), (s["in_proj"], H))]
    workspace = sml.small_m_linear_workspace(max(s["in_proj"], 2 * I), device)
    x = (torch.randn(M, H, generator=gen)).to(device, dtype)
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
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke run: references only)")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes, dtype = (TINY if args.tiny else REAL), torch.bfloat16
    rows = []
    for M in (1, 3, 8, 16):
        gen = torch.Generator().manual_seed(M)
        for name, run, ref in cases(M, shapes, dtype, device, gen):
            got, want, exact = run(), ref(dtype), ref(torch.float32)
            err = (got[0].float() - exact[0]).abs().max().item()
            ref_err = (want[0].float() - exact[0]).abs().max().item()
            ok = all(torch.isfinite(g).all().item() for g in got) and err <= 2 * ref_err + 1e-3
            ok = ok and all(torch.equal(g, w) for g, w in zip(got[1:], want[1:]))  # the new residual: exact
            rows.append(dict(check=name, M=M, max_abs_err=err, ref_max_abs_err=ref_err, ok=bool(ok)))
        pdl_modes = (0, 1, 2) if device == "cuda" else (0,)
        outs = [pdl_chain(M, shapes, dtype, device, torch.Generator().manual_seed(100 + M), p) for p in pdl_modes]
        same = all(torch.equal(outs[0], o) for o in outs[1:])
        rows.append(dict(check=f"pdl chain modes {pdl_modes} in a CUDA graph", M=M, max_abs_err=0.0 if same else None,
                         ref_max_abs_err=None, ok=bool(same and torch.isfinite(outs[0]).all().item())))
    print(f"{'check':45s} {'M':>3s} {'err vs fp32':>12s} {'ref err':>8s} ok")
    for r in rows:
        err, ref_err = ("-" if r[k] is None else f"{r[k]:.3g}" for k in ("max_abs_err", "ref_max_abs_err"))
        print(f"{r['check']:45s} {r['M']:3d} {err:>12s} {ref_err:>8s} {r['ok']}")
    with open(args.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name() if device == "cuda" else "cpu", dtype=str(dtype),
                       shapes=shapes, rows=rows), f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

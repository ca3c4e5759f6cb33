"""Every kernel compiles for sm_90 (H200) at the 4B decode shapes, without spills, using Triton's bundled ptxas.

Runs in a subprocess because compiling for the GPU needs TRITON_INTERPRET unset, while the other kernel tests set it.
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = ("import json, kernels.compile_check as cc; rows = cc.run((1, 64)); "
          "print('ROWS=' + json.dumps([{k: r[k] for k in ('case', 'kernel', 'regs', 'spill_stores', 'griddepcontrol')}"
          " for r in rows]))")


@pytest.mark.timeout(300)
def test_all_kernels_compile_for_sm90_without_spills():
    import triton.backends.nvidia  # noqa: F401  (ptxas for sm_90 ships in the triton wheel: no GPU needed)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "OCRIA_FORCE_TRITON")}
    res = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert res.returncode == 0, res.stderr[-4000:]
    rows = json.loads(res.stdout.split("ROWS=", 1)[1])
    kernels = {r["kernel"] for r in rows}
    assert kernels == {"_gdn_recurrent_kernel", "_conv1d_update_kernel", "_paged_decode_partition_kernel",
                       "_paged_decode_reduce_kernel", "_store_kvcache_kernel", "_gated_rmsnorm_kernel",
                       "_rmsnorm_kernel", "_silu_mul_kernel", "_small_m_linear_kernel", "_fused_attn_inputs_kernel",
                       "_copy_rows_kernel", "_quant_rows_kernel", "_quant_gemv_kernel", "_gdn_verify_kernel", "_gdn_fold_kernel", "_ring_advance_kernel", "_conv_verify_kernel",
                       "_conv_commit_kernel", "_dequant_nvfp4_kernel"}
    for r in rows:
        assert r["regs"] is not None, f"ptxas gave no register report for {r}"
        assert r["spill_stores"] == 0, f"register spills at the default launch config: {r}"
        # pdl=True launches wait on the kernel before (griddepcontrol.wait); the others never do
        assert r["griddepcontrol"] == r["case"].endswith(" pdl"), r
    pdl_kernels = {r["kernel"] for r in rows if r["griddepcontrol"]}
    no_pdl = {"_store_kvcache_kernel", "_silu_mul_kernel", "_copy_rows_kernel", "_quant_rows_kernel",
              "_gdn_verify_kernel", "_gdn_fold_kernel",
              "_ring_advance_kernel", "_conv_verify_kernel", "_conv_commit_kernel", "_dequant_nvfp4_kernel"}
    assert pdl_kernels == kernels - no_pdl, pdl_kernels

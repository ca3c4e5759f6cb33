"""bench/decode_profile.py: the tiny CPU run end to end (CPU ops stand in for kernels), and the device-kernel
aggregation on hand-built profiler events shaped like a CUDA profile (kernels listed under their launching op)."""
import json

import pytest
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from conftest import load_bench


def load():
    return load_bench("decode_profile")


@pytest.mark.timeout(300)
def test_tiny_cpu_profile_writes_consistent_json(tmp_path):
    prof = load()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a small shared CPU, waking a second OpenMP thread per op costs ms
    try:
        prof.main(["--tiny", "--device", "cpu", "--out", str(tmp_path), "--batch-sizes", "1,2", "--steps", "3",
                   "--graph-steps", "4", "--warmup", "1", "--variants", "default,unfused_attn"])
    finally:
        torch.set_num_threads(threads)
    data = json.loads((tmp_path / "decode_profile.json").read_text())
    assert data["meta"]["copy_bandwidth_GBps"] > 0
    runs = data["runs"]
    assert [(r["variant"], r["batch"]) for r in runs] == [("default", 1), ("default", 2), ("unfused_attn", 1),
                                                          ("unfused_attn", 2)]
    # the tiny model: 3 GDN + 1 attention layer, four weight GEMMs in each, and the LM head
    weights = {"linear_attn.in_proj", "linear_attn.out_proj", "mlp.gate_up_proj", "mlp.down_proj",
               "self_attn.qkv_proj", "mlp.down_proj|self_attn.o_proj", "lm_head"}
    for r in runs:
        assert r["profile_source"].startswith("cpu ops") and r["steps_profiled"] == 3
        assert r["roofline_ms"] > 0 and r["graph_step_ms"] > 0 and r["graph_vs_roofline"] > 0
        assert r["kernel_sum_ms"] > 0 and r["kernels_per_step"] > 17 and 0 < r["gemm_share"] <= 1
        assert r["gemm_bytes_source"] == "gemm shapes"
        cats, scopes = r["categories"], r["scopes"]
        assert cats["gemm"]["kernels_per_step"] == 17
        assert sum(c["ms"] for c in cats.values()) == pytest.approx(r["kernel_sum_ms"])
        assert sum(c["gap_ms"] for c in cats.values()) == pytest.approx(r["gap_ms"])
        assert sum(s["us_per_step"] for s in scopes.values()) / 1e3 == pytest.approx(r["kernel_sum_ms"])
        assert scopes["linear_attention"]["layers"] == 3 and scopes["full_attention"]["layers"] == 1
        assert {"embed+rope", "norm+head", "step (inputs, sampler)"} <= set(scopes)
        assert {g["weight"] for g in r["gemms"]} == weights
        assert sum(g["calls_per_step"] for g in r["gemms"]) == 17
        head = next(g for g in r["gemms"] if g["weight"] == "lm_head")
        assert (head["M"], head["K"], head["N"], head["scope"]) == (r["batch"], 64, 600, "norm+head")
        assert head["MB_per_call"] * 1e6 == (r["batch"] * 64 + 64 * 600 + r["batch"] * 600) * 4
        times = [k["us_per_step"] for k in r["kernels"]]
        assert times == sorted(times, reverse=True) and r["kernels"][0]["per_step"] > 0


def ev(i, name, t0, t1, parent=None, device=False, **kw):
    e = FunctionEvent(id=i, name=name, thread=1, start_us=t0, end_us=t1,
                      device_type=DeviceType.CUDA if device else DeviceType.CPU, **kw)
    if parent is not None:
        e.set_cpu_parent(parent)
        parent.append_cpu_child(e)
    return e


def test_device_kernels_are_attributed_to_ops_and_layer_ranges():
    prof = load()
    cpu = [ev(1, "prof::linear_attention", 0, 100)]
    cpu.append(ev(2, "aten::linear", 10, 40, cpu[0]))
    cpu.append(ev(3, "aten::mm", 12, 38, cpu[1], input_shapes=[[8, 64], [64, 256]]))
    cpu.append(ev(4, "Torch-Compiled Region: 0/1", 50, 70, cpu[0], is_user_annotation=True))
    cpu.append(ev(5, "triton_poi_fused_sigmoid_0", 52, 60, cpu[3]))  # inductor's own range around its launch
    cpu.append(ev(6, "aten::copy_", 120, 125))  # outside the forward
    kernels = [(3, "nvjet_tst_64x8_64x16", 20.0), (3, "splitKreduce_kernel", 2.0), (1, "_gdn_recurrent_kernel", 5.0),
               (5, "triton_poi_fused_sigmoid_0", 3.0), (6, "Memcpy HtoD (Pinned -> Device)", 1.0)]
    device = []
    for n, (op, name, us) in enumerate(kernels):
        cpu[op - 1].append_kernel(name, 0, us)
        device.append(ev(100 + n, name, 200 + 10 * n, 200 + 10 * n + us, device=True, activity_type="kernel",
                         linked_correlation_id=op))
    cpu[3].append_kernel("Torch-Compiled Region: 0/1", 0, 30.0)  # the range's device-side span: not a kernel
    device.append(ev(110, "Torch-Compiled Region: 0/1", 250, 280, device=True, activity_type="gpu_user_annotation",
                     linked_correlation_id=4))
    device.append(ev(111, "_rmsnorm_kernel", 300, 304, device=True, activity_type="kernel", linked_correlation_id=0))

    recs, info = prof.kernel_records(cpu + device)
    assert info["source"] == "device kernels" and info["unlinked_us"] == 4.0 and info["uncounted_us"] == 0.0
    roof = dict(weights=40_000.0, kv=1000.0, gdn_state=1000.0, total=42_000.0)
    res = prof.summarise(recs, info, 1, 1e9, roof, {("linear_attention", 256, 64): "mlp.gate_up_proj"}, 2,
                         {"_gdn_recurrent_kernel", "_rmsnorm_kernel"}, {"linear_attention": 1})
    cats = res["categories"]
    assert {c: v["kernels_per_step"] for c, v in cats.items()} == {
        "gemm": 2, "triton (ours)": 2, "inductor": 1, "memcpy/memset": 1}
    assert cats["gemm"]["ms"] == pytest.approx(0.022) and cats["triton (ours)"]["ms"] == pytest.approx(0.009)
    assert res["kernel_sum_ms"] == pytest.approx(0.035) and res["kernels_per_step"] == 6
    assert {s: v["per_step"] for s, v in res["scopes"].items()} == {
        "linear_attention": 4, "unlinked": 1, "step (inputs, sampler)": 1}
    [g] = res["gemms"]  # split-K: two kernels, one call
    assert (g["weight"], g["M"], g["K"], g["N"], g["calls_per_step"]) == ("mlp.gate_up_proj", 8, 64, 256, 1)
    nbytes = (8 * 64 + 64 * 256 + 8 * 256) * 2
    assert g["MB_per_call"] * 1e6 == nbytes and g["GBps"] == pytest.approx(nbytes / 22e-6 / 1e9)
    assert cats["gemm"]["gap_ms"] == pytest.approx(0.022 - 1e3 * nbytes / 1e9)
    assert cats["triton (ours)"]["MB"] * 1e6 == 2000.0  # KV + GDN state bytes go to our kernels
    assert res["unlinked_ms"] == pytest.approx(0.004)


@pytest.mark.timeout(300)
def test_tiny_cpu_profile_of_speculative_steps(tmp_path):
    """--spec: the steps profiled are speculative (a random drafter), their ops attributed to the draft pass, the
    drafter's context write, the commit and the verify pass's layers."""
    prof = load()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        prof.main(["--tiny", "--device", "cpu", "--out", str(tmp_path), "--batch-sizes", "2", "--steps", "2",
                   "--graph-steps", "3", "--warmup", "1", "--variants", "default", "--spec", "4"])
    finally:
        torch.set_num_threads(threads)
    (r,) = json.loads((tmp_path / "decode_profile.json").read_text())["runs"]
    scopes = r["scopes"]
    assert {"draft", "drafter context", "commit", "linear_attention", "full_attention"} <= set(scopes)
    assert all(scopes[s]["us_per_step"] > 0 for s in ("draft", "drafter context", "commit"))
    # the LM head runs twice a step: in the verify pass over batch x block rows, and in the draft pass over the
    # block's block - 1 masked positions a sequence
    assert {g["M"] for g in r["gemms"] if g["weight"] == "lm_head" and g["scope"] == "norm+head"} == {2 * 4, 2 * 3}


@pytest.mark.timeout(300)
def test_tiny_cpu_prefill_profile_attributes_the_vision_tower_and_layers(tmp_path):
    """bench/prefill_profile.py on the tiny model: page prefills timed, their kernels split by scope (the vision tower,
    both layer kinds, the head) and GEMM shape; the scopes add up to the kernel total."""
    prof = load_bench("prefill_profile")
    assert prof.main(["--tiny", "--device", "cpu", "--pages", "2", "--repeats", "1", "--variants", "default",
                      "--out", str(tmp_path)]) == 0
    (r,) = json.loads((tmp_path / "prefill_profile.json").read_text())["runs"]
    assert r["variant"] == "default" and r["pages"] == 2 and r["ms_per_page"] > 0 and r["tokens_per_s"] > 0
    assert r["prompt_tokens"] == 2 * (16 + 18)  # 16 merged image tokens + 18 of scaffolding a page
    assert {"vision", "linear_attention", "full_attention", "norm+head"} <= set(r["scopes"])
    assert sum(s["ms"] for s in r["scopes"].values()) == pytest.approx(r["kernel_sum_ms"], rel=1e-6)
    assert 0 < r["gemm_share"] <= 1 and r["gemm_TFLOP"] > 0
    assert any(g["scope"] == "vision" and g["M"] == 2 * 4 * 16 for g in r["gemms"])  # 4 patches a merged token


def test_gemm_shape_of_each_gemm_op():
    """(M, K, N) from each GEMM op's recorded input shapes: addmm's bias and _scaled_mm's row-wise scales are not
    its operands (a prefill profile's FP8 GEMMs would count K = 1 FLOPs otherwise)."""
    from types import SimpleNamespace

    prof = load()

    def op(name, shapes):
        return SimpleNamespace(name=name, input_shapes=shapes)

    assert prof.gemm_shape(op("aten::mm", [[8, 32], [32, 64]])) == (8, 32, 64)
    assert prof.gemm_shape(op("aten::addmm", [[64], [8, 32], [32, 64]])) == (8, 32, 64)
    assert prof.gemm_shape(op("aten::linear", [[8, 32], [64, 32], [64]])) == (8, 32, 64)
    assert prof.gemm_shape(op("aten::_scaled_mm", [[8, 32], [32, 64], [8, 1], [1, 64], [], []])) == (8, 32, 64)

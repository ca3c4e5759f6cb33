"""Quantized checkpoints (compressed-tensors layout): the codecs, the quantization_config parser, validation of bad or
mismatched checkpoints before any weights load, loading into the engine (exact against the same weights dequantized),
the kernels' path inside the engine, and agreement with the bf16 model."""
import kernels.testing  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is compiled)
import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.checkpoint import CheckpointError, inspect_checkpoint
from engine.config import ConfigError, load_config
from engine.interface import SamplingParams
from engine.llm_engine import Engine
from engine.models.quant_linear import QuantWeight, SplitWeight
from engine.quant_codec import dequantize, quantize_fp8, quantize_nvfp4, round_e2m1_codes
from engine.quant_config import parse_quant_config, quant_config_dict
from engine.quantize import dequantize_tensors, plan_precisions, quantize_checkpoint
from engine.testing import build_checkpoint

FP8_RULES = [(r"in_proj_[ab]$", "bf16")]
NVFP4_RULES = [(r"in_proj_[ab]$", "bf16"), (r"down_proj$", "fp8")]


@pytest.fixture(scope="module")
def src(tmp_path_factory, tiny_tokenizer):
    return build_checkpoint(tmp_path_factory.mktemp("bf16"), tokenizer=tiny_tokenizer, seed=4, dtype=torch.bfloat16)


def quantized(src, out, default, rules, act_fp8=True):
    plan = plan_precisions(load_config(src), rules, default)
    quantize_checkpoint(src, out, plan, act_fp8=act_fp8)
    return out


@pytest.fixture(scope="module")
def fp8_ckpt(src, tmp_path_factory):
    return quantized(src, tmp_path_factory.mktemp("q") / "m-fp8", "fp8", FP8_RULES)


@pytest.fixture(scope="module")
def nvfp4_ckpt(src, tmp_path_factory):
    return quantized(src, tmp_path_factory.mktemp("q") / "m-nvfp4", "nvfp4", NVFP4_RULES)


def dequantized_copy(qdir, out):
    """The quantized checkpoint with every quantized module written back as its fp32 dequantized weight and the
    quantization_config removed: a plain checkpoint holding exactly the weights the quantized one encodes."""
    shutil.copytree(qdir, out)
    cfg = json.loads((out / "config.json").read_text())
    plain = dequantize_tensors(load_file(out / "model.safetensors"), cfg.pop("quantization_config"))
    save_file(plain, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg))
    return out


# ------------------------------------------------------------------ codecs

def test_e2m1_rounding_nearest_ties_to_even():
    v = torch.tensor([0.0, 0.24, 0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, 6.0, -0.75, -5.0, -0.1])
    want = [0.0, 0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, -1.0, -4.0, -0.0]
    table = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    codes = round_e2m1_codes(v)
    got = torch.where(codes >= 8, -table[(codes & 7).long()], table[(codes & 7).long()])
    assert got.tolist() == want


@pytest.mark.parametrize("N,K", [(48, 96), (33, 208)])
def test_nvfp4_round_trip(N, K):
    """Every weight lands on its block's E2M1 grid point nearest to it: the error is at most half a grid step (the
    largest step, 2 units between 4 and 6, bounds it), and re-quantizing the dequantized tensor is lossless."""
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(N + K)) * 0.05
    packed, bs, gs = quantize_nvfp4(w)
    assert packed.shape == (N, K // 2) and packed.dtype == torch.uint8 and bs.shape == (N, K // 16)
    assert bs.dtype == torch.float8_e4m3fn and gs.shape == (1,) and gs.dtype == torch.float32
    wq = dequantize(dict(weight_packed=packed, weight_scale=bs, weight_global_scale=gs), "nvfp4")
    step = (bs.float() / gs).repeat_interleave(16, dim=1)
    assert ((w - wq).abs() <= step * 1.0 + 1e-9).all()
    assert (w - wq).norm() / w.norm() < 0.12  # ~4.5 bits a weight
    packed2, bs2, gs2 = quantize_nvfp4(wq, amax=w.abs().amax())
    assert torch.equal(bs2.float(), bs.float())
    assert torch.equal(dequantize(dict(weight_packed=packed2, weight_scale=bs2, weight_global_scale=gs2), "nvfp4"), wq)


def test_fp8_round_trip():
    w = torch.randn(40, 72, generator=torch.Generator().manual_seed(1))
    q, s = quantize_fp8(w)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (40, 1)
    wq = dequantize(dict(weight=q, weight_scale=s), "fp8")
    assert (w - wq).norm() / w.norm() < 0.03
    assert torch.equal(q.float().abs().amax(1), torch.full((40,), 448.0))


def test_compressed_tensors_reads_our_format_where_installed(nvfp4_ckpt):
    """The same bytes as compressed-tensors' own packer, and its config model parses our quantization_config.
    compressed-tensors needs pydantic and loguru, so the engine does not use it (docs/quantization.md); this
    cross-check runs where it is installed (pip install -e '.[interop]')."""
    ct = pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationConfig

    qc = QuantizationConfig.model_validate(json.loads((nvfp4_ckpt / "config.json").read_text())["quantization_config"])
    scheme = qc.config_groups["group_nvfp4"]
    w = torch.randn(48, 96, generator=torch.Generator().manual_seed(2)) * 0.05
    packed, bs, gs = quantize_nvfp4(w)
    theirs = NVFP4PackedCompressor.compress(dict(weight=w, weight_scale=bs.float(), weight_global_scale=gs), scheme)
    assert torch.equal(theirs["weight_packed"], packed), ct.__version__


# ------------------------------------------------------------------ config and validation

def test_config_round_trip_and_scheme_lookup():
    d = quant_config_dict({"a": (["re:.*mlp\\.gate_proj$"], "nvfp4", False), "b": (["Linear"], "fp8", True)},
                          ["lm_head", "re:.*visual.*", "re:.*in_proj_[ab]$", "re:.*gate_proj$"])
    qc = parse_quant_config(d)
    assert qc.label == "fp8+nvfp4"
    s = qc.scheme_for("model.language_model.layers.0.mlp.up_proj")
    assert s.weights == "fp8" and s.runs_w8a8
    assert qc.scheme_for("model.visual.blocks.0.attn.qkv") is None
    assert qc.scheme_for("model.language_model.layers.0.linear_attn.in_proj_a") is None
    d2 = quant_config_dict({"a": (["re:.*gate_proj$"], "nvfp4", False), "b": (["Linear"], "fp8", True)}, [])
    with pytest.raises(ConfigError, match="matches config groups a, b"):
        parse_quant_config(d2).scheme_for("model.language_model.layers.0.mlp.gate_proj")


def _group(cfg):
    return next(iter(cfg["quantization_config"]["config_groups"].values()))


@pytest.mark.parametrize("edit,match", [
    (lambda c: c["quantization_config"].update(quant_method="gptq"), r"quant_method='gptq'"),
    (lambda c: c["quantization_config"].update(quantization_status="frozen"), r"quantization_status='frozen'"),
    (lambda c: c["quantization_config"].update(kv_cache_scheme={"num_bits": 8}), r"kv_cache_scheme"),
    (lambda c: _group(c)["weights"].update(strategy="block", block_structure=[128, 128]),
     r"weights\.strategy='block'"),
    (lambda c: _group(c)["weights"].update(num_bits=4), r"weights\.strategy='channel'"),
    (lambda c: _group(c)["weights"].update(type="int"), r"weights\.type='int'"),
    (lambda c: _group(c)["weights"].update(symmetric=False), r"weights\.symmetric=False"),
    (lambda c: _group(c)["input_activations"].update(dynamic=False, strategy="tensor"),
     r"input_activations\.strategy='tensor'"),
    (lambda c: _group(c).update(format="naive-quantized"), r"format='naive-quantized'"),
    (lambda c: _group(c).update(output_activations={"num_bits": 8}), r"output_activations"),
])
def test_unsupported_config_refused_naming_the_field(fp8_ckpt, tmp_path, edit, match):
    bad = tmp_path / "bad"
    shutil.copytree(fp8_ckpt, bad)
    cfg = json.loads((bad / "config.json").read_text())
    edit(cfg)
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=match):
        inspect_checkpoint(bad)


def _edit_tensors(src, dst, edit, config_edit=None):
    shutil.copytree(src, dst)
    t = load_file(dst / "model.safetensors")
    edit(t)
    save_file(t, dst / "model.safetensors", metadata={"format": "pt"})
    if config_edit:
        cfg = json.loads((dst / "config.json").read_text())
        config_edit(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


GS = "model.language_model.layers.0.mlp.gate_proj.weight_global_scale"
PACKED = "model.language_model.layers.0.mlp.up_proj.weight_packed"
DOWN = "model.language_model.layers.0.mlp.down_proj.weight"


@pytest.mark.parametrize("edit,config_edit,match", [
    (lambda t: t.pop(GS), None, f"missing tensor.*{GS}"),
    (lambda t: t.update({PACKED: t[PACKED][:, :-1].contiguous()}), None, rf"{PACKED}: shape \[128, 31\]"),
    (lambda t: t.update({DOWN: t[DOWN].to(torch.bfloat16)}), None, rf"{DOWN}: unsupported dtype BF16.*F8_E4M3"),
    (lambda t: t.update({PACKED.replace("packed", "zero_point"): torch.zeros(1)}), None, "unexpected tensor"),
    # a bf16 checkpoint's tensors under a config that says they are quantized
    (lambda t: None, lambda c: c["quantization_config"]["config_groups"]["group_nvfp4"]["targets"].append(
        "model.language_model.layers.0.linear_attn.in_proj_a"), r"in_proj_a\.weight: stored unquantized.*group_nvfp4"),
    (lambda t: None, lambda c: c["quantization_config"].update(ignore=[]) or
     c["quantization_config"]["config_groups"]["group_fp8"]["targets"].append("model.visual.blocks.0.attn.qkv"),
     r"module model\.visual\.blocks\.0\.attn\.qkv: quantized by .*group_fp8.*ignore"),
])
def test_mismatched_quantized_checkpoint_fails_inspection(nvfp4_ckpt, tmp_path, edit, config_edit, match):
    bad = _edit_tensors(nvfp4_ckpt, tmp_path / "bad", edit, config_edit)
    with pytest.raises(CheckpointError, match=match):
        inspect_checkpoint(bad)


def test_pipeline_validation_catches_a_bad_quantized_checkpoint(nvfp4_ckpt, tmp_path):
    """The job's up-front check (before Ray starts) goes through inspect_checkpoint, and the model id names the
    precision even when the folder's name does not."""
    from pipeline.checkpoint import CheckpointError as PipelineCheckpointError
    from pipeline.checkpoint import validate

    bad = _edit_tensors(nvfp4_ckpt, tmp_path / "bad", lambda t: t.pop(GS))
    with pytest.raises(PipelineCheckpointError, match="weight_global_scale"):
        validate(str(bad))
    renamed = tmp_path / "ocria"
    shutil.copytree(nvfp4_ckpt, renamed)
    assert validate(str(renamed)).startswith("ocria-fp8+nvfp4-")


# ------------------------------------------------------------------ loading and running

def test_loaded_layout(fp8_ckpt, nvfp4_ckpt, src):
    eng = Engine.from_checkpoint(nvfp4_ckpt, max_num_seqs=2, num_blocks=32)
    lm = eng.model.language_model
    gdn = lm.layers[0].linear_attn.in_proj.weight
    assert isinstance(gdn, SplitWeight)  # [qkv | z] NVFP4, [b | a] bf16
    assert [type(p).__name__ for p in gdn.parts] == ["QuantWeight", "PlainWeight"]
    assert gdn.parts[0].kind == "nvfp4" and gdn.shape == (lm.layers[0].linear_attn.conv_dim + 64 + 8, 64)
    down = lm.layers[0].mlp.down_proj.weight
    assert isinstance(down, QuantWeight) and down.kind == "fp8" and down.act_fp8
    assert isinstance(lm.layers[3].self_attn.qkv_proj.weight, QuantWeight)  # q, k, v fused, one row scale each
    assert isinstance(eng.model.visual.blocks[0].attn.qkv.weight, torch.nn.Parameter)
    assert eng.model_id != Engine.from_checkpoint(fp8_ckpt, max_num_seqs=2, num_blocks=32).model_id


def test_weight_only_quantized_engine_equals_its_dequantized_weights(src, nvfp4_ckpt, tmp_path):
    """NVFP4 (and FP8 without activation quantization) only changes the weights: the engine on the quantized
    checkpoint gives the tokens and logits of the engine on the same weights dequantized into a plain checkpoint."""
    w8a16 = quantized(src, tmp_path / "w8a16", "fp8", NVFP4_RULES[:1] + [(r"mlp", "nvfp4")], act_fp8=False)
    img = np.random.default_rng(1).integers(0, 256, (60, 80, 3), dtype=np.uint8)
    sp = SamplingParams(max_tokens=8)
    for q in (w8a16, quantized(src, tmp_path / "nv_only", "nvfp4", NVFP4_RULES[:1])):
        plain = dequantized_copy(q, tmp_path / (q.name + "_deq"))
        outs = [Engine.from_checkpoint(c, dtype="float32", max_num_seqs=2, num_blocks=32).generate(
            [dict(prompt="Read.", image=img, sampling=sp, keep_logits=True, ignore_eos=True)])[0] for c in (q, plain)]
        assert outs[0].output_token_ids == outs[1].output_token_ids
        torch.testing.assert_close(outs[0].logits, outs[1].logits, atol=1e-4, rtol=1e-4)


def first_token_logits(ckpt, prompts):
    eng = Engine.from_checkpoint(ckpt, dtype="float32", max_num_seqs=4, num_blocks=64)
    sp = SamplingParams(max_tokens=1)
    outs = eng.generate([dict(prompt=p, image=im, sampling=sp, keep_logits=True) for p, im in prompts])
    return torch.stack([o.logits[0] for o in outs])


def test_quantized_logits_agree_with_bf16(src, fp8_ckpt, nvfp4_ckpt, tmp_path):
    """Next-token logits on 12 image+text prompts against the bf16 checkpoint: FP8 W8A8, FP8 weight-only and the
    NVFP4 mix. The tiny random model amplifies any weight error (FP8 weights alone, ~2 % per matrix, move its
    logits by ~18 %), so this checks orderings measured on the same prompts rather than absolute levels (those are
    measured on the trained ocria-tiny, bench/results/ocria_tiny_quant_quality.json): 8-bit weights closer than 4.5,
    the dynamic per-token activation quantization adding little to FP8's weight error, FP8's top-1 mostly kept."""
    rng = np.random.default_rng(7)
    prompts = [(f"Read page {i}.", rng.integers(0, 256, (40 + 8 * i, 64, 3), dtype=np.uint8)) for i in range(12)]
    ref = first_token_logits(src, prompts)
    w8a16 = quantized(src, tmp_path / "w8a16", "fp8", FP8_RULES, act_fp8=False)
    stats = {}
    for name, ck in (("fp8", fp8_ckpt), ("w8a16", w8a16), ("nvfp4", nvfp4_ckpt)):
        got = first_token_logits(ck, prompts)
        stats[name] = (float((got - ref).norm() / ref.norm()), float((got.argmax(-1) == ref.argmax(-1)).float().mean()))
    assert 0 < stats["w8a16"][0] <= stats["fp8"][0] < 1.5 * stats["w8a16"][0], stats
    assert stats["fp8"][0] < stats["nvfp4"][0] < 1.0, stats
    assert stats["fp8"][1] >= 0.75, stats


@pytest.mark.parametrize("which,kernels_used", [
    ("nvfp4_ckpt", {"nvfp4_linear_triton", "nvfp4_linear_triton swiglu", "fp8_linear_triton",
                    "silu_mul_quant_fp8_triton"}),
    ("fp8_ckpt", {"fp8_linear_triton", "fp8_linear_triton swiglu", "rmsnorm_quant_fp8_triton",
                  "silu_mul_quant_fp8_triton", "quant_fp8_per_token_triton"}),
])
def test_quantized_engine_on_the_triton_kernels(request, monkeypatch, which, kernels_used):
    """Every kernel forced to Triton (interpreter): decode projections run the quantized GEMVs (gate_up with its
    SwiGLU epilogue, as the bf16 GEMV does), FP8 activations come
    from the fused producers (RMSNorm + residual + quant before an FP8 gate_up, SiLU*mul + quant before an FP8
    down_proj) or the per-token quantizer, and the tokens and logits are those of the torch reference path."""
    import kernels.fp8_quant as fq
    import kernels.quant_linear as ql

    ckpt = request.getfixturevalue(which)
    img = np.random.default_rng(3).integers(0, 256, (50, 70, 3), dtype=np.uint8)
    sp = SamplingParams(max_tokens=4)
    req = [dict(prompt="Read.", image=img, sampling=sp, keep_logits=True, ignore_eos=True)]
    ref = Engine.from_checkpoint(ckpt, dtype="float32", max_num_seqs=2, num_blocks=32).generate(req)[0]
    calls = []
    for mod, name in ((ql, "nvfp4_linear_triton"), (ql, "fp8_linear_triton"), (fq, "silu_mul_quant_fp8_triton"),
                      (fq, "rmsnorm_quant_fp8_triton"), (fq, "quant_fp8_per_token_triton")):
        fn = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _fn=fn, _n=name, **k: (
            calls.append(_n + (" swiglu" if k.get("swiglu") else "")), _fn(*a, **k))[1])
    monkeypatch.setenv("OCRIA_FORCE_TRITON", "1")
    got = Engine.from_checkpoint(ckpt, dtype="float32", max_num_seqs=2, num_blocks=32).generate(req)[0]
    assert got.output_token_ids == ref.output_token_ids
    torch.testing.assert_close(got.logits, ref.logits, atol=2e-4, rtol=1e-4)
    assert kernels_used <= set(calls), sorted(set(calls))

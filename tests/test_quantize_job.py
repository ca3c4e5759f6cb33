"""jobs/quantize.py (pipeline.quantize.quantize_checkpoint_job): recipes (built-in and YAML), calibration with activation-aware scales on the sample pages, the
checkpoint it writes loads back in the engine, and mistakes fail with a line naming the fix."""
import kernels.testing  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is compiled)
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.interface import SamplingParams
from engine.llm_engine import Engine
from engine.testing import build_checkpoint
from pipeline.quantize import quantize_checkpoint_job as quantize

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def src(tmp_path_factory, tiny_tokenizer):
    return build_checkpoint(tmp_path_factory.mktemp("bf16"), tokenizer=tiny_tokenizer, seed=6, dtype=torch.bfloat16)


def test_awq_calibrated_nvfp4_checkpoint_loads_and_reads(src, tmp_path):
    out = tmp_path / "nv"
    assert quantize(src, "nvfp4", out, calib=ROOT / "samples" / "letter.pdf") == 0
    report = json.loads((out / "quantization_report.json").read_text())
    assert report["modules"] == {"fp8": 4, "nvfp4": 4 * 3 + 3 * 2 + 1 * 3}  # down FP8; qkv/z, q/k/v/o, gate/up NVFP4
    awq = report["awq"]
    assert len(awq) == 4 * 3  # per layer: the mixer's norm group, the MLP's norm group, down_proj through up_proj
    assert all(g["err"] <= g["rtn_err"] for g in awq.values())  # alpha 0 (RTN) is on the grid
    assert any(g["alpha"] > 0 for g in awq.values())
    assert report["calibration_files"] == [str(ROOT / "samples" / "letter.pdf")]
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == "compressed-tensors" and cfg["format"] == "mixed-precision"
    eng = Engine.from_checkpoint(out, max_num_seqs=2, num_blocks=32)
    img = np.random.default_rng(0).integers(0, 256, (60, 80, 3), dtype=np.uint8)
    o = eng.generate([dict(prompt="Read.", image=img, sampling=SamplingParams(max_tokens=6), ignore_eos=True)])[0]
    assert o.finish_reason == "length" and len(o.output_token_ids) == 6


def test_awq_folding_keeps_the_unquantized_function(src, tmp_path):
    """The scales folded into the norms and up_proj change nothing before quantization: an all-bf16 'quantization'
    with the same folds (scales searched for an FP8 plan, applied, nothing quantized) gives bf16's logits."""
    from engine.config import load_config
    from engine.quantize import BF16, _fold_awq, collect_calibration, plan_precisions
    from engine.checkpoint import inspect_checkpoint, iter_checkpoint_tensors
    from safetensors.torch import save_file
    import shutil

    cfg = load_config(src)
    images = [np.random.default_rng(i).integers(0, 256, (64, 96, 3), dtype=np.uint8) for i in range(2)]
    cal = collect_calibration(src, images)
    plan = plan_precisions(cfg, [], "fp8")
    w = {n: t.float() for n, t in iter_checkpoint_tensors(inspect_checkpoint(src))}
    report = {}
    _fold_awq(cfg, w, plan, cal, report)
    assert any(r["alpha"] > 0 for r in report.values())
    folded = tmp_path / "folded"
    shutil.copytree(src, folded)
    save_file(w, str(folded / "model.safetensors"), metadata={"format": "pt"})
    sp = SamplingParams(max_tokens=1)
    req = [dict(prompt="Read.", image=images[0], sampling=sp, keep_logits=True)]
    a, b = (Engine.from_checkpoint(c, dtype="float32", max_num_seqs=2, num_blocks=32).generate(req)[0].logits
            for c in (src, folded))
    torch.testing.assert_close(a, b, atol=2e-3, rtol=2e-3)  # bf16 source weights vs their fp32 folds
    assert BF16 == "bf16"


def test_yaml_recipe(src, tmp_path):
    recipe = tmp_path / "mix.yaml"
    recipe.write_text("default: bf16\nrules:\n  - {pattern: 'layers\\.0\\.mlp', precision: nvfp4}\n"
                      "  - {pattern: 'o_proj$', precision: fp8}\nfp8_activations: none\nawq: false\n")
    out = tmp_path / "q"
    assert quantize(src, str(recipe), out) == 0
    groups = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]
    assert sorted(groups["group_nvfp4"]["targets"]) == sorted(
        f"model.language_model.layers.0.mlp.{n}" for n in ("gate_proj", "up_proj", "down_proj"))
    assert groups["group_fp8"]["targets"] == ["model.language_model.layers.3.self_attn.o_proj"]
    assert groups["group_fp8"]["input_activations"] is None  # weight-only FP8
    Engine.from_checkpoint(out, max_num_seqs=2, num_blocks=32)


@pytest.mark.parametrize("recipe,match", [
    ("int4", "neither a built-in recipe"),
    ("{yaml}", "default\n  Input should be 'bf16', 'fp8' or 'nvfp4'"),
])
def test_mistakes_fail_with_a_clear_line(src, tmp_path, capsys, recipe, match):
    bad = tmp_path / "bad.yaml"
    bad.write_text("default: fp4\n")
    assert quantize(src, recipe.replace("{yaml}", str(bad)), tmp_path / "o") == 2
    assert match in capsys.readouterr().err


def test_the_command_line_runs_the_job(src, tmp_path):
    """jobs/quantize.py is a thin CLI: its flags reach the job and its exit status is the job's."""
    import subprocess
    import sys

    cmd = [sys.executable, str(ROOT / "jobs" / "quantize.py"), "--checkpoint", str(src), "--recipe", "int4",
           "--out", str(tmp_path / "o")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "neither a built-in recipe" in r.stderr


def test_refuses_quantized_input_and_nonempty_out(src, tmp_path, capsys):
    out = tmp_path / "q"
    assert quantize(src, "fp8", out, no_awq=True) == 0
    assert quantize(out, "fp8", tmp_path / "q2") == 2
    assert "quantized already" in capsys.readouterr().err
    assert quantize(src, "fp8", out, no_awq=True) == 2
    assert "not empty" in capsys.readouterr().err

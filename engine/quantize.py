"""Post-training quantization of a bf16 checkpoint into the compressed-tensors layout the engine (and vLLM) loads.

quantize_checkpoint(src, out, plan, ...): every decoder projection named in `plan` is written FP8 (per-channel
weight scales; activations dynamic per token unless act_fp8=False) or NVFP4 (engine/quant_codec.py); everything
else (vision tower, embeddings, tied head, norms, GDN conv1d/gates) is copied as it is. With calibration statistics
(Calibration, collected by running the engine on page images) each group of projections that reads one RMSNorm's
output gets activation-aware scales first (AWQ): per input channel s = mean|x|^alpha (normalised), the weights'
columns multiplied by s and the norm's (1 + w) divided by it, alpha picked per group on a grid by the output error
of the quantized projections on the calibration activations (alpha = 0 is plain round-to-nearest, so the search
never does worse on them). The MLP's down_proj gets its scales through up_proj's rows instead (silu(gate) * up is
linear in up). Scales are not searched for o_proj / out_proj, whose inputs come from attention / the gated norm.
"""
from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from engine.checkpoint import QUANTIZABLE, inspect_checkpoint, iter_checkpoint_tensors, text_prefix
from engine.config import ModelConfig
from engine.quant_codec import dequantize, quantize_fp8, quantize_nvfp4
from engine.quant_config import FP8, NVFP4, quant_config_dict

BF16 = "bf16"
PRECISIONS = (BF16, FP8, NVFP4)
ALPHAS = tuple(i / 20 for i in range(20))
# The built-in recipes (pipeline/quantize.py wraps them for jobs/quantize.py): (rules, default, whether the FP8
# projections quantize their activations per token; NVFP4 ones are weight-only on Hopper either way).
# The GDN gates' inputs stay bf16 (their outputs are 2 x value heads wide; published recipes keep them bf16); the
# NVFP4 mix keeps down_proj in FP8 (llm-compressor's non-uniform example: the most sensitive projection).
GDN_GATES_BF16 = ("in_proj_[ab]$", BF16)
BUILTIN_RECIPES = {
    FP8: ([GDN_GATES_BF16], FP8, True),
    NVFP4: ([GDN_GATES_BF16, (r"mlp\.down_proj$", FP8)], NVFP4, True),
}
# projections reading each norm's output (HF leaf names), and the weight-only pair (up rows scale down's input)
NORM_GROUPS = {"input_layernorm": (("linear_attn.", ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")),
                                   ("self_attn.", ("q_proj", "k_proj", "v_proj"))),
               "post_attention_layernorm": (("mlp.", ("gate_proj", "up_proj")),)}


def decoder_projections(cfg: ModelConfig) -> list[str]:
    """HF module names of every quantizable decoder projection, in layer order."""
    p = text_prefix(cfg)
    out = []
    for i, kind in enumerate(cfg.text.layer_types):
        mixer = (("self_attn.", ("q_proj", "k_proj", "v_proj", "o_proj")) if kind == "full_attention" else
                 ("linear_attn.", ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")))
        out += [f"{p}layers.{i}.{mixer[0]}{n}" for n in mixer[1]]
        out += [f"{p}layers.{i}.mlp.{n}" for n in ("gate_proj", "up_proj", "down_proj")]
    return out


def builtin_plan(cfg: ModelConfig, name: str) -> tuple[dict[str, str], bool]:
    """A built-in recipe's plan (module -> precision) and whether its FP8 projections quantize activations."""
    rules, default, act_fp8 = BUILTIN_RECIPES[name]
    return plan_precisions(cfg, rules, default), act_fp8


def plan_precisions(cfg: ModelConfig, rules: list[tuple[str, str]], default: str) -> dict[str, str]:
    """Module -> precision for every decoder projection: the first rule whose regex is found in the module name
    (re.search), else `default`."""
    for pattern, prec in rules:
        if prec not in PRECISIONS:
            raise ValueError(f"recipe rule {pattern!r}: precision {prec!r} unknown (one of {', '.join(PRECISIONS)})")
        re.compile(pattern)
    if default not in PRECISIONS:
        raise ValueError(f"recipe default precision {default!r} unknown (one of {', '.join(PRECISIONS)})")
    plan = {}
    for m in decoder_projections(cfg):
        plan[m] = next((prec for pattern, prec in rules if re.search(pattern, m)), default)
    return plan


@dataclass
class Calibration:
    """Per projection input (HF module name of its first consumer -> stats): mean |x| per channel and a sample of
    rows, collected from the engine's prefill on calibration pages (collect_calibration)."""
    mean_abs: dict[str, torch.Tensor] = field(default_factory=dict)
    sample: dict[str, torch.Tensor] = field(default_factory=dict)
    tokens: int = 0


def _quant_error(x: torch.Tensor, w: torch.Tensor, prec: str) -> torch.Tensor:
    """||x W^T - x Q(W)^T||^2 for one weight (fp32)."""
    q = dequantize(dict(zip(("weight", "weight_scale"), quantize_fp8(w))), FP8) if prec == FP8 else \
        dequantize(dict(zip(("weight_packed", "weight_scale", "weight_global_scale"), quantize_nvfp4(w))), NVFP4)
    return (x @ (w - q).T).pow(2).sum()


def search_scale(x: torch.Tensor, mean_abs: torch.Tensor, weights: list[tuple[torch.Tensor, str]]):
    """AWQ's grid search: the per-channel scale s (x / s, W * s) minimising the summed output error of the quantized
    `weights` on activations x [T, K]. Returns (s, alpha, error at alpha, error at alpha 0)."""
    best = None
    base = None
    for alpha in ALPHAS:
        s = mean_abs.clamp(min=1e-4).pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        xs = x / s
        err = sum(float(_quant_error(xs, w * s, prec)) for w, prec in weights)
        if alpha == 0:
            base = err
        if best is None or err < best[2]:
            best = (s, alpha, err)
    return best[0], best[1], best[2], base


def collect_calibration(checkpoint: str | Path, images: list, prompt: str | None = None, max_rows: int = 512,
                        max_new_tokens: int = 1) -> Calibration:
    """Run the bf16 checkpoint (CPU, fp32) on `images` and record every decoder projection's input: running
    mean |x| per channel and up to `max_rows` rows (evenly strided) for the scale search."""
    from engine.llm_engine import Engine
    from engine.interface import DEFAULT_PROMPT, SamplingParams
    from engine.models.layers import DecodeProjections

    eng = Engine.from_checkpoint(checkpoint, device="cpu", dtype="float32", enforce_eager=True, max_num_seqs=1)
    cfg = eng.cfg
    names = {}
    for n, m in eng.model.language_model.named_modules():
        if hasattr(m, "weight") and n.rsplit(".", 1)[-1] in ("qkv_proj", "gate_up_proj", "in_proj", "down_proj"):
            hf = {"qkv_proj": "q_proj", "gate_up_proj": "gate_proj", "in_proj": "in_proj_qkv"}.get(
                n.rsplit(".", 1)[-1], "down_proj")
            names[id(m.weight)] = f"{text_prefix(cfg)}{n.rsplit('.', 1)[0]}.{hf}"
    sums: dict[str, torch.Tensor] = {}
    rows: dict[str, list[torch.Tensor]] = {}
    counts: dict[str, int] = {}

    class Recorder(DecodeProjections):
        def linear(self, x, weight, swiglu=False):
            name = names.get(id(weight))
            if name is not None:
                xf = x.detach().float()
                sums[name] = sums.get(name, 0) + xf.abs().sum(0)
                counts[name] = counts.get(name, 0) + xf.shape[0]
                rows.setdefault(name, []).append(xf[:: max(1, xf.shape[0] // 64)])
            return super().linear(x, weight, swiglu)

    eng.model.use(replace(eng.model.path, proj=Recorder()))
    sampling = SamplingParams(max_tokens=max_new_tokens)
    for im in images:
        eng.generate([dict(prompt=prompt or DEFAULT_PROMPT, image=im, sampling=sampling)])
    cal = Calibration()
    for name, total in sums.items():
        cal.mean_abs[name] = total / counts[name]
        r = torch.cat(rows[name])
        cal.sample[name] = r[torch.linspace(0, r.shape[0] - 1, min(max_rows, r.shape[0])).long()]
    cal.tokens = max(counts.values(), default=0)
    return cal


def _fold_awq(cfg: ModelConfig, weights: dict[str, torch.Tensor], plan: dict[str, str], cal: Calibration,
              report: dict) -> None:
    """Apply searched scales in place on the fp32 `weights` (HF names)."""
    p = text_prefix(cfg)
    for i in range(cfg.text.num_hidden_layers):
        lp = f"{p}layers.{i}."
        for norm, groups in NORM_GROUPS.items():
            for mixer, leaves in groups:
                mods = [lp + mixer + n for n in leaves]
                if not all(m + ".weight" in weights for m in mods) or mods[0] not in cal.sample:
                    continue
                quantized = [(weights[m + ".weight"], plan[m]) for m in mods if plan[m] != BF16]
                if not quantized:
                    continue
                s, alpha, err, base = search_scale(cal.sample[mods[0]], cal.mean_abs[mods[0]], quantized)
                report[mods[0]] = dict(alpha=alpha, err=err, rtn_err=base)
                if alpha == 0:
                    continue
                nw = weights[lp + norm + ".weight"]
                weights[lp + norm + ".weight"] = (1.0 + nw) / s - 1.0  # zero-centred RMSNorm: y = n(x) * (1 + w)
                for m in mods:
                    weights[m + ".weight"] = weights[m + ".weight"] * s
        up, down = lp + "mlp.up_proj", lp + "mlp.down_proj"
        if plan.get(down, BF16) != BF16 and down in cal.sample:
            s, alpha, err, base = search_scale(cal.sample[down], cal.mean_abs[down],
                                               [(weights[down + ".weight"], plan[down])])
            report[down] = dict(alpha=alpha, err=err, rtn_err=base)
            if alpha:
                weights[up + ".weight"] = weights[up + ".weight"] / s[:, None]
                weights[down + ".weight"] = weights[down + ".weight"] * s


def quantize_tensors(cfg: ModelConfig, tensors: dict[str, torch.Tensor], plan: dict[str, str], act_fp8: bool = True,
                     calibration: Calibration | None = None) -> tuple[dict[str, torch.Tensor], dict, dict]:
    """HF-named tensors of a bf16 model -> (the quantized checkpoint's tensors, its quantization_config, a report of
    the AWQ search per group). Unplanned tensors keep their dtype; works on any device."""
    unknown = set(plan) - set(decoder_projections(cfg))
    if unknown:
        raise ValueError(f"plan names modules that are not decoder projections: {sorted(unknown)[:3]}")
    awq: dict = {}
    weights = dict(tensors)
    if calibration is not None:
        weights = {n: t.float() for n, t in tensors.items()}
        _fold_awq(cfg, weights, plan, calibration, awq)
    out: dict[str, torch.Tensor] = {}
    groups: dict[str, list[str]] = {FP8: [], NVFP4: []}
    for name, w in weights.items():
        module = name.removesuffix(".weight")
        prec = plan.get(module, BF16) if name.endswith(".weight") else BF16
        if prec == FP8:
            out[name], out[module + ".weight_scale"] = quantize_fp8(w)
        elif prec == NVFP4:
            out[module + ".weight_packed"], out[module + ".weight_scale"], out[module + ".weight_global_scale"] = \
                quantize_nvfp4(w)
        else:
            out[name] = w.to(tensors[name].dtype).contiguous()
        if prec != BF16:
            groups[prec].append(module)
    cg = {f"group_{k}": (v, k, act_fp8 if k == FP8 else False) for k, v in groups.items() if v}
    return out, quant_config_dict(cg, ["lm_head", "re:.*visual.*"]), awq


def dequantize_tensors(tensors: dict[str, torch.Tensor], quant_config: dict, dtype=None) -> dict[str, torch.Tensor]:
    """A quantized checkpoint's tensors (HF names) -> a plain checkpoint's holding exactly the weights they encode:
    every quantized module's weight dequantized (to `dtype`, else fp32), the rest as stored (cast to `dtype` when
    given). The twin that tells a kernel's error from quantization's."""
    from engine.quant_config import parse_quant_config

    qc = parse_quant_config(quant_config)
    by_module: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        module, _, local = name.rpartition(".")
        by_module.setdefault(module, {})[local] = t
    out = {}
    for module, mine in by_module.items():
        s = qc.scheme_for(module)
        if s is None:
            for local, t in mine.items():
                out[f"{module}.{local}"] = t if dtype is None else t.to(dtype)
        else:
            w = dequantize(mine, s.weights)
            out[module + ".weight"] = w if dtype is None else w.to(dtype)
    return out


def quantized_info(meta: dict, src: Path, name: str, recipe_note: str, modules: dict) -> dict:
    """The source's ocria_info.json (how the job reads pages with it: glyph size, blocks, ...) for its quantized copy:
    renamed, its note saying what it is, and the source's measured CER kept under a name that says whose it is."""
    meta = dict(meta)
    if "name" in meta:
        meta["name"] = name
    if "heldout_synthetic_cer" in meta:
        meta["source_heldout_synthetic_cer"] = meta.pop("heldout_synthetic_cer")
    if meta.get("note"):
        meta["note"] = f"{src.name} quantized ({', '.join(f'{n} {k}' for k, n in modules.items())} projections; " \
                       f"ocria_info.json's quantization). The source's note: " + meta["note"]
    meta["quantization"] = dict(source=str(src), note=recipe_note, modules=modules)
    return meta


def quantize_checkpoint(src: str | Path, out: str | Path, plan: dict[str, str], act_fp8: bool = True,
                        calibration: Calibration | None = None, recipe_note: str = "") -> dict:
    """Write `src` quantized by `plan` (module -> bf16/fp8/nvfp4) to `out`; returns a report (per-group AWQ alpha and
    errors, bytes). The output folder gets every non-weight file of `src` and a config.json with the
    quantization_config."""
    from safetensors.torch import save_file

    src, out = Path(src), Path(out)
    info = inspect_checkpoint(src)
    if info.config.quant is not None:
        raise ValueError(f"{src} is quantized already (config.json has a quantization_config): start from bf16")
    tensors = dict(iter_checkpoint_tensors(info))
    outt, qc, awq = quantize_tensors(info.config, tensors, plan, act_fp8, calibration)
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy2(f, out / f.name)
    save_file(outt, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = qc
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    modules = {k.removeprefix("group_"): len(g["targets"]) for k, g in qc["config_groups"].items()}
    info_file = out / "ocria_info.json"
    if info_file.is_file() or recipe_note:
        meta = json.loads(info_file.read_text()) if info_file.is_file() else {}
        info_file.write_text(json.dumps(quantized_info(meta, src, out.name, recipe_note, modules), indent=2) + "\n")
    nbytes = lambda d: sum(t.numel() * t.element_size() for t in d.values())  # noqa: E731
    return {"awq": awq, "modules": modules, "bytes": {"source": nbytes(tensors), "quantized": nbytes(outt)}}


__all__ = ["ALPHAS", "BF16", "BUILTIN_RECIPES", "Calibration", "PRECISIONS", "QUANTIZABLE", "builtin_plan",
           "collect_calibration", "dequantize_tensors", "decoder_projections",
           "plan_precisions", "quantize_checkpoint", "quantize_tensors", "search_scale"]

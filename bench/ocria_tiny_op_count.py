"""How many torch ops one ocria-tiny training step dispatches, by part of the model (vision tower, Gated DeltaNet
layers, attention layers, the rest), forward and backward: a CPU stand-in for the GPU profile that hung on the H200.
On the GPU each op costs host time to dispatch (views included) and each compute op a kernel launch, however small
its tensors, so a part with many ops is bound by the host, not by arithmetic.

  .venv/bin/python bench/ocria_tiny_op_count.py --model build/cand_f2 [--gdn chunked] \
      --config bench/results/ocria_tiny_eval_full_pages_1536_config.yaml --out bench/results/ocria_tiny_op_count_1536.json
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path


def count_ops(model, inputs: dict) -> dict:
    """Ops dispatched by one forward (per part) and the backward of its loss (all parts together: autograd runs the
    backward outside the modules' hooks), under bf16 autocast as in training."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    parts: list[str] = []  # the part whose forward is running (innermost last)
    hooks = []

    def leave(module, args, output) -> None:  # a forward hook that returned a value would replace the output
        parts.pop()

    for name, module in model.named_modules():
        if name.endswith("visual"):
            part = "vision"
        elif name.count(".") == 3 and ".layers." in name:
            part = "gated_deltanet" if hasattr(module, "linear_attn") else "attention"
        else:
            continue
        hooks += [module.register_forward_pre_hook(lambda mod, args, part=part: parts.append(part)),  # returns None
                  module.register_forward_hook(leave)]
    forward, backward = collections.Counter(), collections.Counter()

    class Counter(TorchDispatchMode):
        def __init__(self, counts, by_part: bool):
            super().__init__()
            self.counts, self.by_part = counts, by_part

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.counts[(parts[-1] if parts else "rest") if self.by_part else "all"] += 1
            return func(*args, **(kwargs or {}))

    t0 = time.time()
    with Counter(forward, True), torch.autocast("cpu", dtype=torch.bfloat16):  # as jobs.train_tiny trains
        loss = model(**inputs).loss
    t1 = time.time()
    with Counter(backward, False):
        loss.backward()
    t2 = time.time()
    for hook in hooks:
        hook.remove()
    assert torch.isfinite(loss)
    return {"forward_ops": dict(forward), "backward_ops": backward["all"],
            "cpu_forward_s": round(t1 - t0, 1), "cpu_backward_s": round(t2 - t1, 1)}


def main(argv: list[str] | None = None) -> dict:
    import contextlib

    import torch
    from transformers import Qwen3_5ForConditionalGeneration
    from transformers.models.qwen3_5 import modeling_qwen3_5

    from jobs.chunked_gdn import chunked_gdn_in
    from jobs.train_tiny import (
        PromptBuilder,
        encode_page,
        encoded_batch,
        load_config,
        load_image_processor,
        model_inputs,
        synth_config,
    )
    from pipeline.synthetic import TextPool, make_page

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="merged checkpoint folder (weights + processor files)")
    ap.add_argument("--config", type=Path, default=Path("configs/train_tiny.yaml"), help="page distribution")
    ap.add_argument("--synth", type=Path, default=Path(".synth"))
    ap.add_argument("--pages", type=int, default=1)
    ap.add_argument("--gdn", choices=["transformers", "chunked"], default="transformers",
                    help="gated delta rule: transformers' torch fallback or jobs.chunked_gdn")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    cfg = load_config(args.config, [])
    pool = TextPool.from_json_gz(args.synth / "pool_train.json.gz")
    processor, builder = load_image_processor(args.model), PromptBuilder(args.model, cfg["prompt"])
    merge = cfg["model"]["vision"]["spatial_merge_size"]
    pages = [make_page(cfg["data"]["seed"] + i, pool, synth_config(cfg), args.synth / "fonts") for i in range(args.pages)]
    items = [encode_page(p.image, p.markdown, processor, builder, merge, cfg["data"]["max_answer_tokens"])
             for p in pages]
    batch = encoded_batch(items, builder, processor)
    model = Qwen3_5ForConditionalGeneration.from_pretrained(args.model, dtype=torch.float32).train()
    res = {"command": "python bench/ocria_tiny_op_count.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "pages": args.pages, "tokens_per_page": batch["input_ids"].shape[1],
           "patches": int(batch["pixel_values"].shape[0]),
           "layers": {"gated_deltanet": sum(t == "linear_attention" for t in model.config.text_config.layer_types),
                      "attention": sum(t == "full_attention" for t in model.config.text_config.layer_types)},
           "gated_delta_rule": args.gdn}
    with chunked_gdn_in(modeling_qwen3_5) if args.gdn == "chunked" else contextlib.nullcontext():
        res |= count_ops(model, model_inputs(batch))
    print(json.dumps(res))
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()

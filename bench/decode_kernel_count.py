"""Count the kernels one decode step of the engine's GPU path launches (what a decode CUDA graph replays), per layer
kind and per op, on CPU: every kernel is forced to its Triton version (run by the interpreter) and the step is
instrumented.

  - Triton kernels: each launch of an interpreted @triton.jit function counts 1 (the torch work the interpreter
    does internally is not counted).
  - torch ops: each aten op that runs on the device counts 1 (a GEMM is cuBLAS: 1, or 2 with a split-K reduction);
    views and allocations (empty*) count 0.
  - glue ops (engine/models/glue.py) are torch.compile'd on CUDA: each call is one inductor region, counted as
    --glue-kernels launches (default 1, a lower bound; --inductor measures it by compiling them for the CPU, where
    inductor fuses the same way). On the H200 the compiled regions launched 3-4 kernels each
    (h200_decode_profile.json, since removed, in git at d5d8487: 521 kernels per default step at b1, not 370).

The model is the tiny config with the 4B's layer stack (32 layers, 24 GDN + 8 attention) and the benchmark's context
size, so the attention split into partitions matches the 4B shape too. Prints a table per layer kind for each
variant (bench.engine_bench.variant_short_names; by default the engine's defaults and the attention inputs through
the compiled glue and a KV store instead of their fused kernel).

    python bench/decode_kernel_count.py [--batch 1] [--variants default,unfused_attn,...] [--json OUT.json] [--inductor]
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from bench import harness  # noqa: E402
from bench.op_names import NO_DEVICE_WORK  # noqa: E402

GEMMS = {"mm", "addmm", "bmm", "matmul", "linear"}


class StepCounter(TorchDispatchMode):
    """Records (scope, op) for every device op and Triton launch; `scope` is set by module hooks."""

    def __init__(self):
        super().__init__()
        self.scope = "embed+rope"
        self.counts: Counter = Counter()
        self.muted = 0

    def add(self, name: str, n: int = 1) -> None:
        if n:
            self.counts[(self.scope, name)] += n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.muted:
            op = func.overloadpacket.__name__
            if op not in NO_DEVICE_WORK:
                self.add(f"gemm ({op})" if op in GEMMS else f"torch {op}")
        return func(*args, **(kwargs or {}))

    @contextmanager
    def mute(self):
        self.muted += 1
        try:
            yield
        finally:
            self.muted -= 1


@contextmanager
def forced_triton():
    """Every kernel forced to Triton (OCRIA_FORCE_TRITON=1) for the duration: the engine built in it takes its GPU
    code path (e.g. the decode GEMVs) and its kernels run in the interpreter."""
    forced = os.environ.get("OCRIA_FORCE_TRITON")
    os.environ["OCRIA_FORCE_TRITON"] = "1"
    try:
        yield
    finally:
        if forced is None:
            os.environ.pop("OCRIA_FORCE_TRITON")
        else:
            os.environ["OCRIA_FORCE_TRITON"] = forced


@contextmanager
def count_triton_launches(counter: StepCounter):
    """Each interpreted Triton launch counted, with every kernel forced to Triton for the duration."""
    from triton.runtime.interpreter import InterpretedFunction

    run = InterpretedFunction.run

    def counted(self, *args, **kwargs):
        if not kwargs.get("warmup"):
            counter.add(f"triton {self.__name__}")
        with counter.mute():
            return run(self, *args, **kwargs)

    InterpretedFunction.run = counted
    try:
        with forced_triton():
            yield
    finally:
        InterpretedFunction.run = run


class CountedGlue:
    """Stands in for a layer's Glue: runs the eager functions but counts each call as one compiled region."""

    def __init__(self, glue, counter: StepCounter, kernels_per_call: dict):
        self._glue, self._counter, self._k = glue, counter, kernels_per_call

    def __getattr__(self, name):
        fn = getattr(self._glue, name)

        def call(*args):
            self._counter.add(f"inductor {name}", self._k.get(name, 1))
            with self._counter.mute():
                return fn(*args)
        return call


def inductor_kernels_per_glue_call(cfg) -> dict:
    """Kernels inductor generates for each glue function (compiled for the CPU, dynamic shapes)."""
    import torch._inductor.metrics as metrics

    from engine.models import glue as glue_mod

    t = cfg.text
    n = 3
    qkv = torch.randn(n, (2 * t.num_attention_heads + 2 * t.num_key_value_heads) * t.head_dim)
    att = (qkv, torch.randn(t.head_dim), torch.randn(t.head_dim), torch.randn(n, t.rotary_dim),
           torch.randn(n, t.rotary_dim), t.rms_norm_eps, t.num_attention_heads, t.num_key_value_heads, t.head_dim)
    q, _, _, gate = glue_mod.attention_inputs(*att)
    calls = {"attention_inputs": att, "gdn_gates": (torch.randn(n, 2 * t.linear_num_value_heads),
                                                    torch.randn(t.linear_num_value_heads),
                                                    torch.randn(t.linear_num_value_heads)),
             "gated_output": (q, gate), "gated_output (fused path: 3-D gate view)":
             (q, qkv[:, :2 * t.num_attention_heads * t.head_dim].view(n, t.num_attention_heads, -1)[..., t.head_dim:])}
    out = {}
    for name, args in calls.items():
        fn = getattr(glue_mod, name.split(" ")[0])
        torch._dynamo.reset()
        metrics.reset()
        with torch.no_grad():
            torch.compile(fn, dynamic=True, fullgraph=True)(*args)
        out[name] = metrics.generated_kernel_count
    return out


def build_engine(batch: int, variant: str, layers: int, drafter_dir: str | None = None, block: int = 16):
    """The tiny config with the 4B's layer stack; with drafter_dir, a random drafter of the shipped drafter's shape
    (4 layers, 4 taps, the given block) written there and loaded."""
    from engine.config import parse_config
    from engine.llm_engine import Engine
    from engine.testing import write_random_drafter
    from bench.engine_bench import build_hf_model, hf_config, variant_args

    hf_cfg = hf_config(tiny=True)
    hf_cfg.text_config.num_hidden_layers = layers
    hf_cfg.text_config.layer_types = ["linear_attention" if (i + 1) % 4 else "full_attention" for i in range(layers)]
    cfg = parse_config(hf_cfg.to_dict())
    hf = build_hf_model(hf_cfg, "cpu", torch.float32)
    max_len = 2080  # the 4B benchmark's max_model_len: sizes the block tables, hence the attention partitions
    extra = {}
    if drafter_dir is not None:
        write_random_drafter(drafter_dir, cfg.text, num_layers=4, num_taps=4, block_size=block)
        extra = dict(speculative=dict(drafter=drafter_dir, max_batch=None))
    args = variant_args(variant, max_num_seqs=max(batch, 1), max_model_len=max_len, block_size=32,
                        num_blocks=batch * (max_len // 32) + 1, **extra)
    return Engine(cfg, hf.state_dict().items(), device="cpu", dtype=torch.float32, **args), cfg


def count_decode_step(batch: int, variant: str, layers: int, glue_kernels: dict) -> tuple[Counter, list[str]]:
    with forced_triton():
        eng, cfg = build_engine(batch, variant, layers)
    runner, lm = eng.runner, eng.model.language_model
    per_seq = runner.cache.max_blocks_per_seq
    ctx = 600  # a context past the first attention partition
    runner.decode_inputs.fill(positions=[ctx - 1] * batch,
                              slot_mapping=[b * per_seq * 32 + ctx - 1 for b in range(batch)],
                              state_idx=list(range(batch)), context_lens=[ctx] * batch,
                              block_tables=[list(range(b * per_seq, (b + 1) * per_seq)) for b in range(batch)],
                              padded=batch)
    counter = StepCounter()
    hooks = scope_layers(eng.model, counter, glue_kernels)
    with torch.no_grad(), count_triton_launches(counter), counter:
        runner._decode_forward(batch)  # exactly what capture_decode_graphs records in the graph
    for h in hooks:
        h.remove()
    return counter.counts, [layer.kind for layer in lm.layers]


def scope_layers(model, counter: StepCounter, glue_kernels: dict) -> list:
    """Each layer's ops counted under "layer i", the final norm's and head's under theirs, each glue call as its
    compiled regions; returns the hooks to remove."""
    hooks, lm = [], model.language_model
    model.use(replace(model.path, glue=CountedGlue(model.path.glue, counter, glue_kernels)))
    for i, layer in enumerate(lm.layers):
        hooks.append(layer.register_forward_pre_hook(lambda m, a, i=i: setattr(counter, "scope", f"layer {i}")))
    hooks.append(lm.norm.register_forward_pre_hook(lambda m, a: setattr(counter, "scope", "final norm + head")))
    return hooks


def count_spec_step(batch: int, variant: str, layers: int, glue_kernels: dict, block: int) -> tuple[Counter, list[str]]:
    """One greedy speculative step (engine/speculative.SpecDecoder.greedy_step on engine/spec_graphs' static
    buffers: what its CUDA graph replays) of `batch` sequences at a context of 600 tokens, every block full."""
    import tempfile

    from engine.speculative import StepTensors

    with tempfile.TemporaryDirectory() as tmp, forced_triton():
        eng, cfg = build_engine(batch, variant, layers, drafter_dir=tmp, block=block)
    runner, lm, spec = eng.runner, eng.model.language_model, eng.spec
    per_seq = runner.cache.max_blocks_per_seq
    T, ctx = spec.T, 600
    i = [ctx - 1 + j for b in range(batch) for j in range(T)]  # cache index of each block row
    slots = [b * per_seq * 32 + x for b in range(batch) for x in i[b * T:(b + 1) * T]]
    tables = [list(range(b * per_seq, (b + 1) * per_seq)) for b in range(batch) for _ in range(T)]
    rows = StepTensors(*(torch.tensor(v, dtype=dt) for v, dt in (
        (i, torch.int64), (i, torch.int64), (slots, torch.int64), ([x + 1 for x in i], torch.int32),
        ([ctx - 1 + T] * (batch * T), torch.int32), (tables, torch.int32), (list(range(batch)), torch.int64),
        ([T] * batch, torch.int64))))
    counter = StepCounter()
    hooks = scope_layers(eng.model, counter, glue_kernels)

    def scoped(obj, name, scope, after):  # the calls of obj.name counted under `scope`, later ones under `after`
        fn = getattr(obj, name)

        def call(*a, **k):
            counter.scope = scope
            out = fn(*a, **k)
            counter.scope = after
            return out
        setattr(obj, name, call)

    spec.drafter.fuse_projections()  # done once, by the warm-up step before capture
    spec.drafter.use_glue(CountedGlue(spec.drafter.glue, counter, {}))  # compiled on CUDA: one region per call
    scoped(spec, "propose", "draft", "draft")
    scoped(spec, "verify", "embed+rope", "accept + next token")
    scoped(spec, "commit", "commit", "accept + next token")
    scoped(spec.drafter, "write_context", "drafter context", "final norm + head")
    with torch.no_grad(), count_triton_launches(counter), counter:
        counter.scope = "draft"
        spec.greedy_step(rows)
    for h in hooks:
        h.remove()
    return counter.counts, [layer.kind for layer in lm.layers]


def summarise(counts: Counter, kinds: list[str]) -> dict:
    """Per layer kind: ops of one layer (all layers of a kind launch the same ops) and totals."""
    kind_of = {f"layer {i}": k for i, k in enumerate(kinds)}
    per_kind: dict[str, Counter] = {}
    for (scope, op), n in counts.items():
        per_kind.setdefault(kind_of.get(scope, scope), Counter())[op] += n
    n_of = Counter(kinds)
    out = {}
    for kind, ops in per_kind.items():
        layers = n_of.get(kind, 1)
        # per layer: a mean where layers of one kind differ (a speculative step's tapped layers copy their output)
        out[kind] = dict(layers=layers, per_layer={op: v // layers if v % layers == 0 else round(v / layers, 2)
                                                   for op, v in sorted(ops.items())},
                         per_layer_total=sum(ops.values()) // layers, total=sum(ops.values()))
    out["step_total"] = sum(v["total"] for k, v in out.items())
    return out


def print_table(title: str, s: dict) -> None:
    print(f"\n== {title}: {s['step_total']} kernels per step")
    for kind, v in s.items():
        if kind == "step_total":
            continue
        print(f"  {kind} (x{v['layers']}): {v['per_layer_total']} per layer, {v['total']} in all")
        for op, n in v["per_layer"].items():
            print(f"      {n:>5}  {op}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--layers", type=int, default=32, help="decoder layers (every 4th is attention, as in the 4B)")
    ap.add_argument("--glue-kernels", type=int, default=1, help="launches per compiled glue call (lower bound 1)")
    ap.add_argument("--inductor", action="store_true", help="measure launches per glue call with inductor (CPU)")
    ap.add_argument("--variants", default="default,unfused_attn",
                    help="names from bench.engine_bench.variant_short_names, the first the baseline")
    ap.add_argument("--spec", type=int, default=0, metavar="BLOCK",
                    help="count one greedy speculative step (draft + verify + accept + commit) at this block instead")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from engine.config import parse_config
    from bench.engine_bench import VARIANTS, hf_config, variant_short_names

    names = variant_short_names()
    variants = args.variants.split(",")
    if not set(variants) <= set(names):
        ap.error(f"--variants: some of {', '.join(names)}, got {args.variants}")

    glue_kernels = {}
    if args.inductor:
        glue_kernels = inductor_kernels_per_glue_call(parse_config(hf_config(tiny=True).to_dict()))
        print("inductor kernels per glue call (CPU codegen):", glue_kernels)
        glue_kernels["gated_output"] = max(glue_kernels.pop("gated_output"),
                                           glue_kernels.pop("gated_output (fused path: 3-D gate view)"))
    else:
        glue_kernels = {n: args.glue_kernels for n in ("attention_inputs", "gated_output", "gdn_gates")}
    result = dict(batch=args.batch, layers=args.layers, glue_kernels_per_call=glue_kernels)
    if args.spec:
        result["spec_block"] = args.spec
    for name in variants:
        if args.spec:
            counts, kinds = count_spec_step(args.batch, names[name], args.layers, glue_kernels, args.spec)
        else:
            counts, kinds = count_decode_step(args.batch, names[name], args.layers, glue_kernels)
        result[name] = summarise(counts, kinds)
        print_table(f"{name} {VARIANTS[names[name]]}, batch {args.batch}", result[name])
    base = result[variants[0]]["step_total"]
    for name in variants[1:]:
        n = result[name]["step_total"]
        print(f"kernels per decode step: {variants[0]} {base} -> {name} {n} ({base - n} fewer, "
              f"{100 * (base - n) / base:.0f}%)")
    if args.json:
        step = f"one greedy speculative step (block {args.spec})" if args.spec else "one decode step"
        harness.write_result(args.json, result, harness.result_meta(
            __file__, f"kernels {step} launches at batch {args.batch}, {args.layers} layers, per variant "
            f"({', '.join(variants)}), counted on the CPU with every kernel forced to Triton (each compiled glue call "
            f"counted as glue_kernels_per_call launches)", argv, "cpu"), indent=2)
    return result


if __name__ == "__main__":
    main()

"""Host time of a speculative step's inputs: SpecDecoder.plan + SpecGraphs.fill per step, at several batch sizes.

The host collects every speculative step before it plans the next (a block's length is known only after acceptance),
so this time is not hidden behind the device. Baseline in the same run: the same plan's block tables built and copied
one row per block row (S x T rows, as the step used to), instead of one per sequence repeated on the device.

    python bench/spec_host_cost.py --batches 1 32 128 --out bench/results/spec_host_cost_cpu.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from engine.interface import SamplingParams  # noqa: E402
from engine.llm_engine import Engine  # noqa: E402


def per_call_ms(fn, reps: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return 1e3 * (time.perf_counter() - t) / reps


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default=str(ROOT / "models" / "ocria-tiny"))
    p.add_argument("--drafter", default=str(ROOT / "models" / "ocria-tiny-drafter"))
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128])
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    rows = []
    for B in args.batches:
        eng = Engine.from_checkpoint(args.checkpoint, dtype="float32", max_num_seqs=B, kv_cache_memory_gb=1.0,
                                     speculative=dict(drafter=args.drafter, max_batch=None))
        rng = np.random.default_rng(0)
        for i in range(B):
            eng.add_request(f"r{i}", prompt_token_ids=rng.integers(0, 4000, 30).tolist(), ignore_eos=True,
                            sampling=SamplingParams(max_tokens=64))
        while len(eng.scheduler.running) < B or any(s.num_output == 0 for s in eng.scheduler.running):
            eng.step()
        seqs, spec = list(eng.scheduler.running), eng.spec
        T, graphs = spec.T, spec.graphs
        padded = next(s for s in graphs.sizes if s >= B)

        def step_inputs():
            graphs.fill(spec.plan(seqs), padded)

        def per_row_tables():  # the baseline: the plan's tables repeated per block row, zero-padded, copied
            plan = spec.plan(seqs)
            rows_t = np.zeros((padded * T, graphs.max_blocks), dtype=np.int32)
            rows_t[:B * T, :plan.tables.shape[1]] = np.repeat(plan.tables, T, axis=0)
            scratch.copy_(torch.from_numpy(rows_t))
            graphs.fill(plan, padded)

        scratch = torch.zeros(padded * T, graphs.max_blocks, dtype=torch.int32)
        row = {"batch": B, "block": T, "table_columns": graphs.max_blocks,
               "plan_fill_ms": round(per_call_ms(step_inputs, args.reps), 4),
               "plan_fill_per_row_tables_ms": round(per_call_ms(per_row_tables, args.reps), 4),
               "table_bytes_copied": padded * graphs.max_blocks * 4,
               "table_bytes_copied_per_row": padded * T * graphs.max_blocks * 4}
        print(json.dumps(row), flush=True)
        rows.append(row)
    result = {"rows": rows,
              "note": "the baseline column times the same plan and fill plus building and copying the per-row "
                      "tables the step used before (S x T rows), so the difference is that work alone"}
    if args.out:
        result = harness.write_result(args.out, result, harness.result_meta(
            __file__, f"host time of a speculative step's inputs (SpecDecoder.plan + SpecGraphs.fill), "
            f"{Path(args.checkpoint).name} with its drafter, batch {', '.join(map(str, args.batches))}, against the "
            f"block tables built and copied one row per block row", argv,
            f"{harness.cpu_name()}: host work only, nothing here waits for a device"))
    return result


if __name__ == "__main__":
    main()

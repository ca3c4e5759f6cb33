"""The table of bench/ocria_tiny_step_time.sh: each arm's train_time.json (jobs.train_tiny --time-steps) side by
side, pages/s against the first arm's, and the arms' first-step losses (same weights, same pages: they differ only
by arithmetic).

  python bench/ocria_tiny_step_time_table.py --out OUT/step_time.json OUT/transformers_64 OUT/loader_64 ...
(arm folders as bench/ocria_tiny_step_time.sh names them; each arm is named by its train_time.json's settings)
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def arm_table(arms: dict[str, dict]) -> list[dict]:
    """One row per arm, in order; speedup against the first arm."""
    base = next(iter(arms.values()))["pages_per_s"]
    return [{"arm": name, "pages_per_s": r["pages_per_s"], "speedup": round(r["pages_per_s"] / base, 3),
             "step_ms_mean": r["step_ms_mean"], "data_wait_share": r["data_wait_share"],
             "tokens_per_step": r["tokens_per_step"], "first_loss": r["first_loss"]} for name, r in arms.items()]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("arms", nargs="+", type=Path, help="arm folders, each with run/train_time.json")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    arms = {}
    for folder in args.arms:
        r = json.loads((folder / "run" / "train_time.json").read_text())
        arms[f"{r['rope_positions']}/{r['gdn_chunk']}"] = r
    rows = arm_table(arms)
    print(f"{'arm':<18}{'pages/s':>9}{'speedup':>9}{'step ms':>9}{'data wait':>11}{'tokens':>9}{'first loss':>12}")
    for r in rows:
        print(f"{r['arm']:<18}{r['pages_per_s']:>9}{r['speedup']:>9}{r['step_ms_mean']:>9}{r['data_wait_share']:>11}"
              f"{r['tokens_per_step']:>9}{r['first_loss']:>12}")
    res = {"arms": rows, "runs": arms}
    args.out.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()

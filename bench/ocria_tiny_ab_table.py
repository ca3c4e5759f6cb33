"""Training throughput of ocria-tiny runs side by side, from their logs: steady steps/s and pages/s (the elapsed
times logged every train.log_every steps, the first `skip` records left out: worker start-up and warm-up), and the
first logged losses (runs from the same checkpoint and pages should start alike). Reads each run folder's
ckpt/train_log.jsonl, or ckpt/train_log.jsonl inside its meta.tar (bench/ocria_tiny_gpu_run.sh packs it there).

  python bench/ocria_tiny_ab_table.py OUT/transformers OUT/chunked --out OUT/gdn_ab.json
"""
from __future__ import annotations

import argparse
import json
import tarfile
from pathlib import Path


def read_log(run_dir: Path) -> list[dict]:
    """The run's training log records; `run_dir` is a run's output folder or the folder that holds it (`run/`)."""
    for base in (run_dir, run_dir / "run"):
        if (base / "ckpt" / "train_log.jsonl").is_file():
            text = (base / "ckpt" / "train_log.jsonl").read_text()
            break
        if (base / "meta.tar").is_file():
            with tarfile.open(base / "meta.tar") as tar:
                text = tar.extractfile("ckpt/train_log.jsonl").read().decode()
            break
    else:
        raise FileNotFoundError(f"{run_dir}: no ckpt/train_log.jsonl or meta.tar")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def throughput(records: list[dict], skip: int = 2) -> dict:
    """Steady rates between the record after the first `skip` and the last one of this run's records."""
    if len(records) <= skip + 1:
        raise ValueError(f"{len(records)} log records: too few for steady rates after skipping {skip}")
    first, last = records[skip], records[-1]
    seconds = last["elapsed_s"] - first["elapsed_s"]
    return {"steps": last["step"] - first["step"], "seconds": round(seconds, 1),
            "steps_per_s": round((last["step"] - first["step"]) / seconds, 3),
            "pages_per_s": round((last["pages"] - first["pages"]) / seconds, 1),
            "first_losses": [r["loss"] for r in records[:3]]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--since-step", type=int, default=-1,
                    help="only records after this step: the step of the checkpoint the runs started from (a resumed "
                         "run's log holds its checkpoint's whole history); default: all records")
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    table = {}
    for run in args.runs:
        records = read_log(run)
        table[run.name] = throughput([r for r in records if r["step"] > args.since_step], args.skip)
    print(f"{'run':<16}{'steps':>7}{'seconds':>9}{'steps/s':>9}{'pages/s':>9}  first losses")
    for name, row in table.items():
        print(f"{name:<16}{row['steps']:>7}{row['seconds']:>9}{row['steps_per_s']:>9}{row['pages_per_s']:>9}  "
              f"{row['first_losses']}")
    if args.out:
        args.out.write_text(json.dumps(table, indent=1))
    return table


if __name__ == "__main__":
    main()

"""Archive scale: the driver's listing, resume plan and commit protocol at 10 k to 1 M documents, and a rerun with
nothing to do, timed and with the driver's peak memory (issue 61, item 3).

    python bench/archive_scale.py [--sizes 10000 100000 1000000] [--work /tmp/archive_scale]
                                  [--out bench/results/archive_scale_cpu.json]

Each size runs in fresh processes, so one size's memory does not show in the next:

1. setup (not timed): N real files on the local disk (`d<k>/doc<i>.pdf`, 1,000 a folder, 4 bytes each) and an
   output that a previous run left: documents/ and pages/ parts of 64 documents (run.commit_every_docs' default) in
   the real schemas (pipeline/schema.py), written with pyarrow. Of the N documents 88 % are done (ok, same size and
   mtime), 1 % ok but changed since (another mtime), 1 % failed once with a retryable kind, 1 % failed for good
   (3 attempts), 9 % never seen: 11 % is this run's work. A done document has one page row (short text), parsed
   by the checkpoint's model.
2. driver (timed, one process): `list_s` lists the folder as pipeline.job.prepare does (list_inputs); `plan_s` is
   what prepare does next: OutputStore.reconcile (which reads the plan's columns of the committed documents), then
   plan_against (the models of their pages, plan_run); `commit_s` commits this run's outcome through the real protocol
   (document_row, OutputStore.commit in parts of 64, then the closing reconcile), every planned document ok with
   one page.
3. nothing to do (timed, a fresh process): pipeline.job.prepare + run on the same input and output, which now holds
   every document: the job's own path, without Ray (nothing is planned), checkpoint checks included.

Peak memory is the process's VmHWM (Linux); /proc/self/clear_refs resets it between phases for the per-phase peaks.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402

PER_DIR = 1000
PER_PART = 64  # run.commit_every_docs' default
CHECKPOINT = ROOT / "models" / "ocria-tiny"
OLD_RUN = "20250101T000000000000Z-000000"


def peak_mb() -> float:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024


def rss_mb() -> float:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024


def reset_peak() -> None:
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)


def kind_of(i: int) -> str:
    """The state a previous run left document i in (per 100: 88 done, 1 changed, 1 retryable, 1 given up, 9 new)."""
    r = i % 100
    return ("new" if r >= 91 else "given_up" if r == 90 else "retryable" if r == 89 else "changed" if r == 88
            else "done")


def setup(n: int, work: Path) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.checkpoint import validate
    from pipeline.config import StorageConfig
    from pipeline.schema import DOCUMENT_SCHEMA, PAGE_SCHEMA
    from pipeline.storage import list_documents

    shutil.rmtree(work, ignore_errors=True)
    inp, out = work / "in", work / "out"
    for d in range(0, n, PER_DIR):
        folder = inp / f"d{d // PER_DIR:05d}"
        folder.mkdir(parents=True)
        for i in range(d, min(n, d + PER_DIR)):
            (folder / f"doc{i:08d}.pdf").write_bytes(b"%PDF")
    listed = list_documents(str(inp), StorageConfig(), ["*.pdf"], [])
    assert len(listed) == n
    model_id = validate(str(CHECKPOINT))
    kinds = np.array([kind_of(int(f.uri.rsplit("doc", 1)[1][:8])) for f in listed])
    keep = kinds != "new"
    uri = pa.array([f.uri for f in listed], pa.string()).filter(pa.array(keep))
    size = pa.array([f.size for f in listed], pa.int64()).filter(pa.array(keep))
    mtime = np.array([f.mtime_ns for f in listed], np.int64)[keep]
    k = kinds[keep]
    mtime = np.where(k == "changed", mtime - 1, mtime)
    ok = (k == "done") | (k == "changed")
    m = len(k)
    status = pa.array(np.where(ok, "ok", "error"), pa.string())
    error_kind = pa.array([None if o else "timeout" if kk == "retryable" else "damaged" for o, kk in zip(ok, k)],
                          pa.string())
    attempt = np.where(k == "given_up", 3, 1).astype(np.int32)
    ones = np.where(ok, 1, 0).astype(np.int32)
    docs = pa.table({
        "run_id": pa.array([OLD_RUN] * m), "uri": uri, "sha256": pa.array(["0" * 64] * m), "size_bytes": size,
        "mtime_ns": pa.array(mtime, pa.int64()), "status": status, "error_kind": error_kind,
        "error": pa.array([None if o else "synthetic failure" for o in ok], pa.string()),
        "total_pages": pa.array(np.ones(m, np.int32)), "pages": pa.array(ones), "pages_ok": pa.array(ones),
        "pages_fallback": pa.array(np.zeros(m, np.int32)), "pages_blank": pa.array(np.zeros(m, np.int32)),
        "pages_error": pa.array(np.zeros(m, np.int32)), "truncated": pa.array(np.zeros(m, bool)),
        "prompt_tokens": pa.array(ones.astype(np.int64) * 300), "output_tokens": pa.array(ones.astype(np.int64) * 700),
        "attempt": pa.array(attempt), "raster_s": pa.array(np.full(m, 0.1)), "parse_s": pa.array(np.full(m, 1.0)),
        "committed_at": pa.array(np.full(m, 1_735_689_600_000_000, np.int64)).cast(pa.timestamp("us", tz="UTC")),
    }, schema=DOCUMENT_SCHEMA)
    page_cols = {name: pa.nulls(m, field.type) for name, field in zip(PAGE_SCHEMA.names, PAGE_SCHEMA)}
    page_cols.update(run_id=docs["run_id"], uri=uri, sha256=docs["sha256"],
                     page_index=pa.array(np.where(ok, 0, -1).astype(np.int32)), page_count=pa.array(ones),
                     total_pages=pa.array(ones), status=status, error_kind=error_kind, error=docs["error"],
                     text=pa.array(np.where(ok, "synthetic page text " * 10, None), pa.string()),
                     model_id=pa.array(np.where(ok, model_id, None), pa.string()))
    pages = pa.table(page_cols, schema=PAGE_SCHEMA)
    (out / "documents").mkdir(parents=True)
    (out / "pages").mkdir()
    for seq, start in enumerate(range(0, m, PER_PART), 1):
        name = f"part-{OLD_RUN}-{seq:06d}.parquet"
        pq.write_table(pages.slice(start, PER_PART), out / "pages" / name)
        pq.write_table(docs.slice(start, PER_PART), out / "documents" / name)
    (work / "setup.json").write_text(json.dumps({"documents": n, "committed": m, "model_id": model_id,
                                                 "parts": -(-m // PER_PART)}))


def driver(n: int, work: Path) -> dict:
    """list -> plan -> commit, as the job's driver runs them (pipeline.job.prepare's own steps), timed and with each
    phase's peak memory."""
    from pipeline.config import load_config
    from pipeline.job import list_inputs, plan_against
    from pipeline.plan import PLAN_COLUMNS
    from pipeline.output import OutputStore, document_row
    from pipeline.schema import PAGE_SCHEMA, empty_row
    from pipeline.storage import resolve

    model_id = json.loads((work / "setup.json").read_text())["model_id"]
    cfg = load_config(None, {"input": {"uris": [str(work / "in")]}, "output": str(work / "out")})
    row: dict = {"documents": n, "base_rss_mb": round(rss_mb(), 1)}

    reset_peak()
    t = time.perf_counter()
    listed = list_inputs(cfg)
    row["list_s"] = time.perf_counter() - t
    row["list_peak_rss_mb"] = round(peak_mb(), 1)

    reset_peak()
    t = time.perf_counter()
    store = OutputStore(resolve(cfg.output, cfg.storage))
    committed = store.reconcile(PLAN_COLUMNS).documents
    t1 = time.perf_counter()
    plan = plan_against(cfg, store, listed, model_id, committed)
    t2 = time.perf_counter()
    row.update(plan_s=t2 - t, plan_reconcile_s=t1 - t, plan_read_and_run_s=t2 - t1,
               plan_peak_rss_mb=round(peak_mb(), 1), planned=len(plan.todo), skipped=dict(plan.skipped))
    expected = sum(kind_of(i) in ("new", "changed", "retryable") for i in range(n))
    assert len(plan.todo) == expected, (len(plan.todo), expected)
    del listed, committed
    reset_peak()

    run_id = time.strftime("%Y%m%dT%H%M%S000000Z-", time.gmtime()) + "bench0"
    t = time.perf_counter()
    pending_pages, pending_docs = [], []
    for uri, meta in plan.todo.items():
        rows = [empty_row(PAGE_SCHEMA, run_id=run_id, uri=uri, sha256="0" * 64, page_index=0, page_count=1,
                          total_pages=1, status="ok", text="synthetic page text " * 10, prompt_tokens=300,
                          output_tokens=700, model_id=model_id, raster_s=0.1, parse_s=1.0)]
        pending_pages.extend(rows)
        pending_docs.append(document_row(run_id, rows, meta, cfg.raster.max_pages_per_doc))
        if len(pending_docs) >= cfg.run.commit_every_docs:
            store.commit(run_id, pending_pages, pending_docs)
            pending_pages, pending_docs = [], []
    if pending_docs:
        store.commit(run_id, pending_pages, pending_docs)
    t1 = time.perf_counter()
    report = store.reconcile()
    t2 = time.perf_counter()
    row.update(commit_s=t2 - t, commit_parts_s=t1 - t, commit_reconcile_s=t2 - t1,
               committed=len(plan.todo), superseded=report.superseded_documents, parts_rewritten=report.parts_rewritten,
               commit_peak_rss_mb=round(peak_mb(), 1))
    return row


def nothing_to_do(n: int, work: Path) -> dict:
    """The job's own driver path (prepare + run) on an output that holds every listed document."""
    t = time.perf_counter()
    from pipeline.config import load_config
    from pipeline.job import prepare, run

    imported = time.perf_counter() - t
    cfg = load_config(None, {"input": {"uris": [str(work / "in")]}, "output": str(work / "out"),
                             "model": {"checkpoint": str(CHECKPOINT), "device": "cpu"},
                             "run": {"cache_dir": str(work / "cache")}})
    reset_peak()
    t = time.perf_counter()
    prep = prepare(cfg)
    t1 = time.perf_counter()
    assert not prep.plan.todo, prep.plan.summary()
    lines = []
    summary = run(prep, echo=lines.append)
    t2 = time.perf_counter()
    assert summary["documents"] == 0
    return {"nothing_to_do_s": t2 - t, "nothing_to_do_prepare_s": t1 - t, "nothing_to_do_run_s": t2 - t1,
            "nothing_to_do_import_s": imported, "nothing_to_do_peak_rss_mb": round(peak_mb(), 1),
            "nothing_to_do_skipped": dict(prep.plan.skipped), "ray_imported": "ray" in sys.modules}


def child(phase: str, n: int, work: Path) -> dict:
    cmd = [sys.executable, __file__, "--phase", phase, "--n", str(n), "--work", str(work)]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise RuntimeError(f"{phase} {n} failed:\n{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"  {phase} {n}: {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--work", type=Path, default=Path("/tmp/archive_scale"))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "archive_scale_cpu.json")
    ap.add_argument("--keep", action="store_true", help="leave each size's files under --work")
    ap.add_argument("--phase", choices=["setup", "driver", "nothing"], help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase == "setup":
        setup(args.n, args.work)
        print(json.dumps({}))
        return
    if args.phase == "driver":
        print(json.dumps(driver(args.n, args.work)))
        return
    if args.phase == "nothing":
        print(json.dumps(nothing_to_do(args.n, args.work)))
        return
    results = harness.ResultFile(args.out, harness.result_meta(
        __file__, "the driver's listing, resume plan and commit at " + ", ".join(f"{n:,}" for n in args.sizes)
        + " documents (real files on the local disk, a synthetic previous output), and a rerun with nothing to do: "
        "seconds and peak memory", device="cpu"))
    rows = []
    for n in args.sizes:
        work = args.work / str(n)
        child("setup", n, work)
        row = child("driver", n, work) | child("nothing", n, work)
        row["peak_rss_mb"] = max(row["list_peak_rss_mb"], row["plan_peak_rss_mb"], row["commit_peak_rss_mb"])
        for k, v in row.items():
            if k.endswith("_s"):
                row[k] = round(v, 3)
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("documents", "list_s", "plan_s", "commit_s", "nothing_to_do_s",
                                              "peak_rss_mb", "nothing_to_do_peak_rss_mb")}), flush=True)
        write(results, rows)  # after each size: a 1 M-file folder takes minutes to delete
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def write(results: harness.ResultFile, rows: list[dict]) -> None:
    import pyarrow

    result = {
        "meta": {
            "machine": f"dev VM, {platform.machine()}: {os.cpu_count()} CPU cores (shared with other work), "
                       f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, local disk",
            "python": platform.python_version(), "pyarrow": pyarrow.__version__,
            "real": "the listing (N files on the local disk, listed as pipeline.job.prepare lists), every "
                    "pipeline call timed (reconcile, the plan, document_row, commit), the "
                    "nothing-to-do run (pipeline.job.prepare + run with models/ocria-tiny)",
            "synthetic": "the files' contents (4 bytes), the previous run's output (written with pyarrow in the real "
                         "schemas, 64 documents a part, one page row of short text per document), this run's "
                         "outcome (every planned document ok with one page, built in the driver instead of parsed)",
            "columns": "list_s: listing; plan_s: reconcile + the committed documents and page models read + "
                       "plan_run (prepare's steps after the listing); commit_s: this run's documents committed in "
                       "parts of 64 + the closing reconcile; nothing_to_do_s: prepare + run in a fresh process once "
                       "everything is committed (imports not counted: nothing_to_do_import_s); peak_rss_mb: the "
                       "driver's peak over list, plan and commit (VmHWM; per phase in *_peak_rss_mb, reset between "
                       "phases; base_rss_mb: after the imports)",
            "targets": "1 M documents: plan < 60 s and < 2 GB in the driver; nothing to do < 60 s",
        },
        "rows": rows,
    }
    results.write(result)


if __name__ == "__main__":
    main()

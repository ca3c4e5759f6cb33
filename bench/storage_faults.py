"""Issue 61 (storage that misbehaves): one whole job, on a real local Ray, reading and writing S3 (moto on 127.0.0.1)
through tests/fault_proxy.py, which throttles, answers 5xx, resets connections mid-body and stalls answers at a
fixed rate; then every document is counted in the output: committed once, lost, duplicated.

    python bench/storage_faults.py --out bench/results/storage_faults_cpu.json [--docs 12 --rate 0.04 --seed 61]

A run that stops on a commit it could not finish is run again (as an operator would); the JSON says how many runs.
Faults and requests are the proxy's counts; `whole_operation_retries_driver` are pipeline.storage's tries again in
the driver (listing, reconcile, commits); the rasterize actors' reads retry in their own processes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")

from bench import harness  # noqa: E402


def make_pdf(i: int, pages: int = 2) -> bytes:
    import pymupdf

    doc = pymupdf.open()
    for p in range(pages):
        doc.new_page().insert_text((72, 100), f"Document {i}, page {p}: invoice {1000 + i * 7 + p}", fontsize=14)
    return doc.tobytes()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench/results/storage_faults_cpu.json"))
    ap.add_argument("--docs", type=int, default=12)
    ap.add_argument("--rate", type=float, default=0.04, help="per request, for each of the five faults")
    ap.add_argument("--seed", type=int, default=61)
    ap.add_argument("--max-runs", type=int, default=3)
    args = ap.parse_args()

    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    import pipeline.storage as storage
    from fault_proxy import FAULTS, FaultProxy, Rule
    from engine.testing import build_tiny_checkpoint
    from pipeline.config import StorageConfig, load_config
    from pipeline.job import prepare, run
    from pipeline.output import OutputStore

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    upstream = f"http://{host}:{port}"
    admin = pafs.S3FileSystem(region="us-east-1", allow_bucket_creation=True, **storage.endpoint_kwargs(upstream))
    admin.create_dir("faults")
    uris = []
    for i in range(args.docs):
        with admin.open_output_stream(f"faults/in/doc{i:02d}.pdf") as f:
            f.write(make_pdf(i))
        uris.append(f"s3://faults/in/doc{i:02d}.pdf")

    proxy = FaultProxy(upstream, "s3", [Rule("*", f, rate=args.rate, stall_s=6) for f in FAULTS], seed=args.seed)
    runs, statuses, t0 = [], [], time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = build_tiny_checkpoint(Path(tmp) / "tiny-random", seed=0)
        cfg = load_config(None, {
            "input": {"uris": ["s3://faults/in"]}, "output": "s3://faults/out",
            "storage": {"s3_endpoint": proxy.url, "request_timeout_s": 2},
            "model": {"backend": "native", "checkpoint": str(ckpt), "device": "cpu", "max_tokens": 8},
            "parse": {"batch_size": 4}, "run": {"num_cpus": 2, "commit_every_docs": 2, "cache_dir": f"{tmp}/cache"}})
        for _ in range(args.max_runs):
            try:
                summary = run(prepare(cfg), echo=lambda *_: None)
                runs.append(dict(status="finished", documents=summary["documents"],
                                 documents_error=summary["documents_error"]))
                if not summary["documents_error"]:
                    break
                cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"retry_failed": True})})
            except Exception as e:  # a commit (or the listing) that could not finish: the same command again
                runs.append(dict(status="stopped", error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"))
        wall = time.perf_counter() - t0
        faults = {f"{k}:{f}": n for (k, f), n in sorted(proxy.injected.items())}
        seen, forwarded = dict(proxy.seen), dict(proxy.forwarded)
        proxy.close()

    clean = OutputStore(storage.resolve("s3://faults/out", StorageConfig(s3_endpoint=upstream)))
    clean.reconcile()
    docs = clean.documents().to_pylist()
    counts = Counter(d["uri"] for d in docs)
    page_keys = Counter((p["uri"], p["page_index"]) for p in clean.pages().to_pylist())
    result = dict(
        store="s3 (moto) through tests/fault_proxy.py", docs=args.docs, pages_per_doc=2, seed=args.seed,
        fault_rate_each=args.rate, faults=list(FAULTS), runs=runs, wall_s=round(wall, 1),
        faults_injected=sum(faults.values()), faults_by_kind=faults, requests_seen=seen, requests_forwarded=forwarded,
        whole_operation_retries_driver=dict(storage.RETRIES),
        documents_committed_once=sum(1 for u in uris if counts[u] == 1),
        documents_ok=sum(1 for d in docs if d["status"] == "ok"),
        documents_error={d["uri"]: d["error_kind"] for d in docs if d["status"] != "ok"},
        documents_lost=sum(1 for u in uris if counts[u] == 0),
        documents_duplicated=sum(1 for u in uris if counts[u] > 1),
        pages_duplicated=sum(1 for n in page_keys.values() if n > 1),
    )
    server.stop()
    harness.write_result(args.out, result, harness.result_meta(
        __file__, f"one whole job ({args.docs} documents x 2 pages, local Ray, a tiny random model on the CPU) reading "
        f"and writing S3 (moto) through tests/fault_proxy.py, each of its five faults at {args.rate:g} a request: "
        f"every document counted in the output (committed once, lost, duplicated)", device="cpu"), indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

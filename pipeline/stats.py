"""Run statistics: throughput overall and per engine actor, stage latency percentiles, errors by kind, cost."""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from engine.interface import SpecStats
from pipeline.schema import STATS_SCHEMA


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50, p90, p99; None each when there are no values (a run with nothing to parse): never NaN, which prints as
    `nan` and is not JSON."""
    if not values:
        return {"p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(np.asarray(values, dtype=np.float64), [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99)}


@dataclass
class RunStats:
    run_id: str
    engine_actors: int
    gpus: int
    usd_per_gpu_hour: float
    # A CPU-only run is billed by the CPUs its actors reserve at this price, not its engine actors at the GPU price
    cpus: float = 0.0
    usd_per_cpu_hour: float = 0.0
    docs: Counter = field(default_factory=Counter)  # status -> count
    pages: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)  # error kind -> documents
    output_tokens: int = 0
    prompt_tokens: int = 0
    loop_dropped_tokens: int = 0
    pages_loop_dropped: int = 0  # pages whose answer had a loop's repeats left out
    spec: SpecStats = field(default_factory=SpecStats)  # speculative decoding's counts over the run's pages
    raster_actors: int = 1
    # Times Ray restarted an engine actor (its process died, or its node was lost) during the run, as Ray's actor
    # table counts them; its batches in flight were run again on the new one. None: Ray's table could not be read.
    engine_restarts: int | None = 0
    engine_busy_s: float = 0.0
    raster_s: list[float] = field(default_factory=list)
    parse_s: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    stream_started_unix: float = 0.0  # wall clock at the start of streaming, to line up outside samples (GPU load)
    first_result_s: float = 0.0  # start of streaming -> first committed document (actor start-up, model load)
    # Warm-up: start of streaming -> as many engine batches back as there are engines (each engine started, loaded
    # its model, captured its graphs and finished a batch), and the page rows received by then.
    warmup_s: float = 0.0
    warmup_pages: int = 0
    extra: dict = field(default_factory=dict)

    def add_document(self, doc_row: dict, page_rows: list[dict]) -> None:
        self.docs[doc_row["status"]] += 1
        if doc_row["error_kind"]:
            self.errors[doc_row["error_kind"]] += 1
        for r in page_rows:
            if r["page_index"] < 0:
                continue
            self.pages[r["status"]] += 1
            self.output_tokens += r["output_tokens"] or 0
            self.prompt_tokens += r["prompt_tokens"] or 0
            self.loop_dropped_tokens += r["loop_dropped_tokens"] or 0
            self.pages_loop_dropped += bool(r["loop_dropped_tokens"])
            self.spec.merge(SpecStats.from_columns(r))
            self.raster_s.append(r["raster_s"] or 0.0)
            self.engine_busy_s += r["engine_s"] or 0.0
            if r["parse_s"] is not None:
                self.parse_s.append(r["parse_s"])
            if r["ttft_s"] is not None:
                self.ttft_s.append(r["ttft_s"])

    def speculation(self) -> dict:
        """tau (mean tokens per verify step), drafts proposed and accepted, and the share accepted at each position of
        the block (1 = the first draft); zeros without a drafter."""
        return self.spec.summary()

    def summary(self) -> dict:
        wall = max(self.wall_s, 1e-9)
        n_docs, n_pages = sum(self.docs.values()), sum(self.pages.values())
        per = max(self.engine_actors, 1)
        billed, rate = (self.gpus, self.usd_per_gpu_hour) if self.gpus else (self.cpus, self.usd_per_cpu_hour)
        # past the warm-up mark when one was seen (every engine returned a batch), else past the first result
        steady = n_pages > self.warmup_pages if self.warmup_s else n_pages > 0 and self.wall_s > self.first_result_s
        usd = self.wall_s / 3600 * billed * rate
        return {
            "run_id": self.run_id,
            "wall_s": self.wall_s,
            "stream_started_unix": self.stream_started_unix,
            "documents": n_docs,
            "documents_ok": self.docs["ok"],
            "documents_error": self.docs["error"],
            "pages": n_pages,
            "pages_ok": self.pages["ok"],
            "pages_fallback": self.pages["fallback"],
            "pages_blank": self.pages["blank"],
            "pages_error": self.pages["error"],
            "first_result_s": self.first_result_s,
            "warmup_s": self.warmup_s,
            "warmup_pages": self.warmup_pages,
            # Pages past the warm-up over the time past it; a run whose warm-up took all its pages has no steady phase
            "steady_phase": steady,
            "steady_pages_per_s": (0.0 if not steady else
                                   (n_pages - self.warmup_pages) / max(self.wall_s - self.warmup_s, 1e-9)
                                   if self.warmup_s else n_pages / max(self.wall_s - self.first_result_s, 1e-9)),
            "docs_per_s": n_docs / wall,
            "pages_per_s": n_pages / wall,
            "output_tokens_per_s": self.output_tokens / wall,
            "engine_actors": self.engine_actors,
            "gpus": self.gpus,
            "pages_per_s_per_engine": n_pages / wall / per,
            "output_tokens_per_s_per_engine": self.output_tokens / wall / per,
            # Busy shares of the streaming wall time (actor start-up counts as idle, so short runs read low): an
            # engine share well under 1 on a long run means the GPUs waited; the raster share is the CPU side's load.
            "engine_busy_fraction": self.engine_busy_s / wall / per,
            "raster_busy_fraction": sum(self.raster_s) / wall / max(self.raster_actors, 1),
            "raster_actors": self.raster_actors,
            "engine_restarts": self.engine_restarts,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "loop_dropped_tokens": self.loop_dropped_tokens,
            "pages_loop_dropped": self.pages_loop_dropped,
            "speculation": self.speculation(),
            "raster_s_per_page": percentiles(self.raster_s),
            "parse_s_per_page": percentiles(self.parse_s),
            "ttft_s": percentiles(self.ttft_s),
            "errors_by_kind": dict(self.errors),
            "usd_per_gpu_hour": self.usd_per_gpu_hour,
            "usd_per_cpu_hour": self.usd_per_cpu_hour,
            "cpus": self.cpus,
            "cost_basis": "gpu-hours" if self.gpus else "cpu-hours (CPU run)",
            "usd_per_hour": billed * rate,
            "usd": usd,
            "usd_per_million_pages": usd / n_pages * 1e6 if n_pages else None,
            **self.extra,
        }

    def table(self) -> pa.Table:
        """The stats table: one (metric, value) row per number, nested dicts flattened with dots."""
        rows = []

        def walk(prefix: str, value) -> None:
            if isinstance(value, dict):
                for k, v in value.items():
                    walk(f"{prefix}.{k}" if prefix else k, v)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                rows.append({"run_id": self.run_id, "metric": prefix, "value": float(value)})

        walk("", self.summary())
        return pa.Table.from_pylist(rows, schema=STATS_SCHEMA)

    def to_json(self) -> str:
        return json.dumps(self.summary(), indent=2, sort_keys=True, default=str)


def speculation_lines(spec: dict) -> list[str]:
    """The table's speculative-decoding line: none without a drafter."""
    if not spec["verify_steps"]:
        return []
    by_pos = " ".join(f"{v:.2f}" for v in list(spec["acceptance_by_position"].values())[:16])
    return [f"{'speculation tau':<24}{spec['tau']:>10.2f}   accepted {spec['accepted']} of {spec['drafted']} drafts in "
            f"{spec['verify_steps']} verify steps; accepted by position: {by_pos}"]


def format_table(s: dict) -> str:
    def pct(d: dict, scale: float = 1000.0) -> str:
        return "  ".join(f"{k} {'-' if v is None else f'{v * scale:.1f}':>8}" for k, v in d.items())

    if s["gpus"]:
        billed = f"{s['gpus']} GPU x ${s['usd_per_gpu_hour']:g}/h"
    else:
        billed = f"{s['cpus']:g} CPU x ${s['usd_per_cpu_hour']:g}/h"
    per_million = (f"${s['usd_per_million_pages']:,.0f} per million pages" if s["usd_per_million_pages"] is not None
                   else "no pages to price")

    lines = [
        f"run {s['run_id']}   wall {s['wall_s']:.1f} s   engines {s['engine_actors']} ({s['gpus']} GPU)",
        f"{'documents':<24}{s['documents']:>10}   ok {s['documents_ok']}  error {s['documents_error']}",
        f"{'pages':<24}{s['pages']:>10}   ok {s['pages_ok']}  blank {s['pages_blank']}  fallback {s['pages_fallback']}  "
        f"error {s['pages_error']}",
        f"{'docs/s':<24}{s['docs_per_s']:>10.3f}",
        f"{'pages/s':<24}{s['pages_per_s']:>10.3f}   per engine {s['pages_per_s_per_engine']:.3f}   "
        + (f"after warm-up ({s['warmup_s'] or s['first_result_s']:.1f} s) {s['steady_pages_per_s']:.3f}"
           if s["steady_phase"] else
           f"after warm-up: run too short for a steady phase (warm-up {s['warmup_s']:.1f} of {s['wall_s']:.1f} s)"),
        f"{'output tokens/s':<24}{s['output_tokens_per_s']:>10.1f}   per engine {s['output_tokens_per_s_per_engine']:.1f}",
        f"{'loop repeats left out':<24}{s['loop_dropped_tokens']:>10}   tokens, on {s['pages_loop_dropped']} pages",
        *speculation_lines(s["speculation"]),
        f"{'engine restarts':<24}{'-' if s['engine_restarts'] is None else s['engine_restarts']:>10}   "
        f"(their batches in flight were run again)",
        f"{'busy share':<24}engines {s['engine_busy_fraction']:.2f}   rasterizers {s['raster_busy_fraction']:.2f} "
        f"(of up to {s['raster_actors']})",
        f"{'raster ms/page':<24}{pct(s['raster_s_per_page'])}",
        f"{'parse ms/page':<24}{pct(s['parse_s_per_page'])}",
        f"{'time to first token ms':<24}{pct(s['ttft_s'])}",
        *([f"{'precision':<24}weights {s['precision']['weights']}   KV cache {s['precision']['kv_cache']}   "
           f"GDN state {s['precision']['gdn_state']}"] if s.get("precision") else []),
        f"{'errors by kind':<24}{', '.join(f'{k} {v}' for k, v in sorted(s['errors_by_kind'].items())) or 'none'}",
        f"{'cost':<24}${s['usd']:.4f} at {billed} ({s['cost_basis']})   {per_million}",
    ]
    width = max(len(line) for line in lines)
    return "\n".join(["=" * width, *lines, "=" * width])

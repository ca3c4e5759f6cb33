"""Benchmark reruns (jobs/benchmark_job.py): the real job on a corpus, then a report built from its output folder --
pages/s over time, engine (GPU) busy share, per-stage time, page latency, tokens/s, $ per million pages -- as
report.json and a PNG, compared with an earlier report, and a headline row in <results>/<gpu>_job_throughput.json.

The steady window (STEADY_WINDOW) is where a long backfill spends its time: every engine is loaded and has work.
Its rates are what a nightly run of many pages costs; the overall rates include start-up and the drain at the end.
"""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from pipeline.config import ConfigError, JobConfig, StorageConfig, load_config
from pipeline.provenance import git_commit, quoted
from pipeline.stats import percentiles

STEADY_WINDOW = (
    "from the job's warm-up mark (every engine has started, loaded its model, captured its graphs and returned a "
    "first batch: stats warmup_s) to the start of the last engine call (after it no new page joins an engine and the "
    "engines drain); steady rates count the pages whose engine call ended inside the window, over its length; the "
    "steady busy share spreads each page's engine time evenly over its call, capped at 1 an engine")

# The metrics a comparison lists, in this order; all are in report["metrics"].
COMPARED = ("pages", "pages_per_s_steady", "pages_per_s", "gpu_busy_steady", "gpu_busy", "warmup_s",
            "output_tokens_per_s_steady", "output_tokens_per_s", "latency_p50_s", "latency_p90_s", "latency_p99_s",
            "raster_s_per_page_p50", "usd_per_million_pages", "usd_per_million_pages_overall", "wall_s", "command_s")

ROOT = Path(__file__).resolve().parents[1]
GPU_CONFIG = ROOT / "configs" / "gpu.yaml"
REPORT_JSON, REPORT_PNG = "report.json", "report.png"
REPORT_WHAT = ("the parse job's benchmark rerun (jobs/benchmark_job.py, the real job on a local Ray): pages/s over "
               "time, engine busy share, per-stage time, page latency, tokens/s and $ per million pages, steady and "
               "overall")
HEADLINE_WHAT = ("the whole parse job through jobs/benchmark_job.py, one row per setup, rewritten by each rerun "
                 "(pipeline/report.py)")
MATPLOTLIB_MISSING = ("the report's plots need matplotlib: pip install matplotlib (it comes with the dev and gpu "
                      "extras: pip install -e '.[dev]')")


# ------------------------------------------------------------------------------------------------ the job's output

def load_job_output(output: str, storage: StorageConfig | None = None, run_id: str | None = None
                    ) -> tuple[dict, list[dict]]:
    """A job output folder's run summary (runs/<run_id>.json; the newest run without run_id) and that run's page
    rows (committed parts only)."""
    from pipeline.output import OutputStore
    from pipeline.storage import resolve

    loc = resolve(output, storage or StorageConfig())
    if run_id is None:
        import pyarrow.fs as pafs

        infos = loc.fs.get_file_info(pafs.FileSelector(loc.join("runs"), allow_not_found=True))
        names = sorted(i.base_name for i in infos if i.base_name.endswith(".json"))
        if not names:
            raise ConfigError(f"{output!r} holds no job run (no runs/<run_id>.json): give a parse job's --output")
        run_id = names[-1].removesuffix(".json")  # run ids sort by start time
    with loc.fs.open_input_stream(loc.join("runs", f"{run_id}.json")) as f:
        summary = json.loads(f.read())
    pages = OutputStore(loc).pages()
    pages = pages.select([c for c in pages.column_names if c not in ("text", "text_layer")]).to_pylist()
    return summary, [p for p in pages if p["run_id"] == run_id]


# ------------------------------------------------------------------------------------------------ the report

def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _busy_in(pages: list[dict], t0: float, t1: float) -> float:
    """Engine seconds inside [t0, t1]: each page's engine time spread evenly over its engine call. A call's pages
    hold the engine time accrued since the previous call on that engine returned (pipeline.stages), which overlapping
    calls do not split evenly, so a short span can read a little over 1 engine: shares are capped at 1 (busy_share)."""
    busy = 0.0
    for p in pages:
        s, e, eng = p["parse_started_unix"], p["parse_ended_unix"], p["engine_s"] or 0.0
        busy += eng * (_overlap(s, e, t0, t1) / (e - s) if e > s else float(t0 <= e <= t1))
    return busy


def steady_window(summary: dict, timed: list[dict]) -> tuple[float, float] | None:
    """(start, end) in unix seconds (STEADY_WINDOW), or None where the run was too short to have one."""
    if not timed:
        return None
    t0 = summary["stream_started_unix"]
    start = t0 + (summary["warmup_s"] or summary["first_result_s"])
    end = max(p["parse_started_unix"] for p in timed)
    if end <= start or not any(start < p["parse_ended_unix"] <= end for p in timed):
        return None
    return start, end


def timeline(summary: dict, timed: list[dict], engines: int, bins: int = 40) -> dict:
    """Pages/s, output tokens/s and engine busy share in equal time bins from the start of streaming (a page counts
    when its engine call returned, so a bin's rate moves in steps of one call's pages)."""
    t0, wall = summary["stream_started_unix"], max(summary["wall_s"], 1e-9)
    width = max(wall / bins, 1e-3)
    n = max(1, math.ceil(wall / width))
    pages, tokens = np.zeros(n), np.zeros(n)
    for p in timed:
        i = min(n - 1, max(0, int((p["parse_ended_unix"] - t0) // width)))
        pages[i] += 1
        tokens[i] += p["output_tokens"] or 0
    busy = [busy_share(timed, t0 + i * width, t0 + (i + 1) * width, engines) for i in range(n)]
    return {"bin_s": width, "t_s": [(i + 0.5) * width for i in range(n)], "pages_per_s": list(pages / width),
            "pages_done": list(np.cumsum(pages)), "output_tokens_per_s": list(tokens / width), "gpu_busy": busy}


def busy_share(pages: list[dict], t0: float, t1: float, engines: int) -> float:
    """The engines' busy share of [t0, t1], at most 1 (_busy_in)."""
    return min(1.0, _busy_in(pages, t0, t1) / max(t1 - t0, 1e-9) / max(engines, 1))


def _latency(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None, "max": None, "histogram": {"counts": [],
                                                                                                 "edges": []}}
    counts, edges = np.histogram(np.asarray(values), bins=max(5, min(30, len(values) // 2)))
    return {**percentiles(values), "mean": float(np.mean(values)), "max": float(np.max(values)),
            "histogram": {"counts": counts.tolist(), "edges": edges.tolist()}}


def build_report(summary: dict, pages: list[dict], setup: dict | None = None, command_s: float | None = None,
                 startup_s: float | None = None) -> dict:
    """The report of one job run from its summary (runs/<run_id>.json) and page rows. `setup` (what ran where:
    describe_setup) is copied in; command_s and startup_s are the benchmark's own clock around the job (the job's
    wall_s starts with streaming, after Ray and the actors' placement)."""
    engines = max(summary["engine_actors"], 1)
    billed = summary["gpus"] or summary["engine_actors"]
    parsed = [p for p in pages if p["page_index"] >= 0]
    timed = [p for p in parsed if p.get("parse_ended_unix") is not None]
    t0 = summary["stream_started_unix"]
    window = steady_window(summary, timed)
    steady: dict = {"definition": STEADY_WINDOW, "start_s": None, "end_s": None, "seconds": None, "pages": 0}
    pages_steady = tokens_steady = busy_steady = None
    if window:
        w0, w1 = window
        inside = [p for p in timed if w0 < p["parse_ended_unix"] <= w1]
        span = w1 - w0
        steady.update(start_s=w0 - t0, end_s=w1 - t0, seconds=span, pages=len(inside))
        pages_steady = len(inside) / span
        tokens_steady = sum(p["output_tokens"] or 0 for p in inside) / span
        busy_steady = busy_share(timed, w0, w1, engines)
    usd_per_s = summary["usd_per_gpu_hour"] * billed / 3600
    raster = [p["raster_s"] or 0.0 for p in parsed]
    engine = [p["engine_s"] or 0.0 for p in timed]
    latency = _latency([p["parse_s"] for p in timed if p["parse_s"] is not None])
    call = _latency([p["parse_ended_unix"] - p["parse_started_unix"] for p in timed])
    end_rel = (window[1] - t0) if window else None
    metrics = {
        "pages": summary["pages"], "pages_ok": summary["pages_ok"], "documents": summary["documents"],
        "pages_per_s_steady": pages_steady, "pages_per_s": summary["pages_per_s"],
        "gpu_busy_steady": busy_steady, "gpu_busy": summary["engine_busy_fraction"],
        "warmup_s": summary["warmup_s"],
        "output_tokens_per_s_steady": tokens_steady, "output_tokens_per_s": summary["output_tokens_per_s"],
        "output_tokens_per_page": summary["output_tokens"] / summary["pages"] if summary["pages"] else None,
        "prompt_tokens_per_page": summary["prompt_tokens"] / summary["pages"] if summary["pages"] else None,
        "latency_p50_s": latency["p50"], "latency_p90_s": latency["p90"], "latency_p99_s": latency["p99"],
        "raster_s_per_page_p50": percentiles(raster)["p50"] if raster else None,
        # steady: what a long run pays per page once warm; overall: this run's wall time, start-up and drain included
        "usd_per_million_pages": usd_per_s / pages_steady * 1e6 if pages_steady else None,
        "usd_per_million_pages_overall": summary["usd_per_million_pages"],
        "wall_s": summary["wall_s"], "command_s": command_s,
    }
    stages = {
        "rasterize": {"actors": summary["raster_actors"], "seconds": sum(raster), "per_page_s": percentiles(raster),
                      "busy_share": summary["raster_busy_fraction"]},
        "engine": {"actors": summary["engine_actors"], "seconds": sum(engine), "per_page_s": percentiles(engine),
                   "busy_share": summary["engine_busy_fraction"], "busy_share_steady": busy_steady},
        "time_to_first_token": {"per_page_s": summary["ttft_s"]},
    }
    # The run's wall clock in phases: Ray and actor start-up before streaming, warm-up, steady window, drain
    phases = {"startup_s": startup_s, "warmup_s": steady["start_s"] if window else summary["warmup_s"],
              "steady_s": steady["seconds"], "drain_s": summary["wall_s"] - end_rel if window else None,
              "shutdown_s": (command_s - (startup_s or 0) - summary["wall_s"]) if command_s is not None else None}
    return _clean({
        "run_id": summary["run_id"], "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "setup": setup or {}, "metrics": metrics, "steady_window": steady, "stages": stages, "phases": phases,
        "latency": {"page_s": latency, "engine_call_s": call,
                    "what": "page_s: a page's time in the engine, request submitted -> last token (parse_s); "
                            "engine_call_s: the engine call that held it, start -> return"},
        "timeline": timeline(summary, timed, engines),
        "cost": {"usd_per_gpu_hour": summary["usd_per_gpu_hour"], "basis": summary["cost_basis"]},
        "job_stats": summary,
    })


def _clean(x):
    """NaN and infinities as null, so report.json is strict JSON."""
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


# ------------------------------------------------------------------------------------------------ what ran where

def gpu_name() -> str | None:
    """The first GPU's name from nvidia-smi (no CUDA context in this process), or None without one."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0].strip() if out else None


def gpu_key(gpus: int, name: str | None) -> str:
    """The headline file's prefix: h100 / h200 (issue 60's names), another GPU's model in lower case, or cpu."""
    if not gpus or not name:
        return "cpu"
    for key in ("h200", "h100"):
        if key in name.lower():
            return key
    words = [w for w in name.lower().replace("-", " ").split() if w not in ("nvidia", "tesla", "geforce")]
    return "".join(c for c in (words[0] if words else "gpu") if c.isalnum()) or "gpu"


def settings_vs(cfg: JobConfig, reference: Path = GPU_CONFIG) -> dict | None:
    """The config keys whose value differs from `reference` (configs/gpu.yaml), by dotted key; what to parse and
    where it goes are left out (None without the reference file: an install without configs/)."""
    if not reference.is_file():
        return None
    ref = load_config(reference, {"input": {"uris": cfg.input.uris}, "output": cfg.output})

    def flat(d: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in d.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict) and v and key != "model.options":
                out.update(flat(v, key + "."))
            else:
                out[key] = v
        return out

    mine, theirs = flat(cfg.model_dump()), flat(ref.model_dump())
    skip = ("input.", "output", "storage.", "run.cache_dir", "run.ray_address")
    return {k: v for k, v in sorted(mine.items()) if not k.startswith(skip) and theirs.get(k) != v}


def describe_setup(cfg: JobConfig, summary: dict, corpus: dict) -> dict:
    name = gpu_name() if summary["gpus"] else None
    return {"device": "cuda" if summary["gpus"] else "cpu", "gpus": summary["gpus"], "gpu_name": name,
            "gpu_key": gpu_key(summary["gpus"], name), "engines": summary["engine_actors"],
            "raster_actors": summary["raster_actors"], "checkpoint": cfg.model.checkpoint,
            "backend": cfg.model.backend, "precision": summary["precision"]["weights"],
            "gdn_state_dtype": summary["precision"]["gdn_state"], "kv_cache_dtype": summary["precision"]["kv_cache"],
            "batch_size": cfg.parse.batch_size,
            "concurrent_batches": cfg.parse.concurrent_batches, "max_tokens": cfg.model.max_tokens,
            "engine_options": cfg.model.options, "settings_vs_gpu_yaml": settings_vs(cfg), "corpus": corpus}


# ------------------------------------------------------------------------------------------------ comparison

def load_report(path: str | Path) -> dict:
    """A report from its folder (report.json inside) or its file; ConfigError if there is none."""
    p = Path(path)
    p = p / REPORT_JSON if p.is_dir() else p
    try:
        report = json.loads(p.read_text())
    except OSError:
        raise ConfigError(f"--baseline {str(path)!r}: no report there (expected {p}, written by "
                          f"jobs/benchmark_job.py)") from None
    except ValueError as e:
        raise ConfigError(f"--baseline {str(path)!r}: {p} is not JSON ({e})") from None
    if not isinstance(report, dict) or not isinstance(report.get("metrics"), dict):
        raise ConfigError(f"--baseline {str(path)!r}: {p} is not a benchmark report (no metrics)")
    return report


def compare(old: dict, new: dict) -> list[dict]:
    """Per metric both reports have: old, new and new / old (null where old is 0 or either is missing)."""
    rows = []
    for key in COMPARED:
        a, b = old["metrics"].get(key), new["metrics"].get(key)
        if key not in old["metrics"] or key not in new["metrics"]:
            continue
        ratio = b / a if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else None
        rows.append({"metric": key, "old": a, "new": b, "ratio": ratio})
    return rows


def format_comparison(rows: list[dict]) -> str:
    def num(v) -> str:
        return "-" if v is None else f"{v:.4g}"

    lines = [f"{'metric':<30}{'old':>12}{'new':>12}{'new/old':>10}"]
    lines += [f"{r['metric']:<30}{num(r['old']):>12}{num(r['new']):>12}{num(r['ratio']):>10}" for r in rows]
    return "\n".join(lines)


def format_report(report: dict) -> str:
    m, s, w = report["metrics"], report["setup"], report["steady_window"]

    def num(v, fmt=".3g") -> str:
        return "-" if v is None else format(v, fmt)

    where = f"{s.get('gpus')} x {s.get('gpu_name')}" if s.get("gpus") else f"{s.get('engines')} CPU engine(s)"
    return "\n".join([
        f"benchmark {report['run_id']}: {m['pages']} pages on {where}, {s.get('precision')}, "
        f"GDN state {s.get('gdn_state_dtype')}",
        f"  pages/s        steady {num(m['pages_per_s_steady'])}   overall {num(m['pages_per_s'])}   "
        f"(steady window {num(w['seconds'], '.1f')} s, {w['pages']} pages; warm-up {num(m['warmup_s'], '.1f')} s)",
        f"  engine busy    steady {num(m['gpu_busy_steady'], '.2f')}   overall {num(m['gpu_busy'], '.2f')}",
        f"  tokens/s out   steady {num(m['output_tokens_per_s_steady'])}   overall {num(m['output_tokens_per_s'])}",
        f"  page latency   p50 {num(m['latency_p50_s'])} s   p90 {num(m['latency_p90_s'])} s   "
        f"p99 {num(m['latency_p99_s'])} s",
        f"  $ / M pages    steady {num(m['usd_per_million_pages'], ',.0f')}   "
        f"overall {num(m['usd_per_million_pages_overall'], ',.0f')}   ({report['cost']['basis']})",
    ])


# ------------------------------------------------------------------------------------------------ plots

def require_matplotlib() -> None:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError(MATPLOTLIB_MISSING)


def plot(report: dict, path: Path, baseline: dict | None = None) -> Path:
    """report.png: pages/s and engine busy share over time (warm-up and steady window shaded), the page latency
    distribution, and the run's wall clock by phase beside each stage's seconds."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(MATPLOTLIB_MISSING) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m, s, tl, w = report["metrics"], report["setup"], report["timeline"], report["steady_window"]
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    where = f"{s.get('gpus')} x {s.get('gpu_name')}" if s.get("gpus") else f"{s.get('engines')} CPU engine(s)"
    fig.suptitle(f"{m['pages']} pages on {where}, {s.get('precision')}, GDN state {s.get('gdn_state_dtype')} "
                 f"(run {report['run_id']})", fontsize=11)

    def shade(a):
        warm = report["phases"]["warmup_s"] or 0
        a.axvspan(0, warm, color="0.85", label=f"warm-up {warm:.0f} s")
        if w["start_s"] is not None:
            a.axvspan(w["start_s"], w["end_s"], color="tab:green", alpha=0.12, label="steady window")

    a = ax[0][0]
    shade(a)
    a.step(tl["t_s"], tl["pages_per_s"], where="mid", color="tab:blue", label="pages/s")
    if m["pages_per_s_steady"]:
        a.axhline(m["pages_per_s_steady"], color="tab:green", ls="--", label=f"steady {m['pages_per_s_steady']:.3g}")
    if baseline:
        b = baseline["timeline"]
        a.step(b["t_s"], b["pages_per_s"], where="mid", color="0.4", ls=":", label="baseline pages/s")
    a.set(title="pages/s over time", xlabel="s since streaming started", ylabel="pages/s")
    a.legend(fontsize=8, loc="upper left")
    done = a.twinx()  # a page counts when its engine call returns: the running total reads better than the steps
    done.step(tl["t_s"], tl["pages_done"], where="mid", color="tab:red", lw=1, label="pages done")
    done.set_ylabel("pages done", color="tab:red")
    done.set_ylim(0, max(tl["pages_done"] or [0]) * 1.05 + 1)

    a = ax[0][1]
    shade(a)
    a.step(tl["t_s"], tl["gpu_busy"], where="mid", color="tab:orange", label="engine busy share")
    if m["gpu_busy_steady"] is not None:
        a.axhline(m["gpu_busy_steady"], color="tab:green", ls="--", label=f"steady {m['gpu_busy_steady']:.2f}")
    a.set(title="engine (GPU) busy share", xlabel="s since streaming started", ylim=(0, 1.05))
    a.legend(fontsize=8)

    a = ax[1][0]
    hist = report["latency"]["page_s"]["histogram"]
    if hist["counts"]:
        edges = hist["edges"]
        a.bar(edges[:-1], hist["counts"], width=np.diff(edges), align="edge", color="tab:purple", alpha=0.7)
        for q, ls in (("p50", "-"), ("p90", "--"), ("p99", ":")):
            v = report["latency"]["page_s"][q]
            a.axvline(v, color="k", ls=ls, label=f"{q} {v:.3g} s")
        a.legend(fontsize=8)
    a.set(title="page latency (submitted -> last token)", xlabel="s", ylabel="pages")

    a = ax[1][1]
    ph, st = report["phases"], report["stages"]
    bars = [("start-up", ph["startup_s"]), ("warm-up", ph["warmup_s"]), ("steady", ph["steady_s"]),
            ("drain", ph["drain_s"]), ("shutdown", ph["shutdown_s"]),
            ("rasterize (busy s)", st["rasterize"]["seconds"]), ("engine (busy s)", st["engine"]["seconds"])]
    bars = [(k, v) for k, v in bars if v is not None]
    colors = ["0.6"] * (len(bars) - 2) + ["tab:blue", "tab:orange"]
    a.barh([k for k, _ in bars][::-1], [v for _, v in bars][::-1], color=colors[::-1])
    a.set(title="wall clock by phase, busy seconds by stage", xlabel="s")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------ headline

def headline_entry(report: dict, command: str = "") -> dict:
    m, s = report["metrics"], report["setup"]
    return {"gpus": s.get("gpus"), "gpu_name": s.get("gpu_name"), "engines": s.get("engines"), "pages": m["pages"],
            "pages_per_s_steady": m["pages_per_s_steady"], "pages_per_s": m["pages_per_s"],
            "gpu_busy_steady": m["gpu_busy_steady"], "warmup_s": m["warmup_s"],
            "usd_per_million_pages": m["usd_per_million_pages"],
            "output_tokens_per_s_steady": m["output_tokens_per_s_steady"],
            "output_tokens_per_page": m["output_tokens_per_page"], "precision": s.get("precision"),
            "gdn_state_dtype": s.get("gdn_state_dtype"), "settings": s.get("settings_vs_gpu_yaml") or {},
            "run_id": report["run_id"], "created": report["created"], "command": command}


def write_headline(results: Path, report: dict, command: str = "", report_path: str | None = None) -> Path:
    """<results>/<gpu>_job_throughput.json: one row per setup (GPUs, precision, GDN state dtype, settings that
    differ from configs/gpu.yaml); a rerun of a setup replaces its row, other setups' rows stay."""
    path = results / f"{report['setup'].get('gpu_key', 'cpu')}_job_throughput.json"
    entry = dict(headline_entry(report, command), report=report_path)
    data = {"runs": []}
    if path.is_file():
        data = json.loads(path.read_text())
    kept = quoted(path, print)

    def key(r: dict) -> tuple:
        return r["gpus"], r["precision"], r["gdn_state_dtype"], json.dumps(r["settings"], sort_keys=True)

    runs = [r for r in data.get("runs", []) if key(r) != key(entry)] + [entry]
    # the rows keep their own commands; the file's commit is the last rerun's
    data = {**kept, "what": HEADLINE_WHAT, "commit": git_commit(), "steady_window": STEADY_WINDOW,
            "usd_per_million_pages": "in the steady window, at cost.usd_per_gpu_hour per GPU (per engine actor on CPU)",
            "runs": runs}
    results.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(data), indent=2) + "\n")
    return path


# ------------------------------------------------------------------------------------------------ the benchmark

@dataclass
class Benchmark:
    """Everything checked before Ray starts."""

    cfg: JobConfig
    out: Path
    corpus: dict  # how the input was made: {"generated": {...}} or {"input": [...]}
    baseline: dict | None = None
    results: Path | None = None
    command: str = ""


def plan_benchmark(config_path: str | None, overrides: dict, out: str, *, baseline: str | None = None,
                   results: str | None = None, pages: int | None = None, pages_per_doc: int = 8,
                   paragraphs: int | None = None, overwrite: bool = False, command: str = "") -> Benchmark:
    """Checks the flags, the report folder, the baseline and matplotlib; ConfigError (one line) on any problem."""
    from pipeline.job import local_gpus

    out_dir = Path(out)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out!r} is a file: give a folder for the report and the job's output")
    ours = [out_dir / n for n in (REPORT_JSON, REPORT_PNG, "output", "corpus")]
    if any(p.exists() for p in ours) and not overwrite:
        raise ConfigError(f"--out {out!r} holds an earlier benchmark: give a new folder (and the old one as "
                          f"--baseline), or pass --overwrite to replace it")
    generated = not overrides.get("input", {}).get("uris")
    if not generated and (pages is not None or paragraphs is not None):
        raise ConfigError("--pages and --paragraphs shape the generated corpus: leave them out with --input")
    for name, v in (("--pages", pages), ("--pages-per-doc", pages_per_doc), ("--paragraphs", paragraphs)):
        if v is not None and v < 1:
            raise ConfigError(f"{name} must be at least 1, got {v}")
    base = load_report(baseline) if baseline else None
    if baseline and Path(baseline).resolve() in (out_dir.resolve(), (out_dir / REPORT_JSON).resolve()):
        raise ConfigError("--baseline is the --out folder, which this run overwrites: copy it elsewhere first")
    if results and Path(results).exists() and not Path(results).is_dir():
        raise ConfigError(f"--results {results!r} is a file: give a folder (e.g. bench/results)")
    require_matplotlib()
    corpus_dir = out_dir / "corpus"
    over = json.loads(json.dumps(overrides))
    if generated:
        over.setdefault("input", {})["uris"] = [str(corpus_dir)]
    over["output"] = str(out_dir / "output")
    cfg = load_config(config_path, over)
    try:
        from engine.backends import check_options

        # prepare() checks it too (and the drafter's folder), but after the corpus is made
        check_options(cfg.model.backend, cfg.model.options, cfg.model.drafter)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if generated:
        gpus = local_gpus(cfg)
        # a joined cluster's GPUs are not seen from here: --device cuda counts as one GPU at least
        on_gpu = gpus > 0 or cfg.model.device == "cuda"
        # on a GPU, 1,000 report-like pages per GPU (minutes at issue 60's rates); a CPU reads few, short pages
        n = pages or (1000 * max(gpus, 1) if on_gpu else 24)
        para = paragraphs or (7 if on_gpu else 1)
        corpus = {"generated": {"pages": n, "pages_per_doc": pages_per_doc, "paragraphs": para}}
    else:
        corpus = {"input": list(cfg.input.uris)}
    return Benchmark(cfg, out_dir, corpus, base, Path(results) if results else None, command)


def run_benchmark(bench: Benchmark, echo=print) -> dict:
    """The corpus (when generated), the real job (pipeline.job: jobs/parse_corpus.py's code path) into <out>/output,
    then <out>/report.json and <out>/report.png, the comparison with the baseline, and the headline row."""
    from pipeline.corpus import make_corpus
    from pipeline.job import prepare, run

    out, gen = bench.out, bench.corpus.get("generated")
    for p in (out / "output", out / "corpus") if gen else (out / "output",):  # an earlier run's (--overwrite)
        if p.exists():
            shutil.rmtree(p)
    out.mkdir(parents=True, exist_ok=True)
    if gen:
        t = time.perf_counter()
        make_corpus(out / "corpus", math.ceil(gen["pages"] / gen["pages_per_doc"]), gen["pages_per_doc"],
                    total_pages=gen["pages"], paragraphs=gen["paragraphs"])
        echo(f"corpus: {gen['pages']} generated pages in {out / 'corpus'} ({time.perf_counter() - t:.1f} s)")
    prepared = prepare(bench.cfg)
    t_call, t = time.time(), time.perf_counter()
    job = run(prepared, echo=echo)
    command_s = time.perf_counter() - t
    summary, pages = load_job_output(bench.cfg.output, bench.cfg.storage, job["run_id"])
    setup = describe_setup(bench.cfg, summary, bench.corpus)
    report = build_report(summary, pages, setup, command_s=command_s,
                          startup_s=summary["stream_started_unix"] - t_call if summary["stream_started_unix"] else None)
    device = f"{setup['gpus']} x {setup['gpu_name']}" if setup["gpu_name"] else setup["device"]
    report = {**quoted(out / REPORT_JSON, echo), "what": REPORT_WHAT, "command": bench.command, "device": device,
              "commit": git_commit(), **report}
    if bench.baseline:
        rows = compare(bench.baseline, report)
        report["baseline"] = {"run_id": bench.baseline.get("run_id"), "created": bench.baseline.get("created"),
                              "setup": bench.baseline.get("setup"), "comparison": rows}
    (out / REPORT_JSON).write_text(json.dumps(report, indent=2) + "\n")
    plot(report, out / REPORT_PNG, bench.baseline)
    echo(format_report(report))
    if bench.baseline:
        echo("against the baseline:\n" + format_comparison(report["baseline"]["comparison"]))
    if bench.results:
        path = write_headline(bench.results, report, bench.command, str(out / REPORT_JSON))
        echo(f"headline: {path}")
    echo(f"report: {out / REPORT_JSON}, {out / REPORT_PNG}")
    return report

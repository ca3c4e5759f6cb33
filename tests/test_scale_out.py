"""bench/scale_out.py end to end in its CPU smoke mode: tiny random checkpoint, generated PDFs, the real job on a real
local Ray twice (1 engine, then 2), the scaling JSON. The GPU run (issue #5) is the same code with the 4B shape."""
import json
import math
import os
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from pipeline.output import OutputStore
from pipeline.storage import resolve
from pipeline.config import StorageConfig

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


def test_tiny_cpu_scale_out_runs_both_and_reports_scaling(tmp_path):
    out, work = tmp_path / "report", tmp_path / "work"
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "scale_out.py"), "--tiny", "--device", "cpu",
                           "--out", str(out), "--work", str(work)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=270)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "effic." in proc.stdout
    res = json.loads((out / "scale_out.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == ["scale_out.json"]  # bulky files stay in --work
    runs, rows = res["runs"], res["scaling"]
    assert [r["engine_actors"] for r in runs] == [1, 2] and [r["gpus"] for r in runs] == [0, 0]
    corpus = sorted(p.name for p in (work / "corpus").glob("*.pdf"))
    assert len(corpus) == 8  # 8 pages per engine, 2 pages per document, for 2 engines
    for run, n_docs in zip(runs, (4, 8)):
        assert run["documents"] == run["documents_ok"] == n_docs and run["pages"] == run["pages_ok"] == 2 * n_docs
        assert run["output_tokens"] == 8 * run["pages"]  # ignore_eos: every page exactly --gen-tokens tokens
        assert run["pages_per_s"] > 0 and run["steady_pages_per_s"] > 0 and 0 < run["warmup_s"] < run["wall_s"]
        assert 0 < time.time() - run["stream_started_unix"] < 600
        assert run["gpu_util_steady_pct"] == {}  # no nvidia-smi here: no GPU samples, none made up
        store = OutputStore(resolve(run["output"], StorageConfig()))
        docs, pages = store.documents(), store.pages()
        uris = docs.column("uri").to_pylist()
        assert len(uris) == len(set(uris)) == n_docs and {u.rsplit("/", 1)[-1] for u in uris} == set(corpus[:n_docs])
        keys = list(zip(pages.column("uri").to_pylist(), pages.column("page_index").to_pylist()))
        assert len(keys) == len(set(keys)) == 2 * n_docs
    one, two = runs
    assert math.isclose(rows[0]["scaling_efficiency"], 1.0)
    assert math.isclose(rows[1]["scaling_efficiency"], two["steady_pages_per_s"] / (2 * one["steady_pages_per_s"]))
    assert math.isclose(rows[1]["steady_pages_per_s_per_engine"], two["steady_pages_per_s"] / 2)
    assert math.isclose(rows[1]["gpu_idle_fraction"], 1 - two["engine_busy_fraction"])

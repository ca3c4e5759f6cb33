"""bench/harness.py: a bench script's results JSON holds what bench/results_index.py reads (what, command, card,
commit) straight from the run, and a rerun over a quoted file keeps its claim and figure and says so."""
import json
import subprocess
import sys

from bench import harness, results_index
from conftest import ROOT, load_bench


def _entries(results):
    entries, problems = results_index.collect(results)
    assert not problems
    return {e.name: e for e in entries}


def test_cpu_benches_write_what_the_index_reads(tmp_path):
    """gemv_pdl_check run as a script (its command from sys.argv) and kernels_bench called with an argv: both files,
    under names without a card prefix, index with what, command, card and commit."""
    check, kernels = tmp_path / "gemv_check.json", tmp_path / "kernels.json"
    proc = subprocess.run([sys.executable, "bench/gemv_pdl_check.py", "--tiny", "--out", str(check)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    load_bench("kernels_bench").main(["--dry-run", "--no-sweep", "--batch-sizes", "1", "--out", str(kernels)])

    entries = _entries(tmp_path)
    commit = harness.git_commit() or "uncommitted"  # no git (a copy of the tree): the index falls back to git log
    for path, args in ((check, f"gemv_pdl_check.py --tiny --out {check}"),
                       (kernels, f"kernels_bench.py --dry-run --no-sweep --batch-sizes 1 --out {kernels}")):
        entry = entries[path.name]
        assert entry.what and entry.command == f"python bench/{args}"
        assert entry.card == "CPU" and entry.commit == commit
        data = json.loads(path.read_text())
        assert list(data)[:4] == ["what", "command", "device", "commit"]
        assert data["device"].startswith("cpu (")
    assert json.loads(check.read_text())["rows"] and json.loads(kernels.read_text())["meta"]["dry_run"]


def test_a_rerun_keeps_the_claim_and_says_its_figure_is_old(tmp_path, capsys):
    out = tmp_path / "gemv_check.json"
    out.write_text(json.dumps({"claim": "the chain is exact", "figure": "rel_err 0.001", "what": "old", "rows": []}))
    assert load_bench("gemv_pdl_check").main(["--tiny", "--out", str(out)]) == 0
    assert "kept claim and figure of the file this run replaces" in capsys.readouterr().err

    data = json.loads(out.read_text())
    assert list(data)[:6] == ["claim", "figure", "what", "command", "device", "commit"]
    assert data["what"] != "old" and len(data["rows"]) == 4  # the new run's, the claim and figure the old file's
    (entry,) = _entries(tmp_path).values()
    assert entry.claims == (("the chain is exact", "rel_err 0.001"),)
    assert "| the chain is exact | rel_err 0.001 | `gemv_check.json` | CPU |" in results_index.render([entry])


def test_result_file_meta_first_the_scripts_own_keys_win(tmp_path, capsys):
    meta = harness.result_meta(ROOT / "bench" / "x.py", "w", ["--out", "a b.json"], "cpu")
    assert meta["command"] == "python bench/x.py --out 'a b.json'"  # as it would be typed
    results = harness.ResultFile(tmp_path / "sub" / "r.json", meta)
    results.write({"rows": [1]})
    written = results.write({"device": "cpu (interpreter)", "rows": [1, 2]})  # rewritten as rows come in
    assert written == json.loads((tmp_path / "sub" / "r.json").read_text())
    assert list(written) == ["what", "command", "device", "commit", "rows"]
    assert written["device"] == "cpu (interpreter)" and written["rows"] == [1, 2]
    assert capsys.readouterr().err == ""  # nothing quoted was replaced

    (tmp_path / "q.json").write_text(json.dumps({"claim": ["a", "b"], "figure": ["1", "2"], "notes": "n"}))
    harness.write_result(tmp_path / "q.json", {"rows": []}, meta)
    kept = json.loads((tmp_path / "q.json").read_text())
    assert kept["claim"] == ["a", "b"] and kept["figure"] == ["1", "2"] and "notes" not in kept


def test_device_and_commit_without_a_gpu_or_a_repository(tmp_path):
    assert harness.device_name("cpu") == harness.cpu_name() and harness.cpu_name().startswith("cpu (")
    assert harness.device_name("cpu (interpreter)") == "cpu (interpreter)"  # a description stays as given
    assert harness.result_meta("bench/x.py", "w", [], {"device": "cuda", "gpus": 2})["device"] == {"device": "cuda",
                                                                                                   "gpus": 2}
    assert harness.git_commit(tmp_path) is None

"""bench/harness.py: a results JSON starts with what bench/results_index.py reads (what, command, card, commit), and
a rerun over a quoted file keeps its claim and figure."""
import json

from bench import harness
from conftest import ROOT


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

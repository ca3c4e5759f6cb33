"""bench/results/README.md is what bench/results_index.py writes from the result files, every result file says how
it was made and where, and no README or doc quotes a result file that is not there."""
import json
import re
from pathlib import Path

from bench import results_index

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "results" / "README.md"]
# a path under bench/results/; one written after a commit ("f25791a:bench/results/x.json") names a file that only git
# history holds, as docs/decisions.md says
QUOTED = re.compile(r"(?<![0-9a-f]:)bench/results/([A-Za-z0-9_./-]+)")


def test_readme_is_what_the_generator_writes():
    entries, _ = results_index.collect()
    readme = (results_index.RESULTS / results_index.README).read_text()
    assert not results_index.check(readme, results_index.render(entries)), (
        "bench/results/README.md is edited by hand or stale: run `make results-index`")
    assert results_index.main(["--check"]) == 0


def test_every_result_says_what_it_is_its_command_and_card():
    entries, problems = results_index.collect()
    assert not problems
    assert entries
    for entry in entries:
        assert entry.what and entry.command and entry.card, entry.name


def test_every_quoted_result_file_exists():
    missing = []
    for doc in DOCS:
        for match in QUOTED.finditer(doc.read_text()):
            name = match.group(1).rstrip(".,")
            if name and not (results_index.RESULTS / name).exists():
                missing.append(f"{doc.relative_to(ROOT)}: bench/results/{name}")
    assert not missing


def _results(tmp_path: Path, **files: dict) -> Path:
    for name, data in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(data, indent=1))
    return tmp_path


def test_a_result_without_a_command_or_card_fails(tmp_path, capsys):
    results = _results(tmp_path, h100_good={"what": "w", "command": "python bench/x.py", "commit": "abc1234"},
                       no_command={"what": "w", "device": "cpu", "commit": "abc1234"},
                       no_card={"what": "w", "command": "python bench/y.py", "commit": "abc1234"})
    (results / "orphan.png").write_bytes(b"")
    assert results_index.main(["--results", str(results)]) == 1
    err = capsys.readouterr().err
    assert "no_command.json: no command" in err and "no_card.json: no card" in err and "orphan.png" in err
    assert "h100_good" not in err


def test_a_hand_edit_fails_the_check(tmp_path, capsys):
    results = _results(tmp_path, h200_a={"what": "w", "command": "c", "commit": "abc1234", "claim": "x is fast",
                                         "figure": "1 ms"},
                       cpu_b={"what": "w", "meta": {"command": "c", "device": "NVIDIA H100 80GB HBM3"},
                              "commit": "abc1234"})
    (results / "h200_a.png").write_bytes(b"")
    assert results_index.main(["--results", str(results)]) == 0
    readme = results / "README.md"
    text = readme.read_text()
    assert "| x is fast | 1 ms | `h200_a.json` | H200 | abc1234 |" in text
    assert "`cpu_b.json` | w | H100 | abc1234 | `c` |" in text  # the device key wins over the name
    assert "(with `h200_a.png`)" in text
    assert results_index.main(["--check", "--results", str(results)]) == 0
    readme.write_text(text.replace("1 ms", "0.5 ms"))
    assert results_index.main(["--check", "--results", str(results)]) == 1
    assert "README.md is not what bench/results_index.py writes" in capsys.readouterr().err

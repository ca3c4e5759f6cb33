"""research/ocria_tiny/beam_quality.py on CPU with a tiny random checkpoint: held-out pages exported as PNG files
with their text, read greedy and with beams (scored; the engine in fp32 against transformers' beam search), and the
share of beam members that continue themselves."""
import json

from conftest import shipped_pages_config, write_synth

from research.ocria_tiny import beam_quality
from research.ocria_tiny.synthetic import TextPool


def test_export_run_and_parents(tmp_path, licence_prose, tiny_checkpoint):
    synth = write_synth(tmp_path / "synth", heldout=TextPool(prose=licence_prose, code=[["x = 1", "y = x + 1"]]))
    pages = tmp_path / "pages"
    beam_quality.main(["export", "--pages", str(pages), "--heldout", "2", "--synth", str(synth),
                       "--config", str(shipped_pages_config(tmp_path))])
    meta = json.loads((pages / "pages.json").read_text())
    assert len(meta["pages"]) == 2 and meta["pool"]["sha256"]
    assert all((pages / f"{p['page']}.png").is_file() and p["reference_text"] for p in meta["pages"])

    beam_quality.main(["run", "--pages", str(pages), "--out", str(tmp_path / "out"), "--model", str(tiny_checkpoint),
                       "--device", "cpu", "--beams", "2", "--check-pages", "1", "--max-new-tokens", "4"])
    result = json.loads((tmp_path / "out" / "beam_quality.json").read_text())
    assert result["pages"]["pool"] == meta["pool"]
    quality, exact = result["rows"][:2], result["rows"][2:]
    assert [(r["part"], r["num_beams"], r["pages"]) for r in quality] == [("ocria-tiny float32", 1, 2),
                                                                          ("ocria-tiny float32", 2, 2)]
    assert all(r["pages_per_s"] > 0 and r["text_cer"] >= 0 for r in quality)
    assert [(r["num_beams"], r["pages"], r["identical"]) for r in exact] == [(1, 1, 1), (2, 1, 1)], exact

    beam_quality.main(["parents", "--pages", str(pages), "--out", str(tmp_path / "parents.json"), "--model",
                       str(tiny_checkpoint), "--beams", "2", "--num-pages", "2", "--max-new-tokens", "4"])
    parents = json.loads((tmp_path / "parents.json").read_text())
    assert parents["request_steps"] > 0 and 0 <= parents["share_of_members_continuing_themselves"] <= 1

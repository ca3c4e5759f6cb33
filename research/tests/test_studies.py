"""The studies kept beside the shipped model's figures: the paired bootstrap that decided each change."""
import json

import pytest
from conftest import load_study


def test_paired_cer_pools_edits_over_characters_and_bootstraps_the_pages_together(tmp_path):
    paired = load_study("paired_cer")

    def eval_file(name, cers, chars, first=0):
        rows = [{"page": f"heldout_{first + i:04d}", "model_text": {"cer": c, "ref_chars": n},
                 "model_md": {"ref_chars": n + 10}, "model_output": "x" * int((n + 10) * (1 + c))}
                for i, (c, n) in enumerate(zip(cers, chars))]
        (tmp_path / name).write_text(json.dumps({"heldout_synthetic": {"per_page": rows}}))
        return tmp_path / name

    chars = [100, 300, 200, 400, 150, 250, 350]
    cers_a = [0.10, 0.20, 0.05, 0.10, 0.30, 0.10, 0.15]
    a = eval_file("a.json", cers_a, chars)
    b = eval_file("b.json", [0.05, 0.10, 0.04, 0.08, 0.20, 0.05, 0.90], chars)  # better on 6, one page runs on
    rows_a, rows_b = paired.read_pages([a]), paired.read_pages([b])
    res = paired.compare(paired.page_errors(rows_a), paired.page_errors(rows_b), draws=500, seed=3)
    assert res["pooled"]["a"] == pytest.approx(sum(c * n for c, n in zip(cers_a, chars)) / sum(chars), abs=1e-4)
    assert (res["pages_b_better"], res["pages_b_worse"]) == (6, 1)
    assert res["median_page"] == {"a": 0.1, "b": 0.08}
    assert res["largest_losses"][0] == "heldout_0006 0.150 -> 0.900"
    lo, hi = res["bootstrap_90pct"]
    assert lo <= res["difference_b_minus_a"] <= hi and lo < 0 < hi  # one run-on page makes the sign uncertain
    assert 0 < res["share_of_draws_b_better"] < 1
    assert paired.run_on_pages(rows_b) == {"ratio": 1.25, "pages": ["heldout_0006"],
                                           "share_of_edits": round(0.9 * 350 / (0.9 * 350 + 0.05 * 100 + 0.1 * 300 +
                                                                               0.04 * 200 + 0.08 * 400 + 0.2 * 150 +
                                                                               0.05 * 250), 3)}
    assert paired.run_on_pages(rows_a)["pages"] == ["heldout_0004"]  # 1.3x its reference
    # the same pages read from two files per side (two processes' halves) give the same errors
    halves = [eval_file("a0.json", cers_a[:4], chars[:4]), eval_file("a1.json", cers_a[4:], chars[4:], first=4)]
    assert paired.page_errors(paired.read_pages(halves)) == paired.page_errors(rows_a)
    # one range of a file that holds more: pages 4-6 are the second half's
    assert paired.page_errors(paired.read_pages([a], (4, 6))) == paired.page_errors(paired.read_pages(halves[1:]))
    with pytest.raises(ValueError, match="different pages"):
        paired.compare(paired.page_errors(rows_a), paired.page_errors(paired.read_pages(halves[:1])))
    # a page whose reference is another on one side (another PyMuPDF drew another document) is left out and listed
    other = eval_file("other.json", cers_a, [*chars[:2], 999, *chars[3:]])
    assert paired.references_differ(rows_a, paired.read_pages([other])) == ["heldout_0002"]
    out = tmp_path / "pair.json"
    paired.main(["--a", str(a), "--b", str(other), "--out", str(out), "--draws", "50"])
    res = json.loads(out.read_text())
    assert res["left_out_references_differ"] == ["heldout_0002"] and res["pages"] == 6


def test_distill_compare_trains_one_drafter_per_share_on_one_collection(tiny_checkpoint, tmp_path):
    """The drafter-recipe study: one collection, a drafter per (--arch, --distill) pair, each logging its validation
    loss and tau estimate."""
    import numpy as np
    from PIL import Image

    pages = tmp_path / "pages"
    pages.mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        Image.fromarray(rng.integers(0, 256, (48 + 16 * i, 64, 3), dtype=np.uint8)).save(pages / f"p{i}.png")
    study = load_study("distill_compare")
    res = study.main(["--pages", str(pages), "--out", str(tmp_path / "d.json"), "--checkpoint", str(tiny_checkpoint),
                      "--steps", "2", "--val-pages", "1", "--val-every", "1", "--max-tokens", "12",
                      "--collect-batch", "4", "--arch", "dflash", "dflash2"])
    assert res["answers"] == 4
    assert [(r["arch"], r["distill"]) for r in res["runs"]] == [("dflash", 0.0), ("dflash", 0.5), ("dflash2", 0.0),
                                                                ("dflash2", 0.5)]
    for r in res["runs"]:
        assert [s for s, _ in r["val_tau_estimate"]] == [0, 1, 2] and r["tau_estimate_at_best"] >= 1.0
    assert json.loads((tmp_path / "d.json").read_text())["runs"] == json.loads(json.dumps(res["runs"]))

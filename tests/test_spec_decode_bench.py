"""bench/spec_decode_bench.py end to end on CPU at toy sizes (--smoke): every part runs and writes its rows."""
import json

import numpy as np
from PIL import Image

from conftest import load_bench
from engine.testing import write_random_drafter


def test_spec_decode_bench_smoke(tiny_checkpoint, tmp_path):
    pages = tmp_path / "pages"
    pages.mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        Image.fromarray(rng.integers(0, 256, (64, 96, 3), dtype=np.uint8)).save(pages / f"b{i}.png")
    drafter = write_random_drafter(tmp_path / "drafter", tiny_checkpoint, block_size=4)
    out = tmp_path / "spec.json"
    load_bench("spec_decode_bench").main(["--device", "cpu", "--smoke", "--checkpoint", str(tiny_checkpoint),
                                          "--drafter", str(drafter), "--pages", str(pages), "--out", str(out),
                                          "--profile", "[0.9, 0.9, 0.9]", "--eager-batches", "1",
                                          "--fold-after", "0", "2"])
    res = json.loads(out.read_text())
    models = [r["model"] for r in res["rows"]]
    assert models == ["ocria-tiny"] * 4 + ["tiny-shape"] * 12
    assert [(r["spec_fold_after"], r["batch"]) for r in res["rows"][:4]] == [(0, 1), (0, 2), (2, 1), (2, 2)]
    # the toy 4B shape: part 1's measured profile, then the given one; steps through the static buffers (as captured
    # on CUDA), batch 1 also eagerly; each GDN write-back threshold in turn
    assert [(r["spec_fold_after"], r["batch"], r["profile"], r["spec_step"]) for r in res["rows"][4:]] == [
        (fold_after, *row) for fold_after in (0, 2) for row in (
            (1, "ocria-tiny measured", "graphs"), (1, "ocria-tiny measured", "eager"), (1, "given 0", "graphs"),
            (1, "given 0", "eager"), (2, "ocria-tiny measured", "graphs"), (2, "given 0", "graphs"))]
    for r in res["rows"]:
        assert {"model", "batch", "block_size", "tau", "tok_s_per_seq", "tok_s_per_seq_plain", "speedup",
                "method"} <= set(r) and r["tau"] >= 1.0 and r["tok_s_per_seq"] > 0
    assert all(r["identical"] == r["batch"] for r in res["rows"][:4])
    # acceptance follows the profile: 9 in 10 per position (tau 3.4 expected with 3 drafts, less where max_tokens
    # cuts a block) against the random drafter's of part 1
    given = [r["tau"] for r in res["rows"][4:] if r["profile"] == "given 0"]
    measured = [r["tau"] for r in res["rows"][4:] if r["profile"] == "ocria-tiny measured"]
    assert min(given) > 2.0 and max(measured) < 1.5, (given, measured)

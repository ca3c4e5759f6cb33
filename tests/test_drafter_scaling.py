"""bench/drafter_scaling.py as a CPU dry run on the tiny random VL checkpoint: one collection, three sizes of a few
pages, a few steps each; every (size, split, block) has its tau row, each drafter learned from the answers to its
first pages only, the collection bench's speedup is carried over, a PNG is drawn, and a budget the answers cannot fit
stops the run after its first group of pages. The collection says where its time went (`collection`, echoed at each
size), each drafter's training how many pages its answers came from; the collection bench bounds its eager side and
writes what it measured as it goes."""
import json
import itertools
import re

import click
import numpy as np
import pytest
from PIL import Image

from conftest import load_bench

SIZES, BLOCKS, SPLITS = (2, 3, 5), (4, 3), ("heldout", "corpus")


def write_images(folder, n: int, seed: int):
    folder.mkdir()
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (48 + 16 * (i % 3), 64, 3), dtype=np.uint8)).save(folder / f"p{i}.png")
    return folder


def flags(ckpt, pages, tmp_path, out, *more):
    return ["--checkpoint", str(ckpt), "--pages", str(pages), "--tau-pages", str(tmp_path / "heldout"),
            "--tau-pages", str(tmp_path / "corpus"), "--steps", "3", "--set", "max_tokens=10", "--set", "num_layers=1",
            "--set", "num_taps=2", "--set", "block_size=4", "--set", "anchors=6", "--set", "gamma=4",
            "--set", "pages_per_step=2", "--set", "collect_batch=4", "--set", "collect_group=2",
            "--set", "save_dtype=float32", "--out", str(out), *more]


@pytest.mark.slow  # a collection, three drafters' training and their tau reads
def test_drafter_scaling_dry_run(tiny_checkpoint, tmp_path, capsys):
    pages = write_images(tmp_path / "pages", 5, seed=0)
    write_images(tmp_path / "heldout", 2, seed=1)
    write_images(tmp_path / "corpus", 1, seed=2)
    bench_json = tmp_path / "collect_bench.json"
    load_bench("drafter_collect_bench").main(
        ["--checkpoint", str(tiny_checkpoint), "--pages", str(pages), "--max-pages", "2", "--batch", "2",
         "--max-tokens", "6", "--num-taps", "2", "--warmup", "0", "--out", str(bench_json)], standalone_mode=False)
    out = tmp_path / "scaling" / "drafter_scaling.json"
    load_bench("drafter_scaling").main(
        flags(tiny_checkpoint, pages, tmp_path, out, "--sizes", ",".join(map(str, SIZES)),
              "--blocks", ",".join(map(str, BLOCKS)), "--collect-bench", str(bench_json)), standalone_mode=False)
    result = json.loads(out.read_text())
    echoed = capsys.readouterr().out
    for key in ("what", "command", "device", "torch", "commit", "config", "collection_s", "collection_pages_per_s",
                "collection_images_per_s", "collection_gb", "collection_mb_per_page", "rows", "png"):
        assert key in result, key
    assert result["collection_speedup"] == json.loads(bench_json.read_text())["speedup"]
    assert result["collection_pages"] == SIZES[-1] and result["dropped"] == {}
    rows = result["rows"]
    assert sorted((r["pages"], r["split"], r["block_size"]) for r in rows) == \
        sorted(itertools.product(SIZES, SPLITS, BLOCKS))
    for r in rows:
        assert r["tau"] >= 1.0 and r["identical_to_plain"], r
        assert r["steps"] == 3 and r["train_seconds"] >= 0
    # each drafter saw the answers to its first pages only: one answer a page here (random weights, no early stop)
    per_size = {r["pages"]: r for r in rows}
    assert [per_size[n]["answers"] for n in SIZES] == list(SIZES)
    assert [per_size[n]["block_images"] for n in SIZES] == list(SIZES)
    tokens = [per_size[n]["answer_tokens"] for n in SIZES]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(SIZES)
    for n in SIZES:
        log = json.loads((out.with_suffix("") / f"pages_{n}" / "train_log.json").read_text())
        assert log["answers"] == n and log["answer_tokens"] == per_size[n]["answer_tokens"]
    assert (out.parent / result["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # where the collection's time went: 3 groups (collect_group 2: sizes 2, 3 and 5 read 2, 1 and 2 pages), parts
    # adding up to at most the collection's wall time, the start apart from the steady part
    c = result["collection"]
    assert c["groups"] == 3 and c["images"] == SIZES[-1] and 0 < c["seconds"] <= result["collection_s"] + 0.1
    assert set(c["parts_s"]) == {"pages_wait", "preprocess", "generate", "taps", "other"}
    assert sum(c["parts_s"].values()) <= c["seconds"] + 0.05 and min(c["parts_s"].values()) >= 0
    assert c["start"]["images"] == 2 and c["steady"]["images"] == SIZES[-1] - 2 and c["steady"]["images_per_s"] > 0
    assert c["target_load_s"] == result["target_load_s"] and c["render"] is None  # files, not drawn pages
    for n in SIZES:  # each size's line carries the breakdown; each training says its pages
        assert re.search(rf"collected the answers to {n} pages .*: target load .*first answers at", echoed), n
        assert re.search(rf"collected {n} answers to {n} pages \(", echoed), n
    assert "None pages" not in echoed
    bench = json.loads(bench_json.read_text())
    assert bench["complete"] and set(bench["phases_s"]) >= {"load", "warmup", "collect", "eager 2"}
    assert bench["speedup_basis"] == "same images" and set(bench["collect_ms_per_image"]) >= {"generate", "taps"}
    # a budget the smallest size's answers cannot fit: stopped after the first group, saying why
    with pytest.raises(click.ClickException, match="over the budget"):
        load_bench("drafter_scaling").main(
            flags(tiny_checkpoint, pages, tmp_path, tmp_path / "small.json", "--sizes", "4",
                  "--memory-gb", str(result["collection_mb_per_page"] / 2**10)), standalone_mode=False)


@pytest.mark.slow  # two collections
def test_collect_bench_bounds_its_eager_side(tiny_checkpoint, tmp_path):
    """--eager-max-images / --seconds stop the eager collection (run last, batch by batch) early: the speedup is then
    the rates' ratio over the images each read, and a drafter_scaling run still picks it up; a bound already past
    when the eager side would start leaves it out, the JSON complete without a speedup."""
    pages = write_images(tmp_path / "pages", 4, seed=0)
    common = ["--checkpoint", str(tiny_checkpoint), "--pages", str(pages), "--batch", "1", "--max-tokens", "6",
              "--num-taps", "2", "--warmup", "1"]
    bounded = tmp_path / "bounded.json"
    load_bench("drafter_collect_bench").main([*common, "--eager-max-images", "2", "--out", str(bounded)],
                                             standalone_mode=False)
    r = json.loads(bounded.read_text())
    assert r["complete"] and r["images"] == 4 and r["eager_images"] == 2 and r["answers_compared"] == 2
    assert r["speedup_basis"] == "rates (eager on the first 2)"
    assert r["speedup"] == pytest.approx(r["collect_images_per_s"] / r["eager_images_per_s"], rel=0.02)
    assert list(r["phases_s"]) == ["load", "warmup", "collect", "eager 1", "eager 2"]
    past = tmp_path / "past.json"
    load_bench("drafter_collect_bench").main([*common, "--seconds", "0", "--out", str(past)], standalone_mode=False)
    r = json.loads(past.read_text())
    assert r["complete"] and "speedup" not in r and "eager_images" not in r and r["collect_images_per_s"] > 0

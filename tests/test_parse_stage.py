"""pipeline.stages.ParseStage outside Ray: concurrent batches on one actor (parse.concurrent_batches) keep every
page's row and split the engine's busy time between them without counting overlaps twice."""
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from engine.testing import build_checkpoint
from pipeline.config import StorageConfig
from pipeline.schema import RASTER_SCHEMA, empty_row
from pipeline.stages import ParseStage


def _batch(doc: str, n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        h, w = 48 + 16 * i, 40
        rows.append(empty_row(RASTER_SCHEMA, uri=f"file:///{doc}.pdf", sha256=doc * 8, page_index=i, page_count=n,
                              total_pages=n, status="ok", image=rng.integers(0, 256, (h, w, 3), np.uint8).tobytes(),
                              image_height=h, image_width=w, text_layer="", raster_s=0.01))
    return pa.Table.from_pylist(rows, schema=RASTER_SCHEMA)


def test_concurrent_batches_keep_rows_and_share_engine_time(tiny_checkpoint, tmp_path):
    stage = ParseStage(run_id="r", backend_name="native", checkpoint=str(tiny_checkpoint), storage=StorageConfig(),
                       cache_dir=str(tmp_path), device="cpu", dtype="float32",
                       sampling={"max_tokens": 6, "temperature": 0.0}, prompt="Read.", fallback_to_text_layer=False,
                       options={"max_num_seqs": 4, "num_blocks": 96})
    batches = [_batch(f"d{b}", 3 + b, b) for b in range(4)]
    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(stage, batches))
    for batch, out in zip(batches, outs):
        assert out.column("page_index").to_pylist() == batch.column("page_index").to_pylist()
        assert set(out.column("uri").to_pylist()) == set(batch.column("uri").to_pylist())
        assert set(out.column("status").to_pylist()) == {"ok"}
    shares = sum(sum(t.column("engine_s").to_pylist()) for t in outs)
    assert abs(shares - stage.backend.busy_s) < 1e-6 and shares > 0
    # each call's span, shared by its pages, holds every page's engine time (submitted -> last token)
    spans = []
    for out in outs:
        rows = out.to_pylist()
        [(start, end)] = {(r["parse_started_unix"], r["parse_ended_unix"]) for r in rows}
        assert all(end - start >= r["parse_s"] > 0 for r in rows)
        spans.append((start, end))
    (s0, e0), (s1, e1) = spans[:2]  # the first two calls ran at once: their spans overlap
    assert max(s0, s1) < min(e0, e1), spans
    stage.backend.close()


def test_loop_drop_reaches_the_page_rows(tmp_path):
    """model.loop_drop_tokens: rows count the tokens a loop's repeats took out of the text, and the text is the
    answer without them (the same pages read without the drop give the full answer)."""
    # tied embeddings: a random model then mostly repeats its last token, so greedy answers fall into loops
    ckpt = build_checkpoint(tmp_path / "tied", seed=6, tie=True)

    def read(sampling):
        stage = ParseStage(run_id="r", backend_name="native", checkpoint=str(ckpt),
                           storage=StorageConfig(), cache_dir=str(tmp_path), device="cpu", dtype="float32",
                           sampling=sampling, prompt="Read.", fallback_to_text_layer=False,
                           options={"max_num_seqs": 4, "num_blocks": 96})
        out = stage(_batch("d", 4, 7))
        stage.backend.close()
        return out.to_pylist()

    free = read({"max_tokens": 40, "temperature": 0.0})
    dropped = read({"max_tokens": 40, "temperature": 0.0, "loop_drop_tokens": 6})
    assert [r["loop_dropped_tokens"] for r in free] == [0] * 4
    assert [r["output_tokens"] for r in dropped] == [r["output_tokens"] for r in free]
    for f, d in zip(free, dropped):
        if d["loop_dropped_tokens"]:
            assert len(d["text"]) < len(f["text"])
        else:
            assert d["text"] == f["text"]
    assert any(r["loop_dropped_tokens"] for r in dropped), [r["text"] for r in free]


def test_speculation_counts_reach_the_page_rows_and_the_stats(tiny_checkpoint, tmp_path):
    """With a drafter (model.drafter) the rows carry each page's verify steps, drafts, accepted drafts (by block
    position) and tau; the text is the plain read's (speculation is lossless); the run's stats add them up."""
    from engine.testing import write_random_drafter
    from pipeline.stats import RunStats, format_table

    drafter = write_random_drafter(tmp_path / "drafter", tiny_checkpoint, block_size=4)

    def read(options):
        stage = ParseStage(run_id="r", backend_name="native", checkpoint=str(tiny_checkpoint), storage=StorageConfig(),
                           cache_dir=str(tmp_path), device="cpu", dtype="float32",
                           sampling={"max_tokens": 10, "temperature": 0.0}, prompt="Read.",
                           fallback_to_text_layer=False, options={"max_num_seqs": 4, "num_blocks": 96, **options})
        out = stage(_batch("d", 3, 5)).to_pylist()
        stage.backend.close()
        return out

    plain, spec = read({}), read({"speculative": {"drafter": str(drafter)}})
    assert [r["text"] for r in spec] == [r["text"] for r in plain]
    assert all(r["spec_steps"] is None or r["spec_steps"] == 0 for r in plain)
    assert all(r["spec_tau"] is None for r in plain)
    for r in spec:
        assert r["spec_steps"] > 0 and r["spec_drafted"] >= r["spec_accepted"] >= 0
        assert r["spec_tau"] == (r["spec_accepted"] + r["spec_steps"]) / r["spec_steps"]
        assert sum(r["spec_drafted_by_pos"]) == r["spec_drafted"] and sum(r["spec_accepted_by_pos"]) == r["spec_accepted"]
        assert len(r["spec_drafted_by_pos"]) <= 3  # block 4: at most 3 drafts a step
    stats = RunStats(run_id="r", engine_actors=1, gpus=0, usd_per_gpu_hour=1.0)
    stats.add_document({"status": "ok", "error_kind": None}, spec)
    s = stats.summary()["speculation"]
    assert s["verify_steps"] == sum(r["spec_steps"] for r in spec)
    assert s["tau"] == (s["accepted"] + s["verify_steps"]) / s["verify_steps"]
    first = sum(r["spec_accepted_by_pos"][0] for r in spec) / sum(r["spec_drafted_by_pos"][0] for r in spec)
    assert s["acceptance_by_position"]["1"] == first
    assert "speculation tau" in format_table(stats.summary())
    plain_stats = RunStats(run_id="p", engine_actors=1, gpus=0, usd_per_gpu_hour=1.0)
    plain_stats.add_document({"status": "ok", "error_kind": None}, plain)
    assert "speculation tau" not in format_table(plain_stats.summary())

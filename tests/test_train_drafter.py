"""jobs/train_drafter.py on the tiny random VL checkpoint: a few CPU steps on the target's own greedy answers to
page images given as PNG files; the loss falls and the drafter it writes loads in the engine and decodes losslessly."""
import json

import numpy as np
from PIL import Image

from engine.models.dflash import load_dflash_config
from engine.config import load_config
from jobs.train_drafter import TrainDrafterConfig, train


def test_train_drafter_smoke(tiny_checkpoint, tmp_path):
    pages = tmp_path / "pages"
    pages.mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        Image.fromarray(rng.integers(0, 256, (64 + 16 * i, 80, 3), dtype=np.uint8)).save(pages / f"p{i}.png")
    cfg = TrainDrafterConfig(checkpoint=str(tiny_checkpoint), pages=str(pages), out=str(tmp_path / "drafter"),
                             max_tokens=24, num_layers=1, num_taps=2, block_size=4, anchors=12, gamma=4, lr=3e-3,
                             steps=60, heldout=1, measure_blocks=[4], seed=0)
    log = train(cfg, echo=lambda *_: None)
    losses = log["losses"]
    assert len(losses) == 60 and np.mean(losses[-10:]) < 0.8 * np.mean(losses[:10]), (losses[:10], losses[-10:])
    dcfg = load_dflash_config(tmp_path / "drafter", load_config(tiny_checkpoint).text)
    assert dcfg.block_size == 4 and len(dcfg.target_layer_ids) == 2
    (tau,) = log["heldout_tau"]
    assert tau["identical_to_plain"] and tau["verify_steps"] > 0 and tau["tau"] >= 1.0
    assert json.loads((tmp_path / "drafter" / "train_log.json").read_text())["steps"] == 60
    # bench/drafter_tau.py measures the same on a folder of images
    from conftest import load_bench

    out = tmp_path / "tau.json"
    load_bench("drafter_tau").main(["--checkpoint", str(tiny_checkpoint), "--drafter", str(tmp_path / "drafter"),
                                    "--pages", str(pages), "--prefix", "p0", "--block", "4", "--max-tokens", "24",
                                    "--check-plain", "--out", str(out)], standalone_mode=False)
    (row,) = json.loads(out.read_text())["rows"]
    assert row["identical_to_plain"] and row["pages"] == 1 and row["block_size"] == 4

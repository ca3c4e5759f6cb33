"""How fast one CPU core makes ocria-tiny training pages (pipeline.synthetic.make_page, then train_tiny.encode_page:
the engine's image processor's uint8 patches + prompt/answer ids) for each kind of page the curricula use. Tells
whether the H200's data loader workers (train.num_workers, 14 of its 16 cores) can keep up with the training step.

    .venv/bin/python bench/ocria_tiny_datagen_bench.py --out bench/results/ocria_tiny_datagen_cpu.json
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STAGES = {  # the page kinds of RECIPE=E (bench/ocria_tiny_gpu_run.sh)
    "lines 14-24 px, cropped": dict(font_px=[14, 24], max_chars=[8, 80], crop=True, strict_chars=True),
    "paragraphs 14-24 px, cropped": dict(font_px=[14, 24], max_chars=[60, 400], crop=True),
    "full pages 12-20 px": dict(font_px=[12, 20], max_chars=[100, 800]),
    "final pages 10-18 px": dict(font_px=[10, 18], max_chars=[150, 1300]),
}


def main(argv=None) -> dict:
    import yaml

    from jobs.train_tiny import PromptBuilder, encode_page, load_image_processor, settings_config
    from pipeline.synthetic import TextPool, make_page

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=Path("configs/train_tiny.yaml"))
    ap.add_argument("--synth", type=Path, default=Path(".synth"))
    ap.add_argument("--model-dir", type=Path, default=Path("build/ocria-tiny-next2"))
    ap.add_argument("--pages", type=int, default=30, help="pages per kind")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    cfg = yaml.safe_load(args.config.read_text())
    pool = TextPool.from_json_gz(args.synth / "pool_train.json.gz")
    processor, builder = load_image_processor(args.model_dir), PromptBuilder(args.model_dir, cfg["prompt"])
    merge, max_answer = cfg["model"]["vision"]["spatial_merge_size"], cfg["data"]["max_answer_tokens"]
    rows = {}
    for name, settings in STAGES.items():
        scfg = settings_config(cfg, settings)
        make_s = encode_s = 0.0
        for i in range(args.pages):
            t0 = time.perf_counter()
            page = make_page(cfg["data"]["seed"] + i, pool, scfg, args.synth / "fonts")
            t1 = time.perf_counter()
            encode_page(page.image, page.markdown, processor, builder, merge, max_answer)
            make_s, encode_s = make_s + t1 - t0, encode_s + time.perf_counter() - t1
        rows[name] = dict(pages=args.pages, make_ms=1e3 * make_s / args.pages, encode_ms=1e3 * encode_s / args.pages,
                          pages_per_s_per_core=args.pages / (make_s + encode_s))
        print(f"{name:30s} make {rows[name]['make_ms']:5.1f} ms  encode {rows[name]['encode_ms']:5.1f} ms  "
              f"{rows[name]['pages_per_s_per_core']:5.1f} pages/s per core", flush=True)
    res = dict(cpu=platform.processor() or platform.machine(), command=" ".join(["bench/ocria_tiny_datagen_bench.py",
               *(argv if argv is not None else sys.argv[1:])]), stages=rows)
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()

"""Collect the text pools and fonts for synthetic pages, and optionally write preview / held-out pages.

  python -m research.ocria_tiny.make_synthetic_pages --out .synth                      # pools + fonts (what training carries)
  python -m research.ocria_tiny.make_synthetic_pages --out .synth --preview 8          # + PNG/markdown previews in .synth/preview
  python -m research.ocria_tiny.make_synthetic_pages --out .synth --bench 40           # + pages/s of the generator on one core
"""
from __future__ import annotations

import argparse
import shutil
import sys
import sysconfig
import time
from pathlib import Path

from research.ocria_tiny.synthetic import TTF_FAMILIES, SynthConfig, TextPool, collect_pool, make_page

FONT_DIRS = (Path("/usr/share/fonts/truetype/dejavu"),)
HELDOUT_CODE_PACKAGE = "numpy"  # code lines of held-out pages come from this package, never from the stdlib


def heldout_code_root() -> Path | None:
    try:
        import numpy

        return Path(numpy.__file__).parent
    except ImportError:
        return None


def build(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for split, code_root in (("train", None), ("heldout", heldout_code_root())):
        t0 = time.time()
        pool = collect_pool(split, stdlib, code_root)
        pool.to_json_gz(out / f"pool_{split}.json.gz")
        chars = sum(map(len, pool.prose))
        print(f"{split}: {len(pool.prose)} paragraphs ({chars / 1e6:.1f} M chars), {len(pool.code)} code runs, "
              f"{time.time() - t0:.1f}s")
    fonts = out / "fonts"
    fonts.mkdir(exist_ok=True)
    for name in TTF_FAMILIES:
        for d in FONT_DIRS:
            if (d / name).is_file():
                shutil.copyfile(d / name, fonts / name)
    print("fonts:", sorted(p.name for p in fonts.iterdir()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(".synth"))
    ap.add_argument("--skip-build", action="store_true", help="reuse pools already in --out")
    ap.add_argument("--preview", type=int, default=0, help="write this many training pages as PNG + .md")
    ap.add_argument("--bench", type=int, default=0, help="time this many pages")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not args.skip_build:
        build(args.out)
    pool = TextPool.from_json_gz(args.out / "pool_train.json.gz")
    cfg = SynthConfig()
    fonts = args.out / "fonts"
    if args.preview:
        from PIL import Image

        prev = args.out / "preview"
        prev.mkdir(exist_ok=True)
        for i in range(args.preview):
            page = make_page(args.seed + i, pool, cfg, fonts)
            Image.fromarray(page.image).save(prev / f"page_{i:03d}.png")
            (prev / f"page_{i:03d}.md").write_text(page.markdown + "\n")
            print(i, page.image.shape, page.style, len(page.markdown))
    if args.bench:
        t0 = time.time()
        for i in range(args.bench):
            make_page(args.seed + 10_000 + i, pool, cfg, fonts)
        print(f"{args.bench / (time.time() - t0):.1f} pages/s on one core")
    return 0


if __name__ == "__main__":
    sys.exit(main())

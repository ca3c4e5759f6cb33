"""Character / word error rate of ocria-tiny and Tesseract on (a) held-out synthetic pages and (b) born-digital pages of
the shared corpus (reference: the PDF's text layer), all rendered by the pipeline's rasterizer at the model's resolution.

  python -m research.ocria_tiny.eval_ocr --model models/ocria-tiny --synth .synth --heldout 40 \
      --config research/ocria_tiny/results/eval_full_pages_1536_config.yaml \
      --corpus ../shared/corpus --corpus-pages 12 --out research/ocria_tiny/results/eval.json

The config's page size (image.target_longest_px, max_pixels) must be the model's (its processor's max_pixels): the
shipped model reads pages at 1,536 px; research/ocria_tiny/train_tiny.yaml's default is 768 px.

Metrics: CER = Levenshtein(hyp, ref) / len(ref) over characters, WER the same over whitespace-separated words; the
aggregate is micro (total edits / total reference length). `md` compares the model's markdown with the generating
markdown exactly (whitespace runs collapsed); `text` compares plain text (markdown syntax stripped, whitespace
collapsed) and is the metric shared with Tesseract and with the corpus text layers.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unicodedata
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from pipeline.text import collapse_ws, edit_distance_rows, levenshtein, markdown_to_text  # noqa: F401 (re-exported)

# ---------------------------------------------------------------- metrics


MARKDOWN_LINE_KINDS = ("paragraph", "heading", "list", "table", "code")


def markdown_line_kinds(markdown: str) -> list[str]:
    """The kind of each line of `markdown.split("\\n")` in our markdown subset: a code fence's lines (fences
    included) are code; an empty line goes with the line before."""
    kinds: list[str] = []
    fenced = False
    for line in markdown.split("\n"):
        if not line and kinds:
            kind = kinds[-1]
        elif line.startswith("```"):
            kind, fenced = "code", not fenced
        elif fenced:
            kind = "code"
        elif line.startswith("|"):
            kind = "table"
        elif line.startswith("#"):
            kind = "heading"
        elif re.match(r"(- |\d+\. )", line):
            kind = "list"
        else:
            kind = "paragraph"
        kinds.append(kind)
    return kinds


def normalize_reference(text: str) -> str:
    """Corpus text layers: compatibility forms folded (ligatures -> letters), whitespace collapsed."""
    return collapse_ws(unicodedata.normalize("NFKC", text))


@dataclass
class Score:
    char_edits: int = 0
    chars: int = 0
    word_edits: int = 0
    words: int = 0
    pages: int = 0

    def add(self, hyp: str, ref: str) -> dict:
        ce, we = levenshtein(hyp, ref), levenshtein(hyp.split(), ref.split())
        self.char_edits += ce
        self.chars += len(ref)
        self.word_edits += we
        self.words += len(ref.split())
        self.pages += 1
        return {"cer": ce / max(1, len(ref)), "wer": we / max(1, len(ref.split())), "ref_chars": len(ref)}

    def summary(self) -> dict:
        return {"cer": self.char_edits / max(1, self.chars), "wer": self.word_edits / max(1, self.words),
                "pages": self.pages, "ref_chars": self.chars, "ref_words": self.words}


# ---------------------------------------------------------------- readers


class HFPageReader:
    """ocria-tiny through transformers' Qwen3_5ForConditionalGeneration, batched with left padding; greedy, or beam
    search with `num_beams` > 1 (transformers' length-normalised beam scores, early stopping)."""

    def __init__(self, model_dir: Path, device: str = "cpu", model=None, prompt: str | None = None,
                 num_beams: int = 1):
        import torch
        from transformers import Qwen3_5ForConditionalGeneration

        from engine.interface import DEFAULT_PROMPT
        from research.ocria_tiny.encoding import PromptBuilder, load_image_processor

        self.torch = torch
        self.device = device
        self.model = model if model is not None else Qwen3_5ForConditionalGeneration.from_pretrained(
            model_dir, dtype=torch.float32).to(device)
        self.processor = load_image_processor(model_dir)
        self.builder = PromptBuilder(model_dir, prompt or DEFAULT_PROMPT)
        self.merge = self.model.config.vision_config.spatial_merge_size
        self.num_beams = num_beams

    def read(self, images: list[np.ndarray], max_new_tokens: int = 512) -> list[str]:
        from research.ocria_tiny.encoding import encode_page

        torch = self.torch
        items = [encode_page(im, None, self.processor, self.builder, self.merge, 0) for im in images]
        n = max(len(x["input_ids"]) for x in items)
        pad = self.builder.ids.endoftext
        ids = torch.full((len(items), n), pad, dtype=torch.long)
        mask = torch.zeros((len(items), n), dtype=torch.long)
        for i, x in enumerate(items):
            L = len(x["input_ids"])
            ids[i, n - L :], mask[i, n - L :] = x["input_ids"], 1
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                mm_token_type_ids=(ids == self.builder.ids.image_pad).to(torch.int32).to(self.device),
                pixel_values=self.processor.expand_patches(
                    torch.cat([x["pixel_bytes"] for x in items]).to(self.device)),
                image_grid_thw=torch.stack([x["grid"] for x in items]).to(self.device),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                num_beams=self.num_beams,
                early_stopping=self.num_beams > 1,  # a beam search ends once num_beams answers have ended
                eos_token_id=self.builder.ids.eos_ids,
                pad_token_id=pad,
            )
        self.model.train(was_training)
        return [self.builder.tok.decode(row[n:].tolist(), skip_special_tokens=True).strip() for row in out.cpu()]

    def fed_answer(self, image: np.ndarray, markdown: str, max_answer: int):
        """Teacher forcing: the logits [T, V] (float32, on the CPU) the model gives at each of the T answer tokens of
        `markdown` when fed the reference before it, and those tokens. The answer is the markdown's tokens then the
        stop token, or only its first `max_answer` tokens when it is longer."""
        from research.ocria_tiny.encoding import encode_page, encoded_batch, model_inputs

        item = encode_page(image, markdown, self.processor, self.builder, self.merge, max_answer)
        batch = encoded_batch([item], self.builder, self.processor)
        was_training = self.model.training
        self.model.eval()
        with self.torch.no_grad():
            logits = self.model(**{k: v.to(self.device) for k, v in model_inputs(batch).items()}).logits[0, :-1]
        self.model.train(was_training)
        labels = batch["labels"][0, 1:]
        answer = labels != -100
        return logits.float().cpu()[answer], labels[answer]


class EnginePageReader:
    """ocria-tiny through the pipeline's own path: the native engine's parse backend (its processor, chat template
    and decoding), greedy or beam search with `num_beams` > 1; `loop_stop_tokens` > 0 ends looping answers,
    `loop_drop_tokens` > 0 leaves the loops' repeats out and reads on (engine/loop_guard.py). dtype "auto": fp32 on
    CPU, bf16 on CUDA."""

    def __init__(self, model_dir: Path, device: str = "cpu", num_beams: int = 1, batch: int = 8,
                 dtype: str = "auto", loop_stop_tokens: int = 0, loop_drop_tokens: int = 0,
                 loop_ban_next: bool = False, engine_options: dict | None = None):
        from engine.backends import load_backend

        self.backend = load_backend("native", str(model_dir), device=device, dtype=dtype,
                                    max_batch_size=batch * num_beams, **(engine_options or {}))
        self.processor = self.backend.engine.processor.image_processor
        self.num_beams = num_beams
        self.loop_stop_tokens = loop_stop_tokens
        self.loop_drop_tokens = loop_drop_tokens
        self.loop_ban_next = loop_ban_next

    def read(self, images: list[np.ndarray], max_new_tokens: int = 512) -> list[str]:
        from engine.interface import PageRequest, SamplingParams

        sampling = SamplingParams(max_tokens=max_new_tokens, num_beams=self.num_beams,
                                  loop_stop_tokens=self.loop_stop_tokens, loop_drop_tokens=self.loop_drop_tokens,
                                  loop_ban_next=self.loop_ban_next)
        results = self.backend.parse([PageRequest(f"page-{i}", im, sampling=sampling) for i, im in enumerate(images)])
        failed = [f"{r.request_id}: {r.error}" for r in results if r.finish_reason == "error"]
        if failed:
            raise RuntimeError(f"the engine failed on {len(failed)} page(s): {failed[:3]}")
        return [r.text.strip() for r in results]

    def close(self) -> None:
        self.backend.close()


class BlockReader:
    """Another reader, page by page in blocks of at most `max_lines` text lines (pipeline.blocks): all blocks of the
    pages in one call to the reader, their answers joined again per page. With `tolerance` > 0 the pages are read whole
    too, and the whole read is kept unless its length differs from the blocks' by more (pipeline.blocks.prefer_blocks),
    as the job does (model.block_lines, model.block_tolerance)."""

    def __init__(self, reader: HFPageReader | EnginePageReader, max_lines: int, tolerance: float = 0.0,
                 scales: tuple[float, ...] = (1.0,)):
        self.reader = reader
        self.processor = reader.processor
        self.max_lines = max_lines
        self.tolerance = tolerance
        self.scales = scales
        self.chose_blocks: list[bool] = []  # per page read so far, with a tolerance: whether the blocks' read was taken
        self.block_images_read = 0  # every block image the reader was given (each scale, each guard's half)

    def read(self, images: list[np.ndarray], max_new_tokens: int = 512,
             views: list[list[np.ndarray]] | None = None) -> list[str]:
        """The pages' texts; `views`: each page drawn at the other scales (else their block crops are resized)."""
        from pipeline.blocks import join_block_texts, prefer_blocks, read_blocks

        token_px = self.processor.patch_size * self.processor.merge_size

        def read_items(items):
            self.block_images_read += len(items)
            return self.reader.read([crop for _, _, crop in items], max_new_tokens)

        read = read_blocks(images, self.max_lines, token_px, read_items, block_scales=self.scales, views=views)
        by_blocks = [join_block_texts(blocks, texts) for blocks, texts, _ in read]
        if not self.tolerance:
            return by_blocks
        whole = self.reader.read(images, max_new_tokens)
        chosen = [prefer_blocks(w, b, self.tolerance) for w, b in zip(whole, by_blocks)]
        self.chose_blocks += chosen
        return [b if c else w for w, b, c in zip(whole, by_blocks, chosen)]

    def close(self) -> None:
        self.reader.close()


def tesseract_available() -> bool:
    return shutil.which("tesseract") is not None


def tesseract_read(image: np.ndarray) -> str:
    from PIL import Image

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "page.png"
        Image.fromarray(image).save(path)
        env = dict(os.environ, OMP_THREAD_LIMIT="1")
        res = subprocess.run(["tesseract", str(path), "-", "--psm", "3", "-l", "eng"], capture_output=True, text=True,
                             env=env, timeout=120)
        if res.returncode != 0:
            raise RuntimeError(f"tesseract failed: {res.stderr.strip()[:300]}")
        return res.stdout


# ---------------------------------------------------------------- page sets


@dataclass
class EvalPage:
    name: str
    image: np.ndarray
    reference_md: str | None  # synthetic pages only
    reference_text: str
    lines: list | None = None  # synthetic pages: their text lines (research.ocria_tiny.synthetic.TextLine), where each lies
    columns: int | None = None  # synthetic pages: how many columns the layout had
    pdf: bytes | None = None  # synthetic pages: the one-page PDF the image was drawn from
    views: tuple[np.ndarray, ...] = ()  # the page drawn at Drawing.zooms (blocks read at several sizes)


@dataclass(frozen=True)
class Drawing:
    """How the pages are drawn for the reader: at the config's page size, or, with glyph_px > 0, pages with a text
    layer so their body text's em is glyph_px pixels within max_pixels, as the job draws them
    (pipeline.rasterize.page_scale)."""
    target_longest_px: int
    max_pixels: int
    glyph_px: float = 0.0
    as_scans: bool = False  # with glyph_px: ignore the text layer, size the glyphs from the ink as the job sizes scans
    zooms: tuple[float, ...] = ()  # the page drawn again at these times its size (the job's other block scales)

    def render(self, page) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """The page's image and its views at `zooms`."""
        from pipeline.rasterize import render_views

        image, *views = render_views(page, self.target_longest_px, self.max_pixels, self.glyph_px,
                                     glyph_from_ink=self.as_scans, text_layer=not self.as_scans, zooms=self.zooms)
        return image, tuple(views)


def glyph_drawing(cfg: dict, model_dir: Path, glyph_px: float, max_new_tokens: int, as_scans: bool = False,
                  zooms: tuple[float, ...] = ()) -> Drawing:
    """Pages at glyph_px up to the pixels the model's processor lets through and its context holds beside
    max_new_tokens of answer, as the job caps them (pipeline.page_reading.glyph_max_pixels)."""
    from pipeline.page_reading import glyph_max_pixels, image_processor

    target = cfg["image"]["target_longest_px"]
    cap = glyph_max_pixels(str(model_dir), image_processor(str(model_dir)), max_new_tokens, target)
    return Drawing(target, cap, glyph_px, as_scans, zooms)


def heldout_pages(n: int, cfg: dict, synth: Path, page_index: int | None = None, first: int = 0,
                  drawing: Drawing | None = None) -> list[EvalPage]:
    """Pages `first` .. `first` + n - 1 from the held-out text pool (licences, another package's code) and held-out
    seeds, drawn like the final training distribution, or like training page `page_index` (its curriculum stage).
    A later `first` gives pages no earlier choice between checkpoints was made on. With a glyph-size `drawing` each
    page's PDF is drawn again that way (`redrawn`)."""
    from research.ocria_tiny.train_config import synth_config
    from research.ocria_tiny.synthetic import TextPool, make_page

    pool = TextPool.from_json_gz(synth / "pool_heldout.json.gz")
    scfg = synth_config(cfg, page_index)
    pages = []
    for i in range(first, first + n):
        p = make_page(cfg["data"]["heldout_seed"] + i, pool, scfg, synth / "fonts")
        pages.append(EvalPage(f"heldout_{i:04d}", p.image, p.markdown, markdown_to_text(p.markdown), p.lines,
                              p.style.columns, p.pdf))
    return redrawn(pages, drawing) if drawing is not None and drawing.glyph_px else pages


def redrawn(pages: list[EvalPage], drawing: Drawing) -> list[EvalPage]:
    """Synthetic pages drawn again from their PDFs by `drawing` (the same documents at another size; their text-line
    boxes, drawn for the first size, are left out)."""
    import pymupdf

    out = []
    for p in pages:
        with pymupdf.open("pdf", p.pdf) as doc:
            image, views = drawing.render(doc[0])
            out.append(replace(p, image=image, views=views, lines=None))
    return out


def pymupdf_version() -> str:
    """The PyMuPDF that drew the pages: versions lay the same page out with more or less text (1.26.7 on the GPU
    machine and 2.0 here differ on 2 of 96 held-out pages, session 29), so references match only within one."""
    import pymupdf

    return pymupdf.__version__


def pool_fingerprint(synth: Path) -> dict:
    """Which held-out pool drew the pages: its size and a hash of its file (written byte-stable, gzip mtime 0).
    The pool is collected from the machine's licences and numpy's code, so another machine image can give other
    pages under the same seeds; compare held-out numbers only between results with the same fingerprint."""
    import hashlib

    from research.ocria_tiny.synthetic import TextPool

    path = synth / "pool_heldout.json.gz"
    pool = TextPool.from_json_gz(path)
    return {"paragraphs": len(pool.prose), "code_runs": len(pool.code),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:16]}


MIN_VOWEL_SHARE = 0.25  # text in Latin script: 37-48 % on the corpus' pages; shifted glyph codes: 7-13 %


def text_layer_reads(text: str) -> bool:
    """Whether a text layer is text at all: at least MIN_VOWEL_SHARE of its letters a-z are vowels (y included).
    Two arXiv first pages of the corpus map their glyphs to letters shifted by one ("kzmftzfd" for "language"), so
    their text layer cannot be the reference; English, German and Lorem Ipsum pass."""
    letters = [c for c in text.lower() if "a" <= c <= "z"]
    return bool(letters) and sum(c in "aeiouy" for c in letters) / len(letters) >= MIN_VOWEL_SHARE


def first_page_reads(pdf: Path) -> bool:
    """Whether the PDF's first page has a text layer that reads as text (`text_layer_reads`)."""
    import pymupdf

    with pymupdf.open(pdf) as doc:
        return text_layer_reads(doc[0].get_text("text"))


BORN_DIGITAL = ("text", "table", "multicol")  # manifest categories whose first page's text layer was typeset


def born_digital_rows(corpus: Path, min_chars: int = 200, readable_only: bool = True,
                      categories: tuple[str, ...] = BORN_DIGITAL) -> list[dict]:
    """Manifest rows of the corpus PDFs whose first page is born-digital text: expected ok, category text/table/multicol,
    a text layer of at least `min_chars` characters, not rendered blank, and (`readable_only`) a text layer that
    reads as text (`text_layer_reads`); sorted by file name. Other `categories` (e.g. scan: scans with an OCR layer)
    are taken the same way."""
    import csv

    rows = list(csv.DictReader((corpus / "manifest.csv").open()))
    rows = [r for r in rows if r["expected_behaviour"] == "ok" and r["category"] in categories
            and r["blank_render_p0"] == "False" and int(r["text_chars_p0"] or 0) >= min_chars
            and (not readable_only or first_page_reads(corpus / r["filename"]))]
    return sorted(rows, key=lambda r: r["filename"])


def corpus_pages(corpus: Path, n: int, cfg: dict, min_chars: int = 200,
                 drawing: Drawing | None = None, categories: tuple[str, ...] = BORN_DIGITAL) -> list[EvalPage]:
    """First pages of born-digital corpus PDFs (manifest: expected ok, category text/table/multicol, a text layer,
    not rendered blank), or of other `categories`, rendered by the pipeline's rasterizer (at the config's page size
    unless `drawing` says otherwise); the reference is the page's text layer (a scan's: its OCR layer)."""
    import pymupdf

    drawing = drawing or Drawing(cfg["image"]["target_longest_px"], cfg["image"]["max_pixels"])
    pages = []
    for r in born_digital_rows(corpus, min_chars, categories=categories):
        if len(pages) >= n:
            break
        doc = pymupdf.open(corpus / r["filename"])
        try:
            page = doc[0]
            ref = normalize_reference(page.get_text("text"))
            if len(ref) < min_chars:
                continue
            image, views = drawing.render(page)
        finally:
            doc.close()
        pages.append(EvalPage(r["filename"], image, None, ref, views=views))
    return pages


# ---------------------------------------------------------------- run


def config_fits_model(cfg: dict, model_dir: Path, processor_max_pixels: int) -> bool:
    """Whether the config draws pages at the model's own size: the page size its ocria_info.json names (page_px),
    within what its processor lets through unshrunk; without page_px, its processor's max_pixels exactly."""
    from pipeline.checkpoint import checkpoint_info

    page_px = checkpoint_info(str(model_dir)).get("page_px")
    if page_px:
        return cfg["image"]["target_longest_px"] == page_px and cfg["image"]["max_pixels"] <= processor_max_pixels
    return cfg["image"]["max_pixels"] == processor_max_pixels


def evaluate(pages: list[EvalPage], reader: HFPageReader | EnginePageReader | None, use_tesseract: bool,
             batch: int, max_new_tokens: int) -> dict:
    model_md, model_text, tess = Score(), Score(), Score()
    per_page = []
    model_s = tess_s = 0.0
    for k in range(0, len(pages), batch):
        chunk = pages[k : k + batch]
        hyps = [None] * len(chunk)
        if reader is not None:
            t0 = time.time()
            images = [p.image for p in chunk]
            hyps = (reader.read(images, max_new_tokens, [list(p.views) for p in chunk])
                    if isinstance(reader, BlockReader) else reader.read(images, max_new_tokens))
            model_s += time.time() - t0
        for p, hyp in zip(chunk, hyps):
            rec = {"page": p.name, "size": list(p.image.shape[:2])}
            if hyp is not None:
                rec["model_text"] = model_text.add(markdown_to_text(hyp), p.reference_text)
                if p.reference_md is not None:
                    rec["model_md"] = model_md.add(collapse_ws(hyp), collapse_ws(p.reference_md))
                rec["model_output"] = hyp  # whole, so decoding rules (loop stops) can be replayed on it
            if use_tesseract:
                t0 = time.time()
                rec["tesseract_text"] = tess.add(collapse_ws(tesseract_read(p.image)), p.reference_text)
                tess_s += time.time() - t0
            per_page.append(rec)
            print(json.dumps({k: v for k, v in rec.items() if k != "model_output"}), flush=True)
    out = {"per_page": per_page}
    if reader is not None:
        out["model_text"] = model_text.summary() | {"seconds": round(model_s, 1)}
        if model_md.pages:
            out["model_md"] = model_md.summary()
    if use_tesseract:
        out["tesseract_text"] = tess.summary() | {"seconds": round(tess_s, 1)}
    return out


def note_blocks_taken(reader, section: dict) -> None:
    """With a BlockReader: the block images it read; reading pages both ways, the pages whose block read was taken."""
    if isinstance(reader, BlockReader):
        section["block_images_read"], reader.block_images_read = reader.block_images_read, 0
    if isinstance(reader, BlockReader) and reader.tolerance:
        section["blocks_taken"] = [r["page"] for r, c in zip(section["per_page"], reader.chose_blocks) if c]
        reader.chose_blocks = []


def main(argv: list[str] | None = None) -> int:
    from research.ocria_tiny.train_config import load_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path("models/ocria-tiny"))
    ap.add_argument("--config", type=Path, default=Path("research/ocria_tiny/train_tiny.yaml"))
    ap.add_argument("--synth", type=Path, default=Path(".synth"))
    ap.add_argument("--heldout", type=int, default=40, help="held-out synthetic pages (0: none)")
    ap.add_argument("--heldout-from", type=int, default=0, help="the first held-out page's number")
    ap.add_argument("--corpus", type=Path, default=Path("../shared/corpus"))
    ap.add_argument("--corpus-pages", type=int, default=12, help="born-digital corpus pages (0: none)")
    ap.add_argument("--corpus-categories", nargs="+", default=list(BORN_DIGITAL),
                    help="manifest categories of the corpus pages (scan: scans whose OCR layer is the reference)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=1024, help="full synthetic pages take up to ~680")
    ap.add_argument("--num-beams", type=int, default=1, help="1: greedy decoding")
    ap.add_argument("--loop-stop-tokens", type=int, default=0,
                    help="native reader: end an answer that loops over this many tokens (0: off)")
    ap.add_argument("--loop-drop-tokens", type=int, default=0,
                    help="native reader: leave out the repeats of a loop over this many tokens and read on (0: off)")
    ap.add_argument("--loop-ban-next", action="store_true",
                    help="with --loop-drop-tokens: forbid the token that would go on with a loop")
    ap.add_argument("--glyph-px", type=float, default=0.0,
                    help="draw pages with a text layer so their body text is this many pixels (the job's "
                         "raster.glyph_px; 0: every page at the config's size)")
    ap.add_argument("--glyph-from-ink", action="store_true",
                    help="with --glyph-px: draw the pages as scans are drawn, the text layer ignored and the glyph "
                         "size measured from the ink's text lines (raster.glyph_from_ink)")
    ap.add_argument("--reader", choices=["transformers", "native"], default="transformers",
                    help="native: the pipeline's engine and processor (engine.native_backend)")
    ap.add_argument("--block-lines", type=int, default=0,
                    help="read each page in blocks of at most this many text lines (pipeline.blocks; 0: whole pages)")
    ap.add_argument("--block-tolerance", type=float, default=0.0,
                    help="with --block-lines: read pages whole too and keep that read unless its plain text's length "
                         "differs from the blocks' by more than this share (the job's model.block_tolerance; 0: "
                         "blocks only)")
    ap.add_argument("--block-scales", type=float, nargs="+", default=[1.0],
                    help="with --block-lines: read each block at these sizes (the first the main read) and keep the "
                         "reads' character vote (pipeline.vote; the job's model.block_scales)")
    ap.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE",
                    help="native reader: an EngineOptions field given as a string (e.g. gdn_state_dtype=bfloat16)")
    ap.add_argument("--no-model", action="store_true")
    ap.add_argument("--no-tesseract", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                    help="native reader: auto is fp32 on the CPU, bf16 on CUDA")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    cfg = load_config(args.config, [])
    if (args.loop_stop_tokens or args.loop_drop_tokens) and args.reader != "native":
        raise SystemExit("--loop-stop-tokens and --loop-drop-tokens need --reader native (transformers' generate "
                         "has neither)")
    use_tess = not args.no_tesseract and tesseract_available()
    if not args.no_tesseract and not use_tess:
        print("tesseract not found: skipping the Tesseract baseline "
              "(apt-get install -y --no-install-recommends tesseract-ocr tesseract-ocr-eng)", file=sys.stderr)
    readers = {"transformers": lambda: HFPageReader(args.model, args.device, num_beams=args.num_beams),
               "native": lambda: EnginePageReader(args.model, args.device, args.num_beams, args.batch, args.dtype,
                                                  loop_stop_tokens=args.loop_stop_tokens,
                                                  loop_drop_tokens=args.loop_drop_tokens,
                                                  loop_ban_next=args.loop_ban_next,
                                                  engine_options=dict(o.split("=", 1) for o in args.engine_option))}
    reader = None if args.no_model else readers[args.reader]()
    if reader is not None and args.block_lines:
        reader = BlockReader(reader, args.block_lines, args.block_tolerance, tuple(args.block_scales))
    if reader is not None and not config_fits_model(cfg, args.model, reader.processor.max_pixels):
        raise SystemExit(f"{args.config} draws pages at {cfg['image']['target_longest_px']} px, max_pixels "
                         f"{cfg['image']['max_pixels']:,}, but {args.model} reads pages of another size (its "
                         f"processor's max_pixels {reader.processor.max_pixels:,}, ocria_info.json's page_px): pass a "
                         "--config at the model's size (e.g. research/ocria_tiny/results/eval_full_pages_1536_config.yaml "
                         "for the shipped model)")
    drawing = Drawing(cfg["image"]["target_longest_px"], cfg["image"]["max_pixels"])
    if args.glyph_px:
        drawing = glyph_drawing(cfg, args.model, args.glyph_px, args.max_new_tokens, args.glyph_from_ink,
                                tuple(args.block_scales[1:]) if args.block_lines else ())
    elif args.glyph_from_ink:
        raise SystemExit("--glyph-from-ink needs --glyph-px (the size to draw the measured glyphs at)")
    result = {"command": " ".join([Path(sys.executable).name, "-m", "research.ocria_tiny.eval_ocr", *(argv or sys.argv[1:])]),
              "model": str(args.model), "reader": args.reader, "num_beams": args.num_beams,
              "loop_stop_tokens": args.loop_stop_tokens, "loop_drop_tokens": args.loop_drop_tokens,
              "loop_ban_next": args.loop_ban_next, "glyph_px": args.glyph_px, "glyph_from_ink": args.glyph_from_ink,
              "block_lines": args.block_lines,
              "block_tolerance": args.block_tolerance, "block_scales": args.block_scales,
              "tesseract": use_tess, "pymupdf": pymupdf_version()}
    if args.heldout:
        pages = heldout_pages(args.heldout, cfg, args.synth, first=args.heldout_from, drawing=drawing)
        result["heldout_synthetic"] = evaluate(pages, reader, use_tess, args.batch, args.max_new_tokens)
        note_blocks_taken(reader, result["heldout_synthetic"])
        result["heldout_synthetic"]["pool"] = pool_fingerprint(args.synth)
    if args.corpus_pages:
        categories = tuple(args.corpus_categories)
        result["corpus"] = evaluate(corpus_pages(args.corpus, args.corpus_pages, cfg, drawing=drawing,
                                                 categories=categories), reader, use_tess, args.batch,
                                    args.max_new_tokens)
        note_blocks_taken(reader, result["corpus"])
        result["corpus"]["categories"] = list(categories)
        result["corpus"]["left_out_unreadable_text_layer"] = [
            r["filename"] for r in born_digital_rows(args.corpus, readable_only=False, categories=categories)
            if not first_page_reads(args.corpus / r["filename"])]
    summary = {s: {k: v for k, v in result[s].items() if k != "per_page"} for s in ("heldout_synthetic", "corpus") if s in result}
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

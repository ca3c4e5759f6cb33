"""Synthetic document pages for training and evaluating ocria-tiny: text blocks -> (markdown, HTML) -> PyMuPDF Story
layout -> one-page PDF -> the pipeline's rasterizer. The markdown that produced a page is its ground truth.

Everything is a pure function of (seed, text pool, page settings), so a page can be regenerated from its seed.
Imports only the standard library, numpy, pymupdf and pipeline.rasterize: it runs on the GPU machine too.
"""
from __future__ import annotations

import ast
import gzip
import html
import io
import json
import random
import re
import string
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pymupdf

from pipeline.rasterize import render_page

# ---------------------------------------------------------------- text pools


@dataclass(frozen=True)
class TextPool:
    prose: list[str]  # paragraphs, ASCII, single-spaced
    code: list[list[str]]  # runs of consecutive code lines (one source file each)

    def to_json_gz(self, path: str | Path) -> None:
        Path(path).write_bytes(gzip.compress(json.dumps({"prose": self.prose, "code": self.code}).encode(), mtime=0))

    @classmethod
    def from_json_gz(cls, path: str | Path) -> TextPool:
        d = json.loads(gzip.decompress(Path(path).read_bytes()))
        return cls(prose=d["prose"], code=d["code"])


def to_ascii(text: str) -> str:
    """Fold to printable ASCII (the model's training alphabet): accents dropped, other symbols removed."""
    text = unicodedata.normalize("NFKD", text)
    return "".join(c for c in text if 32 <= ord(c) < 127 or c == "\n")


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


def split_paragraphs(text: str, min_words: int = 6) -> list[str]:
    """Blank-line separated paragraphs, whitespace collapsed, ASCII-folded; keeps those that read like prose."""
    out = []
    for chunk in re.split(r"\n\s*\n", to_ascii(text)):
        para = " ".join(chunk.split())
        words = para.split()
        if len(words) < min_words:
            continue
        letters = sum(c.isalpha() for c in para)
        if letters < 0.6 * len(para):  # tables of dashes, hex dumps, ascii art
            continue
        out.append(para)
    return out


def python_docstrings(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                out += split_paragraphs(doc)
    return out


def python_code_runs(path: Path, max_len: int = 72) -> list[list[str]]:
    """Runs of non-blank, non-comment code lines of moderate length."""
    runs, cur = [], []
    for line in to_ascii(path.read_text(encoding="utf-8", errors="replace")).splitlines():
        line = line.rstrip()
        ok = line.strip() and not line.strip().startswith("#") and len(line) <= max_len and '"""' not in line
        if ok:
            cur.append(line.replace("\t", "    "))
        elif cur:
            if len(cur) >= 2:
                runs.append(cur)
            cur = []
    if len(cur) >= 2:
        runs.append(cur)
    return runs


def collect_pool(split: str, python_lib: Path, code_root: Path | None = None) -> TextPool:
    """Text found on this machine. `train`: Python stdlib docstrings + code, /usr/share/doc READMEs, changelogs and
    markdown. `heldout`: licences (/usr/share/common-licenses, /usr/share/doc/*/copyright) + code of another package
    (`code_root`, e.g. numpy). The two splits share no source file."""
    doc = Path("/usr/share/doc")
    prose, code = [], []
    if split == "train":
        for p in sorted(python_lib.glob("*.py")):
            prose += python_docstrings(p)
            code += python_code_runs(p)
        for pat in ("*/README*", "*/*.md*", "*/changelog*", "*/NEWS*"):
            for p in sorted(doc.glob(pat)):
                if p.is_file():
                    prose += split_paragraphs(_read_text(p))
    elif split == "heldout":
        for p in sorted(Path("/usr/share/common-licenses").iterdir()):
            if p.is_file():
                prose += split_paragraphs(_read_text(p))
        for p in sorted(doc.glob("*/copyright")):
            prose += split_paragraphs(_read_text(p))
        if code_root is not None:
            for p in sorted(code_root.rglob("*.py")):
                code += python_code_runs(p)
    else:
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    prose = list(dict.fromkeys(prose))  # dedupe (licences repeat across packages), keep order
    if not prose:
        raise ValueError(f"no prose found for split {split!r}: are /usr/share/doc and {python_lib} present?")
    if not code:
        code = [["x = 1", "y = x + 1"]]
    return TextPool(prose=prose, code=code)


# ---------------------------------------------------------------- blocks

MONTHS = "January February March April May June July August September October November December".split()


def _words(rng: random.Random, pool: TextPool, lo: int, hi: int) -> str:
    para = pool.prose[rng.randrange(len(pool.prose))].split()
    n = min(len(para), rng.randint(lo, hi))
    start = rng.randint(0, len(para) - n)
    return " ".join(para[start : start + n])


def _number(rng: random.Random) -> str:
    kind = rng.randrange(7)
    if kind == 0:
        return str(rng.randint(0, 999))
    if kind == 1:
        return f"{rng.randint(0, 99999):,}"
    if kind == 2:
        return f"{rng.uniform(0, 1000):.{rng.randint(1, 3)}f}"
    if kind == 3:
        return f"${rng.uniform(0, 50000):,.2f}"
    if kind == 4:
        return f"{rng.uniform(0, 100):.1f}%"
    if kind == 5:
        return f"{rng.randint(1990, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    return f"{rng.randint(1, 28)} {rng.choice(MONTHS)} {rng.randint(1900, 2030)}"


def _cell(rng: random.Random, pool: TextPool, max_chars: int) -> str:
    text = _number(rng) if rng.random() < 0.5 else _words(rng, pool, 1, 2)
    return text.replace("|", "/")[:max_chars].strip() or "0"


def _sprinkle_numbers(rng: random.Random, text: str) -> str:
    words = text.split()
    for _ in range(rng.randint(1, 3)):
        words.insert(rng.randint(0, len(words)), _number(rng))
    return " ".join(words)


@dataclass(frozen=True)
class Block:
    kind: str  # heading | paragraph | bullets | numbered | code | table
    lines: tuple[str, ...]  # heading/paragraph: 1; lists/code: items; table: rows joined by '\t'
    level: int = 0  # heading level


# Made-up words: text no language model can guess, only read. ocria-tiny read held-out words absent from its training
# text far worse than words it had seen (research/ocria_tiny/studies/teacher_forced.py): names, paths, numbers.
EXTENSIONS = ("c", "h", "cpp", "hpp", "py", "txt", "md", "json", "yml", "html", "so", "v2")
PATH_JOINERS = "/_-."


def made_up_word(rng: random.Random, word: str, pool: TextPool, same_length: bool = False, max_len: int = 40) -> str:
    """A stand-in for `word`: its letters replaced by random ones of the same case (digits and punctuation kept: a
    number stays as it is); or (unless `same_length`) a path or identifier of 2-5 pool words, at most `max_len`
    characters (it cannot wrap, so it must fit a column), or a short code of letters and digits."""
    kind = 0.0 if same_length else rng.random()
    if kind < 0.5:
        return "".join(rng.choice(string.ascii_lowercase) if c.islower() else
                       rng.choice(string.ascii_uppercase) if c.isupper() else c for c in word)
    if kind < 0.75:
        parts = [re.sub(r"[^A-Za-z0-9]", "", _words(rng, pool, 1, 1)) or "x" for _ in range(rng.randint(2, 5))]
        joiner = rng.choice(PATH_JOINERS)
        path = joiner.join(p.lower() if rng.random() < 0.7 else p for p in parts)
        path += f".{rng.choice(EXTENSIONS)}" if rng.random() < 0.5 else ""
        return path[:max_len].rstrip(PATH_JOINERS)
    alphabet = string.ascii_letters + string.digits
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(2, 9)))


def with_made_up_words(b: Block, share: float, rng: random.Random, pool: TextPool, max_len: int = 40) -> Block:
    """`b` with about `share` of its words replaced by `made_up_word`s (paths at most `max_len` characters); code
    blocks unchanged, table cells keep their lengths (the columns were sized for them)."""
    if b.kind == "code" or share <= 0:
        return b
    same_length = b.kind == "table"

    def swap(text: str) -> str:
        return " ".join(made_up_word(rng, w, pool, same_length, max_len) if rng.random() < share else w
                        for w in text.split(" "))

    lines = tuple("\t".join(swap(cell) for cell in line.split("\t")) for line in b.lines)
    return Block(b.kind, lines, b.level)


# Path lists: the file lists of licence files ("Files: libs/x/include/boost/x/detail/y_z.hpp ...") are a quarter of
# the held-out pages' characters and half of ocria-tiny's errors there (research/ocria_tiny/results/s28_runs.json), but
# the training text holds paths only as short names. These are built from the pool's own words, so they teach reading
# long paths that share a prefix without showing any held-out path.
PATH_LIST_LABELS = ("Files:", "Source:", "See", "Modified:", "")


def _path_part(rng: random.Random, pool: TextPool, max_len: int) -> str:
    """A directory or file stem: one to three pool words, lowercase letters and digits, joined by '_' or '-'."""
    words = [re.sub(r"[^a-z0-9]", "", w.lower()) for w in _words(rng, pool, 1, 3).split()]
    part = rng.choice("_-").join(w for w in words if w) or "src"
    return part[:max_len].rstrip("_-") or "src"


def path_list(rng: random.Random, pool: TextPool, line_chars: int) -> str:
    """A label and 1-6 file paths below one shared root of 1-4 directories, each path 1-5 more directories and a file
    with an extension. Each part fits half a line: the layout wraps a path only after a '/' or a '-'."""
    part_len = max(4, line_chars // 2)
    root = [_path_part(rng, pool, part_len) for _ in range(rng.randint(1, 4))]
    paths = []
    for _ in range(rng.randint(1, 6)):
        dirs = root + [_path_part(rng, pool, part_len) for _ in range(rng.randint(1, 5))]
        paths.append("/".join(dirs) + "/" + _path_part(rng, pool, part_len) + "." + rng.choice(EXTENSIONS))
    label = rng.choice(PATH_LIST_LABELS)
    return f"{label} {' '.join(paths)}" if label else " ".join(paths)


def with_path_lists(b: Block, share: float, rng: random.Random, pool: TextPool, line_chars: int) -> Block:
    """A paragraph, or each item of a list, replaced by a `path_list` with probability `share`; other blocks as they
    are."""
    if share <= 0 or b.kind not in ("paragraph", "bullets", "numbered"):
        return b
    if b.kind == "paragraph":
        return Block("paragraph", (path_list(rng, pool, line_chars),)) if rng.random() < share else b
    items = tuple(path_list(rng, pool, line_chars - 4) if rng.random() < share else t for t in b.lines)
    return Block(b.kind, items, b.level)


def sample_block(rng: random.Random, pool: TextPool, line_chars: int) -> Block:
    """One block whose lines fit `line_chars` characters where they cannot wrap (code, table rows)."""
    r = rng.random()
    if r < 0.14:
        text = _words(rng, pool, 2, 8).rstrip(".,;:")
        return Block("heading", (text[:1].upper() + text[1:],), level=rng.choice((1, 2, 2, 3, 3)))
    if r < 0.55:
        text = _words(rng, pool, 8, 70)
        if rng.random() < 0.3:
            text = _sprinkle_numbers(rng, text)
        return Block("paragraph", (text,))
    if r < 0.70:
        kind = "bullets" if rng.random() < 0.6 else "numbered"
        items = [_words(rng, pool, 2, 14) for _ in range(rng.randint(2, 5))]
        items = [_sprinkle_numbers(rng, t) if rng.random() < 0.2 else t for t in items]
        return Block(kind, tuple(items))
    if r < 0.82:
        run = pool.code[rng.randrange(len(pool.code))]
        n = min(len(run), rng.randint(2, 7))
        start = rng.randint(0, len(run) - n)
        lines = [ln[: max(8, line_chars)].rstrip() for ln in run[start : start + n]]
        base = min(len(ln) - len(ln.lstrip()) for ln in lines)
        return Block("code", tuple(ln[base:] or "pass" for ln in lines))
    if r < 0.92:
        cols = rng.randint(2, 4)
        max_cell = max(3, line_chars // cols - 3)
        header = [_words(rng, pool, 1, 2).replace("|", "/")[:max_cell].strip() or "Name" for _ in range(cols)]
        rows = [header] + [[_cell(rng, pool, max_cell) for _ in range(cols)] for _ in range(rng.randint(1, 5))]
        return Block("table", tuple("\t".join(row) for row in rows))
    text = " ".join(f"{_words(rng, pool, 1, 3).rstrip('.,;:')}: {_number(rng)}" for _ in range(rng.randint(1, 4)))
    return Block("paragraph", (text,))


def block_markdown(b: Block) -> str:
    if b.kind == "heading":
        return "#" * b.level + " " + b.lines[0]
    if b.kind == "paragraph":
        return b.lines[0]
    if b.kind == "bullets":
        return "\n".join(f"- {t}" for t in b.lines)
    if b.kind == "numbered":
        return "\n".join(f"{i}. {t}" for i, t in enumerate(b.lines, 1))
    if b.kind == "code":
        return "```\n" + "\n".join(b.lines) + "\n```"
    if b.kind == "table":
        rows = [r.split("\t") for r in b.lines]
        out = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        out += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        return "\n".join(out)
    raise ValueError(f"unknown block kind {b.kind!r}")


def trim_block(b: Block, max_chars: int) -> Block:
    """`b` cut to about `max_chars` characters of markdown: whole lines (list items, code lines, table rows) while they
    fit, then the first words of the next; never less than one word (a table keeps its header and one row)."""
    def fits(lines) -> bool:
        return len(block_markdown(Block(b.kind, tuple(lines), b.level))) <= max_chars

    if fits(b.lines):
        return b
    keep = 2 if b.kind == "table" else 1
    lines = list(b.lines[:keep])
    for line in b.lines[keep:]:
        if not fits([*lines, line]):
            break
        lines.append(line)
    if b.kind != "table":
        words = lines[-1].split()
        while len(words) > 1 and not fits([*lines[:-1], " ".join(words)]):
            words.pop()
        lines[-1] = " ".join(words)
    return Block(b.kind, tuple(lines), b.level)


def block_html(b: Block) -> str:
    e = html.escape
    if b.kind == "heading":
        return f"<h{b.level}>{e(b.lines[0])}</h{b.level}>"
    if b.kind == "paragraph":
        return f"<p>{e(b.lines[0])}</p>"
    if b.kind in ("bullets", "numbered"):
        tag = "ul" if b.kind == "bullets" else "ol"
        return f"<{tag}>" + "".join(f"<li>{e(t)}</li>" for t in b.lines) + f"</{tag}>"
    if b.kind == "code":
        return "<pre>" + e("\n".join(b.lines)) + "</pre>"
    if b.kind == "table":
        rows = [r.split("\t") for r in b.lines]
        head = "<tr>" + "".join(f"<th>{e(c)}</th>" for c in rows[0]) + "</tr>"
        body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows[1:])
        return f"<table>{head}{body}</table>"
    raise ValueError(f"unknown block kind {b.kind!r}")


def page_markdown(blocks: list[Block]) -> str:
    return "\n\n".join(block_markdown(b) for b in blocks)


# ---------------------------------------------------------------- layout

# CSS families: MuPDF's built-ins (Charis SIL, Nimbus Sans/Roman/Mono) plus any TTF in the font folder.
BUILTIN_FAMILIES = ("serif", "sans-serif", "Times", "Helvetica")
TTF_FAMILIES = {"DejaVuSans.ttf": "dejavusans", "DejaVuSerif.ttf": "dejavuserif"}


@dataclass(frozen=True)
class PageStyle:
    width_pt: float
    height_pt: float
    margin_pt: float
    columns: int
    family: str
    font_pt: float
    table_borders: bool
    gap_pt: float = 18.0


def font_families(font_dir: Path | None) -> list[str]:
    fams = list(BUILTIN_FAMILIES)
    if font_dir is not None:
        fams += [fam for name, fam in TTF_FAMILIES.items() if (font_dir / name).is_file()]
    return fams


def sample_style(rng: random.Random, families: list[str], target_longest_px: int, font_px: tuple[float, float],
                 two_columns: float) -> PageStyle:
    """Page size, margins, columns and font. The font size is drawn in *rendered pixels* so text stays legible at the
    model's resolution whatever the page size: pt = px * longest_pt / target_longest_px. Pages wide enough for two
    columns of 35+ characters get two with probability `two_columns` (the draw is the same whatever the share, so
    pages keep their size, margins and font when it changes)."""
    width = rng.uniform(280, 620)
    height = width * rng.uniform(1.2, 1.45)
    px = rng.uniform(*font_px)
    font_pt = px * height / target_longest_px
    margin = rng.uniform(0.04, 0.12) * width
    col_chars = (width - 2 * margin) / (0.5 * font_pt)
    columns = 2 if col_chars > 70 and rng.random() < two_columns else 1
    return PageStyle(width, height, margin, columns, rng.choice(families), font_pt, rng.random() < 0.6)


def column_rects(s: PageStyle) -> list[pymupdf.Rect]:
    inner = pymupdf.Rect(s.margin_pt, s.margin_pt, s.width_pt - s.margin_pt, s.height_pt - s.margin_pt)
    if s.columns == 1:
        return [inner]
    w = (inner.width - s.gap_pt) / 2
    return [pymupdf.Rect(inner.x0, inner.y0, inner.x0 + w, inner.y1), pymupdf.Rect(inner.x1 - w, inner.y0, inner.x1, inner.y1)]


def page_css(s: PageStyle) -> str:
    faces = "".join(f"@font-face {{font-family: {fam}; src: url({name});}}" for name, fam in TTF_FAMILIES.items())
    border = "border: 1px solid black; border-collapse: collapse;" if s.table_borders else ""
    return (
        faces + f"* {{font-family: {s.family}; font-size: {s.font_pt:.2f}pt;}}"
        f"h1 {{font-size: {1.6 * s.font_pt:.2f}pt;}} h2 {{font-size: {1.35 * s.font_pt:.2f}pt;}}"
        f"h3 {{font-size: {1.15 * s.font_pt:.2f}pt;}} pre {{font-family: monospace;}}"
        f"table, th, td {{{border}}} td, th {{padding: 1px 4px;}}"
    )


def layout_pdf(blocks: list[Block], s: PageStyle, archive: pymupdf.Archive | None) -> tuple[bytes, bool]:
    """One-page PDF of `blocks`; the bool says whether all of them fitted."""
    story = pymupdf.Story("".join(block_html(b) for b in blocks), user_css=page_css(s), archive=archive)
    buf = io.BytesIO()
    writer = pymupdf.DocumentWriter(buf)
    dev = writer.begin_page(pymupdf.Rect(0, 0, s.width_pt, s.height_pt))
    more = 1
    for rect in column_rects(s):
        more, _ = story.place(rect)
        story.draw(dev)
        if not more:
            break
    writer.end_page()
    writer.close()
    return buf.getvalue(), not more


def ink_box(image: np.ndarray, pad: int = 12, ink_below: int = 200) -> tuple[int, int, int, int] | None:
    """(y0, y1, x0, x1): the bounding box of the image's non-white pixels plus `pad` pixels of paper on each side,
    clipped to the image; None for a blank image."""
    # channel minimum as two elementwise minimums, and row/column projections instead of np.nonzero: ~10x faster than
    # image.min(axis=2) (a strided reduction over 3 values), which was most of a line page's making time
    ink = np.minimum(np.minimum(image[..., 0], image[..., 1]), image[..., 2]) < ink_below
    rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    if rows.size == 0:
        return None
    y0, y1 = max(rows[0] - pad, 0), min(rows[-1] + 1 + pad, image.shape[0])
    x0, x1 = max(cols[0] - pad, 0), min(cols[-1] + 1 + pad, image.shape[1])
    return int(y0), int(y1), int(x0), int(x1)


@dataclass(frozen=True)
class TextLine:
    """One line of text as laid out on the page: its box in the page image's pixels and its characters (ASCII-folded,
    whitespace runs as one space)."""
    x0: float
    y0: float
    x1: float
    y1: float
    text: str


def text_lines(page: pymupdf.Page, scale_x: float, scale_y: float, dx: float = 0.0, dy: float = 0.0) -> list[TextLine]:
    """The page's horizontal text lines from its text layer, boxes mapped to image pixels: x * scale_x - dx."""
    out = []
    for block in page.get_text("dict")["blocks"]:
        for line in block.get("lines", ()):
            text = " ".join(to_ascii("".join(span["text"] for span in line["spans"])).split())
            if not text or abs(line["dir"][1]) > 1e-3:
                continue
            x0, y0, x1, y1 = line["bbox"]
            out.append(TextLine(x0 * scale_x - dx, y0 * scale_y - dy, x1 * scale_x - dx, y1 * scale_y - dy, text))
    return out


@dataclass(frozen=True)
class SynthConfig:
    target_longest_px: int = 768
    max_pixels: int = 768 * 768
    font_px: tuple[float, float] = (10.0, 18.0)
    max_chars: tuple[int, int] = (150, 1300)  # markdown length budget per page, drawn uniformly
    crop: bool = False  # cut the image to the text (ink_box): short early-curriculum pages become a few tokens
    strict_chars: bool = False  # max_chars is a hard cap: blocks are cut to it (a line of a few words, not a paragraph)
    text_lines: bool = False  # also read where each text line lies (SyntheticPage.lines; ~2 ms a page)
    made_up_words: float = 0.0  # share of words (not in code) replaced by made-up ones (`made_up_word`; numbers stay)
    path_lists: float = 0.0  # share of paragraphs and list items replaced by file-path lists (`path_list`)
    two_columns: float = 0.35  # share of the pages wide enough for two columns that get them (`sample_style`)
    # (lo, hi): each page is drawn again so its body text's em is a size drawn from this range, within max_pixels, as
    # the job draws pages at a reader's glyph size (pipeline.rasterize.page_scale); the layout stays font_px's
    glyph_px: tuple[float, float] | None = None


@dataclass
class SyntheticPage:
    seed: int
    image: np.ndarray  # H x W x 3 uint8, rendered by pipeline.rasterize.render_page
    markdown: str
    style: PageStyle
    pdf: bytes  # the one-page PDF that was rasterized
    # where each line of text is in `image` (the auxiliary reading loss of research.ocria_tiny.text_line_ctc); None unless
    # SynthConfig.text_lines
    lines: list[TextLine] | None


def make_page(seed: int, pool: TextPool, cfg: SynthConfig, font_dir: Path | None = None) -> SyntheticPage:
    rng = random.Random(seed)
    style = sample_style(rng, font_families(font_dir), cfg.target_longest_px, cfg.font_px, cfg.two_columns)
    col_w = (column_rects(style)[0].width) / (0.62 * style.font_pt)  # monospace chars per column line
    budget = rng.randint(*cfg.max_chars)
    blocks, used = [], 0
    # made-up words from a random stream of their own (pages without them stay as they were), before the block is
    # measured against the budget: paths are longer than the words they replace
    made_up = random.Random(f"made-up-{seed}") if cfg.made_up_words > 0 else None
    paths = random.Random(f"path-lists-{seed}") if cfg.path_lists > 0 else None  # likewise
    while used < budget:
        b = sample_block(rng, pool, int(col_w))
        if paths is not None:
            b = with_path_lists(b, cfg.path_lists, paths, pool, int(col_w))
        if made_up is not None:
            b = with_made_up_words(b, cfg.made_up_words, made_up, pool, max_len=max(8, int(col_w) // 2))
        size = len(block_markdown(b))
        if cfg.strict_chars and size > budget - used:
            blocks.append(trim_block(b, budget - used))  # the budget is spent: no trailing scraps of blocks
            break
        blocks.append(b)
        used += size + 2
    archive = pymupdf.Archive(str(font_dir)) if font_dir is not None else None
    while True:  # drop trailing blocks until the rest fits on the page
        pdf, fits = layout_pdf(blocks, style, archive)
        if fits or len(blocks) == 1:
            break
        blocks.pop()
    if not fits:  # a single block larger than the page: keep its first words only
        b = blocks[0]
        while not fits and len(" ".join(b.lines).split()) > 2:
            words = b.lines[0].split()
            b = Block("paragraph", (" ".join(words[: len(words) * 2 // 3]),))
            blocks = [b]
            pdf, fits = layout_pdf(blocks, style, archive)
    # the glyph size from a random stream of its own, so the page's layout and text stay as without it
    glyph = random.Random(f"glyph-{seed}").uniform(*cfg.glyph_px) if cfg.glyph_px else 0.0
    doc = pymupdf.open("pdf", pdf)
    try:
        image = render_page(doc[0], cfg.target_longest_px, cfg.max_pixels, glyph)
        box = ink_box(image) if cfg.crop else None
        y0, x0 = (box[0], box[2]) if box else (0, 0)
        lines = None
        if cfg.text_lines:
            rect = doc[0].rect
            lines = text_lines(doc[0], image.shape[1] / rect.width, image.shape[0] / rect.height, x0, y0)
    finally:
        doc.close()
    if box is not None:
        image = np.ascontiguousarray(image[box[0]:box[1], box[2]:box[3]])
    return SyntheticPage(seed, image, page_markdown(blocks), style, pdf, lines)

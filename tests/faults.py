"""Documents made to fault the renderer, built in a fraction of a second, so fault tests need no corpus."""
import struct
import zlib


def _pdf(objects: list[bytes]) -> bytes:
    """A PDF of the given objects (numbered from 1; object 1 the catalog), with its cross-reference table."""
    out, offsets = b"%PDF-1.7\n", []
    for i, obj in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + obj + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    return out + b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)


def _stream(content: bytes, entries: bytes = b"") -> bytes:
    return b"<< %s /Length %d >>\nstream\n" % (entries, len(content)) + content + b"\nendstream"


FORM = b"/Type /XObject /Subtype /Form /BBox [0 0 612 792]"
QUICK_PAGE = b"0 0 1 rg 72 72 200 100 re f\n"


def pdf_pages(*slow: bool, depth: int = 40) -> bytes:
    """One page per argument: a quick page (a filled box), or a slow one that draws form 40 of a chain in which each
    form draws the one below it twice: 2^40 strokes in 8 KB. Drawing time doubles with each level (measured here:
    depth 12 1.3 s, 14 5.4 s, 16 25 s), so depth 40 keeps MuPDF busy until it is killed, with no MuPDF bug needed;
    MuPDF's own nesting limit (an error, not a hang) lies between 40 and 100."""
    n = len(slow)
    first_form = 3 + 2 * n  # pages and their contents first, then the forms
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(b"%d 0 R" % (3 + 2 * i) for i in range(n)), n)]
    for i, is_slow in enumerate(slow):
        res = b"/Resources << /XObject << /F %d 0 R >> >>" % (first_form + depth) if is_slow else b""
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R %s >>" % (4 + 2 * i, res))
        objects.append(_stream(b"/F Do\n" if is_slow else QUICK_PAGE))
    objects.append(_stream(b"0.1 w 10 10 m 600 780 l 20 700 l h S\n", FORM))  # level 0: one stroke
    for level in range(1, depth + 1):
        objects.append(_stream(b"/G Do /G Do\n", FORM + b" /Resources << /XObject << /G %d 0 R >> >>"
                               % (first_form + level - 1)))
    return _pdf(objects)


def hanging_pdf() -> bytes:
    return pdf_pages(True)


def slow_second_page_pdf() -> bytes:
    """Page 0 renders at once, page 1 never finishes: the renderer is mid-document after the first page."""
    return pdf_pages(False, True)


def png_bomb(side: int) -> bytes:
    """A side x side RGB PNG of zeros: about 1.3 MB of file per 10,000 x 10,000 (300 MB decoded)."""
    z, row = zlib.compressobj(1), b"\x00" * (side * 3 + 1)  # filter byte + RGB row
    data = b"".join(z.compress(row) for _ in range(side)) + z.flush()

    def chunk(tag, body):
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", data) + chunk(b"IEND", b""))

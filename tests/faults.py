"""Documents made to fault the renderer, built in a fraction of a second, so fault tests need no corpus."""
import struct
import zlib


def pdf_with_content(*pages: bytes) -> bytes:
    """A minimal PDF whose pages draw the given content streams (Flate-compressed, as real files carry them)."""
    n = len(pages)
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(b"%d 0 R" % (3 + 2 * i) for i in range(n)), n)]
    for i, content in enumerate(pages):
        stream = zlib.compress(content, 6)
        objs.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R >>" % (4 + 2 * i))
        objs.append(b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream")
    out, offsets = b"%PDF-1.7\n", []
    for i, obj in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + obj + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1) + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    return out + b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)


# A page that takes MuPDF minutes: 100,000 strokes across the whole page (measured: 300,000 take > 120 s at 256 px
# on this 2-core machine), in 40 KB of file. A "hang" that needs no MuPDF bug and stops when the renderer is killed.
SLOW_PAGE = b"0.1 w\n" + b"10 10 m 600 780 l 20 700 l h S\n" * 100_000
QUICK_PAGE = b"0 0 1 rg 72 72 200 100 re f\n"


def hanging_pdf() -> bytes:
    return pdf_with_content(SLOW_PAGE)


def slow_second_page_pdf() -> bytes:
    """Page 0 renders at once, page 1 takes minutes: the renderer is mid-document after the first page."""
    return pdf_with_content(QUICK_PAGE, SLOW_PAGE)


def png_bomb(side: int) -> bytes:
    """A side x side RGB PNG of zeros: about 1.3 MB of file per 10,000 x 10,000 (300 MB decoded)."""
    z, row = zlib.compressobj(1), b"\x00" * (side * 3 + 1)  # filter byte + RGB row
    data = b"".join(z.compress(row) for _ in range(side)) + z.flush()

    def chunk(tag, body):
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", data) + chunk(b"IEND", b""))

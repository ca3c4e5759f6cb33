"""Progress in pages: done of known, documents, the current rate; one line every 30 s without a terminal."""
import time

from pipeline.progress import PageProgress


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def row(uri, i, n):
    return {"uri": uri, "page_index": i, "page_count": n}


def test_pages_done_of_known_and_a_line_every_30_s_without_a_terminal():
    clock, lines = Clock(), []
    p = PageProgress(3, lines.append, interactive=False, clock=clock)
    for i in range(10):  # document a: 10 pages, one a second
        clock.t += 1
        p.row(row("a", i, 10))
    p.document_done()
    assert lines == []  # nothing before 30 s
    p.row({"uri": "b", "page_index": -1, "page_count": 0})  # a failed document: known, no page
    p.document_done()
    for i in range(100):  # document c: 100 pages, two a second, from t = 10 s to 60 s
        clock.t += 0.5
        p.row(row("c", i, 100))
    assert len(lines) == 2 and lines[0].startswith("pages 50/110 known, documents 2/3, 1.67 pages/s")  # at 30 s
    rate = float(lines[1].split(", ")[-1].split()[0])
    assert lines[1].startswith("pages 110/110 known") and 1.9 <= rate <= 2.1  # the last half minute's, not the run's
    p.document_done()
    p.close()
    assert lines[-1].startswith("pages 110/110 known, documents 3/3")


def test_a_burst_after_a_long_wait_is_not_read_as_hundreds_of_pages_a_second():
    clock, lines = Clock(), []
    p = PageProgress(1, lines.append, interactive=False, clock=clock)
    clock.t = 76.0  # model loading: nothing for 76 s, then all 7 pages at once
    for i in range(7):
        p.row(row("a", i, 7))
    p.document_done()
    p.close()
    assert abs(p.pages_per_s() - 7 / 76) < 1e-6 and "0.09 pages/s" in lines[-1]


def test_a_line_while_nothing_arrives():
    lines = []
    p = PageProgress(6, lines.append, interactive=False, every_s=0.2)  # the real clock
    time.sleep(0.7)
    p.close()
    assert lines[0].startswith("waiting for the first pages (0 s") and lines[0].endswith("documents 0/6")
    assert len(lines) >= 2  # a line a period while waiting, and the last one

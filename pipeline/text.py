"""Plain text of a page's markdown answer: what the CER metric compares (jobs.eval_ocr) and what the job measures a
read's length by (pipeline.blocks.prefer_blocks)."""
from __future__ import annotations

import re

def collapse_ws(text: str) -> str:
    return " ".join(text.split())


_FENCE = re.compile(r"^\s*```.*$", re.M)
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+", re.M)
_LIST = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+", re.M)
_TABLE_SEP = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)*\|?\s*$", re.M)


def markdown_to_text(md: str) -> str:
    """Plain text of our markdown subset: fences, heading marks, list markers, table pipes and rules removed."""
    text = _FENCE.sub("", md)
    text = _TABLE_SEP.sub("", text)
    text = _HEADING.sub("", text)
    text = _LIST.sub("", text)
    text = re.sub(r"^\s*\|", "", text, flags=re.M)
    text = re.sub(r"\|\s*$", "", text, flags=re.M)
    text = text.replace(" | ", " ")
    return collapse_ws(text)

"""Character CTC losses that teach ocria-tiny's vision tower to read (training only: the heads are saved beside each
checkpoint, never in the shipped model).

`TextLineCTC` reads every text line of every training page. The synthetic page's text layer says where each line is
(research.ocria_tiny.synthetic.text_lines); the line's merged image tokens, left to right in the token rows around its centre,
become CTC frames over its characters. Before it, the only reading signal was `research.ocria_tiny.train_tiny.LineCTC` on pages
that are a single cropped line (a fifth of the pages in the last runs): on full pages the vision tower learned
glyphs only through the decoder, and its own reading of 10-18 px lines stayed at CER ~0.5
(research/ocria_tiny/commands.md, session 10).
"""
from __future__ import annotations

import itertools
import math

# blank (0) + printable ASCII 32..126 as 1..95: the synthetic text is ASCII (research.ocria_tiny.synthetic.to_ascii)
CTC_CLASSES = 96
LINE_BUCKETS = 4  # where a line's centre lies between two merged token rows, in quarters: one read-out per quarter
# columns of a batch's line geometry (collate_lines; line_geometry makes all but the page index)
GEOM_PAGE, GEOM_TOKEN, GEOM_COLS, GEOM_NEXT_ROW, GEOM_BUCKET, GEOM_CHARS, GEOM_MIN_FRAMES = range(7)


def ctc_chars(text: str) -> list[int]:
    """CTC class ids of a line's visible characters (anything outside printable ASCII is skipped)."""
    return [ord(c) - 31 for c in text if 32 <= ord(c) < 127]


def ctc_min_frames(targets: list[int]) -> int:
    """Fewest CTC frames that can emit `targets`: one per label plus a blank between equal neighbours."""
    return len(targets) + sum(a == b for a, b in itertools.pairwise(targets))


def ctc_greedy(frame_ids: list[int]) -> list[int]:
    """Best-path CTC decoding: repeats merged, then blanks (0) dropped."""
    return [c for k, c in enumerate(frame_ids) if c != 0 and (k == 0 or c != frame_ids[k - 1])]


def greedy_cer(best_paths: list[list[int]], targets: list[list[int]]) -> float:
    """Character error rate, over all characters, of best-path readings (each sequence's most likely class per
    frame) against their target characters."""
    from pipeline.text import levenshtein

    reads = [ctc_greedy(path) for path in best_paths]
    return sum(levenshtein(r, t) for r, t in zip(reads, targets)) / sum(len(t) for t in targets)


def line_geometry(lines, image_hw: tuple[int, int], grid_hw: tuple[int, int], patch: int, merge: int):
    """Where each text line of a page lies in its merged image tokens once the processor has resized the image to
    `grid_hw` patches. Returns int64 [n, 6], the columns GEOM_TOKEN..GEOM_MIN_FRAMES (token index of the line's
    first column in the upper of the two token rows around its centre, its columns, the offset to the lower row (0
    on the last row), the quarter bucket, its characters, its fewest CTC frames), and the int64 characters of all
    lines. `lines`: research.ocria_tiny.synthetic.TextLine boxes in image pixels; lines without characters are left out."""
    import torch

    (h, w), (gh, gw) = image_hw, grid_hw
    size = patch * merge
    rows, cols = gh // merge, gw // merge
    sx, sy = gw * patch / w, gh * patch / h
    geom, chars = [], []
    for line in lines:
        target = ctc_chars(line.text)
        if not target:
            continue
        # centre in token-row units, measured from the first row's centre: r0 and r0 + 1 bracket it
        u = min(max((line.y0 + line.y1) / 2 * sy / size - 0.5, 0.0), rows - 1.0)
        r0 = min(int(u), rows - 1)
        bucket = min(int((u - r0) * LINE_BUCKETS), LINE_BUCKETS - 1)
        c0 = min(max(math.floor(line.x0 * sx / size), 0), cols - 1)
        c1 = min(max(math.ceil(line.x1 * sx / size) - 1, c0), cols - 1)
        next_row = cols if r0 + 1 < rows else 0
        geom.append([r0 * cols + c0, c1 - c0 + 1, next_row, bucket, len(target), ctc_min_frames(target)])
        chars += target
    return torch.tensor(geom, dtype=torch.int64).reshape(-1, 6), torch.tensor(chars, dtype=torch.int64)


def collate_lines(items: list[dict]) -> dict:
    """The batch's line geometry (a page-index column in front: GEOM_* names the columns) and characters."""
    import torch

    geoms = [torch.cat([torch.full((len(x["line_geom"]), 1), i), x["line_geom"]], 1) for i, x in enumerate(items)]
    return {"line_geom": torch.cat(geoms), "line_chars": torch.cat([x["line_chars"] for x in items])}


class TextLineCTC:
    """Auxiliary CTC loss: every text line on a page, read from the merged image tokens the decoder sees.

    A line's frames are its token columns; each column's frame input is the two token rows that bracket the line's
    centre, concatenated, and a linear read-out for the quarter of the row gap where the centre lies turns it into
    `subframes` CTC frames (one merged token is 32 px: up to ~6 characters at 10 px). Lines with fewer frames than
    characters (ctc_min_frames) are left out.

    `head_only_steps`: for that many losses the features are detached, so a new head learns to read what the vision
    tower already encodes before its gradients reach it. Without it, in a CPU probe from a trained checkpoint (batch
    8, so noisy), the answer loss went from 1.82 to 2.0-2.7 over the next steps and the gradient norm to 23
    (research/ocria_tiny/results/tlc_cpu_probe_train_log.jsonl)."""

    HEAD_FILE = "text_line_ctc_head.pt"

    def __init__(self, model, weight: float, subframes: int, head_only_steps: int = 0):
        import torch

        hidden = model.config.text_config.hidden_size
        self.weight, self.subframes, self.head_only_steps = weight, subframes, head_only_steps
        device = next(model.parameters()).device
        self.head = torch.nn.Linear(2 * hidden, LINE_BUCKETS * subframes * CTC_CLASSES).to(device)
        self.features = None
        # the merged image tokens, as the model computes them inside its forward (no second vision pass)
        model.model.visual.register_forward_hook(lambda mod, args, out: setattr(self, "features", out.pooler_output))

    def parameters(self):
        return self.head.parameters()

    def _sequences(self, grid_thw, geom, merge: int):
        """(frame logits [T, n, classes], frames per line [n], kept-line mask) from the last forward's features."""
        import torch

        feats, self.features = self.features, None
        feats = torch.cat(feats) if isinstance(feats, (list, tuple)) else feats
        if self.head_only_steps > 0:
            feats = feats.detach()
        sizes = grid_thw[:, 1:].prod(-1) // (merge * merge)
        start = torch.cumsum(sizes, 0) - sizes
        keep = geom[:, GEOM_COLS] * self.subframes >= geom[:, GEOM_MIN_FRAMES]
        g = geom[keep]
        width = int(g[:, GEOM_COLS].max()) if len(g) else 0
        cols = torch.minimum(torch.arange(width, device=g.device)[None], g[:, GEOM_COLS, None] - 1)
        upper = start[g[:, GEOM_PAGE]][:, None] + g[:, GEOM_TOKEN, None] + cols  # [n, width] token indices
        x = torch.cat([feats[upper], feats[upper + g[:, GEOM_NEXT_ROW, None]]], -1)
        frames = x.new_zeros(len(g), width, self.subframes * CTC_CLASSES)
        span = self.subframes * CTC_CLASSES
        for b in range(LINE_BUCKETS):  # one read-out per quarter: only the lines whose centre lies there
            sel = g[:, GEOM_BUCKET] == b
            if sel.any():
                w, bias = self.head.weight[b * span:(b + 1) * span], self.head.bias[b * span:(b + 1) * span]
                frames[sel] = torch.nn.functional.linear(x[sel], w, bias).to(frames.dtype)
        logits = frames.reshape(len(g), width * self.subframes, CTC_CLASSES).transpose(0, 1)
        return logits, g[:, GEOM_COLS] * self.subframes, keep

    def loss(self, grid_thw, geom, chars, merge: int):
        """Mean CTC loss over the batch's lines (None when no line can be aligned); call right after the forward."""
        import torch
        import torch.nn.functional as F

        logits, frames, keep = self._sequences(grid_thw, geom, merge)
        self.head_only_steps = max(self.head_only_steps - 1, 0)
        if not keep.any():
            return None
        lengths = geom[:, GEOM_CHARS]
        char_line = torch.repeat_interleave(torch.arange(len(geom), device=geom.device), lengths)
        return F.ctc_loss(F.log_softmax(logits.float(), -1), chars[keep[char_line]], frames, lengths[keep], blank=0,
                          zero_infinity=True)

    def reading_cer(self, model, batch: dict, merge: int) -> float | None:
        """Character error rate of the head's greedy reading of the batch's lines (does the vision tower read,
        whatever the decoder does?); None when no line can be aligned."""
        import torch

        device = next(model.parameters()).device
        bf16 = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
        with torch.no_grad(), bf16:
            model.model.get_image_features(batch["pixel_values"].to(device), batch["image_grid_thw"].to(device))
            geom = batch["line_geom"].to(device)
            logits, frames, keep = self._sequences(batch["image_grid_thw"].to(device), geom, merge)
        if not keep.any():
            return None
        targets = torch.split(batch["line_chars"], batch["line_geom"][:, GEOM_CHARS].tolist())
        targets = [t.tolist() for t, k in zip(targets, keep.tolist()) if k]
        best = logits.argmax(-1).T.tolist()
        return greedy_cer([ids[:n] for ids, n in zip(best, frames.tolist())], targets)

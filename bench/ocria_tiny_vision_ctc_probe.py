"""CPU probe: can ocria-tiny's vision tower (configs/train_tiny.yaml size, from scratch) alone learn to read single
lines with a character CTC head (jobs/train_tiny.LineCTC's head: SUB frames per merged token column)? No decoder.
Lines: 22-32 px, 8-40 characters, cropped, strict_chars; training lines from the training pool, held-out lines from the
held-out pool; greedy CTC CER on the held-out lines every 250 steps.

    python bench/ocria_tiny_vision_ctc_probe.py render 8000 build/lines_train.pkl
    python bench/ocria_tiny_vision_ctc_probe.py render 200 build/lines_held.pkl heldout
    python bench/ocria_tiny_vision_ctc_probe.py train build/lines_train.pkl build/lines_held.pkl 900 4

Smaller glyphs, starting from a trained checkpoint's vision tower and CTC head (run D's: 6 frames per column):

    python bench/ocria_tiny_vision_ctc_probe.py render 8000 build/lines_train_10_18.pkl train 10,18
    python bench/ocria_tiny_vision_ctc_probe.py render 200 build/lines_held_10_18.pkl heldout 10,18
    python bench/ocria_tiny_vision_ctc_probe.py train build/lines_train_10_18.pkl build/lines_held_10_18.pkl 1500 6 \
        build/cand_d3 build/run_d/ckpt3/line_ctc_head.pt
"""
import pickle
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SYNTH = ROOT / ".synth"
MODEL = ROOT / "build" / "ocria-tiny-next2"  # `jobs.train_tiny prepare --set image.image_mean=1.0 ...` (white = 0)


def render(n, out, heldout, font=(22.0, 32.0), canvas=768):
    from jobs.eval_ocr import markdown_to_text
    from pipeline.synthetic import SynthConfig, TextPool, make_page

    pool = TextPool.from_json_gz(SYNTH / ("pool_heldout.json.gz" if heldout else "pool_train.json.gz"))
    cfg = SynthConfig(target_longest_px=canvas, max_pixels=canvas * canvas, font_px=font, max_chars=(8, 40), crop=True,
                      strict_chars=True)
    base = 900_000_000 if heldout else 1000
    items = []
    t = time.time()
    for i in range(n):
        p = make_page(base + i, pool, cfg, SYNTH / "fonts")
        items.append((p.image, markdown_to_text(p.markdown)))
    print(f"{n} pages in {time.time() - t:.1f}s", flush=True)
    Path(out).write_bytes(pickle.dumps(items))


def train(train_pkl, held_pkl, secs, sub, init=None, init_head=None, lr=1e-3, bs=32):
    import torch
    import torch.nn.functional as F
    from transformers import Qwen3_5Config
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

    from jobs.eval_ocr import levenshtein
    from jobs.text_line_ctc import CTC_CLASSES, ctc_chars, ctc_greedy

    torch.manual_seed(0)
    tr, he = pickle.loads(Path(train_pkl).read_bytes()), pickle.loads(Path(held_pkl).read_bytes())
    proc = Qwen2VLImageProcessorPil.from_pretrained(str(MODEL))
    cfg = Qwen3_5Config.from_pretrained(MODEL).vision_config
    vis = Qwen3_5VisionModel._from_config(cfg)
    head = torch.nn.Linear(cfg.out_hidden_size, sub * CTC_CLASSES)
    if init:  # a trained checkpoint's vision tower (and its line CTC head)
        from safetensors.torch import load_file

        weights = load_file(Path(init) / "model.safetensors")
        vis.load_state_dict({k.removeprefix("model.visual."): v.float() for k, v in weights.items()
                             if k.startswith("model.visual.")})
        head.load_state_dict(torch.load(init_head, map_location="cpu"))
    params = list(vis.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.05)

    def enc(batch):
        px = proc(images=[im for im, _ in batch], return_tensors="pt")
        return px["pixel_values"], px["image_grid_thw"]

    def columns(pv, grid):
        feats = vis(pv, grid_thw=grid).pooler_output
        rc = (grid[:, 1:] // 2).tolist()
        seqs = []
        for x, (r, c) in zip(torch.split(feats, [r * c for r, c in rc]), rc):
            col = x.reshape(r, c, -1).mean(0)  # (c, d)
            seqs.append(head(col).reshape(c * sub, CTC_CLASSES))
        return seqs

    def evaluate():
        vis.eval()
        edits = chars = 0
        with torch.no_grad():
            for k in range(0, len(he), 64):
                b = he[k:k + 64]
                for s, (_, t) in zip(columns(*enc(b)), b):
                    hyp, ref = ctc_greedy(s.argmax(-1).tolist()), ctc_chars(t)
                    edits += levenshtein(hyp, ref)
                    chars += len(ref)
        vis.train()
        return edits / max(chars, 1), "".join(chr(i + 31) for i in hyp), t

    t0 = time.time()
    step = 0
    rng = np.random.default_rng(0)
    while time.time() - t0 < secs:
        idx = rng.integers(0, len(tr), bs)
        b = [tr[i] for i in idx]
        frac = min(1.0, step / 100)
        for g in opt.param_groups:
            g["lr"] = lr * frac
        with torch.autocast("cpu", dtype=torch.bfloat16):
            seqs = columns(*enc(b))
        targets = [torch.tensor(ctc_chars(t)) for _, t in b]
        logp = F.log_softmax(torch.nn.utils.rnn.pad_sequence([s.float() for s in seqs]), -1)
        loss = F.ctc_loss(logp, torch.cat(targets), [len(s) for s in seqs], [len(t) for t in targets], blank=0,
                          zero_infinity=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
        step += 1
        if step % 50 == 0:
            print(f"step {step} t {time.time() - t0:.0f}s ctc {loss.item():.3f}", flush=True)
        if step % 250 == 0:
            c, hyp, ref = evaluate()
            print(f"  heldout CER {c:.3f} | {hyp!r} vs {ref!r}", flush=True)
    c, hyp, ref = evaluate()
    print(f"final step {step} heldout CER {c:.3f} | {hyp!r} vs {ref!r}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "render":
        font = tuple(float(v) for v in sys.argv[5].split(",")) if len(sys.argv) > 5 else (22.0, 32.0)
        render(int(sys.argv[2]), sys.argv[3], len(sys.argv) > 4 and sys.argv[4] == "heldout", font)
    else:
        train(sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5]), *sys.argv[6:8])

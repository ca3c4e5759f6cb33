"""Training and evaluation examples of ocria-tiny: the chat-templated prompt with the page's image tokens, the answer's
token ids and labels, and batches of them as the model's inputs."""
from __future__ import annotations

from pathlib import Path

import torch

from research.ocria_tiny.text_line_ctc import collate_lines, line_geometry


class PromptBuilder:
    """Token ids of one training example: chat-templated prompt with the page's image tokens, then the answer."""

    def __init__(self, model_dir: Path, prompt: str):
        import jinja2
        from tokenizers import Tokenizer

        from engine.hf_format import special_token_ids

        self.tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.ids = special_token_ids(self.tok)
        template = jinja2.Environment().from_string((model_dir / "chat_template.jinja").read_text())
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
        text = template.render(messages=messages, add_generation_prompt=True)
        head, tail = text.split("<|image_pad|>")
        self.head = self.tok.encode(head, add_special_tokens=False).ids
        self.tail = self.tok.encode(tail, add_special_tokens=False).ids

    def prompt_ids(self, n_image_tokens: int) -> list[int]:
        return self.head + [self.ids.image_pad] * n_image_tokens + self.tail

    def answer_ids(self, markdown: str, max_tokens: int) -> list[int]:
        """The page's markdown, then <|im_end|>; a page longer than `max_tokens` keeps its first `max_tokens` tokens
        and no <|im_end|>, so the model is never taught to stop in the middle of a page (session 16: taught to stop
        at 447 tokens, it stopped there on all 11 of 24 held-out pages that go on)."""
        ids = self.tok.encode(markdown, add_special_tokens=False).ids
        return ids + [self.ids.im_end] if len(ids) < max_tokens else ids[:max_tokens]


def load_image_processor(model_dir: Path):
    """The engine's image processor for the checkpoint: the HF Qwen2-VL processor's pixels bit for bit
    (tests/test_engine_processor.py, test_train_tiny.py). Its uint8 patches make a loader worker's full page 3x
    cheaper to encode than the HF processor's float patches (18-19 -> 6 ms, with the ids) and 8x smaller to ship
    (research/ocria_tiny/results/datagen_cpu_s12.json)."""
    from engine.processor import ImageProcessor

    return ImageProcessor.from_file(model_dir / "preprocessor_config.json")


def encode_page(image, markdown: str | None, processor, builder: PromptBuilder, merge: int, max_answer: int,
                lines=None) -> dict:
    """A training example; the image as uint8 patches in merge order (`model_batch` makes them float on the
    device). With the page's text `lines` (research.ocria_tiny.synthetic.TextLine) it also carries where each line lies in the
    image tokens (research.ocria_tiny.text_line_ctc.line_geometry)."""

    from engine.rope import mrope_positions

    raw, grid = processor.merge_order_patches(image)
    n_img = grid[1] * grid[2] // (merge * merge)
    prompt = builder.prompt_ids(n_img)
    answer = builder.answer_ids(markdown, max_answer) if markdown is not None else []
    ids = torch.tensor(prompt + answer)
    item = {
        "pixel_bytes": torch.from_numpy(raw),
        "grid": torch.tensor(grid),
        "input_ids": ids,
        "labels": torch.tensor([-100] * len(prompt) + answer),
        # the decoder's rotary positions, made here in the loader's workers: transformers' own get_rope_index walks
        # the batch page by page with ~10 device syncs each, ~660 a step at batch 64
        # (research/ocria_tiny/results/s21_train_profile_varlen.txt)
        "position_ids": torch.from_numpy(mrope_positions(ids, builder.ids.image_pad, [grid], merge)[0]),
    }
    if lines is not None:
        item["line_geom"], item["line_chars"] = line_geometry(lines, image.shape[:2], grid[1:], processor.patch_size,
                                                              merge)
    return item


def collate(items: list[dict], pad_id: int, image_id: int, positions: bool = True) -> dict:
    """Items from `encode_page`, right-padded into one batch; without `positions` the model computes the rotary
    positions itself (transformers' way, the baseline of research/ocria_tiny/results/s22_step_time.json)."""

    n = max(len(x["input_ids"]) for x in items)
    ids = torch.full((len(items), n), pad_id, dtype=torch.long)
    labels = torch.full((len(items), n), -100, dtype=torch.long)
    mask = torch.zeros((len(items), n), dtype=torch.long)
    rows = torch.zeros((3, len(items), n), dtype=torch.long)  # padding at 0, as transformers leaves it
    for i, x in enumerate(items):  # right padding: causal positions of real tokens are unaffected
        L = len(x["input_ids"])
        ids[i, :L], labels[i, :L], mask[i, :L] = x["input_ids"], x["labels"], 1
        rows[:, i, :L] = x["position_ids"]
    return {
        "input_ids": ids,
        "labels": labels,
        "attention_mask": mask,
        **({"position_ids": rows} if positions else {}),
        "mm_token_type_ids": (ids == image_id).to(torch.int32),
        "pixel_bytes": torch.cat([x["pixel_bytes"] for x in items]),
        "image_grid_thw": torch.stack([x["grid"] for x in items]),
    } | (collate_lines(items) if "line_geom" in items[0] else {})


def noisy_answer_inputs(input_ids, labels, share: float, n_plain: int, generator=None):
    """The answer tokens as the model reads them, `share` of them swapped for random plain tokens (ids below
    `n_plain`, the first special token); the labels keep the true text. Fed only true text, the model learns to
    trust the text it wrote: once it misreads, it loses its place on the page, stopping or running on (session 17:
    fed the reference, it gives the stop token P 0.999 at the page's end and < 0.5 everywhere inside on 23 of 24
    held-out pages, yet free-running it stopped early or ran on on 5). Swapped inputs teach it to go on from the
    page instead."""

    if share <= 0:
        return input_ids
    draw = torch.rand(input_ids.shape, device=input_ids.device, generator=generator)
    swap = (labels != -100) & (input_ids < n_plain) & (draw < share)
    random = torch.randint(0, n_plain, input_ids.shape, device=input_ids.device, generator=generator)
    return torch.where(swap, random, input_ids)


def model_inputs(batch: dict) -> dict:
    """The model's forward arguments of a batch from `model_batch` (without the text lines' geometry)."""
    return {k: v for k, v in batch.items() if not k.startswith("line_")}


def model_batch(batch: dict, processor, device="cpu", non_blocking: bool = False) -> dict:
    """A collated batch as the model's inputs on `device`: the uint8 patches shipped there, then rescaled,
    normalised and repeated over the temporal patch into the HF processor's float pixel_values."""
    out = {k: v.to(device, non_blocking=non_blocking) for k, v in batch.items() if k != "pixel_bytes"}
    out["pixel_values"] = processor.expand_patches(batch["pixel_bytes"].to(device, non_blocking=non_blocking))
    return out


def encoded_batch(items: list[dict], builder: PromptBuilder, processor) -> dict:
    """Examples from `encode_page`, collated and made the model's inputs on the CPU."""
    return model_batch(collate(items, builder.ids.endoftext, builder.ids.image_pad), processor)

"""Baseline parse backend: transformers' Qwen3_5ForConditionalGeneration + the checkpoint's tokenizer/image processor.

Used as the reference the native engine is compared against, and as a fallback backend. transformers is imported
lazily, inside the class, so `engine` imports without it.

Inputs are built here rather than with AutoProcessor: in transformers 5.17 Qwen3VLProcessor insists on a video
processor, which needs torchvision even for images; and the PIL image processor gives the same pixels on every machine.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engine.checkpoint import inspect_checkpoint
from engine.interface import PageRequest, PageResult, SamplingParams, seed_for_request
from engine.model_runner import resolve_dtype

def request_seed(req: PageRequest) -> int:
    return int(req.sampling.seed) if req.sampling.seed is not None else seed_for_request(req.request_id)


def check_request(req: PageRequest) -> None:
    img, sp = req.image, req.sampling
    if not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
        desc = f"{type(img).__name__} {getattr(img, 'dtype', '')} {getattr(img, 'shape', '')}"
        raise ValueError(f"image must be an H x W x 3 uint8 RGB array, got {desc}")
    if img.shape[0] < 1 or img.shape[1] < 1:
        raise ValueError(f"image is empty: shape {img.shape}")
    if sp.max_tokens < 1:
        raise ValueError(f"sampling.max_tokens must be >= 1, got {sp.max_tokens}")
    if sp.temperature < 0:
        raise ValueError(f"sampling.temperature must be >= 0, got {sp.temperature}")
    if not 0 < sp.top_p <= 1:
        raise ValueError(f"sampling.top_p must be in (0, 1], got {sp.top_p}")
    if sp.top_k < 0:
        raise ValueError(f"sampling.top_k must be >= 0 (0 = off), got {sp.top_k}")
    if sp.num_beams < 1 or (sp.num_beams > 1 and sp.temperature > 0):
        raise ValueError(f"sampling.num_beams must be >= 1, and 1 when sampling (temperature > 0); got {sp}")
    if sp.loop_stop_tokens or sp.loop_drop_tokens or sp.loop_ban_next:
        raise ValueError(f"sampling.loop_stop_tokens, loop_drop_tokens and loop_ban_next are the native engine's "
                         f"(engine/loop_guard.py); the transformers backend takes 0 and False, got {sp}")


@dataclass
class _Prepared:
    index: int  # position in the parse() call
    req: PageRequest
    input_ids: list[int]
    pixel_values: torch.Tensor  # [patches, C*T*P*P]
    grid_thw: torch.Tensor  # [1, 3]


class _StepClock:
    """A logits processor that only records when each decoding step's logits are ready (step k -> token k)."""

    def __init__(self):
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        self.times.append(time.perf_counter())
        return scores


class TransformersBackend:
    backend_id = "transformers"

    def __init__(
        self,
        checkpoint_dir: str | Path,
        device: str = "cpu",
        dtype: str = "float32",
        max_batch_size: int = 8,
        max_new_tokens: int = SamplingParams.max_tokens,
    ):
        """max_new_tokens caps every request's sampling.max_tokens (a request over it ends with finish "length")."""
        info = inspect_checkpoint(checkpoint_dir)  # names what is wrong: folder, config.json, model_type, tensors
        if info.text_only:
            raise ValueError(f"{checkpoint_dir}: a page parser needs a vision checkpoint (model_type qwen3_5)")
        if info.config.quant is not None:
            raise ValueError(f"{checkpoint_dir}: quantized ({info.config.quant.label}) checkpoints run on the native "
                             "backend only (transformers would need compressed-tensors): use backend native")
        self.config = json.loads((Path(checkpoint_dir) / "config.json").read_text())
        if max_batch_size < 1 or max_new_tokens < 1:
            raise ValueError(f"max_batch_size and max_new_tokens must be >= 1, got {max_batch_size}, {max_new_tokens}")
        from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration
        from transformers.models.auto.image_processing_auto import AutoImageProcessor

        self.checkpoint_dir = Path(checkpoint_dir)
        self.model_id = info.model_id
        self.device = torch.device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.max_batch_size = max_batch_size
        self.max_new_tokens = max_new_tokens
        self.busy_s = 0.0  # seconds spent in parse() (one call at a time: this backend is not thread-safe)

        self.tokenizer = AutoTokenizer.from_pretrained(self.checkpoint_dir)
        if not self.tokenizer.chat_template:
            raise ValueError(f"{self.checkpoint_dir} has no chat template (chat_template.jinja or tokenizer_config.json)")
        self.image_processor = AutoImageProcessor.from_pretrained(self.checkpoint_dir, backend="pil")
        self.model = Qwen3_5ForConditionalGeneration.from_pretrained(self.checkpoint_dir, dtype=self.dtype)
        self.model.to(self.device).eval()

        self.image_token_id = int(self.config["image_token_id"])
        self.merge = int(self.config["vision_config"].get("spatial_merge_size", 2))
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.config.get("eos_token_id", self.tokenizer.eos_token_id)
        self.eos_ids = sorted({int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None})
        if not self.eos_ids:
            raise ValueError(f"{self.checkpoint_dir}: no eos token id in generation_config.json or config.json")
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.eos_ids[0])

    # ---- inputs

    def _prepare(self, index: int, req: PageRequest) -> _Prepared:
        check_request(req)
        vis = self.image_processor(images=[req.image], return_tensors="pt", input_data_format="channels_last")
        grid = vis["image_grid_thw"]
        n_image_tokens = int(grid[0].prod()) // (self.merge * self.merge)
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": req.prompt}]}]
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        ids = [int(i) for i in ids]
        if ids.count(self.image_token_id) != 1:
            raise ValueError(f"prompt must yield exactly one image placeholder, got {ids.count(self.image_token_id)}")
        at = ids.index(self.image_token_id)
        ids = ids[:at] + [self.image_token_id] * n_image_tokens + ids[at + 1 :]
        return _Prepared(index, req, ids, vis["pixel_values"], grid)

    def _batch_inputs(self, items: list[_Prepared]) -> dict:
        width = max(len(p.input_ids) for p in items)
        input_ids = torch.full((len(items), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(items), width), dtype=torch.long)
        for row, p in enumerate(items):  # left padding: every prompt ends at the last column
            input_ids[row, width - len(p.input_ids) :] = torch.tensor(p.input_ids)
            attention[row, width - len(p.input_ids) :] = 1
        mm_token_type_ids = ((input_ids == self.image_token_id) & (attention == 1)).to(torch.int32)
        return {
            "input_ids": input_ids.to(self.device),
            "attention_mask": attention.to(self.device),
            "mm_token_type_ids": mm_token_type_ids.to(self.device),
            "pixel_values": torch.cat([p.pixel_values for p in items]).to(self.device, self.dtype),
            "image_grid_thw": torch.cat([p.grid_thw for p in items]).to(self.device),
        }

    # ---- generation

    def _generation_config(self, sp: SamplingParams, max_new_tokens: int):
        from transformers import GenerationConfig

        # A fresh config: only the request's SamplingParams apply, not the checkpoint's sampling defaults.
        sample = sp.temperature > 0
        return GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=sample,
            temperature=sp.temperature if sample else None,
            top_p=sp.top_p if sample else None,
            top_k=sp.top_k if sample else None,
            num_beams=sp.num_beams,
            early_stopping=True if sp.num_beams > 1 else None,  # as the native engine's beam search
            length_penalty=sp.length_penalty,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            bos_token_id=None,
        )

    def _max_tokens(self, req: PageRequest) -> int:
        return min(req.sampling.max_tokens, self.max_new_tokens)

    @torch.inference_mode()
    def _generate(self, items: list[_Prepared], sp: SamplingParams, submitted: float) -> list[PageResult]:
        """One generate() call over `items` (greedy or beam search, or a single sampled request); results in
        `items` order."""
        from transformers import LogitsProcessorList

        inputs = self._batch_inputs(items)
        clock = _StepClock()
        out = self.model.generate(
            **inputs,
            generation_config=self._generation_config(sp, max(self._max_tokens(p.req) for p in items)),
            logits_processor=LogitsProcessorList([clock]),
        )
        done = time.perf_counter()
        new_tokens = out[:, inputs["input_ids"].shape[1] :].tolist()
        results = []
        for p, tokens in zip(items, new_tokens):
            tokens = tokens[: self._max_tokens(p.req)]
            stop_at = next((i for i, t in enumerate(tokens) if t in self.eos_ids), None)
            if stop_at is not None:
                tokens, finish = tokens[: stop_at + 1], "stop"
            else:
                finish = "length"
            text_ids = tokens[:-1] if finish == "stop" else tokens
            first = clock.times[0] if clock.times else done
            last = clock.times[len(tokens) - 1] if len(tokens) <= len(clock.times) else done
            results.append(
                PageResult(
                    request_id=p.req.request_id,
                    text=self.tokenizer.decode(text_ids, skip_special_tokens=True),
                    prompt_tokens=len(p.input_ids),
                    output_tokens=len(tokens),  # includes the stop token
                    finish_reason=finish,
                    ttft_s=first - submitted,
                    decode_s=last - first,
                    total_s=done - submitted,
                )
            )
        return results

    def _generate_sampled(self, p: _Prepared, submitted: float) -> PageResult:
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, device_type=self.device.type if devices else "cuda"):
            torch.manual_seed(request_seed(p.req))
            return self._generate([p], p.req.sampling, submitted)[0]

    def parse(self, requests: list[PageRequest]) -> list[PageResult]:
        submitted = time.perf_counter()
        results: list[PageResult | None] = [None] * len(requests)

        def fail(i: int, err: Exception) -> None:
            results[i] = PageResult(
                request_id=requests[i].request_id,
                text="",
                prompt_tokens=0,
                output_tokens=0,
                finish_reason="error",
                error=f"{type(err).__name__}: {err}",
                total_s=time.perf_counter() - submitted,
            )

        # greedy requests batch together; beam searches with others of the same width, penalty and max_tokens
        # (a beam search's result depends on its length limit, so it is not cut afterwards like greedy outputs)
        greedy: dict[SamplingParams, list[_Prepared]] = {}
        sampled = []
        for i, req in enumerate(requests):
            try:
                p = self._prepare(i, req)
            except Exception as e:  # noqa: BLE001 - a bad request fails alone
                fail(i, e)
                continue
            sp = req.sampling
            if sp.temperature > 0:
                sampled.append(p)
            else:
                key = SamplingParams() if sp.num_beams == 1 else SamplingParams(
                    max_tokens=self._max_tokens(req), num_beams=sp.num_beams, length_penalty=sp.length_penalty)
                greedy.setdefault(key, []).append(p)

        for sp, group in greedy.items():
            group.sort(key=lambda p: len(p.input_ids))  # similar lengths together keep left padding small
            for start in range(0, len(group), self.max_batch_size):
                batch = group[start : start + self.max_batch_size]
                try:
                    for p, r in zip(batch, self._generate(batch, sp, submitted)):
                        results[p.index] = r
                except Exception:  # noqa: BLE001 - retry one by one so only the culprit fails
                    for p in batch:
                        try:
                            results[p.index] = self._generate([p], sp, submitted)[0]
                        except Exception as e:  # noqa: BLE001
                            fail(p.index, e)

        for p in sampled:  # one by one: each request's seed alone decides its tokens
            try:
                results[p.index] = self._generate_sampled(p, submitted)
            except Exception as e:  # noqa: BLE001
                fail(p.index, e)
        self.busy_s += time.perf_counter() - submitted
        return results  # type: ignore[return-value]

    def close(self) -> None:
        self.model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

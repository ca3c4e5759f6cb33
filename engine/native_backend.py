"""The pipeline's parse backend on the native engine (engine.interface.ParseBackend)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from engine.interface import PageRequest, PageResult
from engine.llm_engine import Engine, RequestRejected, seed_for_request
from engine.processor import ProcessorError


class NativeBackend:
    backend_id = "native"

    def __init__(self, checkpoint_dir: str | Path, device: str = "cpu", dtype: str = "auto",
                 max_new_tokens: int | None = None, chat_template_kwargs: dict | None = None, **engine_options):
        """engine_options: EngineOptions fields (max_num_seqs, max_model_len, max_num_batched_tokens, block_size,
        num_blocks, kv_cache_memory_gb, gpu_memory_utilization, enforce_eager). `max_batch_size` (the transformers
        backend's name) is accepted as max_num_seqs. max_new_tokens caps every request's sampling.max_tokens."""
        if "max_batch_size" in engine_options:
            engine_options.setdefault("max_num_seqs", engine_options.pop("max_batch_size"))
        if max_new_tokens is not None and max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.engine = Engine.from_checkpoint(checkpoint_dir, device=device, dtype=dtype,
                                             chat_template_kwargs=chat_template_kwargs, **engine_options)
        if self.engine.text_only:
            raise ValueError(f"{checkpoint_dir}: a page parser needs a vision checkpoint (model_type qwen3_5)")
        self.model_id = self.engine.model_id
        self.max_new_tokens = max_new_tokens

    def parse(self, requests: list[PageRequest]) -> list[PageResult]:
        results: dict[str, PageResult] = {}
        order = []
        for i, req in enumerate(requests):
            key = f"{i}:{req.request_id}"  # unique even if the caller repeats an id
            order.append((key, req))
            sampling = req.sampling
            if self.max_new_tokens is not None and sampling.max_tokens > self.max_new_tokens:
                sampling = dataclasses.replace(sampling, max_tokens=self.max_new_tokens)
            if sampling.seed is None:  # derive from the caller's id, not our internal key
                sampling = dataclasses.replace(sampling, seed=seed_for_request(req.request_id))
            try:
                if not isinstance(req.image, np.ndarray):
                    raise ProcessorError(f"image must be an H x W x 3 uint8 numpy array, got {type(req.image).__name__}")
                self.engine.add_request(key, prompt=req.prompt, image=req.image, sampling=sampling)
            except (RequestRejected, ProcessorError) as e:
                results[key] = PageResult(req.request_id, "", 0, 0, "error", error=str(e))
        while self.engine.has_unfinished():
            for out in self.engine.step():
                rid = out.request_id.split(":", 1)[1]
                results[out.request_id] = PageResult(
                    request_id=rid, text=out.text, prompt_tokens=out.prompt_tokens, output_tokens=out.output_tokens,
                    finish_reason=out.finish_reason, ttft_s=out.ttft_s, decode_s=out.decode_s, total_s=out.total_s)
        return [results[key] for key, _ in order]

    def close(self) -> None:
        import torch

        device = self.engine.device
        self.engine = None
        if device.type == "cuda":
            torch.cuda.empty_cache()


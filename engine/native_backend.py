"""The pipeline's parse backend on the native engine (engine.interface.ParseBackend)."""
from __future__ import annotations

import dataclasses
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

import numpy as np

from engine.interface import PageRequest, PageResult, SamplingParams, seed_for_request
from engine.llm_engine import Engine, RequestRejected
from engine.processor import ProcessorError


class NativeBackend:
    backend_id = "native"

    def __init__(self, checkpoint_dir: str | Path, device: str = "cpu", dtype: str = "auto",
                 max_new_tokens: int | None = None, chat_template_kwargs: dict | None = None,
                 preprocess_threads: int = 4, ignore_eos: bool = False, **engine_options):
        """engine_options: EngineOptions fields (max_num_seqs, max_model_len, max_num_batched_tokens, block_size,
        num_blocks, kv_cache_memory_gb, gpu_memory_utilization, enforce_eager). `max_batch_size` (the transformers
        backend's name) is accepted as max_num_seqs. max_new_tokens caps every request's sampling.max_tokens.
        ignore_eos: every page generates exactly its max_tokens (benchmarks: fixed-length, page-shaped work)."""
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
        self.preprocess_threads = max(1, preprocess_threads)
        self.ignore_eos = ignore_eos

    def parse(self, requests: list[PageRequest]) -> list[PageResult]:
        """Image preprocessing runs in a small thread pool; each request joins the engine as soon as its inputs are
        ready, so preprocessing overlaps decoding instead of delaying the first step."""
        t_submit = time.perf_counter()
        results: dict[str, PageResult] = {}
        order, pending = [], {}
        with ThreadPoolExecutor(max_workers=self.preprocess_threads) as pool:
            for i, req in enumerate(requests):
                key = f"{i}:{req.request_id}"  # unique even if the caller repeats an id
                order.append(key)
                if not isinstance(req.image, np.ndarray):
                    results[key] = _error(req, f"image must be an H x W x 3 uint8 numpy array, got "
                                               f"{type(req.image).__name__}")
                    continue
                pending[pool.submit(self.engine.processor.page_inputs, req.image, req.prompt, compact=True)] = (key, req)
            while pending or self.engine.has_unfinished():
                ready = [f for f in pending if f.done()]
                if not ready and not self.engine.has_unfinished():
                    wait(pending, return_when=FIRST_COMPLETED)
                    ready = [f for f in pending if f.done()]
                for fut in ready:
                    key, req = pending.pop(fut)
                    try:
                        ids, patches, grids = fut.result()
                        self.engine.add_request(key, prompt_token_ids=ids, pixel_values=patches, image_grids=grids,
                                                sampling=self._sampling(req), ignore_eos=self.ignore_eos,
                                                arrival_time=t_submit)
                    except (RequestRejected, ProcessorError) as e:
                        results[key] = _error(req, str(e))
                if self.engine.has_unfinished():
                    for out in self.engine.step():
                        rid = out.request_id.split(":", 1)[1]
                        results[out.request_id] = PageResult(
                            request_id=rid, text=out.text, prompt_tokens=out.prompt_tokens,
                            output_tokens=out.output_tokens, finish_reason=out.finish_reason, ttft_s=out.ttft_s,
                            decode_s=out.decode_s, total_s=out.total_s)
        return [results[key] for key in order]

    def _sampling(self, req: PageRequest) -> SamplingParams:
        sampling = req.sampling
        if self.max_new_tokens is not None and sampling.max_tokens > self.max_new_tokens:
            sampling = dataclasses.replace(sampling, max_tokens=self.max_new_tokens)
        if sampling.seed is None:  # derive from the caller's id, not our internal key
            sampling = dataclasses.replace(sampling, seed=seed_for_request(req.request_id))
        return sampling

    def close(self) -> None:
        import torch

        device = self.engine.device
        self.engine = None
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _error(req: PageRequest, message: str) -> PageResult:
    return PageResult(req.request_id, "", 0, 0, "error", error=message)

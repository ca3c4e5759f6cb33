"""The pipeline's parse backend on the native engine (engine.interface.ParseBackend)."""
from __future__ import annotations

import dataclasses
import itertools
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from engine.engine_loop import EngineLoop
from engine.interface import PageRequest, PageResult, SamplingParams, seed_for_request
from engine.llm_engine import Engine, RequestOutput
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
        self.ignore_eos = ignore_eos
        self.loop = EngineLoop(self.engine)
        self._preprocess = ThreadPoolExecutor(max_workers=max(1, preprocess_threads), thread_name_prefix="preprocess")
        self._calls = itertools.count()

    def parse(self, requests: list[PageRequest]) -> list[PageResult]:
        """Safe to call from several threads at once: the calls share one engine, so one call's pages join the
        running batch while another's finish. Each page's image is preprocessed in a small thread pool and joins the
        engine as soon as it is ready, so preprocessing overlaps decoding instead of delaying the first step."""
        t_submit = time.perf_counter()
        call = next(self._calls)  # request keys stay unique across concurrent calls and repeated ids
        pending = []
        for i, req in enumerate(requests):
            if not isinstance(req.image, np.ndarray):
                pending.append(_error(req, f"image must be an H x W x 3 uint8 numpy array, got "
                                           f"{type(req.image).__name__}"))
            else:
                pending.append(self._preprocess.submit(self._submit, f"{call}:{i}:{req.request_id}", req, t_submit))
        results = []
        for req, item in zip(requests, pending):
            item = item.result() if isinstance(item, Future) else item  # preprocessed: engine future or error
            item = item.result() if isinstance(item, Future) else item  # generated
            results.append(item if isinstance(item, PageResult) else _page_result(req, item))
        return results

    def _submit(self, key: str, req: PageRequest, t_submit: float):
        try:
            ids, patches, grids = self.engine.processor.page_inputs(req.image, req.prompt, compact=True)
        except ProcessorError as e:
            return _error(req, str(e))
        return self.loop.submit(key, prompt_token_ids=ids, pixel_values=patches, image_grids=grids,
                                sampling=self._sampling(req), ignore_eos=self.ignore_eos, arrival_time=t_submit)

    @property
    def busy_s(self) -> float:
        """Seconds the engine has spent stepping since it was loaded (overlapping calls counted once)."""
        return self.loop.busy_s

    def _sampling(self, req: PageRequest) -> SamplingParams:
        sampling = req.sampling
        if self.max_new_tokens is not None and sampling.max_tokens > self.max_new_tokens:
            sampling = dataclasses.replace(sampling, max_tokens=self.max_new_tokens)
        if sampling.seed is None:  # derive from the caller's id, not our internal key
            sampling = dataclasses.replace(sampling, seed=seed_for_request(req.request_id))
        return sampling

    def close(self) -> None:
        import torch

        self.loop.close()
        self._preprocess.shutdown()
        device = self.engine.device
        self.engine = self.loop = None
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _page_result(req: PageRequest, out: RequestOutput) -> PageResult:
    if out.finish_reason == "error":
        return _error(req, out.error or "engine rejected the request")
    return PageResult(request_id=req.request_id, text=out.text, prompt_tokens=out.prompt_tokens,
                      output_tokens=out.output_tokens, finish_reason=out.finish_reason, ttft_s=out.ttft_s,
                      decode_s=out.decode_s, total_s=out.total_s, loop_dropped_tokens=out.loop_dropped_tokens,
                      spec=out.spec)


def _error(req: PageRequest, message: str) -> PageResult:
    return PageResult(req.request_id, "", 0, 0, "error", error=message)

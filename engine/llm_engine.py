"""Engine: requests in, tokens and text out. add_request / step / generate over the scheduler and model runner."""
from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from engine import ops
from engine.beam_search import BeamChoice, BeamGroup, BeamStepper
from engine.block_manager import BlockManager
from engine.checkpoint import expected_tensors, inspect_checkpoint, iter_checkpoint_tensors, load_weights
from engine.config import ModelConfig, default_max_model_len
from engine.interface import SamplingParams, SpecStats, seed_for_request
from engine.model_runner import ModelRunner, resolve_dtype
from engine.models.dflash import DFlashDrafter
from engine.models.qwen3_5 import Qwen3_5Model
from engine.options import DEFAULT_TUNING, KV_DTYPES, STATE_DTYPES, DecodeTuning, EngineOptions, RunnerConfig
from engine.processor import Processor
from engine.request_checks import RequestRejected, check_prompt, check_sampling, image_inputs
from engine.rope import mrope_positions
from engine.sampler import Sampler
from engine.scheduler import NEED_DRAIN, ScheduledStep, Scheduler
from engine.sequence import SeqStatus, Sequence
from engine.spec_graphs import SpecGraphs
from engine.speculative import SpecDecoder, SpecFlight
from engine.state_pool import StatePool
from engine.step_metadata import PrefillChunk, to_device

PLACEHOLDER = -1  # a sampled token the host has not seen yet


@dataclass
class StepRecord:
    """Timing of one engine step (when Engine.record_steps is set)."""
    is_prefill: bool
    num_seqs: int
    num_tokens: int
    t_start: float
    t_launched: float  # host done launching (device work queued)
    wait_s: float = 0.0  # host blocked waiting for the device's tokens
    device_s: float = 0.0  # device time of the step (CUDA events; 0 on CPU)


@dataclass
class InFlight:
    seqs: list  # sequences that receive one token each from this step (beam requests' members excepted)
    tokens: torch.Tensor  # [len(seqs)] (pinned host copy on CUDA, filled asynchronously)
    beams: list[tuple[list[BeamGroup], BeamChoice]] = field(default_factory=list)  # beam requests' choices (host)
    logits: torch.Tensor | None = None  # kept only when some sequence records its logits
    event: torch.cuda.Event | None = None
    ev_start: torch.cuda.Event | None = None
    record: StepRecord | None = None
    spec: SpecFlight | None = None  # a speculative step: up to T tokens per sequence (tokens is then [S, T])


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    text: str
    finish_reason: str  # "stop" | "length" | "loop" | "error"
    error: str | None = None
    ttft_s: float = 0.0
    decode_s: float = 0.0
    total_s: float = 0.0
    num_preemptions: int = 0
    loop_dropped_tokens: int = 0  # output tokens left out of `text` as a loop's repeats (SamplingParams)
    logits: torch.Tensor | None = field(default=None, repr=False)  # [output_tokens, V] when requested
    spec: SpecStats = field(default_factory=SpecStats)  # speculative decoding's counts (zeros without a drafter)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def decode_tokens_per_s(self) -> float:
        return (self.output_tokens - 1) / self.decode_s if self.decode_s > 0 else 0.0


class Engine:
    def __init__(self, cfg: ModelConfig, weights: Iterable[tuple[str, torch.Tensor]], device="cpu", dtype="auto",
                 processor: Processor | None = None, stop_token_ids: Iterable[int] = (), model_id: str = "",
                 options: EngineOptions | None = None, expected: dict | None = None,
                 tuning: DecodeTuning = DEFAULT_TUNING):
        opts = options or EngineOptions()
        opts.check()
        tuning.check()
        self.cfg, self.options, self.model_id, self.processor = cfg, opts, model_id, processor
        self._image_processor = processor.image_processor if processor is not None else None
        self.device = torch.device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        if opts.kv_cache_dtype == "fp8" and self.device.type == "cuda" and \
                torch.cuda.get_device_capability(self.device) < (8, 9):
            major, minor = torch.cuda.get_device_capability(self.device)
            raise ValueError(f"kv_cache_dtype='fp8' needs a GPU with FP8 (sm_89 or newer); this one is "
                             f"sm_{major}{minor}: use kv_cache_dtype: auto")
        self.text_only = opts.text_only or cfg.vision is None
        self.max_model_len = opts.max_model_len or default_max_model_len(cfg.text)
        mnbt = opts.max_num_batched_tokens or (8192 if self.device.type == "cuda" else 2048)

        self.model = Qwen3_5Model(cfg, self.dtype, self.device, text_only=self.text_only)
        load_weights(self.model, cfg, weights, expected=expected)
        drafter, verify_len, spec = None, None, opts.speculative
        if opts.speculates:
            drafter = DFlashDrafter.from_pretrained(spec.drafter, cfg.text, self.dtype, self.device)
            n = spec.num_speculative_tokens
            verify_len = n + 1 if n is not None else drafter.cfg.block_size
            if verify_len < 2:
                raise ValueError(f"the drafter's block_size={verify_len}: a verify step needs >= 1 draft (set "
                                 "speculative.num_speculative_tokens, or no drafter)")
        pdl = tuning.pdl and ops.pdl_supported(self.device)
        self.runner = ModelRunner(self.model, cfg, RunnerConfig(
            device=self.device, dtype=self.dtype, max_num_seqs=opts.max_num_seqs, max_model_len=self.max_model_len,
            max_num_batched_tokens=mnbt, block_size=opts.block_size, num_blocks=opts.num_blocks,
            kv_cache_memory_gb=opts.kv_cache_memory_gb, gpu_memory_utilization=opts.gpu_memory_utilization,
            cuda_graphs=not opts.enforce_eager, compile_glue=opts.compile,
            state_dtype=STATE_DTYPES[opts.gdn_state_dtype], kv_dtype=KV_DTYPES[opts.kv_cache_dtype] or self.dtype,
            verify_len=verify_len, tuning=replace(tuning, pdl=pdl)), drafter)
        self.block_manager = BlockManager(self.runner.cache.num_blocks, opts.block_size)
        self.spec = None
        if drafter is not None:
            most = min(opts.max_num_seqs, spec.max_batch or opts.max_num_seqs)  # sequences a spec step holds
            self.spec = SpecDecoder(self.runner, drafter, verify_len, most)
            if not opts.enforce_eager:  # greedy steps from static buffers, as CUDA graphs where there is CUDA
                self.spec.graphs = SpecGraphs(self.spec, most, self.runner.cache.max_blocks_per_seq,
                                              self.runner.scratch_slot, capture=True)
        self.scheduler = Scheduler(self.block_manager, StatePool(opts.max_num_seqs), opts.max_num_seqs, mnbt,
                                   decode_len=self._decode_len, min_admit=tuning.prefill_min_seqs)
        self.beams = BeamStepper(self.scheduler, self.runner, self.block_manager.block_size, self.device)
        self.sampler = Sampler()
        stops = set(stop_token_ids) | set(cfg.text.eos_token_ids)
        if processor is not None:
            stops |= set(processor.eos_token_ids)
        self.stop_token_ids = frozenset(stops)
        self._ids = itertools.count()
        self._seqs: dict[str, Sequence] = {}
        self._inflight: InFlight | None = None
        self.record_steps = False  # set to fill step_log with StepRecords (benchmarks)
        self.step_log: list[StepRecord] = []

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str | Path, device="cpu", dtype="auto", chat_template_kwargs=None,
                        tuning: DecodeTuning = DEFAULT_TUNING, **options) -> Engine:
        opts = EngineOptions(**options)
        info = inspect_checkpoint(checkpoint_dir, text_only=opts.text_only)
        processor = Processor(checkpoint_dir, info.config, chat_template_kwargs)
        return cls(info.config, iter_checkpoint_tensors(info), device, dtype, processor=processor,
                   model_id=info.model_id, options=opts, expected=expected_tensors(info.config, info.text_only),
                   tuning=tuning)

    # ------------------------------------------------------------------ requests
    def add_request(self, request_id: str, *, prompt: str | None = None, image=None,
                    prompt_token_ids: list[int] | None = None, pixel_values=None, image_grids=None,
                    sampling: SamplingParams | None = None, ignore_eos: bool = False,
                    keep_logits: bool = False, arrival_time: float | None = None) -> None:
        """Queue a request: either `prompt` (+ optional page `image`, rendered through the chat template) or
        pre-tokenized `prompt_token_ids` (+ `pixel_values` [P, patch_dim] and `image_grids`)."""
        sampling = sampling or SamplingParams()
        if request_id in self._seqs:
            raise RequestRejected(f"request {request_id!r}: id already in use")
        check_sampling(request_id, sampling, keep_logits, self.options.max_num_seqs)
        beams = sampling.num_beams
        if prompt_token_ids is None:
            if self.processor is None:
                raise RequestRejected(f"request {request_id!r}: engine has no tokenizer; pass prompt_token_ids")
            if prompt is None:
                raise RequestRejected(f"request {request_id!r}: give prompt or prompt_token_ids")
            if image is not None and self.text_only:
                raise RequestRejected(f"request {request_id!r}: image given but the engine is text-only")
            prompt_token_ids, pixel_values, image_grids = self.processor.page_inputs(image, prompt)
        ids = [int(t) for t in prompt_token_ids]
        check_prompt(request_id, ids, sampling, self.cfg.text.vocab_size, self.max_model_len, self.block_manager)
        images, pos, delta = self.prompt_inputs(request_id, ids, pixel_values, image_grids)
        seed = sampling.seed if sampling.seed is not None else seed_for_request(request_id)
        gen = torch.Generator(device=self.device).manual_seed(seed) if sampling.temperature > 0 else None
        stops = frozenset() if ignore_eos else self.stop_token_ids
        seq = Sequence(next(self._ids), request_id, ids, sampling, stops, pos, delta, images, gen, keep_logits)
        if arrival_time is not None:  # time.perf_counter() when the caller received the request
            seq.arrival_time = arrival_time
        if beams > 1:  # the other members share the prompt; its caches are copied to them once it is computed
            others = [Sequence(next(self._ids), request_id, ids, sampling, stops, pos, delta) for _ in range(beams - 1)]
            BeamGroup([seq, *others], sampling.length_penalty, self.device)
        self._seqs[request_id] = seq
        self.scheduler.add(seq)

    def prompt_inputs(self, request_id: str, ids: list[int], pixel_values, image_grids):
        """A prompt's image inputs checked against its image tokens, and its mRoPE positions -> (ImageInputs or
        None, positions [3, len(ids)], rope delta); RequestRejected naming the request if they do not fit."""
        images = None
        grids = [tuple(int(v) for v in g) for g in (image_grids or [])]
        if pixel_values is not None or grids:
            if self.text_only:
                raise RequestRejected(f"request {request_id!r}: image inputs given but the engine is text-only")
            images = image_inputs(request_id, self.cfg, ids, pixel_values, grids, self._image_processor is not None)
        merge = self.cfg.vision.spatial_merge_size if self.cfg.vision is not None else 2
        try:
            pos, delta = mrope_positions(ids, self.cfg.image_token_id, grids, merge)
        except ValueError as e:
            raise RequestRejected(f"request {request_id!r}: {e}") from e
        return images, pos, delta

    def abort(self, request_id: str) -> None:
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return
        if seq.status == SeqStatus.WAITING:
            self.scheduler.abort_waiting(seq)
        elif seq.status != SeqStatus.FINISHED:
            for s in seq.beam.members if seq.beam is not None else [seq]:
                self.scheduler.finish(s, "abort")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or self._inflight is not None

    def _decode_len(self, seq: Sequence) -> int:
        """Tokens of KV cache seq's next decode step needs: its newest token's, or its speculative block's (the
        block is reserved whether or not the step turns out to speculate)."""
        if self.spec is None or seq.beam is not None:
            return len(seq)
        return len(seq) - 1 + self.spec.block_len(seq)

    def _speculates(self, seqs: list[Sequence]) -> bool:
        """Whether a decode step over seqs is speculative: a drafter, no beam members, a batch within
        speculative.max_batch."""
        most = self.options.speculative.max_batch if self.spec is not None else None
        return (self.spec is not None and all(s.beam is None for s in seqs)
                and (most is None or len(seqs) <= most))

    # ------------------------------------------------------------------ stepping
    def step(self) -> list[RequestOutput]:
        """Launch one scheduled step, then collect the previous one; returns the requests that finished.

        The host runs one step ahead of the device: step t + 1 is launched (its input tokens are read from the
        device) before step t's tokens come back, so host work overlaps device work. A sequence's newest token is
        a placeholder until collected; one that stopped at step t may still be computed at t + 1 (result dropped).
        After a speculative step the host waits: how many tokens it gave is known only once collected. A
        speculative step may follow a plain one still in flight (the lengths are known, the last token is read
        on the device).
        """
        finished = []
        if self._inflight is not None and self._inflight.spec is not None:
            finished += self._collect()  # a speculative step's lengths are known only once collected: no step ahead
        had_flight = self._inflight is not None
        sched = self.scheduler.schedule(can_preempt=not had_flight)
        if sched == NEED_DRAIN:
            finished += self._collect()
            sched = self.scheduler.schedule(can_preempt=True)
        launched = self._launch(sched) if sched is not None else None
        finished += self._collect()
        self._inflight = launched
        if sched is None and not had_flight and self.scheduler.waiting and not self.scheduler.running:
            raise RuntimeError("scheduler cannot admit any waiting request (KV cache or state slots too small)")
        return finished

    def _launch(self, sched: ScheduledStep) -> InFlight | None:
        t0 = time.perf_counter()
        timing = self.record_steps and self.device.type == "cuda"
        ev_start = torch.cuda.Event(enable_timing=True) if timing else None
        if sched.is_prefill:
            seqs, logits = self._prefill(sched.seqs, sched.chunk_lens, ev_start)
        elif self._speculates(sched.seqs):
            return self._launch_spec(sched, t0, ev_start, timing)
        else:
            seqs, logits = sched.seqs, self._decode(sched.seqs, ev_start)
        if not seqs:
            if self.record_steps:
                self.step_log.append(StepRecord(sched.is_prefill, len(sched.seqs), sum(sched.chunk_lens), t0,
                                                time.perf_counter()))
            return None
        tokens = self.sampler(logits, seqs)
        beams, fed = [], seqs
        if any(s.beam is not None for s in seqs):
            seqs, tokens, logits, beams = self.beams.step(seqs, tokens, logits)
            fed = seqs + [m for groups, _ in beams for group in groups for m in group.members]
            tokens = torch.cat([tokens] + [choice.tokens.flatten() for _, choice in beams])
        slots = to_device([s.state_slot for s in fed], torch.int64, self.device)
        self.runner.next_tokens[slots] = tokens  # decode inputs of the next step, without a host round trip
        tokens = tokens[:len(seqs)]
        on_cuda = self.device.type == "cuda"
        # kept logits are read when this step is collected, after the next one ran: a copy, since a decode step's
        # logits may be the CUDA graph's output buffer (fp32 models get it without a conversion's copy)
        flight = InFlight(seqs, tokens.to("cpu", non_blocking=True) if on_cuda else tokens,
                          [(gs, c.to_host() if on_cuda else c) for gs, c in beams],
                          logits=logits.clone() if any(s.logits is not None for s in seqs) else None)
        if self.device.type == "cuda":
            flight.event = torch.cuda.Event(enable_timing=timing)
            flight.event.record()
        flight.ev_start = ev_start
        for s in fed:  # placeholder until collected
            s.token_ids.append(PLACEHOLDER)
            s.status = SeqStatus.DECODING
        if self.record_steps:
            flight.record = StepRecord(sched.is_prefill, len(sched.seqs), sum(sched.chunk_lens), t0,
                                       time.perf_counter())
        return flight

    def _launch_spec(self, sched: ScheduledStep, t0: float, ev_start, timing: bool) -> InFlight:
        """A speculative step over the scheduled decode batch (engine/speculative.py; beam search never gets here)."""
        if ev_start is not None:
            ev_start.record()
        spec = self.spec.step(sched.seqs)
        on_cuda = self.device.type == "cuda"
        host = spec.tokens.to("cpu", non_blocking=True) if on_cuda else spec.tokens
        spec.emitted = spec.emitted.to("cpu", non_blocking=True) if on_cuda else spec.emitted
        flight = InFlight(sched.seqs, host, logits=spec.logits, spec=spec, ev_start=ev_start)
        if on_cuda:
            flight.event = torch.cuda.Event(enable_timing=timing)
            flight.event.record()
        if self.record_steps:
            flight.record = StepRecord(False, len(sched.seqs), len(sched.seqs), t0, time.perf_counter())
        return flight

    def _collect(self) -> list[RequestOutput]:
        """Wait for the step in flight (if any) and apply its tokens."""
        flight, self._inflight = self._inflight, None
        if flight is None:
            return []
        t_wait = time.perf_counter()
        if flight.event is not None:
            flight.event.synchronize()
        tokens = flight.tokens.tolist()
        now = time.perf_counter()
        if flight.record is not None:
            flight.record.wait_s = now - t_wait
            if flight.ev_start is not None:
                flight.record.device_s = flight.ev_start.elapsed_time(flight.event) / 1e3
            self.step_log.append(flight.record)
        if flight.spec is not None:
            return self._collect_spec(flight, tokens, now)
        finished, kept = [], _kept_logits(flight)
        for row, (seq, tok) in enumerate(zip(flight.seqs, tokens)):
            if seq.status == SeqStatus.FINISHED:
                continue  # stopped at an earlier step (or aborted): this extra token is dropped
            out = self._apply_token(seq, tok, kept.get(row), now)
            if out is not None:
                finished.append(out)
        for groups, choice in flight.beams:
            for row, group in enumerate(groups):
                leader = group.leader
                if leader.status == SeqStatus.FINISHED:
                    continue  # ended (or aborted) at an earlier step
                leader.first_token_time = leader.first_token_time or now
                leader.last_token_time = now
                if group.apply(choice, row):
                    finished.append(self._output(self.beams.finish(group)))
        return finished

    def _apply_token(self, seq: Sequence, tok: int, logits_row, now: float) -> RequestOutput | None:
        """The host learns seq's next token (its placeholder is filled): stop, length and loop checks."""
        i = seq.num_known
        seq.token_ids[i] = tok
        seq.num_known += 1
        if seq.logits is not None:
            seq.logits.append(logits_row.cpu())
        seq.first_token_time = seq.first_token_time or now
        seq.last_token_time = now
        reason = "stop" if tok in seq.stop_ids else ("length" if i + 1 - seq.prompt_len >= seq.sampling.max_tokens
                                                    else None)
        keep = seq.loop_guard.push(seq.token_ids, seq.prompt_len, i + 1) if seq.loop_guard else None
        if seq.loop_drop is not None:
            seq.loop_drop.push(seq.token_ids, seq.prompt_len, i + 1)
        if keep is not None and reason != "stop":
            reason, i = "loop", seq.prompt_len + keep - 1  # the answer ends after the loop's first unit
            if seq.logits is not None:
                del seq.logits[keep:]
        if not reason:
            return None
        del seq.token_ids[i + 1:]  # tokens launched after the stop are dropped
        seq.num_known = i + 1
        self.scheduler.finish(seq, reason)
        return self._output(seq)

    def _collect_spec(self, flight: InFlight, tokens: list[list[int]], now: float) -> list[RequestOutput]:
        """Each sequence's emitted tokens (accepted drafts + the target's), one by one as plain decode would."""
        spec, finished, kept = flight.spec, [], _kept_logits(flight)
        for row, (seq, toks, n, valid) in enumerate(zip(flight.seqs, tokens, spec.emitted.tolist(), spec.valid)):
            if seq.status == SeqStatus.FINISHED:
                continue  # aborted while in flight
            seq.spec_stats.add(valid, n)
            seq.num_computed = len(seq) - 1 + n  # the block's first n tokens are now in the caches
            for j in range(n):
                seq.token_ids.append(PLACEHOLDER)
                out = self._apply_token(seq, toks[j], kept[row][j] if row in kept else None, now)
                if out is not None:
                    finished.append(out)
                    break
        return finished

    def _prefill(self, seqs: list[Sequence], lens: list[int], start_event=None):
        self._encode_images([s for s in seqs if s.images is not None and s.image_embeds is None])
        chunks, rows, sampled, row = [], [], [], 0
        for seq, n in zip(seqs, lens):
            s, e = seq.num_computed, seq.num_computed + n
            chunks.append(PrefillChunk(token_ids=seq.token_ids[s:e], positions=seq.positions(s, e), start=s,
                                       block_table=seq.block_table, state_slot=seq.state_slot,
                                       embed_overrides=seq.image_rows(s, e)))
            seq.num_computed = e
            row += n
            if e == len(seq):  # prompt fully in the caches: its last row yields the next token
                rows.append(row - 1)
                sampled.append(seq)
                seq.image_embeds = None
        logits = self.runner.run_prefill(chunks, rows, start_event) if chunks else None
        return sampled, logits

    def _encode_images(self, seqs: list[Sequence]) -> None:
        if not seqs:
            return
        pv = torch.cat([self._device_patches(s.images.pixel_values) for s in seqs])
        grids = [g for s in seqs for g in s.images.grids]
        emb = self.model.encode_images(pv, grids)
        m2 = self.cfg.vision.spatial_merge_size**2
        start = 0
        for s in seqs:
            n = sum(t * h * w for t, h, w in s.images.grids) // m2
            s.image_embeds = emb[start:start + n]
            start += n

    def _device_patches(self, pixel_values: torch.Tensor) -> torch.Tensor:
        if pixel_values.dtype == torch.uint8:
            return self._image_processor.expand_patches(to_device(pixel_values, torch.uint8, self.device))
        return to_device(pixel_values, torch.float32, self.device)

    def _decode(self, seqs: list[Sequence], start_event=None) -> torch.Tensor:
        bs = self.block_manager.block_size
        positions, slots, state_idx, ctx, tables = [], [], [], [], []
        for seq in seqs:
            i = len(seq) - 1  # the newest token (maybe still a placeholder on the host), not yet in the caches
            positions.append(i + seq.rope_delta)
            slots.append(seq.block_table[i // bs] * bs + i % bs)
            state_idx.append(seq.state_slot)
            ctx.append(i + 1)
            tables.append(seq.block_table)
            seq.num_computed = i + 1
        return self.runner.run_decode(positions, slots, state_idx, ctx, tables, start_event,
                                      row_owners=[(s.seq_id, s.num_preemptions) for s in seqs])

    def _output(self, seq: Sequence) -> RequestOutput:
        self._seqs.pop(seq.request_id, None)
        out_ids = seq.output_ids
        text_ids = out_ids[:-1] if out_ids and out_ids[-1] in seq.stop_ids else out_ids
        if seq.loop_drop is not None:
            text_ids = seq.loop_drop.kept(text_ids)
        text = self.processor.decode(text_ids) if self.processor is not None else ""
        first = seq.first_token_time or seq.arrival_time
        last = seq.last_token_time or first
        return RequestOutput(
            request_id=seq.request_id, prompt_token_ids=seq.token_ids[:seq.prompt_len], output_token_ids=out_ids,
            text=text, finish_reason=seq.finish_reason, ttft_s=first - seq.arrival_time, decode_s=last - first,
            total_s=last - seq.arrival_time, num_preemptions=seq.num_preemptions,
            loop_dropped_tokens=seq.loop_drop.left_out if seq.loop_drop is not None else 0,
            logits=torch.stack(seq.logits) if seq.logits else None, spec=seq.spec_stats)

    # ------------------------------------------------------------------ convenience
    def generate(self, requests: list[dict], on_finish=None) -> list[RequestOutput]:
        """Run requests (dicts of add_request arguments; request_id optional) to completion, in input order.
        Requests the engine rejects come back with finish_reason "error" and the reason. on_finish(output), if
        given, sees each output as its request ends (e.g. to reduce kept logits while the others run)."""
        ids, results = [], {}
        for i, r in enumerate(requests):
            r = dict(r)
            rid = r.pop("request_id", None) or f"req-{i}"
            ids.append(rid)
            try:
                self.add_request(rid, **r)
            except RequestRejected as e:
                results[rid] = RequestOutput(rid, [], [], "", "error", error=str(e))
        while self.has_unfinished():
            for out in self.step():
                if on_finish is not None:
                    on_finish(out)
                results[out.request_id] = out
        return [results[i] for i in ids]


def _kept_logits(flight: InFlight) -> dict[int, torch.Tensor]:
    """The step's logits rows of the sequences that keep them, on the host: row -> [V] (plain step) or [T, V]
    (speculative step). One gather and one copy for the step, not one synchronising copy per row."""
    logits = flight.spec.logits if flight.spec is not None else flight.logits
    rows = [r for r, s in enumerate(flight.seqs) if s.logits is not None and s.status != SeqStatus.FINISHED]
    if not rows or logits is None:
        return {}
    host = logits[torch.tensor(rows, device=logits.device)].cpu()
    return {r: h.clone() for r, h in zip(rows, host)}  # own storage: a row kept must not hold the step's batch

"""The parse job: check everything that can be checked before Ray starts, then stream
documents -> rasterizer actors -> engine actors -> committed Parquet parts, and report stats."""
from __future__ import annotations

import logging
import os
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.fs as pafs

from engine.backends import check_options
from pipeline.blocks import BlockReading
from pipeline.checkpoint import (
    CheckpointError, checkpoint_note, localize, validate, validate_drafter, weight_precision)
from pipeline.config import ConfigError, JobConfig, knob
from pipeline.local_ray import ray_session
from pipeline.output import DocumentAssembler, OutputStore, ReconcileReport, document_row
from pipeline.page_reading import block_reading, raster_options
from pipeline.plan import PLAN_COLUMNS, Plan, plan_run, unique_listing
from pipeline.progress import PageProgress
from pipeline.rasterize import RasterOptions
from pipeline.redact import install_log_redaction, redact
from pipeline.schema import DOC_TASK_SCHEMA, PAGE_SCHEMA, empty_row
from pipeline.stats import RunStats, format_table
from pipeline.storage import (LISTING_SCHEMA, Location, check_writable, explain, list_table, resolve, retrying,
                              write_parquet_atomic, write_text)

log = logging.getLogger("ocria.job")


NOTE_SHOWN = 160  # characters of the checkpoint's note printed; runs/<run_id>.json keeps all of it


def short_note(note: str) -> str:
    """The checkpoint's note for the console: its first sentence, at most NOTE_SHOWN characters."""
    first = note.split(". ", 1)[0].strip()
    return first if len(first) <= NOTE_SHOWN else first[: NOTE_SHOWN - 3].rstrip() + "..."


def new_run_id() -> str:
    # Sorts by start time, so the newest commit of a document is the last part name that holds it.
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ") + "-" + secrets.token_hex(3)


@dataclass
class Prepared:
    """Everything decided before Ray starts."""

    cfg: JobConfig
    run_id: str
    store: OutputStore
    plan: Plan
    checkpoint_dir: str
    raster: RasterOptions  # the page size for this checkpoint and max_tokens
    blocks: BlockReading  # whether pages are also read in blocks of a few lines
    drafter: str | None = None  # the speculative drafter's folder (model.drafter), None: off


def prepare(cfg: JobConfig) -> Prepared:
    """Fails fast, with a message saying what to fix, on a bad checkpoint, input or output."""
    install_log_redaction()  # a process that runs the job logs no credential, whoever called it
    try:
        checkpoint_dir = localize(cfg.model.checkpoint, cfg.storage, cfg.run.cache_dir)
        model_id = validate(checkpoint_dir)
        raster = raster_options(cfg, checkpoint_dir)
        blocks = block_reading(cfg, checkpoint_dir)
        drafter = validate_drafter(cfg.model.drafter, checkpoint_dir, cfg.model.backend)
    except CheckpointError as e:
        raise ConfigError(str(e)) from None
    try:
        check_options(cfg.model.backend, cfg.model.options, drafter)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    store = OutputStore(writable_output(cfg))
    try:
        report = store.reconcile(PLAN_COLUMNS)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--output {cfg.output!r} is not usable: {explain(cfg.output, e, cfg.storage)}") from None
    if report.orphan_parts_removed or report.superseded_documents:
        log.info("output repaired: %s", report)
    plan = plan_against(cfg, store, list_inputs(cfg), model_id, report.documents)
    if plan.other_model:
        others = sorted({m for ids in plan.other_model.values() for m in ids})
        raise ConfigError(
            f"output {cfg.output!r} holds {len(plan.other_model)} document(s) parsed by another model "
            f"({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}), e.g. {next(iter(plan.other_model))}; "
            f"this run's model is {model_id}. Skipping them would keep their old text beside this model's: pass "
            f"--reparse to parse them again (their new rows replace the old), or write to another --output")
    if plan.todo and not ray_address(cfg):  # a local Ray's size is known now: check the pools fit before starting it
        size_pools(cfg, local_cpus(cfg), local_gpus(cfg), " CPUs of the local Ray (--num-cpus)")
    return Prepared(cfg, new_run_id(), store, plan, checkpoint_dir, raster, blocks, drafter)


def list_inputs(cfg: JobConfig) -> pa.Table:
    """Every input's files, each URI once (pipeline.storage.LISTING_SCHEMA)."""
    listings = []
    for uri in cfg.input.uris:
        try:
            listings.append(list_table(uri, cfg.storage, cfg.input.include, cfg.input.exclude))
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot list input {uri!r}: {explain(uri, e, cfg.storage)}") from None
    return unique_listing(pa.concat_tables(listings)) if listings else LISTING_SCHEMA.empty_table()


def plan_against(cfg: JobConfig, store: OutputStore, listed: pa.Table, model_id: str,
                 committed: pa.Table | None = None) -> Plan:
    """The plan of `listed` against what the (reconciled) output holds: the documents' columns the plan reads
    (`committed`: as reconcile(PLAN_COLUMNS) found them, else read here), and the models that wrote their pages."""
    committed = store.documents(PLAN_COLUMNS) if committed is None else committed
    return plan_run(listed, committed, cfg.run.retry_failed, cfg.run.max_attempts, cfg.input.limit, model_id,
                    store.page_model_table(), cfg.run.reparse)


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def writable_output(cfg: JobConfig) -> Location:
    """The output location, once it is known to be a folder (or prefix) this job can write to: a small file is
    written there and deleted, so a bad --output fails now, not in the first commit after parsing."""
    try:
        loc = resolve(cfg.output, cfg.storage)
        if loc.scheme == "file" and inside_ray_job_submit() and not _absolute(cfg.output):
            raise ConfigError(f"--output {cfg.output!r} is relative, and inside `ray job submit` that is a folder in "
                              f"the copy of --working-dir Ray made for this job ({os.getcwd()}), which Ray may delete "
                              f"once the job is over: give an absolute path on storage every node shares, or an "
                              f"s3:// / gs:// prefix")
        if retrying(f"stat {cfg.output}", loc.fs.get_file_info, loc.path).type == pafs.FileType.File:
            raise ConfigError(f"--output {cfg.output!r} is an existing file: give a folder (or an object-storage "
                              f"prefix) for the pages/, documents/ and stats/ tables")
        check_writable(loc)
    except (OSError, ValueError) as e:
        reason = explain(cfg.output, e, cfg.storage) if isinstance(e, OSError) else str(e)
        if reason == redact(str(e)):  # nothing more specific known: a local folder's or the store's own words
            reason = f"{_first_line(e)}: choose a folder you can write to, or fix its permissions"
        raise ConfigError(f"--output {cfg.output!r} cannot be written: {reason}") from None
    return loc


def inside_ray_job_submit() -> bool:
    """Whether this driver is the entrypoint of `ray job submit` (Ray's job supervisor sets this variable for it)."""
    return bool(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR"))


def _absolute(path: str) -> bool:
    local = path[7:] if path.startswith("file://") else path
    return local.startswith(("/", "~"))


def ray_address(cfg: JobConfig) -> str | None:
    return cfg.run.ray_address or os.environ.get("RAY_ADDRESS") or None


def local_cpus(cfg: JobConfig) -> float:
    return cfg.run.num_cpus or os.cpu_count() or 1


def local_gpus(cfg: JobConfig) -> int:
    """The GPUs a local Ray would see (it honours CUDA_VISIBLE_DEVICES as torch does); 0 without torch's CUDA."""
    if cfg.model.device == "cpu":
        return 0
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@dataclass(frozen=True)
class PoolSizes:
    engines: int
    gpus_per_engine: int
    engine_cpus: float
    raster_max: int
    raster_cpus: float


INPUT_CPU_RESERVE = 0.25  # Ray Data's own tasks; leaving nothing for them deadlocks a small cluster silently


def size_pools(cfg: JobConfig, cluster_cpus: float, cluster_gpus: int, cpus_from: str = " CPUs of the Ray cluster"
               ) -> PoolSizes:
    """One engine per GPU (or `parse.num_actors`), rasterizers in what CPU remains. The sum of CPU requests
    never exceeds the cluster's, which on a small cluster would hang the job without an error."""
    use_gpu = cfg.model.device == "cuda" or (cfg.model.device == "auto" and cluster_gpus > 0)
    if use_gpu and cluster_gpus == 0:
        raise ConfigError(f"{knob('model.device')} is cuda but Ray sees no GPUs: use --device cpu (or auto), "
                          f"or join a cluster with GPUs (--ray-address)")
    engines = cfg.parse.num_actors or (cluster_gpus if use_gpu else 1)
    if use_gpu and engines > cluster_gpus:
        raise ConfigError(f"{knob('parse.num_actors')} is {engines} but there are {cluster_gpus} GPUs (one engine "
                          f"per GPU): lower --num-engines to {cluster_gpus} at most")
    budget = cluster_cpus - engines * cfg.parse.cpus_per_actor - INPUT_CPU_RESERVE
    if budget <= 0:
        raise ConfigError(
            f"{engines} engine(s) x {cfg.parse.cpus_per_actor:g} CPU each ({knob('parse.cpus_per_actor')}) leave no "
            f"CPU for drawing pages out of {cluster_cpus:g}{cpus_from}: lower --num-engines (parse.num_actors)"
            + (" or raise --num-cpus" if "num-cpus" in cpus_from else ""))
    raster_max = cfg.raster.num_actors_max or max(1, int(budget // cfg.raster.cpus_per_actor))
    raster_max = max(raster_max, cfg.raster.num_actors_min)
    raster_cpus = min(cfg.raster.cpus_per_actor, budget / raster_max)
    return PoolSizes(engines, 1 if use_gpu else 0, cfg.parse.cpus_per_actor, raster_max, raster_cpus)


def build_dataset(ray, prep: Prepared, pools: PoolSizes):
    from ray.data import ActorPoolStrategy, DataContext

    from engine.backends import concurrent_calls
    from pipeline.stages import ParseStage, RasterizeStage

    cfg = prep.cfg
    ctx = DataContext.get_current()
    ctx.wait_for_min_actors_s = 600  # start every engine actor before streaming, not one at a time
    # The job reports progress in pages itself (pipeline.progress); Ray Data's bars, or without a terminal its ten
    # log lines every ten seconds, and its execution-plan lines would bury it.
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    todo = prep.plan.todo  # built column by column: a first run of an archive plans a million documents
    tasks = pa.table([list(todo), [m.size_bytes for m in todo.values()], [m.mtime_ns for m in todo.values()],
                      [m.attempt for m in todo.values()]], schema=DOC_TASK_SCHEMA)
    # Small blocks, cut here in the driver: no repartition task (it would ask for a whole CPU that a small
    # cluster may not have free), and one slow document holds up few others.
    per_block = max(1, min(16, tasks.num_rows // (8 * pools.raster_max)))
    ds = ray.data.from_arrow([tasks.slice(i, per_block) for i in range(0, tasks.num_rows, per_block)])
    ds = ds.map_batches(
        RasterizeStage, batch_size=1, batch_format="pyarrow",
        fn_constructor_kwargs=dict(storage=cfg.storage, opts=prep.raster,
                                   page_timeout_s=cfg.raster.page_timeout_s, memory_limit_mb=cfg.raster.memory_limit_mb,
                                   max_lost_pages=cfg.raster.max_lost_pages),
        compute=ActorPoolStrategy(min_size=min(cfg.raster.num_actors_min, pools.raster_max), max_size=pools.raster_max),
        num_cpus=pools.raster_cpus,
    )
    m = cfg.model
    calls = concurrent_calls(m.backend, cfg.parse.concurrent_batches)
    return ds.map_batches(
        ParseStage, batch_size=cfg.parse.batch_size, batch_format="pyarrow",
        fn_constructor_kwargs=dict(
            # A remote checkpoint is copied by each engine's node into its own cache; a local one is the path
            # the driver resolved (absolute, so the workers' working directory does not matter).
            run_id=prep.run_id, backend_name=m.backend, storage=cfg.storage, cache_dir=cfg.run.cache_dir,
            checkpoint=prep.checkpoint_dir if resolve(m.checkpoint, cfg.storage).scheme == "file" else m.checkpoint,
            device="cuda" if pools.gpus_per_engine else "cpu", dtype=m.dtype, prompt=m.prompt,
            sampling=dict(max_tokens=m.max_tokens, temperature=m.temperature, top_p=m.top_p, top_k=m.top_k, seed=m.seed,
                          num_beams=m.num_beams, length_penalty=m.length_penalty,
                          loop_stop_tokens=m.loop_stop_tokens, loop_drop_tokens=m.loop_drop_tokens,
                          loop_ban_next=m.loop_ban_next),
            fallback_to_text_layer=cfg.parse.fallback_to_text_layer, block_reading=prep.blocks,
            options=dict(m.options, speculative=dict(m.options.get("speculative") or {}, drafter=prep.drafter))
            if prep.drafter else m.options),
        compute=ActorPoolStrategy(size=pools.engines, max_concurrent_calls_per_actor=calls,
                                  enable_true_multi_threading=calls > 1),
        num_gpus=pools.gpus_per_engine, num_cpus=pools.engine_cpus,
    )


def run(prep: Prepared, echo=print) -> dict:
    cfg = prep.cfg
    echo(f"run {prep.run_id}: {prep.plan.summary()}")
    note = checkpoint_note(prep.checkpoint_dir)
    if note:
        echo(f"model {cfg.model.checkpoint}: {short_note(note)}")
    engines, gpus = cfg.parse.num_actors or 1, 0
    stats = RunStats(prep.run_id, engines, gpus, cfg.cost.usd_per_gpu_hour, usd_per_cpu_hour=cfg.cost.usd_per_cpu_hour)
    t0 = time.perf_counter()
    if prep.plan.todo:
        with ray_session(ray_address(cfg), local_cpus(cfg)) as ray:
            res = ray.cluster_resources()
            pools = size_pools(cfg, res.get("CPU", 1.0), int(res.get("GPU", 0)))
            stats.engine_actors, stats.gpus = pools.engines, pools.engines * pools.gpus_per_engine
            stats.raster_actors = pools.raster_max
            stats.cpus = pools.engines * pools.engine_cpus + pools.raster_max * pools.raster_cpus
            echo(f"engines: {pools.engines} x {'GPU' if pools.gpus_per_engine else 'CPU'}; "
                 f"rasterizers: up to {pools.raster_max} x {pools.raster_cpus:.2f} CPU")
            ds = build_dataset(ray, prep, pools)  # seconds on a busy machine (Ray Data's imports): start-up too
            # one origin for wall_s, warmup_s and first_result_s, so stream_started_unix + warmup_s is the warm-up mark
            t0, stats.stream_started_unix = time.perf_counter(), time.time()
            try:
                _stream_and_commit(ds, prep, stats, t0, echo)
            finally:
                stats.engine_restarts = engine_restarts(ray, pools.engines)
    stats.wall_s = time.perf_counter() - t0
    # a run that committed nothing leaves the output as prepare's reconcile did: at a million documents another
    # pass over every part would be most of a rerun's time
    report = prep.store.reconcile() if prep.plan.todo else ReconcileReport()
    stats.extra.update(skipped=dict(prep.plan.skipped), superseded_documents=report.superseded_documents,
                       backend=cfg.model.backend, checkpoint=cfg.model.checkpoint, checkpoint_note=note,
                       precision=precision(prep, on_gpu=stats.gpus > 0))
    _write_stats(prep, stats)
    summary = stats.summary()
    echo(format_table(summary))
    return summary


def engine_restarts(ray, engines: int) -> int | None:
    """How many times an engine actor of this job was started again: the sum of `num_restarts` over the actors of
    this driver's job whose name is Ray Data's engine worker (`MapWorker(MapBatches(ParseStage))`), plus the actors
    beyond the pool's fixed size `engines` (Ray Data's replacements for actors Ray could not restart). Read from the
    GCS actor table, which every cluster has (Ray's state API needs the dashboard, which a local Ray here runs without).
    None when the table cannot be read (a Ray that moved it): the stats say unknown rather than 0."""
    try:
        from ray._private.state import state
        from ray.core.generated import gcs_pb2

        job = ray.JobID.from_hex(ray.get_runtime_context().get_job_id())
        rows = state._connect_and_get_accessor().get_actor_table(job, None)
        actors = [gcs_pb2.ActorTableData.FromString(r) for r in rows]
    except Exception as e:  # private API: a newer Ray may move it; the run's output does not depend on it
        log.warning("cannot read Ray's actor table for the engine restarts: %s", _first_line(e))
        return None
    ours = [a for a in actors if "ParseStage" in a.repr_name]
    return sum(a.num_restarts for a in ours) + max(0, len(ours) - engines)


def precision(prep: Prepared, on_gpu: bool) -> dict:
    """What the engine stores at which precision (weights, KV cache, GDN state), for the stats and the report: the
    lossy ones change the output, so a run's figures name them. dtype auto is the engine's (bf16 on GPU, else fp32)."""
    m = prep.cfg.model
    opts = m.options or {}
    dtype = m.dtype if m.dtype != "auto" else "bfloat16" if on_gpu else "float32"
    kv = opts.get("kv_cache_dtype", "auto")
    return dict(weights=weight_precision(prep.checkpoint_dir, dtype), kv_cache=dtype if kv == "auto" else kv,
                gdn_state=opts.get("gdn_state_dtype", "float32"))


def _stream_and_commit(ds, prep: Prepared, stats: RunStats, started: float, echo=print) -> None:
    """`started`: the perf_counter origin of the run's wall_s, which warmup_s and first_result_s share."""
    cfg, plan = prep.cfg, prep.plan
    assembler = DocumentAssembler()
    pending_pages, pending_docs = [], []

    def flush():
        if pending_docs:
            prep.store.commit(prep.run_id, pending_pages, pending_docs)
            pending_pages.clear()
            pending_docs.clear()

    def add_document(rows):
        if not stats.first_result_s:
            stats.first_result_s = time.perf_counter() - started
        doc = document_row(prep.run_id, rows, plan.todo[rows[0]["uri"]], cfg.raster.max_pages_per_doc)
        stats.add_document(doc, rows)
        pending_pages.extend(rows)
        pending_docs.append(doc)
        progress.document_done()
        if len(pending_docs) >= cfg.run.commit_every_docs:
            flush()

    progress = PageProgress(len(plan.todo), echo)
    try:
        blocks = pages_seen = 0
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):  # a block: one engine call's pages
            for row in batch.to_pylist():
                progress.row(row)
                pages_seen += row["page_index"] >= 0  # as the stats count pages: an error row is none
                done = assembler.add(row)
                if done:
                    add_document(done)
            blocks += 1
            if blocks == stats.engine_actors:  # every engine has returned a batch: start-up is over
                stats.warmup_s, stats.warmup_pages = time.perf_counter() - started, pages_seen
        for uri, got, expected in assembler.incomplete():  # never drop a document silently
            add_document([_incomplete_row(prep, uri, got, expected)])
    finally:
        try:
            flush()  # whole documents finished before a failure are kept; the rest is redone on the next run
        finally:
            progress.close()


def _incomplete_row(prep: Prepared, uri: str, got: int, expected: int) -> dict:
    return empty_row(PAGE_SCHEMA, run_id=prep.run_id, uri=uri, page_index=-1, page_count=0, total_pages=0,
                     status="error", error_kind="incomplete", error=f"only {got} of {expected} pages came back")


def _write_stats(prep: Prepared, stats: RunStats) -> None:
    loc = prep.store.loc
    write_parquet_atomic(loc.fs, loc.join("stats", f"{prep.run_id}.parquet"), stats.table())
    write_text(loc.fs, loc.join("runs", f"{prep.run_id}.json"), redact(stats.to_json()))  # it names the checkpoint

"""Job configuration: pydantic models loaded from YAML in configs/, overridden by CLI flags.

Every model forbids unknown keys, so a typo in a YAML file fails before Ray starts and names the key.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipeline.blocks import BLOCK_SCALES_RULE, valid_block_scales
from pipeline.redact import redact


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class StorageConfig(Strict):
    """How to reach object storage. Credentials never live here: they come from the environment or the standard
    AWS / Google chains."""

    s3_endpoint: str | None = Field(None, description="S3-compatible endpoint URL, e.g. http://127.0.0.1:9000")
    s3_region: str = "us-east-1"
    gcs_endpoint: str | None = Field(None, description="GCS-compatible endpoint URL, e.g. an emulator at "
                                     "http://127.0.0.1:9023; null = STORAGE_EMULATOR_HOST if set, else Google's")
    anonymous: bool = Field(False, description="send no credentials (public buckets); a GCS endpoint taken from "
                            "STORAGE_EMULATOR_HOST is always reached anonymously, as Google's own clients do")
    # Each object-store call is bounded by these, so a store that does not answer fails the call in seconds
    # (pipeline/storage.py) instead of retrying for the clients' defaults (15 minutes for GCS).
    connect_timeout_s: float = Field(5.0, gt=0, le=60, description="S3: seconds to open a connection")
    request_timeout_s: float = Field(10.0, gt=0, le=300, description="S3: seconds a request may go without "
                                     "receiving a byte before that try is abandoned (3 tries per request)")
    retry_time_limit_s: float = Field(10.0, ge=1, le=3600, description="GCS: seconds after which one call stops "
                                      "retrying errors that may pass (unreachable endpoint, 5xx, throttling); the "
                                      "backoff under way may take it to about twice that")

    @field_validator("s3_endpoint", "gcs_endpoint")
    @classmethod
    def _endpoint_without_credentials(cls, v: str | None) -> str | None:
        """An endpoint is a URL without userinfo: credentials in it would be printed wherever the endpoint is."""
        if v is None:
            return v
        if not v.strip():
            return None
        scheme, _, rest = v.partition("://") if "://" in v else ("http", "", v)
        if scheme not in ("http", "https"):
            raise ValueError(f"{redact(v)!r} is not an http:// or https:// URL (host:port alone means http)")
        if "@" in rest:  # anywhere: an unencoded '/' in a password would end the host part early
            host = rest.rsplit("@", 1)[1].split("/", 1)[0]
            raise ValueError(f"{scheme}://***@{host} carries credentials (user:password@): give the endpoint without "
                             f"them and the credentials through the environment (AWS_ACCESS_KEY_ID / "
                             f"AWS_SECRET_ACCESS_KEY for S3, GOOGLE_APPLICATION_CREDENTIALS for GCS)")
        return v


class InputConfig(Strict):
    uris: list[str] = Field(default_factory=list, description="s3://, gs://, file:// URIs or local paths (files or prefixes)")
    include: list[str] = Field(default_factory=lambda: ["*.pdf", "*.png", "*.jpg", "*.jpeg", "*.tif", "*.tiff"])
    exclude: list[str] = Field(default_factory=list)
    limit: int | None = Field(None, ge=1, description="process at most this many new documents (smoke runs)")


class RasterConfig(Strict):
    @model_validator(mode="before")
    @classmethod
    def _doc_timeout_is_per_page(cls, data):
        """doc_timeout_s, the old name, sets page_timeout_s: a long document is never failed for its length."""
        if isinstance(data, dict) and "doc_timeout_s" in data:
            data = dict(data)
            old = data.pop("doc_timeout_s")
            data.setdefault("page_timeout_s", old)
        return data

    target_longest_px: int | None = Field(
        None, ge=64, le=10000, description="longest page side in pixels; null = derived from the checkpoint's max_pixels"
    )
    max_pixels: int | None = Field(None, ge=64 * 64, description="pixel cap per page; null = the checkpoint's max_pixels")
    glyph_px: float | None = Field(
        None, ge=0, le=200, description="draw pages with a text layer so their body text's em is this many pixels "
        "(within max_pixels); 0 = off (every page at target_longest_px); null = the checkpoint's reading size "
        "(ocria_info.json glyph_px), else off"
    )
    glyph_from_ink: bool | None = Field(
        None, description="with a glyph size: draw pages without a text layer (scans) at it too, their body text's "
        "size measured from the height of their inked text lines (pipeline.blocks.line_height_px); null = the "
        "checkpoint's (ocria_info.json glyph_from_ink), else off"
    )
    max_pages_per_doc: int = Field(500, ge=1)
    page_timeout_s: float = Field(60.0, gt=0, description="seconds to open a document, and to draw each of its pages; "
                                  "a page past it is one error row (kind timeout), the renderer is killed and the "
                                  "document's next pages drawn")
    max_lost_pages: int = Field(2, ge=1, description="after this many of a document's pages timed out or crashed the "
                                "renderer, its remaining pages are not drawn (each one error row)")
    memory_limit_mb: int = Field(4096, ge=0, description="address-space cap of the render process; 0 = none")
    extract_text: bool = True
    num_actors_min: int = Field(1, ge=1)
    num_actors_max: int | None = Field(None, ge=1, description="null = sized from the cluster's free CPUs")
    cpus_per_actor: float = Field(1.0, gt=0, description="lowered automatically when the cluster has less to spare")


class ModelConfig(Strict):
    backend: Literal["native", "transformers"] = "native"
    checkpoint: str = Field("models/ocria-tiny", description="local folder or s3:// / gs:// prefix of an HF-format checkpoint")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    prompt: str = "Convert this page to markdown."
    max_tokens: int = Field(1024, ge=1)
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    seed: int | None = Field(None, description="null = each page's own seed, derived from its sha256 and index")
    num_beams: int = Field(1, ge=1, description="> 1: beam search of this width (needs temperature 0)")
    length_penalty: float = Field(1.0, description="beam search: finished beams are ranked by log p / length ** this")
    loop_stop_tokens: int = Field(0, ge=0, description="> 0 (>= 3): end a page's answer once it repeats one unit over "
                                  "this many tokens, keeping one copy (native backend, without beam search)")
    loop_drop_tokens: int = Field(0, ge=0, description="> 0 (>= 3): leave out of a page's answer the repeats of any "
                                  "loop over this many tokens, keeping one copy, and read on (native backend, without "
                                  "beam search; not with loop_stop_tokens)")
    loop_ban_next: bool = Field(False, description="with loop_drop_tokens: forbid the token that would go on with a "
                                "loop the drop found, so the model leaves it")
    block_lines: int | None = Field(None, ge=0, description="> 0: read each page in blocks of at most this many text "
                                    "lines (pipeline.blocks), alone or beside the whole page (model.block_tolerance); "
                                    "0 = off; null = the checkpoint's (ocria_info.json block_lines), else off")
    block_tolerance: float | None = Field(None, ge=0, description="with block_lines: 0 = blocks only (a page is read "
                                          "whole only where no blocks could be cut); > 0 = the page is read whole too "
                                          "and the blocks' read taken where the page read's plain text is longer or "
                                          "shorter than it by more than this share; null = the checkpoint's "
                                          "(ocria_info.json block_tolerance), else 0.1")
    block_scales: list[float] | None = Field(None, min_length=1, description="with block_lines: read each block at "
                                             "these sizes of the page as drawn (the first 1: the main read; the "
                                             "page is drawn at each of the others too) and keep the reads' "
                                             "character vote (pipeline.vote); a block whose reads agree word for "
                                             "word in a majority is read no further; null = the checkpoint's "
                                             "(ocria_info.json block_scales), else [1]")
    drafter: str | None = Field(None, description="speculative decoding (native backend): a DFlash drafter folder "
                                "made for this checkpoint (engine/models/dflash.py); null or 'none' = off")
    options: dict = Field(default_factory=dict, description="extra keyword arguments for the backend")

    @model_validator(mode="after")
    def _beams_are_greedy(self) -> "ModelConfig":
        if self.num_beams > 1 and self.temperature > 0:
            raise ValueError(f"model.num_beams={self.num_beams} needs model.temperature 0 (beam search does not "
                             f"sample); got temperature {self.temperature}")
        for name in ("loop_stop_tokens", "loop_drop_tokens"):
            n = getattr(self, name)
            if n and (n < 3 or self.backend != "native" or self.num_beams > 1):
                raise ValueError(f"model.{name}={n} must be 0 (off) or >= 3, with model.backend native and "
                                 f"model.num_beams 1 (got {self.backend}, {self.num_beams})")
        if self.loop_ban_next and not self.loop_drop_tokens:
            raise ValueError("model.loop_ban_next needs model.loop_drop_tokens > 0 (the drop finds the loops it bans)")
        if self.block_scales is not None and not valid_block_scales(self.block_scales):
            raise ValueError(f"model.block_scales={self.block_scales}: {BLOCK_SCALES_RULE}")
        if self.loop_stop_tokens and self.loop_drop_tokens:
            raise ValueError(f"model.loop_stop_tokens={self.loop_stop_tokens} and model.loop_drop_tokens="
                             f"{self.loop_drop_tokens}: set one of them (the stop ends the answer, the drop reads on)")
        return self


class ParseConfig(Strict):
    num_actors: int | None = Field(None, ge=1, description="null = one per GPU, or 1 on a CPU-only cluster")
    batch_size: int = Field(32, ge=1, description="pages per batch handed to one engine actor")
    cpus_per_actor: float = Field(1.0, gt=0)
    concurrent_batches: int = Field(2, ge=1, description="batches one engine actor works on at once (native backend; "
                                    "the transformers backend takes 1): the next batch's pages join the engine "
                                    "while the last one's finish, so the GPU does not drain between batches")
    fallback_to_text_layer: bool = True


class CostConfig(Strict):
    usd_per_gpu_hour: float = Field(2.69, ge=0, description="H100 on-demand price used by olmOCR's figures")
    usd_per_cpu_hour: float = Field(0.045, ge=0, description="what one CPU core costs an hour: a CPU-only run is "
                                    "priced by the CPUs its actors hold at this rate (about one vCPU of a cloud "
                                    "general-purpose instance on demand)")


class RunConfig(Strict):
    ray_address: str | None = Field(None, description="null = RAY_ADDRESS if set (ray job submit), else a local Ray")
    num_cpus: float | None = Field(None, gt=0, description="CPUs of the local Ray; null = all cores")
    retry_failed: bool = Field(False, description="process only documents whose last attempt failed")
    reparse: bool = Field(False, description="parse again the documents whose committed pages another model wrote")
    max_attempts: int = Field(3, ge=1, description="a failing document is retried on reruns up to this many attempts")
    commit_every_docs: int = Field(64, ge=1, description="documents per committed output part")
    allow_errors: bool = Field(False, description="exit 0 when documents failed (their rows still say why); off: "
                               "exit 3 when some failed, 4 when all did (docs/outcomes.md)")
    term_grace_s: float = Field(20.0, gt=0, le=3600, description="after SIGTERM, seconds to commit the finished "
                                "documents and stop Ray before the process ends regardless (status 143 either way)")
    cache_dir: str = "~/.cache/ocria/checkpoints"


class JobConfig(Strict):
    input: InputConfig = Field(default_factory=InputConfig)
    output: str = "out"
    storage: StorageConfig = Field(default_factory=StorageConfig)
    raster: RasterConfig = Field(default_factory=RasterConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    parse: ParseConfig = Field(default_factory=ParseConfig)
    cost: CostConfig = Field(default_factory=CostConfig)
    run: RunConfig = Field(default_factory=RunConfig)

    @field_validator("output")
    @classmethod
    def _output_not_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("output must be a URI or path")
        return v

    @model_validator(mode="after")
    def _inputs_given(self) -> "JobConfig":
        if not self.input.uris:
            raise ValueError("input.uris is empty: pass --input URI (repeatable) or set input.uris in the YAML")
        return self


class ConfigError(Exception):
    """A configuration problem, worded for the person running the job (credentials redacted: it quotes URIs and
    storage errors as given)."""

    def __init__(self, message: str):
        super().__init__(redact(message))


# The command line's flags (jobs/parse_corpus.py; the option's name, dashes as underscores) and the keys they set.
FLAG_KEYS = {
    "input": ("input", "uris"), "include": ("input", "include"), "exclude": ("input", "exclude"),
    "limit": ("input", "limit"), "output": ("output",), "s3_endpoint": ("storage", "s3_endpoint"),
    "s3_region": ("storage", "s3_region"), "gcs_endpoint": ("storage", "gcs_endpoint"),
    "backend": ("model", "backend"), "checkpoint": ("model", "checkpoint"),
    "drafter": ("model", "drafter"), "device": ("model", "device"), "dtype": ("model", "dtype"),
    "max_tokens": ("model", "max_tokens"), "prompt": ("model", "prompt"), "num_beams": ("model", "num_beams"),
    "loop_stop_tokens": ("model", "loop_stop_tokens"), "loop_drop_tokens": ("model", "loop_drop_tokens"),
    "loop_ban_next": ("model", "loop_ban_next"), "block_lines": ("model", "block_lines"),
    "block_tolerance": ("model", "block_tolerance"), "block_scales": ("model", "block_scales"),
    "max_pages": ("raster", "max_pages_per_doc"),
    "target_longest_px": ("raster", "target_longest_px"), "glyph_px": ("raster", "glyph_px"),
    "glyph_from_ink": ("raster", "glyph_from_ink"),
    "page_timeout": ("raster", "page_timeout_s"), "doc_timeout": ("raster", "page_timeout_s"),
    "batch_size": ("parse", "batch_size"), "num_engines": ("parse", "num_actors"),
    "retry_failed": ("run", "retry_failed"), "reparse": ("run", "reparse"), "max_attempts": ("run", "max_attempts"),
    "ray_address": ("run", "ray_address"), "num_cpus": ("run", "num_cpus"),
    "commit_every": ("run", "commit_every_docs"), "usd_per_gpu_hour": ("cost", "usd_per_gpu_hour"),
    "allow_errors": ("run", "allow_errors"), "usd_per_cpu_hour": ("cost", "usd_per_cpu_hour"),
}
_FLAG_OF_KEY = {".".join(path): "--" + name.replace("_", "-") for name, path in FLAG_KEYS.items()
                if name != "doc_timeout"}


def knob(key: str) -> str:
    """How a person changes config key `key`: its flag and the key ("--num-engines (parse.num_actors)"), or the key
    alone where no flag sets it."""
    flag = _FLAG_OF_KEY.get(key)
    return f"{flag} ({key})" if flag else key


def _nearest_key(loc: tuple) -> str:
    """' (did you mean model.max_tokens?)' for an unknown key at `loc`, or ''."""
    import difflib

    model: type[BaseModel] | None = JobConfig
    for part in loc[:-1]:
        field = model.model_fields.get(str(part)) if model else None
        model = field.annotation if field and isinstance(field.annotation, type) and issubclass(
            field.annotation, BaseModel) else None
    if model is None:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1, cutoff=0.6)
    return f" (did you mean {'.'.join([*map(str, loc[:-1]), close[0]])}?)" if close else ""


def _merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_config(path: str | Path | None, overrides: dict | None = None) -> JobConfig:
    """YAML file (optional) + nested overrides from CLI flags -> validated JobConfig, or ConfigError."""
    data: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {e}") from e
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: expected a mapping at the top level, got {type(data).__name__}")
    data = _merge(data, overrides or {})
    try:
        return JobConfig.model_validate(data)
    except ValidationError as e:
        where = f" in {path}" if path else ""
        lines = [f"invalid job configuration{where}:"]
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
            if err["type"] == "extra_forbidden" and err["loc"]:
                lines.append(f"  {loc}: unknown key{_nearest_key(err['loc'])}")
            else:
                lines.append(f"  {knob(loc)}: {err['msg']}")
        raise ConfigError("\n".join(lines)) from None

"""Pick a parse backend by name. Backends are imported only when asked for, so neither is needed to import this."""
from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import inspect

from engine.interface import ParseBackend

# name -> (module, class)
_BACKENDS = {
    "native": ("engine.native_backend", "NativeBackend"),
    "transformers": ("engine.backend_transformers", "TransformersBackend"),
}


# backends whose parse() may be called from several threads at once (calls share one engine)
_THREAD_SAFE = frozenset({"native"})


def concurrent_calls(name: str, wanted: int) -> int:
    """How many parse() calls an actor holding backend `name` may run at once: `wanted`, or 1 if it is not
    thread-safe."""
    return wanted if name in _THREAD_SAFE else 1


def available_backends() -> list[str]:
    """Names whose module is present (the transformers backend also needs transformers installed)."""
    names = []
    for name, (module, _) in sorted(_BACKENDS.items()):
        if importlib.util.find_spec(module) is None:
            continue
        if name == "transformers" and importlib.util.find_spec("transformers") is None:
            continue
        names.append(name)
    return names


def load_backend(
    name: str, checkpoint_dir: str, device: str = "cpu", dtype: str = "auto", **options
) -> ParseBackend:
    """Construct backend `name` on `checkpoint_dir`; `options` go to its constructor (e.g. max_batch_size)."""
    if name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r}: choose one of {sorted(_BACKENDS)}")
    module_name, class_name = _BACKENDS[name]
    if importlib.util.find_spec(module_name) is None:
        raise ValueError(f"backend {name!r} is not available: module {module_name} is missing from this install")
    if name == "transformers" and importlib.util.find_spec("transformers") is None:
        raise ValueError("backend 'transformers' needs the transformers package: pip install transformers==5.17.0")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(checkpoint_dir, device=device, dtype=dtype, **options)


def check_options(name: str, options: dict, drafter: str | None = None) -> None:
    """ValueError naming an option the native backend does not take (with the nearest one it does, or what replaced
    a removed one), or an engine option's value no engine can take (with `drafter`, the model.drafter the job will
    hand in as speculative.drafter), so that the mistake fails where the job starts, not in every engine's actor.
    Other backends are not checked."""
    if name != "native":
        return
    from engine.options import REMOVED_OPTIONS

    for key in options:
        if key in REMOVED_OPTIONS:
            raise ValueError(f"model.options.{key} was removed: {REMOVED_OPTIONS[key]}; delete the key")
    if isinstance(options.get("speculative"), dict) and "drafter" in options["speculative"]:
        # the job checks and localizes model.drafter before Ray starts; one given here would reach the engines as is
        raise ValueError("model.options.speculative.drafter: set model.drafter (--drafter) instead, the job checks "
                         "that folder before it starts")
    from engine.native_backend import NativeBackend
    from engine.options import EngineOptions

    params = inspect.signature(NativeBackend.__init__).parameters
    known = {p for p, v in params.items() if v.kind == v.KEYWORD_ONLY or v.kind == v.POSITIONAL_OR_KEYWORD}
    known = (known - {"self", "checkpoint_dir", "device", "dtype"}) | {"max_batch_size"}
    fields = {f.name for f in dataclasses.fields(EngineOptions)}
    known |= fields
    for key in options:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
            raise ValueError(f"model.options.{key} is not an option of the native backend"
                             + (f" (did you mean {close[0]}?)" if close else "")
                             + " (engine.options.EngineOptions lists the engine's)")
    try:
        given = {k: v for k, v in options.items() if k in fields}
        if drafter is not None:
            given["speculative"] = dict(given.get("speculative") or {}, drafter=drafter)
        EngineOptions(**given).check()
    except ValueError as e:
        raise ValueError(f"model.options.{e}") from None

"""Bad configs and checkpoints fail before Ray starts, with a message that says what to fix."""
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import RAY_PROBE, ROOT
from pipeline.config import ConfigError, load_config


def test_unknown_key_is_named(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("input: {uris: [x]}\nmodel: {max_token: 5}\n")
    with pytest.raises(ConfigError, match="model.max_token"):
        load_config(p)


def test_bad_value_and_missing_input(tmp_path):
    with pytest.raises(ConfigError, match="model.max_tokens"):
        load_config(None, {"input": {"uris": ["x"]}, "model": {"max_tokens": 0}})
    with pytest.raises(ConfigError, match="--input"):
        load_config(None, {})
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")


def test_beam_search_must_be_greedy():
    cfg = load_config(None, {"input": {"uris": ["x"]}, "model": {"num_beams": 4}})
    assert (cfg.model.num_beams, cfg.model.temperature) == (4, 0.0)
    with pytest.raises(ConfigError, match="num_beams=4 needs model.temperature 0"):
        load_config(None, {"input": {"uris": ["x"]}, "model": {"num_beams": 4, "temperature": 0.5}})


def test_loop_stop_needs_the_native_greedy_engine():
    cfg = load_config(None, {"input": {"uris": ["x"]}, "model": {"loop_stop_tokens": 48}})
    assert cfg.model.loop_stop_tokens == 48
    for bad in ({"loop_stop_tokens": 2}, {"loop_stop_tokens": 48, "backend": "transformers"},
                {"loop_stop_tokens": 48, "num_beams": 4}):
        with pytest.raises(ConfigError, match="model.loop_stop_tokens="):
            load_config(None, {"input": {"uris": ["x"]}, "model": bad})
    assert load_config(None, {"input": {"uris": ["x"]}, "model": {"loop_drop_tokens": 64}}).model.loop_drop_tokens == 64
    for bad in ({"loop_drop_tokens": 2}, {"loop_drop_tokens": 48, "backend": "transformers"},
                {"loop_drop_tokens": 48, "loop_stop_tokens": 48}):
        with pytest.raises(ConfigError, match="model.loop_(drop|stop)_tokens="):
            load_config(None, {"input": {"uris": ["x"]}, "model": bad})
    with pytest.raises(ConfigError, match="model.loop_ban_next needs model.loop_drop_tokens"):
        load_config(None, {"input": {"uris": ["x"]}, "model": {"loop_ban_next": True}})


def test_flags_override_yaml(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("input: {uris: [a]}\nmodel: {backend: transformers, max_tokens: 5}\nparse: {batch_size: 4}\n")
    cfg = load_config(p, {"model": {"max_tokens": 9}, "input": {"uris": ["b"]}})
    assert (cfg.model.backend, cfg.model.max_tokens, cfg.parse.batch_size, cfg.input.uris) == ("transformers", 9, 4, ["b"])


def run_cli(*args, timeout=60, env=None):
    """(the finished process, whether it imported Ray); the probe's line is taken out of proc.stderr."""
    proc = subprocess.run([sys.executable, "-c", RAY_PROBE, str(ROOT / "jobs/parse_corpus.py"), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=dict(os.environ, **(env or {})))
    assert "ray imported: " in proc.stderr, proc.stderr
    imported = "ray imported: True" in proc.stderr
    proc.stderr = re.sub(r"\n?ray imported: (True|False)\n$", "", proc.stderr)
    return proc, imported


@pytest.mark.parametrize("mutate,message", [
    (None, "checkpoint folder not found"),
    ("model_type", "model_type"),
    ("drop_tensor", "model.language_model"),
])
def test_bad_checkpoint_fails_before_ray(tmp_path, tiny_checkpoint, mutate, message):
    import shutil

    ckpt = tmp_path / "ckpt"
    if mutate:
        shutil.copytree(tiny_checkpoint, ckpt)
        if mutate == "model_type":
            cfg = json.loads((ckpt / "config.json").read_text())
            cfg["model_type"] = "llama"
            (ckpt / "config.json").write_text(json.dumps(cfg))
        else:  # a checkpoint missing one tensor
            from safetensors.torch import load_file, save_file
            weights = load_file(ckpt / "model.safetensors")
            weights.pop(next(k for k in weights if "layers.0.mlp.up_proj" in k))
            save_file(weights, ckpt / "model.safetensors", metadata={"format": "pt"})
    proc, ray_imported = run_cli("--input", str(ROOT / "samples"), "--output", str(tmp_path / "out"),
                                 "--checkpoint", str(ckpt))
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
    assert not ray_imported and "Started a local Ray" not in proc.stderr + proc.stdout
    assert not (tmp_path / "out" / "documents").exists()


def test_missing_input_fails_before_ray(tmp_path, tiny_checkpoint):
    proc, ray_imported = run_cli("--input", str(tmp_path / "nope"), "--output", str(tmp_path / "out"),
                                 "--checkpoint", str(tiny_checkpoint))
    assert proc.returncode != 0 and f"input not found: {tmp_path / 'nope'}" in proc.stderr and not ray_imported


def test_shipped_configs_are_valid():
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        if path.name.startswith(("train_", "runtime_env")):
            continue  # train_*: plain YAML for research/ocria_tiny/train_tiny.py; runtime_env: Ray's, tested below
        load_config(path, {"input": {"uris": ["x"]}})


def test_runtime_env_installs_what_pyproject_requires():
    """configs/runtime_env.yaml's pip list is pyproject.toml's dependencies but Ray (the cluster's own), and the
    preflight check knows a module for each of them."""
    import tomllib

    import yaml

    from pipeline.preflight import JOB_MODULES

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((ROOT / "configs" / "runtime_env.yaml").read_text())
    assert sorted(env["pip"]["packages"]) == sorted(d for d in deps if not d.startswith("ray"))
    names = {d.split("[")[0].split("=")[0].split(">")[0].split("<")[0] for d in deps}
    assert {r.split("[")[0] for r in JOB_MODULES.values()} == names - {"triton", "ray"}  # triton: torch's; ray: below


def test_a_python_without_the_job_packages_gets_one_line_naming_them():
    """As under `ray job submit` to a cluster started from another environment: the entry point runs where none of
    the job's packages can be imported (here: this Python without its site-packages) and says so in one line, with
    the runtime_env that provides them, exit status 2."""
    proc = subprocess.run([sys.executable, "-S", "-I", str(ROOT / "jobs" / "parse_corpus.py"), "--input", "x",
                           "--output", "y"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("Error: this Python") and "click, pydantic" in line
    assert "--runtime-env configs/runtime_env.yaml" in line and "Traceback" not in proc.stderr


@pytest.mark.parametrize("case", ["output-unwritable", "output-is-a-file", "too-many-engines", "cuda-without-gpu",
                                  "misspelled-key", "misspelled-engine-option", "bad-engine-option-value",
                                  "removed-engine-option", "internal-tuning-option"])
def test_every_listed_mistake_fails_before_ray_in_two_lines_naming_the_fix(tmp_path, tiny_checkpoint, case):
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "typo.yaml").write_text("input: {uris: [samples]}\nparse: {num_actor: 2}\n")
    (tmp_path / "option.yaml").write_text(
        "input: {uris: [samples]}\nmodel: {options: {speculative: {max_batchs: 8}}}\n")
    (tmp_path / "value.yaml").write_text("input: {uris: [samples]}\nmodel: {options: {speculative: {max_batch: 0}}}\n")
    (tmp_path / "removed.yaml").write_text("input: {uris: [samples]}\nmodel: {options: {spec_chunk_verify: true}}\n")
    (tmp_path / "tuning.yaml").write_text("input: {uris: [samples]}\nmodel: {options: {decode_gemv: false}}\n")
    args, says = {
        "output-unwritable": (["--output", "/proc/no-such/out"], r"--output '/proc/no-such/out' cannot be written"),
        "output-is-a-file": (["--output", str(tmp_path / "a-file")], r"is an existing file: give a folder"),
        "too-many-engines": (["--num-engines", "3", "--device", "cpu", "--num-cpus", "2"],
                             r"lower --num-engines \(parse.num_actors\) or raise --num-cpus"),
        "cuda-without-gpu": (["--device", "cuda"], r"--device \(model.device\) is cuda but Ray sees no GPUs: use --device cpu"),
        "misspelled-key": (["--config", str(tmp_path / "typo.yaml")],
                           r"parse.num_actor: unknown key \(did you mean parse.num_actors\?\)"),
        "misspelled-engine-option": (["--config", str(tmp_path / "option.yaml")],
                                     r"model.options.speculative.max_batchs is not a speculation option "
                                     r"\(did you mean max_batch\?\)"),
        "bad-engine-option-value": (["--config", str(tmp_path / "value.yaml")],
                                    r"model.options.speculative.max_batch=0: give an integer >= 1"),
        "removed-engine-option": (["--config", str(tmp_path / "removed.yaml")],
                                  r"model.options.spec_chunk_verify was removed: the GDN verify runs token by token"),
        "internal-tuning-option": (["--config", str(tmp_path / "tuning.yaml")],
                                   r"model.options.decode_gemv was removed: decode-path tuning is internal"),
    }[case]
    if "--output" not in args:
        args += ["--output", str(tmp_path / "out")]
    env_gpu = "cuda-without-gpu" == case
    proc, ray_imported = run_cli("--input", str(ROOT / "samples"), "--checkpoint", str(tiny_checkpoint), *args,
                                 env={"CUDA_VISIBLE_DEVICES": ""} if env_gpu else None)
    assert proc.returncode == 2 and not ray_imported  # the documented status of a run that could not start
    assert re.search(says, proc.stderr), proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "Started a local Ray" not in proc.stderr + proc.stdout
    assert not (tmp_path / "out" / "documents").exists()


def test_every_removed_engine_option_is_refused_in_one_line_saying_so():
    """A key of model.options that named a removed engine option fails with what became of it, not as a typo."""
    import dataclasses

    from engine.backends import check_options
    from engine.options import REMOVED_OPTIONS, EngineOptions

    fields = {f.name for f in dataclasses.fields(EngineOptions)}
    for key, why in REMOVED_OPTIONS.items():
        assert key not in fields
        with pytest.raises(ValueError) as e:
            check_options("native", {"max_num_seqs": 8, key: True})
        assert str(e.value) == f"model.options.{key} was removed: {why}; delete the key"
        assert "\n" not in why



def test_speculation_options_are_checked_as_one_mapping():
    """model.options.speculative: its keys checked with the nearest valid one; its drafter comes from model.drafter."""
    from engine.backends import check_options

    check_options("native", {"speculative": {"max_batch": 8, "num_speculative_tokens": 7}})
    for bad, says in (({"max_batchs": 8}, r"speculative.max_batchs is not a speculation option \(did you mean "
                                          r"max_batch\?\)"),
                      ({"num_speculative_tokens": 0}, r"speculative.num_speculative_tokens=0: give an integer >= 1"),
                      ({"drafter": "d"}, r"speculative.drafter: set model.drafter \(--drafter\) instead")):
        with pytest.raises(ValueError, match=r"^model.options." + says):
            check_options("native", {"speculative": bad})


def test_options_that_exclude_speculation_fail_with_a_drafter_before_ray():
    """configs/gpu.yaml keeps the GDN state in bf16, which the speculative verify cannot step: with --drafter the
    job's check says so where it starts, not in every engine actor."""
    from engine.backends import check_options

    check_options("native", {"gdn_state_dtype": "bfloat16"})
    check_options("native", {"gdn_state_dtype": "float32"}, drafter="models/ocria-tiny-drafter")
    with pytest.raises(ValueError, match=r"^model.options.gdn_state_dtype='bfloat16' with a drafter: .*float32"):
        check_options("native", {"gdn_state_dtype": "bfloat16"}, drafter="models/ocria-tiny-drafter")

def test_bad_drafter_fails_before_ray(tmp_path, tiny_checkpoint):
    """--drafter: a DFlash drafter whose config does not fit the checkpoint is refused before Ray starts, in a line
    naming the field and the way out."""
    from engine.testing import write_random_drafter

    drafter = write_random_drafter(tmp_path / "drafter", tiny_checkpoint)
    cfg = json.loads((drafter / "config.json").read_text())
    (drafter / "config.json").write_text(json.dumps(dict(cfg, hidden_size=cfg["hidden_size"] * 2)))
    proc, ray_imported = run_cli("--input", str(ROOT / "samples"), "--output", str(tmp_path / "out"),
                                 "--checkpoint", str(tiny_checkpoint), "--drafter", str(drafter))
    assert proc.returncode != 0 and not ray_imported
    assert "hidden_size" in proc.stderr and "--drafter none" in proc.stderr, proc.stderr
    assert "Started a local Ray" not in proc.stderr + proc.stdout


def test_every_config_key_is_documented():
    """docs/configuration.md names every key a config can hold, so a new key cannot ship undocumented."""
    from pydantic import BaseModel

    from pipeline.config import JobConfig

    def keys(model: type[BaseModel], prefix: str = ""):
        for name, field in model.model_fields.items():
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
                yield from keys(field.annotation, f"{prefix}{name}.")
            else:
                yield f"{prefix}{name}", name

    doc = (ROOT / "docs" / "configuration.md").read_text()
    missing = [full for full, leaf in keys(JobConfig)
               if f"`{full}`" not in doc and not re.search(rf"`{re.escape(full.rsplit('.', 1)[0])}\.[^`]*`[^|]*\b{leaf}\b", doc)]
    assert not missing, f"add to docs/configuration.md: {missing}"


def test_the_old_per_document_limit_is_read_as_the_per_page_limit():
    """raster.doc_timeout_s (and --doc-timeout) limited a whole document, which failed long documents for their
    length; the limit is per page now, and the old key sets it."""
    from pipeline.cli import overrides

    base = {"input": {"uris": ["x"]}}
    assert load_config(None, base).raster.page_timeout_s == 60
    assert load_config(None, base | {"raster": {"doc_timeout_s": 300}}).raster.page_timeout_s == 300
    both = {"raster": {"doc_timeout_s": 300, "page_timeout_s": 20}}
    assert load_config(None, base | both).raster.page_timeout_s == 20  # the new key wins
    assert load_config(None, base | overrides(doc_timeout=45.0)).raster.page_timeout_s == 45
    assert load_config(None, base | overrides(page_timeout=30.0)).raster.page_timeout_s == 30


def test_a_drafter_given_as_a_storage_uri_fails_before_ray(tmp_path, tiny_checkpoint):
    """The engines load the drafter from a local folder on every node: an object-storage URI is refused up front."""
    proc, ray_imported = run_cli("--input", str(ROOT / "samples"), "--output", str(tmp_path / "out"),
                                 "--checkpoint", str(tiny_checkpoint), "--drafter", "s3://bucket/drafter")
    assert proc.returncode != 0 and not ray_imported
    assert "local folder present on every node" in proc.stderr and "--drafter none" in proc.stderr, proc.stderr


def test_a_relative_output_inside_ray_job_submit_is_refused(tmp_path, monkeypatch):
    """Inside `ray job submit` the driver runs in Ray's copy of --working-dir, deleted with the job: a relative
    --output would land there. Refused in one line naming the way out; an absolute one (or outside a submitted job,
    a relative one) is used."""
    from pipeline.job import writable_output

    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, {"input": {"uris": ["x"]}, "output": "out"})
    assert writable_output(cfg).path == str(tmp_path / "out")  # a plain run: relative to where it was started
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"working_dir": "gcs://_ray_pkg"}}))
    for relative in ("out", "file://out"):
        with pytest.raises(ConfigError, match=rf"--output '{relative}' is relative, and inside `ray job submit`.*"
                                              r"give an absolute path on storage every node shares, or an s3://"):
            writable_output(load_config(None, {"input": {"uris": ["x"]}, "output": relative}))
    assert writable_output(load_config(None, {"input": {"uris": ["x"]}, "output": str(tmp_path / "abs")})).path == \
        str(tmp_path / "abs")

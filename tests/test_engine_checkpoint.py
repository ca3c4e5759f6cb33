"""Checkpoint inspection (headers only) and loading: fused projections, shards, tied heads, clear errors."""
import kernels.testing  # noqa: F401  (sets TRITON_INTERPRET before any kernel module is compiled)
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.checkpoint import CheckpointError, inspect_checkpoint, weight_sample
from engine.config import ConfigError
from engine.interface import SamplingParams
from engine.llm_engine import Engine
from engine.testing import build_checkpoint


@pytest.fixture(scope="module")
def vl(tmp_path_factory, tiny_tokenizer):
    return build_checkpoint(tmp_path_factory.mktemp("vl"), tokenizer=tiny_tokenizer, seed=3)


def copy_with(src, dst, edit=None, config_edit=None):
    """Copy a single-file checkpoint, letting `edit` change the tensor dict and `config_edit` the config dict."""
    shutil.copytree(src, dst)
    if edit is not None:
        tensors = load_file(dst / "model.safetensors")
        edit(tensors)
        save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    if config_edit is not None:
        cfg = json.loads((dst / "config.json").read_text())
        config_edit(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_inspect_checks_headers_and_ids_the_weights(vl, tmp_path):
    info = inspect_checkpoint(vl)
    assert info.config.model_type == "qwen3_5" and not info.text_only
    assert "model.visual.merger.linear_fc2.weight" in info.tensors and "lm_head.weight" in info.tensors
    assert info.model_id.startswith(vl.name + "-")
    # Other weights with the same header (another training of the architecture): inspection passes, as it checks
    # headers, but the model id differs, as it samples the data; the same bytes give the same id.

    def digest(path):  # the id's name part is the folder's
        return inspect_checkpoint(path).model_id.split("-")[-1]

    assert digest(copy_with(vl, tmp_path / "same")) == digest(vl)
    bad = copy_with(vl, tmp_path / "retrained")
    f = bad / "model.safetensors"
    raw = bytearray(f.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    raw[8 + n:] = b"\xff" * (len(raw) - 8 - n)
    f.write_bytes(bytes(raw))
    assert digest(bad) != digest(vl)


def test_weight_sample_reads_spread_windows_of_large_files(tmp_path):
    f = tmp_path / "w.bin"
    data = bytes(range(256)) * 1000 + b"tail"  # 256,004 bytes after a 10-byte "header"
    f.write_bytes(b"h" * 10 + data)
    sample = weight_sample(f, 10, windows=5, width=100)
    assert len(sample) == 500 and sample[:100] == data[:100] and sample[-100:] == data[-100:]
    assert weight_sample(f, 10, windows=5, width=60_000) == data  # smaller than the windows: all of it


@pytest.mark.parametrize("case, match", [
    ("missing", "missing tensor.*layers.3.self_attn.k_norm.weight"),
    ("extra", "unexpected tensor.*model.language_model.layers.0.bogus.weight"),
    ("shape", r"tensor model.language_model.layers.1.linear_attn.in_proj_z.weight: shape \[63, 64\]"),
])
def test_malformed_checkpoint_names_the_tensor(vl, tmp_path, case, match):
    def edit(t):
        if case == "missing":
            del t["model.language_model.layers.3.self_attn.k_norm.weight"]
        elif case == "extra":
            t["model.language_model.layers.0.bogus.weight"] = torch.zeros(2)
        else:
            t["model.language_model.layers.1.linear_attn.in_proj_z.weight"] = torch.zeros(63, 64)

    bad = copy_with(vl, tmp_path / case, edit)
    with pytest.raises(CheckpointError, match=match):
        inspect_checkpoint(bad)
    with pytest.raises(CheckpointError, match=match):
        Engine.from_checkpoint(bad)


def test_unsupported_model_type_and_truncated_file(vl, tmp_path):
    bad = copy_with(vl, tmp_path / "mt", config_edit=lambda c: c.update(model_type="qwen2_vl"))
    with pytest.raises(ConfigError, match="model_type='qwen2_vl' unsupported"):
        inspect_checkpoint(bad)
    trunc = copy_with(vl, tmp_path / "trunc")
    f = trunc / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match="extends past the end of the file"):
        inspect_checkpoint(trunc)


def test_mtp_ignored_and_tied_head_may_be_stored(tmp_path, tiny_tokenizer):
    tied = build_checkpoint(tmp_path / "tied", tie=True, tokenizer=tiny_tokenizer, seed=4)
    assert "lm_head.weight" not in load_file(tied / "model.safetensors")

    def add(t):
        t["mtp.fc.weight"] = torch.zeros(64, 128)
        t["lm_head.weight"] = t["model.language_model.embed_tokens.weight"].clone()

    extra = copy_with(tied, tmp_path / "extra", add)
    outs = []
    for path in (tied, extra):
        eng = Engine.from_checkpoint(path, num_blocks=16)
        assert eng.cfg.text.tie_word_embeddings
        outs.append(eng.generate([dict(prompt_token_ids=[5, 6, 7, 8], sampling=SamplingParams(max_tokens=8))]))
    assert outs[0][0].output_token_ids == outs[1][0].output_token_ids


def test_sharded_checkpoint_loads_identically(tmp_path, tiny_tokenizer):
    one = build_checkpoint(tmp_path / "one", tokenizer=tiny_tokenizer, seed=5)
    many = build_checkpoint(tmp_path / "many", tokenizer=tiny_tokenizer, seed=5, max_shard_size="100KB")
    assert len(list(many.glob("*.safetensors"))) > 3
    info = inspect_checkpoint(many)
    assert len(info.files) > 3
    req = [dict(prompt_token_ids=list(range(3, 40)), sampling=SamplingParams(max_tokens=10))]
    a = Engine.from_checkpoint(one, num_blocks=16).generate(req)[0].output_token_ids
    b = Engine.from_checkpoint(many, num_blocks=16).generate(req)[0].output_token_ids
    assert a == b


def test_text_only_load_of_vl_checkpoint(vl):
    eng = Engine.from_checkpoint(vl, text_only=True, num_blocks=16)
    assert eng.model.visual is None
    full = Engine.from_checkpoint(vl, num_blocks=16)
    req = [dict(prompt_token_ids=list(range(10, 30)), sampling=SamplingParams(max_tokens=6))]
    assert eng.generate(req)[0].output_token_ids == full.generate(req)[0].output_token_ids

"""research/ocria_tiny/grow_tiny.py: a checkpoint grown by identity layers computes exactly what the original did (transformers'
model, real HF-format files), keeps the 3:1 layer pattern and carries the run's files along."""
import json

import pytest
import torch

from engine.testing import build_checkpoint
from research.ocria_tiny import grow_tiny


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = build_checkpoint(tmp_path_factory.mktemp("ckpt"), seed=5)
    (path / "train_state.json").write_text(json.dumps({"step": 7, "pages": 448}))
    return path


def test_grown_model_computes_the_same_logits(ckpt, tmp_path):
    from transformers import Qwen3_5ForConditionalGeneration

    out = tmp_path / "grown"
    assert grow_tiny.main(["--from", str(ckpt), "--out", str(out), "--blocks", "1"]) == 0
    old = Qwen3_5ForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()
    new = Qwen3_5ForConditionalGeneration.from_pretrained(out, dtype=torch.float32).eval()
    n_old = old.config.text_config.num_hidden_layers
    assert new.config.text_config.num_hidden_layers == n_old + 4
    assert new.config.text_config.layer_types[n_old:] == list(grow_tiny.PATTERN)
    ids = torch.randint(5, 300, (2, 37), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(new(input_ids=ids).logits, old(input_ids=ids).logits, atol=0, rtol=0)
    # the new layers are trainable copies, not dead weights: only their output projections start at zero
    layer = new.model.language_model.layers[n_old]
    assert not layer.linear_attn.out_proj.weight.any() and not layer.mlp.down_proj.weight.any()
    assert layer.linear_attn.in_proj_qkv.weight.abs().sum() > 0
    assert json.loads((out / "train_state.json").read_text()) == {"step": 7, "pages": 448}
    assert (out / "tokenizer.json").exists()
    # our engine loads it too and decodes the same tokens
    from engine.interface import SamplingParams
    from engine.llm_engine import Engine

    req = [dict(prompt_token_ids=list(range(5, 40)), sampling=SamplingParams(max_tokens=6), ignore_eos=True)]
    outs = [Engine.from_checkpoint(p, dtype="float32", max_num_seqs=2, num_blocks=16, block_size=16).generate(req)
            for p in (ckpt, out)]
    assert outs[0][0].output_token_ids == outs[1][0].output_token_ids


def test_grow_errors():
    w = {"model.language_model.layers.0.mlp.down_proj.weight": torch.ones(2, 2)}
    with pytest.raises(ValueError, match="no \\['full_attention'\\] layer"):
        grow_tiny.grow(w, ["linear_attention"], 1)
    with pytest.raises(ValueError, match="blocks must be"):
        grow_tiny.grow(w, ["linear_attention"], 0)
    with pytest.raises(ValueError, match="no decoder layers"):
        grow_tiny.grow({"lm_head.weight": torch.ones(1)}, ["linear_attention"], 1)

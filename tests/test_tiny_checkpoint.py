"""The tiny random checkpoint: real HF format, loads and generates with transformers, builds deterministically."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from tokenizers import Tokenizer

from engine import hf_format
from engine.testing import build_tiny_checkpoint


SPECIALS = [name for name, _ in hf_format.SPECIAL_TOKENS]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("a") / "tiny-random", seed=0)


def _digests(folder: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir())}


def test_files_and_ids(ckpt):
    names = {f.name for f in ckpt.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "preprocessor_config.json",
        "ocria_info.json",
    } <= names
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    assert tok.get_vocab_size(with_added_tokens=True) == 1024
    # specials follow the learned vocab, in the Qwen order
    assert [tok.token_to_id(s) for s in SPECIALS] == list(range(1014, 1024))
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_5"
    assert cfg["text_config"]["vocab_size"] == 1024
    assert cfg["image_token_id"] == tok.token_to_id("<|image_pad|>")
    assert cfg["video_token_id"] == tok.token_to_id("<|video_pad|>")
    assert cfg["vision_start_token_id"] == tok.token_to_id("<|vision_start|>")
    assert cfg["vision_end_token_id"] == tok.token_to_id("<|vision_end|>")
    assert cfg["text_config"]["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    gen = json.loads((ckpt / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    assert json.loads((ckpt / "ocria_info.json").read_text())["random_weights"] is True


def test_weights_random_and_tied(ckpt):
    from safetensors.torch import load_file

    sd = load_file(str(ckpt / "model.safetensors"))
    assert "lm_head.weight" not in sd  # tied, like Qwen3.5-4B
    assert all(t.dtype == torch.bfloat16 for t in sd.values())
    for name, t in sd.items():
        assert t.float().std() > 0.01, f"{name} is (nearly) constant"
    # the (1 + w) norms are not left at their zero default
    assert sd["model.language_model.norm.weight"].float().abs().mean() > 0.02
    assert sd["model.language_model.layers.0.linear_attn.norm.weight"].float().mean().sub(1).abs() < 0.1


def test_tokenizer_roundtrip_and_template(ckpt):
    tk = transformers.AutoTokenizer.from_pretrained(ckpt)
    raw = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    text = "Table 3: ünïcode ½ 12345\n\n| a | b |\n"
    ids = tk(text)["input_ids"]
    assert ids == raw.encode(text).ids
    assert tk.decode(ids) == text
    assert tk.eos_token_id == raw.token_to_id("<|im_end|>")
    assert tk.pad_token_id == raw.token_to_id("<|endoftext|>")
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Convert this page to markdown."}]}]
    prompt = tk.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert prompt == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Convert this page to markdown.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    thinking = tk.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, enable_thinking=True)
    assert thinking == prompt + "<think>\n"
    # special tokens are single ids; <think> survives skip_special_tokens like in the Qwen releases
    assert tk(prompt)["input_ids"].count(raw.token_to_id("<|image_pad|>")) == 1
    think_ids = tk("<think>x</think>")["input_ids"]
    assert tk.decode(think_ids, skip_special_tokens=True) == "<think>x</think>"


def _page(h: int, w: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    page = np.full((h, w, 3), 255, np.uint8)
    for y in range(8, h - 8, 12):  # dark "text lines" of random length
        page[y : y + 5, 10 : 10 + int(rng.integers(w // 4, w - 20))] = rng.integers(0, 80, 3)
    return page


@pytest.mark.slow
def test_generate_with_transformers(ckpt):
    from transformers.models.auto.image_processing_auto import AutoImageProcessor

    tk = transformers.AutoTokenizer.from_pretrained(ckpt)
    ip = AutoImageProcessor.from_pretrained(ckpt, backend="pil")
    model = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()
    assert model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()

    page = _page(330, 250, seed=1)
    vis = ip(images=[page], return_tensors="pt")
    t, h, w = vis["image_grid_thw"][0].tolist()
    assert (t, h % 2, w % 2) == (1, 0, 0) and 64 * 64 <= h * w * 256 <= 256 * 256
    assert vis["pixel_values"].shape == (h * w, 3 * 2 * 16 * 16)
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Convert this page to markdown."}]}]
    prompt = tk.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    prompt = prompt.replace("<|image_pad|>", "<|image_pad|>" * (h * w // 4))
    enc = tk([prompt], return_tensors="pt")
    mm = (enc["input_ids"] == model.config.image_token_id).to(torch.int32)
    with torch.no_grad():
        out = model.generate(**enc, **vis, mm_token_type_ids=mm, max_new_tokens=8, do_sample=False)
        out2 = model.generate(**enc, **vis, mm_token_type_ids=mm, max_new_tokens=8, do_sample=False)
    new = out[0, enc["input_ids"].shape[1] :].tolist()
    assert len(new) >= 1 and out.tolist() == out2.tolist()
    assert len(set(new)) > 1 or new[0] in model.generation_config.eos_token_id  # random weights: not a constant stream
    # the image and the prompt both influence the logits
    with torch.no_grad():
        logits = model(**enc, **vis, mm_token_type_ids=mm).logits[0, -1]
        vis2 = ip(images=[_page(330, 250, seed=2)], return_tensors="pt")
        logits2 = model(**enc, **vis2, mm_token_type_ids=mm).logits[0, -1]
        enc3 = tk([prompt.replace("page", "table")], return_tensors="pt")
        mm3 = (enc3["input_ids"] == model.config.image_token_id).to(torch.int32)
        logits3 = model(**enc3, **vis, mm_token_type_ids=mm3).logits[0, -1]
    assert not torch.allclose(logits, logits2)
    assert not torch.allclose(logits, logits3)
    assert logits.std() > 1.0  # well-scaled init: peaked, not flat
    assert model.generation_config.eos_token_id == [tk.eos_token_id, tk.pad_token_id]


def test_build_is_deterministic(ckpt, tmp_path):
    again = build_tiny_checkpoint(tmp_path / "tiny-random", seed=0)
    assert _digests(again) == _digests(ckpt)
    other = build_tiny_checkpoint(tmp_path / "seed1" / "tiny-random", seed=1)
    d0, d1 = _digests(ckpt), _digests(other)
    assert d1["model.safetensors"] != d0["model.safetensors"]
    assert d1["tokenizer.json"] == d0["tokenizer.json"]  # the tokenizer does not depend on the seed


def test_tokenizer_errors():
    with pytest.raises(ValueError, match="too small"):
        hf_format.train_tokenizer(["abc"], 100)
    with pytest.raises(ValueError, match="give more text"):
        hf_format.train_tokenizer(["a tiny text"], 2000)
    with pytest.raises(ValueError, match="min_pixels"):
        hf_format.write_preprocessor_config("/nonexistent-never-written", min_pixels=10, max_pixels=100)

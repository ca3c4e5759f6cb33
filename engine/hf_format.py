"""Writers for the non-weight files of a Qwen3.5 VL (HF `qwen3_5`) checkpoint folder.

Tokenizer, tokenizer/processor configs, chat template, image preprocessor config and generation config,
written as plain JSON so that transformers' AutoTokenizer and its PIL image processor load the folder (and
`AutoProcessor` a Qwen3VLProcessor where torchvision is installed, which transformers 5.17 needs for it), and our
own engine can read the same files without transformers.
All outputs are deterministic functions of the arguments (sorted keys, fixed formatting).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

# Qwen3.5's pre-tokenizer split (single digits, letters with marks, punctuation runs, newline runs).
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Appended after the learned vocab, in this order. `special=False` tokens (the thinking tags) stay in decoded text,
# as in the Qwen3.5 releases.
SPECIAL_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<think>", False),
    ("</think>", False),
)

# Chat template. An image item renders as <|vision_start|><|image_pad|><|vision_end|>, text items verbatim, in list order.
# Thinking: OFF unless the caller passes enable_thinking=True. With it off, the generation prompt ends with a bare
# "<|im_start|>assistant\n" (no <think> tags at all) - our page-parsing prompts never think. With it on, "<think>\n" follows.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' or 'image' in item or 'image_url' in item -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif item['type'] == 'video' or 'video' in item -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif item['type'] == 'text' -%}"
    "{{- item['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking -%}"
    "{{- '<think>\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)


@dataclass(frozen=True)
class SpecialTokenIds:
    endoftext: int
    im_start: int
    im_end: int
    vision_start: int
    vision_end: int
    vision_pad: int
    image_pad: int
    video_pad: int
    think: int
    think_end: int

    @property
    def eos_ids(self) -> list[int]:
        """Generation stops on either: <|im_end|> closes the assistant turn, <|endoftext|> ends the document."""
        return [self.im_end, self.endoftext]


def _empty_qwen_tokenizer() -> Tokenizer:
    # Same normalizer / pre-tokenizer / decoder as transformers' Qwen3_5Tokenizer, so it rebuilds us identically.
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE trained on `texts`, `vocab_size` tokens in total: the learned vocab (256 bytes + merges)
    fills ids [0, vocab_size - 10), the Qwen special tokens take the last 10 ids.

    Deterministic: same texts and size -> same tokenizer.json bytes.
    """
    n_special = len(SPECIAL_TOKENS)
    n_learned = vocab_size - n_special
    n_bytes = len(pre_tokenizers.ByteLevel.alphabet())
    if n_learned < n_bytes:
        raise ValueError(f"vocab_size={vocab_size} is too small: need >= {n_bytes + n_special} (256 bytes + {n_special} specials)")
    if not texts or not any(texts):
        raise ValueError("texts is empty: give the tokenizer trainer some text")
    tok = _empty_qwen_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=n_learned,
        min_frequency=2,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    learned = tok.get_vocab_size(with_added_tokens=False)
    if learned != n_learned:
        raise ValueError(
            f"the texts yield only {learned} BPE tokens, {n_learned} asked (vocab_size={vocab_size}): "
            "give more text or a smaller vocab_size"
        )
    tok.add_tokens(
        [AddedToken(t, special=special, normalized=False, single_word=False, lstrip=False, rstrip=False)
         for t, special in SPECIAL_TOKENS]
    )
    return tok


def special_token_ids(tok: Tokenizer) -> SpecialTokenIds:
    ids = []
    for name, _ in SPECIAL_TOKENS:
        i = tok.token_to_id(name)
        if i is None:
            raise ValueError(f"tokenizer lacks special token {name!r}")
        ids.append(i)
    return SpecialTokenIds(*ids)


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def write_tokenizer_files(out_dir: str | Path, tok: Tokenizer, model_max_length: int = 32768) -> SpecialTokenIds:
    """tokenizer.json, tokenizer_config.json, chat_template.jinja. Returns the special token ids."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ids = special_token_ids(tok)
    # Tokenizer.to_str is canonical for a given tokenizer; re-dump with sorted keys for stable bytes.
    _write_json(out / "tokenizer.json", json.loads(tok.to_str()))
    added = {
        str(tok.token_to_id(name)): {
            "content": name,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for name, special in SPECIAL_TOKENS
    }
    _write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "Qwen3_5Tokenizer",
            "processor_class": "Qwen3VLProcessor",
            "added_tokens_decoder": added,
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "errors": "replace",
            "split_special_tokens": False,
            "model_max_length": model_max_length,
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
            "vision_start_token": "<|vision_start|>",
            "vision_end_token": "<|vision_end|>",
            "extra_special_tokens": {
                "image_token": "<|image_pad|>",
                "video_token": "<|video_pad|>",
                "vision_start_token": "<|vision_start|>",
                "vision_end_token": "<|vision_end|>",
            },
        },
    )
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    return ids


def write_preprocessor_config(
    out_dir: str | Path,
    min_pixels: int,
    max_pixels: int,
    patch_size: int = 16,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
    image_mean: float = 0.5,
    image_std: float = 0.5,
) -> None:
    """preprocessor_config.json (images) and video_preprocessor_config.json for Qwen2VLImageProcessor/Qwen3VL.

    Images are resized (bicubic) so both sides are multiples of patch_size*merge_size and the pixel count lies in
    [min_pixels, max_pixels], then normalised per channel as (x/255 - image_mean) / image_std (Qwen's 0.5/0.5 maps
    to [-1, 1]; ocria-tiny's 1.0 maps white paper to 0).
    """
    factor = patch_size * merge_size
    if min_pixels < factor * factor or max_pixels < min_pixels:
        raise ValueError(
            f"need {factor * factor} <= min_pixels <= max_pixels, got min_pixels={min_pixels} max_pixels={max_pixels}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    common = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [float(image_mean)] * 3,
        "image_std": [float(image_std)] * 3,
        "merge_size": merge_size,
        "patch_size": patch_size,
        "temporal_patch_size": temporal_patch_size,
        "processor_class": "Qwen3VLProcessor",
        "resample": 3,  # PIL bicubic
        "rescale_factor": 1 / 255,
    }
    _write_json(
        out / "preprocessor_config.json",
        {
            **common,
            "image_processor_type": "Qwen2VLImageProcessor",
            "size": {"shortest_edge": min_pixels, "longest_edge": max_pixels},
        },
    )
    _write_json(
        out / "video_preprocessor_config.json",
        {
            **common,
            "video_processor_type": "Qwen3VLVideoProcessor",
            "size": {"shortest_edge": min_pixels, "longest_edge": max_pixels},
            "fps": 2,
            "min_frames": 4,
            "max_frames": 768,
            "do_sample_frames": True,
        },
    )


def write_generation_config(out_dir: str | Path, ids: SpecialTokenIds) -> None:
    """generation_config.json: greedy by default, stop on <|im_end|> or <|endoftext|>, pad with <|endoftext|>."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_json(
        out / "generation_config.json",
        {"bos_token_id": None, "eos_token_id": ids.eos_ids, "pad_token_id": ids.endoftext, "do_sample": False},
    )


def write_processor_files(
    out_dir: str | Path,
    tok: Tokenizer,
    min_pixels: int,
    max_pixels: int,
    patch_size: int = 16,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
    image_mean: float = 0.5,
    image_std: float = 0.5,
) -> SpecialTokenIds:
    """Everything but config.json and the weights."""
    ids = write_tokenizer_files(out_dir, tok)
    write_preprocessor_config(out_dir, min_pixels, max_pixels, patch_size, merge_size, temporal_patch_size,
                              image_mean, image_std)
    write_generation_config(out_dir, ids)
    return ids


def qwen3_5_config(text: dict, vision: dict, ids: SpecialTokenIds, tie_word_embeddings: bool = True):
    """transformers' Qwen3_5Config with its special-token fields taken from the tokenizer (imported lazily: the
    engine itself runs without transformers)."""
    from transformers import Qwen3_5Config

    return Qwen3_5Config(text_config=text, vision_config=vision, image_token_id=ids.image_pad,
                         video_token_id=ids.video_pad, vision_start_token_id=ids.vision_start,
                         vision_end_token_id=ids.vision_end, eos_token_id=ids.im_end, pad_token_id=ids.endoftext,
                         tie_word_embeddings=tie_word_embeddings)

"""Page image + prompt -> token ids and pixel patches, from the checkpoint's own files.

Matches transformers' Qwen2-VL image processor (PIL bicubic resize to multiples of patch*merge within
[min_pixels, max_pixels], rescale, normalize, merge-block patch order) and the checkpoint's chat template.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from engine.config import ModelConfig


class ProcessorError(ValueError):
    pass


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Closest size with both sides multiples of `factor`, area within [min_pixels, max_pixels], aspect kept."""
    if min(height, width) <= 0:
        raise ProcessorError(f"image has an empty side: {height}x{width}")
    if max(height, width) / min(height, width) > 200:
        raise ProcessorError(f"image aspect ratio {max(height, width) / min(height, width):.1f} exceeds 200")
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        scale = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / scale / factor) * factor)
        w = max(factor, math.floor(width / scale / factor) * factor)
    elif h * w < min_pixels:
        scale = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * scale / factor) * factor
        w = math.ceil(width * scale / factor) * factor
    return h, w


@dataclass(frozen=True)
class ImageProcessor:
    min_pixels: int
    max_pixels: int
    patch_size: int = 16
    merge_size: int = 2
    temporal_patch_size: int = 2
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    resample: int = 3  # PIL bicubic

    @classmethod
    def from_file(cls, path: Path) -> "ImageProcessor":
        d = json.loads(path.read_text())
        size = d.get("size") or {}
        min_px = d.get("min_pixels") or size.get("shortest_edge") or size.get("min_pixels")
        max_px = d.get("max_pixels") or size.get("longest_edge") or size.get("max_pixels")
        if not min_px or not max_px:
            raise ProcessorError(f"{path}: needs min/max pixels (size.shortest_edge / size.longest_edge)")
        return cls(min_pixels=int(min_px), max_pixels=int(max_px), patch_size=int(d.get("patch_size", 16)),
                   merge_size=int(d.get("merge_size", 2)), temporal_patch_size=int(d.get("temporal_patch_size", 2)),
                   image_mean=tuple(d.get("image_mean", (0.5,) * 3)), image_std=tuple(d.get("image_std", (0.5,) * 3)),
                   rescale_factor=float(d.get("rescale_factor", 1 / 255)), resample=int(d.get("resample", 3)))

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        return smart_resize(height, width, self.patch_size * self.merge_size, self.min_pixels, self.max_pixels)

    def merge_order_patches(self, image) -> tuple[np.ndarray, tuple[int, int, int]]:
        """RGB image (H x W x 3 uint8 array or PIL image) -> (uint8 patches [N, C*p*p] in merge-block order, grid
        (1, h/p, w/p)): the resized page before rescale, normalize and the temporal repeat, 1/(4T) of the bytes of
        the float patches. `expand_patches` (on the device) or `__call__` finishes them."""
        if isinstance(image, np.ndarray):
            if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
                raise ProcessorError(f"image must be H x W x 3 uint8 RGB, got {image.dtype} {image.shape}")
            pil = Image.fromarray(image)
        elif isinstance(image, Image.Image):
            pil = image.convert("RGB")
        else:
            raise ProcessorError(f"image must be a numpy array or PIL image, got {type(image).__name__}")
        h, w = self.resized_size(pil.height, pil.width)
        arr = np.asarray(pil.resize((w, h), resample=self.resample), dtype=np.uint8)  # [h, w, C]
        p, m = self.patch_size, self.merge_size
        gh, gw = h // p, w // p
        # [gh/m, m, p, gw/m, m, p, C] -> [gh/m, gw/m, m, m, C, p, p]
        x = arr.reshape(gh // m, m, p, gw // m, m, p, 3).transpose(0, 3, 1, 4, 6, 2, 5)
        return np.ascontiguousarray(x).reshape(gh * gw, 3 * p * p), (1, gh, gw)

    def __call__(self, image) -> tuple[np.ndarray, tuple[int, int, int]]:
        """RGB image -> (patches [N, C*T*p*p] fp32, grid (1, h/p, w/p)), as transformers' processor makes them."""
        raw, grid = self.merge_order_patches(image)
        n, T = raw.shape[0], self.temporal_patch_size
        x = (raw.reshape(n, 3, -1).astype(np.float64) * self.rescale_factor).astype(np.float32)
        x = (x - np.asarray(self.image_mean, np.float32)[:, None]) / np.asarray(self.image_std, np.float32)[:, None]
        x = np.broadcast_to(x[:, :, None], (n, 3, T, x.shape[-1]))  # a still image repeats over T frames
        return np.ascontiguousarray(x).reshape(n, -1), grid

    def expand_patches(self, raw: torch.Tensor) -> torch.Tensor:
        """uint8 patches of `merge_order_patches` (a torch tensor, any device) -> the float32 patches `__call__`
        gives, bit for bit, on that device: the host ships 1 byte per pixel instead of 4T."""
        n, T = raw.shape[0], self.temporal_patch_size
        x = (raw.reshape(n, 3, -1).double() * self.rescale_factor).float()
        mean = torch.tensor(self.image_mean, dtype=torch.float32, device=raw.device)[:, None]
        std = torch.tensor(self.image_std, dtype=torch.float32, device=raw.device)[:, None]
        x = (x - mean) / std
        return x[:, :, None].expand(n, 3, T, x.shape[-1]).reshape(n, -1)


def _load_chat_template(root: Path) -> str | None:
    if (root / "chat_template.jinja").is_file():
        return (root / "chat_template.jinja").read_text()
    for name in ("chat_template.json", "processor_config.json", "tokenizer_config.json"):
        f = root / name
        if f.is_file():
            t = json.loads(f.read_text()).get("chat_template")
            if isinstance(t, str):
                return t
    return None


def _compile_template(template: str):
    """A chat template compiled in a sandbox with the helpers HF templates use (raise_exception, tojson)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise ProcessorError(f"chat template: {msg}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, indent=indent, ensure_ascii=False)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template)
    except jinja2.TemplateError as e:
        raise ProcessorError(f"chat template does not compile: {e}") from e


class Processor:
    """Tokenizer + chat template + image processor of one checkpoint folder."""

    def __init__(self, checkpoint_dir: str | Path, cfg: ModelConfig, chat_template_kwargs: dict | None = None):
        from tokenizers import Tokenizer

        root = Path(checkpoint_dir)
        self.cfg = cfg
        tok_file = root / "tokenizer.json"
        if not tok_file.is_file():
            raise ProcessorError(f"{root}: tokenizer.json missing")
        self.tokenizer = Tokenizer.from_file(str(tok_file))
        self.chat_template = _load_chat_template(root)
        self._template = _compile_template(self.chat_template) if self.chat_template is not None else None
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._prompt_ids: dict[tuple[str, bool], list[int]] = {}  # pages share a few prompts: tokenize each once
        pp = root / "preprocessor_config.json"
        self.image_processor = ImageProcessor.from_file(pp) if (cfg.has_vision and pp.is_file()) else None
        self.eos_token_ids = self._eos_ids(root)

    def _eos_ids(self, root: Path) -> tuple[int, ...]:
        ids = list(self.cfg.text.eos_token_ids)
        gen = root / "generation_config.json"
        if gen.is_file():
            e = json.loads(gen.read_text()).get("eos_token_id")
            ids += [e] if isinstance(e, int) else list(e or [])
        tc = root / "tokenizer_config.json"
        if tc.is_file():
            eos = json.loads(tc.read_text()).get("eos_token")
            eos = eos.get("content") if isinstance(eos, dict) else eos
            if isinstance(eos, str) and self.tokenizer.token_to_id(eos) is not None:
                ids.append(self.tokenizer.token_to_id(eos))
        return tuple(dict.fromkeys(int(i) for i in ids))

    def render_prompt(self, text: str, with_image: bool) -> str:
        import jinja2

        if self._template is None:
            raise ProcessorError("checkpoint has no chat template (chat_template.jinja or tokenizer_config.json)")
        content = ([{"type": "image"}] if with_image else []) + [{"type": "text", "text": text}]
        try:
            return self._template.render(messages=[{"role": "user", "content": content}], add_generation_prompt=True,
                                         **self.chat_template_kwargs)
        except jinja2.TemplateError as e:
            raise ProcessorError(f"chat template failed to render: {e}") from e

    def prompt_ids(self, text: str, with_image: bool) -> list[int]:
        key = (text, with_image)
        ids = self._prompt_ids.get(key)  # thread-safe enough: a race only tokenizes twice
        if ids is None:
            ids = self.encode(self.render_prompt(text, with_image))
            if len(self._prompt_ids) < 1024:
                self._prompt_ids[key] = ids
        return list(ids)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def page_inputs(self, image, prompt: str, compact: bool = False):
        """-> (token ids with image placeholders expanded, patches or None, grids list). Patches are float32
        [P, C*T*p*p] as transformers makes them, or with `compact` the uint8 [P, C*p*p] of
        `ImageProcessor.merge_order_patches` (the engine expands them on its device)."""
        ids = self.prompt_ids(prompt, with_image=image is not None)
        if image is None:
            return ids, None, []
        if self.image_processor is None:
            raise ProcessorError("checkpoint has no vision tower or no preprocessor_config.json: cannot take images")
        make = self.image_processor.merge_order_patches if compact else self.image_processor
        patches, grid = make(image)
        n = grid[0] * grid[1] * grid[2] // self.image_processor.merge_size**2
        pad = self.cfg.image_token_id
        if ids.count(pad) != 1:
            raise ProcessorError(f"rendered prompt has {ids.count(pad)} image placeholders, expected 1")
        i = ids.index(pad)
        return ids[:i] + [pad] * n + ids[i + 1:], patches, [grid]

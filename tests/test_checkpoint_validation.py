"""A broken checkpoint fails the job's check before Ray starts (pipeline.checkpoint.validate), with a message that
names the file or tensor: no tokenizer.json, a shard its index lists but the folder lacks, a tensor in two shards,
a corrupt safetensors header. Each is made from the real tiny checkpoint, which passes the same check."""
import json
import shutil
import struct

import pytest
from safetensors.torch import load_file, save_file

from pipeline.checkpoint import CheckpointError, validate


def copy(src, dest):
    shutil.copytree(src, dest)
    return dest


def shard(folder, overlap: bool = False) -> list[str]:
    """model.safetensors split into two shards with an index, as large HF checkpoints are published; with
    `overlap` the second shard also holds the first shard's first tensor."""
    weights = load_file(folder / "model.safetensors")
    names = sorted(weights)
    halves = [names[: len(names) // 2], names[len(names) // 2:] + (names[:1] if overlap else [])]
    files = [f"model-0000{i + 1}-of-00002.safetensors" for i in range(2)]
    weight_map = {}
    for fname, part in zip(files, halves):
        save_file({n: weights[n] for n in part}, folder / fname, metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return files


def test_the_unbroken_checkpoint_and_its_sharded_form_pass(tiny_checkpoint, tmp_path):
    assert validate(str(tiny_checkpoint))
    sharded = copy(tiny_checkpoint, tmp_path / "sharded")
    shard(sharded)
    assert validate(str(sharded))


def test_missing_tokenizer_json(tiny_checkpoint, tmp_path):
    ckpt = copy(tiny_checkpoint, tmp_path / "ckpt")
    (ckpt / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=f"checkpoint {ckpt} is not usable: {ckpt}: tokenizer.json missing"):
        validate(str(ckpt))


def test_missing_shard(tiny_checkpoint, tmp_path):
    ckpt = copy(tiny_checkpoint, tmp_path / "ckpt")
    files = shard(ckpt)
    (ckpt / files[1]).unlink()
    with pytest.raises(CheckpointError, match=r"shard\(s\) listed in model.safetensors.index.json are missing: "
                                              rf"\['{files[1]}'\]"):
        validate(str(ckpt))


def test_tensor_in_two_shards(tiny_checkpoint, tmp_path):
    ckpt = copy(tiny_checkpoint, tmp_path / "ckpt")
    files = shard(ckpt, overlap=True)
    first = sorted(load_file(ckpt / files[0]))[0]
    with pytest.raises(CheckpointError, match=f"tensor {first} appears in both {files[0]} and {files[1]}"):
        validate(str(ckpt))


@pytest.mark.parametrize("damage,message", [
    ("length", "model.safetensors: corrupt safetensors header length"),
    ("json", "model.safetensors: safetensors header is not valid JSON"),
    ("short", "model.safetensors: too short to be a safetensors file"),
])
def test_corrupt_safetensors_header(tiny_checkpoint, tmp_path, damage, message):
    ckpt = copy(tiny_checkpoint, tmp_path / "ckpt")
    path = ckpt / "model.safetensors"
    data = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    if damage == "length":  # the length field of a flipped bit: past the end of the file
        data[:8] = struct.pack("<Q", n | 1 << 40)
    elif damage == "json":  # the header's bytes overwritten, its length intact
        data[8:8 + 16] = b"\x00" * 16
    else:
        data = data[:5]
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=message):
        validate(str(ckpt))

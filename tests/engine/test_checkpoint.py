"""Checkpoint headers: safetensors files written here by hand (a header and zero bytes).

The model is a 2-layer Llama (hidden 64, 4 heads of 16, 2 KV heads, MLP 128, vocabulary
1000), so every tensor's shape is the one transformers gives it and ``compare`` can
check the checkpoint's count against the engine's exactly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from math import prod
from pathlib import Path
from typing import Any

import pytest

from memfit.engine import checkpoint
from memfit.engine.checkpoint import (
    compare,
    model_from_folder,
    read_checkpoint,
    read_safetensors_header,
)
from memfit.engine.errors import EstimateError
from memfit.engine.hf_config import model_from_hf_config
from memfit.engine.hub_cache import find_model
from memfit.engine.params import count_parameters

BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "U8": 1, "I8": 1, "F8_E4M3": 1, "I64": 8}
CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
#: Llama's linear layers: (name, out_features, in_features)
LINEARS = (
    ("self_attn.q_proj", 64, 64),
    ("self_attn.k_proj", 32, 64),
    ("self_attn.v_proj", 32, 64),
    ("self_attn.o_proj", 64, 64),
    ("mlp.gate_proj", 128, 64),
    ("mlp.up_proj", 128, 64),
    ("mlp.down_proj", 64, 128),
)
Tensors = dict[str, tuple[str, list[int]]]


def write_safetensors(path: Path, tensors: Tensors, metadata: dict[str, str] | None = None) -> Path:
    """A valid safetensors file: the header, then zero bytes for every tensor."""
    header: dict[str, Any] = {"__metadata__": metadata} if metadata is not None else {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = prod(shape) * BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(offset))
    return path


def write_raw(path: Path, header: bytes, data: int = 0, claim: int | None = None) -> Path:
    """A file whose header is ``header`` as given, its length ``claim`` (default: true)."""
    n = len(header) if claim is None else claim
    path.write_bytes(n.to_bytes(8, "little") + header + bytes(data))
    return path


def entry(dtype: str = "F32", shape: Any = (4,), offsets: Any = (0, 16)) -> dict[str, Any]:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


def header_file(path: Path, tensors: dict[str, Any], data: int = 16) -> Path:
    return write_raw(path, json.dumps(tensors).encode(), data)


def plain_tensors(dtype: str = "BF16", tied: bool = False, layers: int = 2) -> Tensors:
    t: Tensors = {"model.embed_tokens.weight": (dtype, [1000, 64])}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name, out_f, in_f in LINEARS:
            t[p + name + ".weight"] = (dtype, [out_f, in_f])
        t[p + "input_layernorm.weight"] = (dtype, [64])
        t[p + "post_attention_layernorm.weight"] = (dtype, [64])
    t["model.norm.weight"] = (dtype, [64])
    if not tied:
        t["lm_head.weight"] = (dtype, [1000, 64])
    return t


def quantized(
    linear: Callable[[str, int, int], Tensors], rest: str = "F16", tied: bool = False
) -> Tensors:
    """The plain model with every block linear replaced by ``linear(prefix, out, in)``."""
    t: Tensors = {}
    for name, (_, shape) in plain_tensors(rest, tied).items():
        if ".layers." in name and name.endswith("proj.weight"):
            t.update(linear(name[: -len("weight")], shape[0], shape[1]))
        else:
            t[name] = (rest, shape)
    return t


def gptq(prefix: str, out_f: int, in_f: int, group: int = 32) -> Tensors:
    return {
        prefix + "qweight": ("I32", [in_f // 8, out_f]),
        prefix + "qzeros": ("I32", [in_f // group, out_f // 8]),
        prefix + "scales": ("F16", [in_f // group, out_f]),
        prefix + "g_idx": ("I32", [in_f]),
    }


def awq(prefix: str, out_f: int, in_f: int, group: int = 32) -> Tensors:
    return {
        prefix + "qweight": ("I32", [in_f, out_f // 8]),
        prefix + "qzeros": ("I32", [in_f // group, out_f // 8]),
        prefix + "scales": ("F16", [in_f // group, out_f]),
    }


def bnb4(prefix: str, out_f: int, in_f: int) -> Tensors:
    w = prefix + "weight"
    return {
        w: ("U8", [out_f * in_f // 2, 1]),
        w + ".absmax": ("F32", [out_f * in_f // 64]),
        w + ".quant_map": ("F32", [16]),
        w + ".quant_state.bitsandbytes__nf4": ("U8", [120]),
    }


def bnb8(prefix: str, out_f: int, in_f: int) -> Tensors:
    return {
        prefix + "weight": ("I8", [out_f, in_f]),
        prefix + "SCB": ("F32", [out_f]),
        prefix + "weight_format": ("U8", []),
    }


def fp8(prefix: str, out_f: int, in_f: int) -> Tensors:
    return {
        prefix + "weight": ("F8_E4M3", [out_f, in_f]),
        prefix + "weight_scale_inv": ("F32", [1, 1]),
    }


def model_folder(
    folder: Path, tensors: Tensors, config: dict[str, Any] | None = None, **changes: Any
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**(config or CONFIG), **changes}))
    write_safetensors(folder / "model.safetensors", tensors, {"format": "pt"})
    return folder


ENGINE_COUNT = count_parameters(model_from_hf_config(CONFIG)).total


def test_the_test_model_counts() -> None:
    assert ENGINE_COUNT == sum(prod(s) for _, s in plain_tensors().values()) == 202_048


# -- one header ---------------------------------------------------------------------------


def test_read_header_of_a_plain_file(tmp_path: Path) -> None:
    path = write_safetensors(tmp_path / "a.safetensors", plain_tensors(), {"format": "pt"})
    header = read_safetensors_header(path)
    assert header["__metadata__"] == {"format": "pt"}
    assert header["lm_head.weight"]["shape"] == [1000, 64]
    assert len(header) == 1 + len(plain_tensors())


def test_only_the_header_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_safetensors(tmp_path / "a.safetensors", plain_tensors())
    reads: list[int] = []
    real_read = os.read

    def read(fd: int, n: int) -> bytes:
        reads.append(n)
        return real_read(fd, n)

    monkeypatch.setattr(checkpoint.os, "read", read)
    read_safetensors_header(path)
    header_len = int.from_bytes(path.read_bytes()[:8], "little")
    assert sum(reads) == 8 + header_len < path.stat().st_size


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "0 bytes: too short"),
        (b"\x02\x00\x00", "3 bytes: too short"),
        ((100).to_bytes(8, "little") + b"{}", "claims 100 bytes but only 2 follow"),
        ((1 << 30).to_bytes(8, "little") + b"{}" + bytes(100), "claims 1,073,741,824 bytes"),
        ((2**64 - 1).to_bytes(8, "little") + b"{}", "claims 18,446,744,073,709,551,615"),
        ((1).to_bytes(8, "little") + b"{", "too short for a JSON object"),
        (b"\x20\x00\x00\x00\x00\x00\x00\x00" + b'{"a": {"dtype": "F32", "shape": [', "not valid"),
        ((4).to_bytes(8, "little") + b"[1] ", "a JSON list, not an object"),
        ((4).to_bytes(8, "little") + b'"\xff"}', "not UTF-8 \\(byte 9\\)"),
        ((16).to_bytes(8, "little") + b'{"a": 1, "a": 2}', "the key 'a' appears twice"),
        ((20_000).to_bytes(8, "little") + b"[" * 20_000, "nested too deeply"),
        (
            (5_004).to_bytes(8, "little") + b"[" + b"9" * 5000 + b"]   ",
            "a number of over 4,300 digits",
        ),
    ],
    ids=[
        "empty",
        "short",
        "claim-past-end",
        "1GB-claim-small-file",
        "max-u64-claim",
        "one-byte-header",
        "truncated-json",
        "not-an-object",
        "not-utf8",
        "duplicate-key",
        "deep-nesting",
        "huge-integer",
    ],
)
def test_malformed_headers(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(EstimateError, match=message) as info:
        read_safetensors_header(path)
    assert info.value.field == "checkpoint"
    assert str(info.value).startswith("checkpoint: bad.safetensors: ")


def test_a_1gb_header_claim_is_refused_without_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is large enough for the claim (sparse), so only the cap refuses it."""
    path = tmp_path / "huge.safetensors"
    with open(path, "wb") as f:
        f.write((1 << 30).to_bytes(8, "little"))
        f.truncate((1 << 30) + 4096)
    reads: list[int] = []
    real_read = os.read
    monkeypatch.setattr(checkpoint.os, "read", lambda fd, n: reads.append(n) or real_read(fd, n))
    start = time.monotonic()
    bound = f"{checkpoint.MAX_HEADER_BYTES:,}"
    with pytest.raises(EstimateError, match=f"claims 1,073,741,824 bytes; headers over {bound}"):
        read_safetensors_header(path)
    assert reads == [8] and time.monotonic() - start < 1.0


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        ("not an object", "tensor 'x' is 'not an object', expected an object"),
        ({"shape": [4], "data_offsets": [0, 16]}, "tensor 'x' has no dtype"),
        ({"dtype": "F32", "data_offsets": [0, 16]}, "tensor 'x' has no shape"),
        ({"dtype": "F32", "shape": [4]}, "tensor 'x' has no data_offsets"),
        (entry(dtype=32), "dtype is 32, expected a string"),
        (entry(dtype=""), "dtype is '', expected a string"),
        (entry(shape=["4"]), r"shape is \['4'\], expected a list of non-negative integers"),
        (entry(shape=[2, "2"]), "expected a list of non-negative integers"),
        (entry(shape=[True, 4]), "expected a list of non-negative integers"),
        (entry(shape=[-4]), "expected a list of non-negative integers"),
        (entry(shape=[4.0]), "expected a list of non-negative integers"),
        ({**entry(), "shape": "4"}, "expected a list of non-negative integers"),
        ({**entry(), "shape": [1] * 65}, "expected a list of non-negative integers"),
        (entry(offsets=["0", "16"]), r"data_offsets is \['0', '16'\], expected two integers"),
        (entry(offsets=[0, "16"]), "expected two integers"),
        (entry(offsets=[0, 8, 16]), "expected two integers"),
        ({**entry(), "data_offsets": {"start": 0}}, "expected two integers"),
        (entry(offsets=[16, 0]), r"data_offsets \[16, 0\] do not make a byte range"),
        (entry(offsets=[-16, 0]), "do not make a byte range"),
        (entry(offsets=[0, 1_000_000]), r"run past the end of the file \(16 bytes of data\)"),
        (entry(offsets=[0, 8]), r"F32 \[4\] takes 16 bytes but data_offsets span 8"),
        (entry(dtype="F4", shape=[3], offsets=[0, 2]), r"F4 \[3\] takes 1.5 bytes"),
    ],
)
def test_malformed_tensor_entries(tmp_path: Path, tensor: Any, message: str) -> None:
    # alone, and after thousands of good tensors (read by the fast path): the same error
    many = {f"ok.{i}": entry(shape=[0, 8], offsets=[0, 0]) for i in range(5000)}
    for tensors in ({"x": tensor}, {**many, "x": tensor}):
        path = header_file(tmp_path / "bad.safetensors", tensors)
        with pytest.raises(EstimateError, match=message) as info:
            read_safetensors_header(path)
        assert str(info.value).startswith("checkpoint: bad.safetensors: ")


def test_overlapping_tensors(tmp_path: Path) -> None:
    path = header_file(
        tmp_path / "bad.safetensors",
        {"a": entry(offsets=[0, 16]), "b": entry(shape=[2], offsets=[8, 16])},
    )
    with pytest.raises(EstimateError, match="tensors 'a' and 'b' overlap"):
        read_safetensors_header(path)


def test_metadata_must_be_an_object(tmp_path: Path) -> None:
    path = header_file(tmp_path / "bad.safetensors", {"__metadata__": [1], "a": entry()})
    with pytest.raises(EstimateError, match="__metadata__ is"):
        read_safetensors_header(path)


def test_empty_tensors_and_scalars(tmp_path: Path) -> None:
    path = header_file(
        tmp_path / "ok.safetensors",
        {
            "empty": entry(shape=[0, 4], offsets=[0, 0]),
            "scalar": entry(shape=[], offsets=[0, 4]),
            "v": entry(shape=[3], offsets=[4, 16]),
        },
    )
    assert set(read_safetensors_header(path)) == {"empty", "scalar", "v"}


def test_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(EstimateError, match=r"nope.safetensors: cannot read it"):
        read_safetensors_header(tmp_path / "nope.safetensors")
    (tmp_path / "dir.safetensors").mkdir()
    with pytest.raises(EstimateError, match="is a directory, not a safetensors file"):
        read_safetensors_header(tmp_path / "dir.safetensors")
    (tmp_path / "dangling.safetensors").symlink_to("gone")
    with pytest.raises(EstimateError, match=r"dangling.safetensors: cannot read it"):
        read_safetensors_header(tmp_path / "dangling.safetensors")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.safetensors")
    with pytest.raises(EstimateError, match="is a FIFO"):
        read_safetensors_header(tmp_path / "pipe.safetensors")


# -- a folder -----------------------------------------------------------------------------


def test_plain_bf16_checkpoint(tmp_path: Path) -> None:
    tensors = plain_tensors()
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = ("F32", [8])
    folder = model_folder(tmp_path / "m", tensors)
    info = read_checkpoint(folder)
    assert info.files == ("model.safetensors",)
    assert info.tensor_count == len(tensors) == 21 + 1
    assert info.raw_elements == ENGINE_COUNT + 8
    assert info.logical_parameters == ENGINE_COUNT and info.logical_slack == 0
    assert info.not_parameters == ("model.layers.0.self_attn.rotary_emb.inv_freq",)
    assert [(d.dtype, d.tensors, d.elements, d.bytes) for d in info.by_dtype] == [
        ("BF16", 21, ENGINE_COUNT, 2 * ENGINE_COUNT),
        ("F32", 1, 8, 32),
    ]
    assert info.total_bytes == 2 * ENGINE_COUNT + 32
    assert info.file_bytes == (folder / "model.safetensors").stat().st_size
    assert info.quantization is None and info.warnings == ()
    lm = next(t for t in info.tensors if t.name == "lm_head.weight")
    assert (lm.dtype, lm.shape, lm.file, lm.nbytes, lm.numel) == (
        "BF16",
        (1000, 64),
        "model.safetensors",
        128_000,
        64_000,
    )
    model, info2 = model_from_folder(folder)
    assert model.name == "m" and info2 == info
    result = compare(model, info)
    assert (result.engine_parameters, result.checkpoint_parameters) == (ENGINE_COUNT,) * 2
    assert not result.mismatch and result.difference == 0 and result.relative_difference == 0


def test_a_mismatching_config_is_flagged(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "m", plain_tensors(), intermediate_size=256)
    model, info = model_from_folder(folder)
    result = compare(model, info)
    assert result.mismatch
    assert result.difference == -2 * 3 * 64 * 128  # three MLP matrices of two layers
    assert result.relative_difference == pytest.approx(result.difference / (ENGINE_COUNT + 49152))
    assert compare(model, info, tolerance=0.5).mismatch is False


def test_tied_embeddings_stored_once_do_not_mismatch(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "m", plain_tensors(tied=True), tie_word_embeddings=True)
    model, info = model_from_folder(folder)
    result = compare(model, info)
    assert not result.mismatch and result.difference == 0 and result.notes == ()


def test_tied_head_saved_beside_the_embedding_is_counted_once(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "m", plain_tensors(), tie_word_embeddings=True)
    model, info = model_from_folder(folder)
    result = compare(model, info)
    assert not result.mismatch and result.checkpoint_parameters == ENGINE_COUNT - 64_000
    assert "lm_head.weight is stored beside the tied embedding" in result.notes[0]


def test_untied_config_with_a_tied_checkpoint_says_why(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "m", plain_tensors(tied=True))
    model, info = model_from_folder(folder)
    result = compare(model, info)
    assert result.mismatch and result.difference == -64_000
    assert "tie_word_embeddings" in result.notes[0]


def test_two_shards_with_an_index(tmp_path: Path) -> None:
    folder = tmp_path / "sharded"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIG))
    tensors = list(plain_tensors().items())
    halves = {"model-00001-of-00002.safetensors": tensors[:12]}
    halves["model-00002-of-00002.safetensors"] = tensors[12:]
    weight_map = {}
    for file, part in halves.items():
        write_safetensors(folder / file, dict(part))
        weight_map.update(dict.fromkeys((n for n, _ in part), file))
    index = {"metadata": {"total_size": 2 * ENGINE_COUNT}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    write_safetensors(folder / "consolidated.safetensors", dict(tensors))  # not in the index
    info = read_checkpoint(folder)
    assert info.files == tuple(sorted(halves))
    assert info.tensor_count == 21 and info.logical_parameters == ENGINE_COUNT
    assert {t.file for t in info.tensors} == set(halves)
    assert info.warnings == ()
    model, _ = model_from_folder(folder)
    assert not compare(model, info).mismatch

    index["metadata"] = {"total_size": 5}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "total_size 5" in read_checkpoint(folder).warnings[0]


def index_folder(tmp_path: Path, weight_map: Any, files: Tensors | None = None) -> Path:
    folder = tmp_path / "idx"
    folder.mkdir(exist_ok=True)
    if files is not None:
        write_safetensors(folder / "a.safetensors", files)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return folder


@pytest.mark.parametrize(
    ("weight_map", "message"),
    [
        ({"x": "b.safetensors"}, "names b.safetensors, which is not in the folder"),
        ({"x": "a.safetensors", "y": "a.safetensors"}, r"lists 1 tensor\(s\) not in their file"),
        ({"x": "../a.safetensors"}, "expected a file name in the folder"),
        ({"x": "/etc/passwd"}, "expected a file name in the folder"),
        ({"x": 3}, "expected a file name in the folder"),
        ([1, 2], "expected an object with a weight_map object"),
    ],
)
def test_bad_indexes(tmp_path: Path, weight_map: Any, message: str) -> None:
    folder = index_folder(tmp_path, weight_map, {"x": ("F32", [4])})
    with pytest.raises(EstimateError, match=message) as info:
        read_checkpoint(folder)
    assert info.value.field == "checkpoint"


def test_index_that_is_not_json(tmp_path: Path) -> None:
    folder = tmp_path / "idx"
    folder.mkdir()
    (folder / "model.safetensors.index.json").write_text('{"weight_map": ')
    with pytest.raises(EstimateError, match=r"model.safetensors.index.json is not valid JSON"):
        read_checkpoint(folder)


def test_tensor_not_where_the_index_says(tmp_path: Path) -> None:
    folder = index_folder(tmp_path, {"x": "a.safetensors"}, {"x": ("F32", [4]), "y": ("F32", [4])})
    assert "1 tensor(s) not where" in read_checkpoint(folder).warnings[0]


def test_folder_problems(tmp_path: Path) -> None:
    with pytest.raises(EstimateError, match="is not a folder"):
        read_checkpoint(tmp_path / "nope")
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(EstimateError, match=r"no \*.safetensors files \(pytorch_model.bin not"):
        read_checkpoint(tmp_path)
    write_safetensors(tmp_path / "a.safetensors", {"x": ("F32", [4])})
    write_safetensors(tmp_path / "b.safetensors", {"x": ("F32", [4])})
    with pytest.raises(EstimateError, match=r"b.safetensors: tensor 'x' is also in a.safetensors"):
        read_checkpoint(tmp_path)


def test_a_bad_shard_names_itself(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "a.safetensors", {"x": ("F32", [4])})
    header_file(tmp_path / "b.safetensors", {"y": entry(shape=["4"])})
    with pytest.raises(EstimateError, match=r"checkpoint: b.safetensors: tensor 'y': shape"):
        read_checkpoint(tmp_path)


def test_unknown_dtype_and_empty_checkpoint_are_warnings(tmp_path: Path) -> None:
    header_file(tmp_path / "a.safetensors", {"x": entry(dtype="F12_NEW", offsets=[0, 16])})
    info = read_checkpoint(tmp_path)
    assert info.raw_elements == 4 and "F12_NEW" in info.warnings[0]
    empty = tmp_path / "empty"
    empty.mkdir()
    write_safetensors(empty / "model.safetensors", {})
    assert read_checkpoint(empty).warnings == ("the checkpoint holds no tensors",)


def test_a_broken_config_does_not_stop_the_checkpoint(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "m", plain_tensors())
    (folder / "config.json").write_text("{")
    info = read_checkpoint(folder)
    assert info.logical_parameters == ENGINE_COUNT
    assert "config.json not read" in info.warnings[0]
    with pytest.raises(EstimateError, match=r"config.json is not valid JSON") as err:
        model_from_folder(folder)
    assert err.value.field == "model"


# -- quantized checkpoints ----------------------------------------------------------------

GPTQ_CONFIG = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False}


def test_gptq(tmp_path: Path) -> None:
    folder = model_folder(
        tmp_path / "m", quantized(gptq), quantization_config=GPTQ_CONFIG, torch_dtype="float16"
    )
    model, info = model_from_folder(folder)
    q = info.quantization
    assert q is not None
    assert (q.method, q.bits, q.config_method, q.confirmed) == ("gptq", 4, "gptq", True)
    assert q.detail == "group size 32"
    assert q.quantized_tensors == 14
    assert q.quantized_parameters == 2 * sum(o * i for _, o, i in LINEARS)
    assert info.logical_parameters == ENGINE_COUNT
    assert info.raw_elements != ENGINE_COUNT
    assert len(info.not_parameters) == 14 * 3  # qzeros, scales, g_idx
    assert {d.dtype for d in info.by_dtype} == {"I32", "F16"}
    assert not compare(model, info).mismatch
    assert info.warnings == ()


def test_gptq_without_a_config_assumes_4_bits(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    write_safetensors(folder / "model.safetensors", quantized(gptq))
    info = read_checkpoint(folder)
    assert info.quantization is not None and info.quantization.confirmed is None
    assert info.logical_parameters == ENGINE_COUNT
    assert "4 assumed" in info.warnings[0]


def test_gptq_8_bit(tmp_path: Path) -> None:
    def gptq8(prefix: str, out_f: int, in_f: int) -> Tensors:
        t = gptq(prefix, out_f, in_f)
        t[prefix + "qweight"] = ("I32", [in_f // 4, out_f])
        return t

    config = {**GPTQ_CONFIG, "bits": 8}
    folder = model_folder(tmp_path / "m", quantized(gptq8), quantization_config=config)
    model, info = model_from_folder(folder)
    assert info.quantization is not None and info.quantization.bits == 8
    assert not compare(model, info).mismatch


def test_awq(tmp_path: Path) -> None:
    config = {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm"}
    folder = model_folder(tmp_path / "m", quantized(awq), quantization_config=config)
    model, info = model_from_folder(folder)
    assert info.quantization is not None
    assert (info.quantization.method, info.quantization.confirmed) == ("awq", True)
    assert info.logical_parameters == ENGINE_COUNT
    assert not compare(model, info).mismatch


def test_bnb_4bit(tmp_path: Path) -> None:
    config = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
    folder = model_folder(tmp_path / "m", quantized(bnb4, "BF16"), quantization_config=config)
    model, info = model_from_folder(folder)
    q = info.quantization
    assert q is not None
    assert (q.method, q.bits, q.detail, q.config_method, q.confirmed) == (
        "bnb-4bit",
        4,
        "nf4",
        "bnb-4bit",
        True,
    )
    assert info.logical_parameters == ENGINE_COUNT and info.logical_slack == 14
    assert len(info.not_parameters) == 14 * 3
    assert not compare(model, info).mismatch


def test_bnb_4bit_padding_is_within_the_slack(tmp_path: Path) -> None:
    """A weight of an odd number of elements packs into (n + 1) / 2 bytes: each 4-bit
    weight may count one element more than it has, and no more."""
    model = model_from_hf_config(CONFIG)
    folder = model_folder(tmp_path / "m", quantized(bnb4, "BF16"))
    info = read_checkpoint(folder)
    assert info.logical_slack == 14
    padded = dataclasses.replace(info, logical_parameters=ENGINE_COUNT + 14)
    assert not compare(model, padded).mismatch
    over = dataclasses.replace(info, logical_parameters=ENGINE_COUNT + 15)
    assert compare(model, over).mismatch
    under = dataclasses.replace(info, logical_parameters=ENGINE_COUNT - 1)
    assert compare(model, under).mismatch


def test_bnb_8bit(tmp_path: Path) -> None:
    folder = model_folder(
        tmp_path / "m", quantized(bnb8), quantization_config={"load_in_8bit": True}
    )
    model, info = model_from_folder(folder)
    assert info.quantization is not None
    assert (info.quantization.method, info.quantization.confirmed) == ("bnb-8bit", True)
    assert info.logical_parameters == ENGINE_COUNT
    assert not compare(model, info).mismatch


def test_fp8(tmp_path: Path) -> None:
    config = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    t = quantized(fp8, "BF16")
    t["model.layers.0.self_attn.k_scale"] = ("F32", [])
    folder = model_folder(tmp_path / "m", t, quantization_config=config)
    model, info = model_from_folder(folder)
    q = info.quantization
    assert q is not None and (q.method, q.bits, q.detail, q.confirmed) == (
        "fp8",
        8,
        "F8_E4M3",
        True,
    )
    assert len(info.not_parameters) == 15
    assert not compare(model, info).mismatch


def test_config_and_tensors_disagree(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "m", quantized(gptq), quantization_config={"load_in_8bit": 1})
    info = read_checkpoint(folder)
    assert info.quantization is not None and info.quantization.confirmed is False
    assert "declares quantization 'bnb-8bit' but the tensors are gptq" in info.warnings[-1]
    folder = model_folder(tmp_path / "p", plain_tensors(), quantization_config=GPTQ_CONFIG)
    info = read_checkpoint(folder)
    assert info.quantization is None
    assert "declares quantization 'gptq' but no tensor" in info.warnings[0]


# -- the model beside it ------------------------------------------------------------------


def test_read_as_is_passed_on_when_the_reader_takes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = model_folder(tmp_path / "m", plain_tensors())
    seen: list[Any] = []

    def with_read_as(cfg: Any, name: Any = None, read_as: Any = None) -> Any:
        seen.append(read_as)
        return model_from_hf_config(cfg, name)

    monkeypatch.setattr(checkpoint, "model_from_hf_config", with_read_as)
    model_from_folder(folder, read_as="text")
    model_from_folder(folder)
    assert seen == ["text", None]

    monkeypatch.setattr(checkpoint, "model_from_hf_config", lambda cfg, name=None: None)
    with pytest.raises(EstimateError, match="does not take read_as") as info:
        model_from_folder(folder, read_as="text")
    assert info.value.field == "read_as"


def test_model_from_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(EstimateError, match="is not a folder"):
        model_from_folder(tmp_path / "nope")
    (tmp_path / "m").mkdir()
    with pytest.raises(EstimateError, match=r"m has no config.json") as info:
        model_from_folder(tmp_path / "m")
    assert info.value.field == "model"
    (tmp_path / "m" / "config.json").write_text("[]")
    with pytest.raises(EstimateError, match=r"config.json is a JSON list"):
        model_from_folder(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text(json.dumps(CONFIG))
    with pytest.raises(EstimateError, match=r"no \*.safetensors files"):
        model_from_folder(tmp_path / "m")


def test_a_snapshot_of_the_hub_cache(tmp_path: Path) -> None:
    """The whole path: a cached model found by name, read and compared."""
    commit = "a" * 40
    repo = tmp_path / "models--org--tiny-llama"
    staging = model_folder(tmp_path / "staging", plain_tensors(), tie_word_embeddings=False)
    for name in ("config.json", "model.safetensors"):
        content = (staging / name).read_bytes()
        blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content)
        link = repo / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    snapshot = find_model("org/tiny-llama", root=tmp_path)
    model, info = model_from_folder(snapshot.path)
    assert model.name == "org/tiny-llama"
    assert model_from_folder(snapshot.path, name="mine")[0].name == "mine"
    assert not compare(model, info).mismatch
    assert re.fullmatch(r"[0-9a-f]{64}", os.readlink(snapshot.path / "config.json")[-64:])

"""What a local model folder's checkpoint holds, read from its safetensors headers only.

A ``.safetensors`` file starts with an 8-byte little-endian length ``N`` and ``N`` bytes of
UTF-8 JSON naming every tensor's dtype, shape and byte range; the tensor data follows.
:func:`read_safetensors_header` reads and checks that header and nothing else, so even a
checkpoint of hundreds of gigabytes is described in milliseconds.

:func:`read_checkpoint` reads every shard of a folder (through
``model.safetensors.index.json`` when there is one) into a :class:`CheckpointInfo`: the
tensors, the elements and bytes by dtype, the quantization the tensors show (GPTQ, AWQ,
bitsandbytes 4- and 8-bit, fp8), confirmed against ``quantization_config`` in
``config.json``, and the checkpoint's *logical* parameter count: packed 4-bit weights
unpacked, quantization scales, zeros and states and non-parameter buffers left out.

:func:`model_from_folder` reads ``config.json`` into a :class:`~memfit.engine.specs.ModelSpec`
beside the checkpoint, and :func:`compare` sets the engine's parameter count against the
checkpoint's.

Every problem is an :class:`~memfit.engine.errors.EstimateError` whose message names the file:

>>> import pathlib, tempfile
>>> bad = pathlib.Path(tempfile.mkdtemp()) / "model.safetensors"
>>> _ = bad.write_bytes((1 << 30).to_bytes(8, "little") + b"{}")
>>> read_safetensors_header(bad)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
memfit.engine.errors.EstimateError: checkpoint: model.safetensors: the header claims ...
"""

from __future__ import annotations

import inspect
import itertools
import json
import math
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

from memfit.engine.errors import EstimateError, shown
from memfit.engine.files import parse_json, read_json, read_text
from memfit.engine.hf_config import model_from_hf_config
from memfit.engine.hub_cache import NOT_HELD, held, snapshot_of
from memfit.engine.params import count_parameters
from memfit.engine.specs import ModelSpec

#: the largest safetensors header read; a larger claim is refused before reading it.
#: Real headers are small: a tensor's entry is ~130 bytes, a 5 GB shard holds a few
#: thousand tensors at most, and DeepSeek-V3's largest shard header is well under 1 MiB;
#: 16 MiB holds ~120,000 entries, a whole DeepSeek-V3 (fp8 scales included) in one file
MAX_HEADER_BYTES = 16 << 20
#: the most header bytes one folder's files may hold together, checked before any is
#: parsed: DeepSeek-V3's 163 headers take ~12 MB, a 1T-parameter MoE stored as 4-bit
#: GPTQ (four tensors per linear) ~40 MB; as much as the index may be
MAX_FOLDER_HEADER_BYTES = 64 << 20
#: the most safetensors files one folder may hold: the largest checkpoints have a few
#: hundred shards (Llama 3.1 405B: 191)
MAX_FILES = 10_000
#: the largest ``model.safetensors.index.json`` read (a 600B-parameter MoE's is ~10 MB)
MAX_INDEX_BYTES = 64 << 20
#: tensors between two calls of a reading's ``progress`` and ``cancelled``
POLL_EVERY = 4096
#: the most dimensions a tensor may have
MAX_RANK = 64
#: the most elements, and the largest dimension, a tensor may have: safetensors stores
#: sizes as unsigned 64-bit integers, so no file describes more
MAX_ELEMENTS = 2**64 - 1
FIELD = "checkpoint"
INDEX_NAME = "model.safetensors.index.json"

#: bits per element of every safetensors dtype
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}  # fmt: skip
FP8_DTYPES = frozenset({"F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ"})
#: the last name part of fp8 scale tensors (per weight, per input, per KV cache)
FP8_SCALES = frozenset(
    {"weight_scale", "weight_scale_inv", "input_scale", "output_scale", "k_scale", "v_scale"}
)
#: what a bitsandbytes 4-bit weight ``W`` stores beside it, as ``W.<suffix>``
BNB4_STATE = (
    "absmax",
    "quant_map",
    "nested_absmax",
    "nested_quant_map",
    "quant_state.bitsandbytes__nf4",
    "quant_state.bitsandbytes__fp4",
)
#: quantization methods this module unpacks, as :attr:`Quantization.method` names them
METHODS = ("gptq", "awq", "bnb-4bit", "bnb-8bit", "fp8")
_HEADS = ("lm_head.weight", "embed_out.weight", "predictions.decoder.weight")
_EMBEDDINGS = (
    "embed_tokens.weight",
    "wte.weight",
    "word_embeddings.weight",
    "embed_in.weight",
    "tok_embeddings.weight",
)


#: ``progress(done, total)``: bytes of safetensors headers read of the folder's total
Progress = Callable[[int, int], object]
#: ``cancelled()``: true when the reading should stop (polled between files and every
#: :data:`POLL_EVERY` tensors)
Cancelled = Callable[[], bool]


class ReadCancelled(Exception):
    """A reading stopped because its ``cancelled`` callable said so; nothing was read."""


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor as a safetensors header describes it."""

    name: str
    #: the safetensors dtype string: "BF16", "F32", "I32", "U8", "F8_E4M3"...
    dtype: str
    shape: tuple[int, ...]
    #: the file it is stored in (a name inside the folder)
    file: str
    #: bytes of its data (``data_offsets`` end minus start)
    nbytes: int

    @property
    def numel(self) -> int:
        """Elements as stored (a packed int32 holding eight 4-bit weights is one)."""
        return prod(self.shape)


@dataclass(frozen=True, slots=True)
class DtypeStats:
    """The tensors of one dtype: how many, their elements and their bytes."""

    dtype: str
    tensors: int
    elements: int
    bytes: int


@dataclass(frozen=True, slots=True)
class Quantization:
    """The quantization a checkpoint's tensors show."""

    #: one of :data:`METHODS`, or several joined by "+" (largest first)
    method: str
    #: bits per quantized weight (4 for GPTQ/AWQ int4 and bitsandbytes 4-bit, 8 for
    #: bitsandbytes 8-bit and fp8); ``None`` when methods of different widths mix
    bits: int | None
    #: more in words: "nf4", "F8_E4M3", "group size 128"...; may be empty
    detail: str
    #: weights stored quantized, and their logical elements
    quantized_tensors: int
    quantized_parameters: int
    #: the method ``config.json``'s ``quantization_config`` names (normalized as
    #: :attr:`method` is: "bnb-4bit" for ``load_in_4bit``...); ``None`` without one
    config_method: str | None
    #: the config names the method the tensors show (``True``), another (``False``), or
    #: there is no config, or it names a method this module does not know (``None``)
    confirmed: bool | None


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """Every tensor of a folder's safetensors checkpoint, counted; see :func:`read_checkpoint`."""

    folder: Path
    #: the safetensors files read, in order
    files: tuple[str, ...]
    #: every tensor, by file and then in header order
    tensors: tuple[TensorInfo, ...]
    #: per dtype, the largest in bytes first
    by_dtype: tuple[DtypeStats, ...]
    #: bytes of tensor data (headers not included)
    total_bytes: int
    #: bytes of the files, headers included
    file_bytes: int
    #: elements as stored, every tensor counted
    raw_elements: int
    #: the parameters the checkpoint stands for: packed weights unpacked, the tensors in
    #: :attr:`not_parameters` left out
    logical_parameters: int
    #: how much :attr:`logical_parameters` may overcount: packing pads a 4-bit weight to
    #: whole bytes (bitsandbytes) or whole int32s (GPTQ, AWQ)
    logical_slack: int
    #: tensors that are not parameters: quantization scales, zeros, indices and states,
    #: and buffers saved with the weights (``rotary_emb.inv_freq``, ``position_ids``...)
    not_parameters: tuple[str, ...]
    #: ``None`` for a checkpoint of plain floating-point weights
    quantization: Quantization | None
    #: things worth saying that did not stop the reading
    warnings: tuple[str, ...] = ()

    @property
    def tensor_count(self) -> int:
        return len(self.tensors)


@dataclass(frozen=True, slots=True)
class Comparison:
    """The engine's parameter count of a model beside its checkpoint's; see :func:`compare`."""

    engine_parameters: int
    #: :attr:`CheckpointInfo.logical_parameters`, less a head stored beside a tied embedding
    checkpoint_parameters: int
    #: checkpoint minus engine
    difference: int
    #: :attr:`difference` over the engine's count (0.0 when both are 0)
    relative_difference: float
    #: the counts disagree by more than packing can explain (and the tolerance allows)
    mismatch: bool
    notes: tuple[str, ...] = ()


# -- one file's header --------------------------------------------------------------------


def _error(path: Path, message: str) -> EstimateError:
    return EstimateError(FIELD, f"{path.name or os.fspath(path)}: {message}")


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _read_exact(fd: int, n: int) -> bytes:
    chunks: list[bytes] = []
    left = n
    while left:
        chunk = os.read(fd, min(left, 1 << 24))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class _Duplicate(ValueError):
    """A key repeated in one JSON object of a header."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # called for every object of the header: the dict is built at C speed, and only an
    # object that lost a key to a repeat is walked again to name it
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Duplicate(f"the key {shown(key)} appears twice")
            seen.add(key)
    return out


class _Watch:
    """A reading's progress and cancel: bytes of headers done of the total, polled."""

    def __init__(self, progress: Progress | None, cancelled: Cancelled | None) -> None:
        self.progress = progress
        self.cancelled = cancelled
        self.total = 0
        self.done = 0

    def check(self) -> None:
        """Stop (:class:`ReadCancelled`) if asked to."""
        if self.cancelled is not None and self.cancelled():
            raise ReadCancelled

    def poll(self, done: int) -> None:
        """Stop if asked to; else say that ``done`` bytes of headers are read."""
        self.check()
        self.done = min(max(done, self.done), self.total)
        if self.progress is not None:
            self.progress(self.done, self.total)


_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_BINARY", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


def _open(path: Path) -> tuple[int, int]:
    """An open descriptor of the regular file ``path`` and its size; a FIFO or a device
    is refused without blocking (opened non-blocking, checked on the descriptor)."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        raise _error(path, f"cannot read it: {exc.strerror or exc}") from exc
    try:
        info = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise _error(path, f"cannot read it: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise _error(path, f"is {_kind(info.st_mode)}, not a safetensors file")
    return fd, info.st_size


def _header_length(path: Path, fd: int, size: int) -> int:
    """The header length the file's first 8 bytes claim, checked against the file's size
    and :data:`MAX_HEADER_BYTES` before a byte of the header is read."""
    if size < 8:
        raise _error(path, f"{size} bytes: too short for a safetensors file")
    n = int.from_bytes(_read_exact(fd, 8), "little")
    if n > size - 8:
        raise _error(
            path,
            f"the header claims {n:,} bytes but only {size - 8:,} follow its length "
            "(a truncated file, or not safetensors)",
        )
    if n > MAX_HEADER_BYTES:
        raise _error(
            path,
            f"the header claims {n:,} bytes; headers over {MAX_HEADER_BYTES:,} bytes "
            f"({MAX_HEADER_BYTES / (1 << 20):g} MiB) are refused: a real one takes well "
            "under 1 MiB",
        )
    if n < 2:
        raise _error(path, f"the header is {n} byte(s): too short for a JSON object")
    return n


def _claimed_length(path: Path) -> int:
    """:func:`_header_length` of the file ``path``: its first 8 bytes only."""
    fd, size = _open(path)
    try:
        return _header_length(path, fd, size)
    except OSError as exc:
        raise _error(path, f"cannot read it: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)


def _raw_header(path: Path, limit: int | None = None) -> tuple[dict[str, Any], int, int]:
    """The parsed header object, the bytes of data after it, and the file's size; a
    header longer than ``limit`` (what the folder's bound leaves) is refused unread."""
    fd, size = _open(path)
    try:
        n = _header_length(path, fd, size)
        if limit is not None and n > limit:
            raise _folder_bound(path)
        raw = _read_exact(fd, n)
    except OSError as exc:
        raise _error(path, f"cannot read it: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if len(raw) < n:
        raise _error(path, "the file ended inside its header")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _error(path, f"the header is not UTF-8 (byte {exc.start + 8:,})") from exc
    try:
        header = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise _error(
            path, f"the header is not valid JSON ({exc.msg} at byte {exc.pos + 8:,})"
        ) from exc
    except RecursionError as exc:
        raise _error(path, "the header is nested too deeply to be safetensors") from exc
    except _Duplicate as exc:
        raise _error(path, f"the header is not valid: {exc}") from exc
    except ValueError as exc:  # an integer over Python's 4,300 digits
        raise _error(path, "the header holds a number of over 4,300 digits") from exc
    if not isinstance(header, dict):
        raise _error(path, f"the header is a JSON {type(header).__name__}, not an object")
    return header, size - 8 - n, size


def _folder_bound(path: Path) -> EstimateError:
    return _error(
        path,
        f"with it the folder's headers are over {MAX_FOLDER_HEADER_BYTES:,} bytes "
        f"({MAX_FOLDER_HEADER_BYTES / (1 << 20):g} MiB) together, and refused: a real "
        "checkpoint's take a few MB",
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tensor(path: Path, name: str, entry: Any, data_len: int) -> tuple[TensorInfo, int]:
    """One header entry checked, and where its data starts."""
    where = f"tensor {shown(name)}"
    if not isinstance(entry, dict):
        raise _error(path, f"{where} is {shown(entry)}, expected an object")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in entry:
            raise _error(path, f"{where} has no {key}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or not dtype.isascii() or not dtype.isprintable() or not dtype:
        raise _error(path, f"{where}: dtype is {shown(dtype)}, expected a string such as 'BF16'")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_RANK
        or not all(_is_int(d) and d >= 0 for d in shape)
    ):
        raise _error(
            path, f"{where}: shape is {shown(shape)}, expected a list of non-negative integers"
        )
    count = _elements(path, where, shape)
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_int, offsets)):
        raise _error(
            path, f"{where}: data_offsets is {shown(offsets)}, expected two integers [start, end]"
        )
    start, end = offsets
    if not 0 <= start <= end:
        raise _error(path, f"{where}: data_offsets {shown(offsets)} do not make a byte range")
    if end > data_len:
        raise _error(
            path,
            f"{where}: data_offsets {shown(offsets)} run past the end of the file "
            f"({data_len:,} bytes of data)",
        )
    dims = tuple(shape)
    bits = DTYPE_BITS.get(dtype)
    if bits is not None:
        need = count * bits
        if need % 8 or need // 8 != end - start:
            raise _error(
                path,
                f"{where}: {dtype} {shown(shape)} takes {_bytes_of_bits(need)} bytes but "
                f"data_offsets span {end - start:,}",
            )
    return TensorInfo(name, dtype, dims, path.name, end - start), start


def _elements(path: Path, where: str, shape: list[int]) -> int:
    """The element count of ``shape`` (non-negative integers), refused when a dimension
    or the count is over :data:`MAX_ELEMENTS`: no product grows past it, and no error
    shows a number longer than a 64-bit one."""
    for i, d in enumerate(shape):
        if d > MAX_ELEMENTS:
            raise _error(
                path,
                f"{where}: dimension {i} of its shape is a {len(str(d)):,}-digit number; "
                f"safetensors sizes are unsigned 64-bit (at most 2^64 - 1)",
            )
    if 0 in shape:
        return 0
    count = 1
    for d in shape:
        count *= d
        if count > MAX_ELEMENTS:
            raise _error(
                path,
                f"{where}: shape {shown(shape)} holds over 2^64 - 1 elements, more than a "
                "safetensors size counts",
            )
    return count


def _bytes_of_bits(bits: int) -> str:
    """``bits`` in bytes, exactly: ``"2,048"``, ``"2.5"``, ``"0.125"`` (no float rounds it)."""
    whole, part = divmod(bits, 8)
    return f"{whole:,}" + (f".{part * 125:03d}".rstrip("0") if part else "")


def _tensor_fast(
    file: str, name: str, entry: Any, data_len: int, dtypes: dict[str, int | None]
) -> tuple[TensorInfo, int] | None:
    """:func:`_tensor` for an entry that passes every one of its checks, without building
    a message; ``None`` for any other entry, which :func:`_tensor` then reads and names.
    ``dtypes``: the dtype strings already found valid, with their bits."""
    if type(entry) is not dict:
        return None
    dtype = entry.get("dtype")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if type(shape) is not list or type(offsets) is not list or len(offsets) != 2:
        return None
    if not isinstance(dtype, str) or (bits := dtypes.get(dtype, 0)) == 0:
        return None  # a dtype not met yet (or not a string): the full check decides
    if len(shape) > MAX_RANK:
        return None
    count = 1
    for d in shape:
        if type(d) is not int or d < 0 or d > MAX_ELEMENTS:
            return None
        count *= d
    if count > MAX_ELEMENTS:
        return None
    start, end = offsets
    if type(start) is not int or type(end) is not int or not 0 <= start <= end <= data_len:
        return None
    if bits is not None and count * bits != (end - start) * 8:
        return None
    return TensorInfo(name, dtype, tuple(shape), file, end - start), start


def _header_tensors(
    path: Path, watch: _Watch | None = None, limit: int | None = None
) -> tuple[dict[str, Any], list[TensorInfo], int, int]:
    """The header, its tensors checked (in header order), the file's size and the
    header's length. ``watch`` is polled every :data:`POLL_EVERY` tensors (its ``done``
    counts this header's bytes in proportion); ``limit`` is what the folder's bound
    leaves for this header."""
    header, data_len, size = _raw_header(path, limit)
    tensors: list[TensorInfo] = []
    starts: list[tuple[int, int, str]] = []
    dtypes: dict[str, int | None] = {}
    file = path.name
    header_len = size - 8 - data_len
    before = watch.done if watch is not None else 0
    entries = len(header)
    for i, (name, entry) in enumerate(header.items()):
        if watch is not None and i % POLL_EVERY == 0 and i:
            watch.poll(before + header_len * i // entries)
        if name == "__metadata__":
            if not isinstance(entry, dict):
                raise _error(path, f"__metadata__ is {shown(entry)}, expected an object")
            continue
        found = _tensor_fast(file, name, entry, data_len, dtypes)
        if found is None:
            found = _tensor(path, name, entry, data_len)
            dtype = found[0].dtype
            dtypes[dtype] = DTYPE_BITS.get(dtype)
        tensor, start = found
        tensors.append(tensor)
        if tensor.nbytes:
            starts.append((start, start + tensor.nbytes, name))
    starts.sort()
    for (_, end_a, a), (start_b, _, b) in itertools.pairwise(starts):
        if start_b < end_a:
            raise _error(path, f"tensors {shown(a)} and {shown(b)} overlap in the data")
    return header, tensors, size, header_len


def read_safetensors_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON header of the safetensors file ``path``, checked; no tensor data is read.

    The 8-byte length must fit the file and :data:`MAX_HEADER_BYTES`; the header must be
    UTF-8 JSON, one object without repeated keys; ``__metadata__``, if there, an object;
    every other entry an object with ``dtype`` (a string), ``shape`` (non-negative
    integers) and ``data_offsets`` (``[start, end]`` inside the data, the span matching
    dtype x shape for every dtype of :data:`DTYPE_BITS`), no two tensors overlapping.
    Anything else is an :class:`EstimateError` (field ``"checkpoint"``) naming the file.
    """
    return _header_tensors(Path(path))[0]


# -- a folder -----------------------------------------------------------------------------


def _index_files(folder: Path) -> tuple[list[str], dict[str, str], int | None]:
    """The shard files ``model.safetensors.index.json`` names, its weight map, and the
    ``metadata.total_size`` it gives (``None`` if absent)."""
    index = folder / INDEX_NAME
    data = parse_json(read_text(index, FIELD, MAX_INDEX_BYTES), FIELD, INDEX_NAME)
    if not isinstance(data, dict) or not isinstance(data.get("weight_map"), dict):
        raise EstimateError(FIELD, f"{INDEX_NAME}: expected an object with a weight_map object")
    weight_map: dict[str, str] = {}
    for name, file in data["weight_map"].items():
        if (
            not isinstance(file, str)
            or not file
            or file in (".", "..")
            or "/" in file
            or "\\" in file
            or not file.isprintable()
        ):
            raise EstimateError(
                FIELD,
                f"{INDEX_NAME}: weight_map[{shown(name)}] is {shown(file)}, "
                "expected a file name in the folder",
            )
        weight_map[name] = file
    meta = data.get("metadata")
    total = meta.get("total_size") if isinstance(meta, dict) else None
    return sorted(set(weight_map.values())), weight_map, total if _is_int(total) else None


def has_weights(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` holds a ``*.safetensors`` file (a model cached or saved with its
    config alone has none); an unreadable folder is left to :func:`read_checkpoint`."""
    try:
        with os.scandir(folder) as it:
            return any(e.name.endswith(".safetensors") for e in it)
    except OSError:
        return True


def _folder_files(folder: Path) -> list[str]:
    try:
        with os.scandir(folder) as it:
            names = sorted(e.name for e in it)
    except OSError as exc:
        raise EstimateError(FIELD, f"cannot read {folder}: {exc.strerror or exc}") from exc
    found = [n for n in names if n.endswith(".safetensors")]
    if not found:
        pickled = [n for n in names if n.endswith((".bin", ".pt", ".pth", ".ckpt"))]
        also = f" ({', '.join(pickled[:3])} not read: only safetensors are)" if pickled else ""
        raise EstimateError(FIELD, f"{folder.name or folder}: no *.safetensors files{also}")
    return found


def _quant_config(cfg: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if cfg is None:
        return {}
    inner = cfg.get("text_config")
    q = cfg.get("quantization_config")
    if q is None and isinstance(inner, Mapping):
        q = inner.get("quantization_config")
    return q if isinstance(q, Mapping) else {}


def _config_method(q: Mapping[str, Any]) -> str | None:
    method = q.get("quant_method")
    method = method.lower() if isinstance(method, str) else ""
    if method in ("bitsandbytes", "") and (q.get("load_in_4bit") or q.get("load_in_8bit")):
        return "bnb-4bit" if q.get("load_in_4bit") else "bnb-8bit"
    return method or None


def _config_int(q: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = q.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


@dataclass
class _Tally:
    tensors: int = 0
    params: int = 0


def _classify(
    tensors: dict[str, TensorInfo], q: Mapping[str, Any], warnings: list[str]
) -> tuple[int, int, list[str], Quantization | None]:
    """The logical parameter count, its slack, the non-parameters and the quantization."""
    config_method = _config_method(q)
    bits = _config_int(q, "bits", "w_bit")
    if bits is not None and not 1 <= bits <= 32:
        warnings.append(f"config.json's quantization bits {bits} ignored; 4 assumed")
        bits = None
    qbits = bits or 4
    logical: dict[str, int] = {}
    aux: set[str] = set()
    slack = 0
    tally: dict[str, _Tally] = {}
    details: dict[str, str] = {}
    ambiguous = 0

    def count(method: str, params: int) -> None:
        t = tally.setdefault(method, _Tally())
        t.tensors += 1
        t.params += params

    per_int32 = 32 / qbits
    pad = math.ceil(per_int32) - 1
    for name, t in tensors.items():
        last = name.rsplit(".", 1)[-1]
        if last == "qweight" and t.dtype in ("I32", "U32") and len(t.shape) == 2:
            prefix = name[: -len("qweight")]
            scales = tensors.get(prefix + "scales")
            if scales is None or len(scales.shape) != 2:
                continue
            rows, cols = t.shape
            if prefix + "g_idx" in tensors or scales.shape[1] == cols:
                method = "gptq"
            elif scales.shape[1] * qbits == cols * 32:
                method = "awq"
            else:
                method = config_method if config_method in ("gptq", "awq") else "gptq"
                ambiguous += 1
            if method == "gptq":  # packed along the input: qweight is (in / 8, out)
                logical[name] = int(rows * per_int32) * cols
                slack += pad * cols
            else:  # AWQ packs along the output: qweight is (in, out / 8)
                logical[name] = rows * int(cols * per_int32)
                slack += pad * rows
            count(method, logical[name])
            aux.update(prefix + s for s in ("scales", "qzeros", "g_idx") if prefix + s in tensors)
        elif last == "weight" and t.dtype == "U8":
            state = [name + "." + s for s in BNB4_STATE if name + "." + s in tensors]
            if any(".quant_state." in s for s in state) or len(state) >= 2:
                logical[name] = 2 * t.numel
                slack += 1
                count("bnb-4bit", logical[name])
                aux.update(state)
                kind = "fp4" if name + ".quant_state.bitsandbytes__fp4" in tensors else "nf4"
                details.setdefault("bnb-4bit", kind)
        elif last == "weight" and t.dtype == "I8" and name[: -len("weight")] + "SCB" in tensors:
            prefix = name[: -len("weight")]
            count("bnb-8bit", t.numel)
            aux.update(prefix + s for s in ("SCB", "weight_format") if prefix + s in tensors)
        elif t.dtype in FP8_DTYPES:
            count("fp8", t.numel)
            details.setdefault("fp8", t.dtype)
    if "fp8" in tally:
        aux.update(n for n in tensors if n.rsplit(".", 1)[-1] in FP8_SCALES)
    if ambiguous:
        warnings.append(
            f"{ambiguous} packed weight(s) whose scales fit neither GPTQ's nor AWQ's layout; "
            "read as " + ("the config's method" if config_method in ("gptq", "awq") else "GPTQ")
        )
    if {"gptq", "awq"} & tally.keys() and bits is None:
        warnings.append("config.json does not give the quantization bits; 4 assumed")
    group = _config_int(q, "group_size", "q_group_size")
    for method in {"gptq", "awq"} & tally.keys():
        if group is not None:
            details[method] = f"group size {group}"
    buffers = [
        n
        for n, t in tensors.items()
        if n not in aux
        and (
            n.endswith((".inv_freq", ".masked_bias"))
            or n.rsplit(".", 1)[-1] == "position_ids"
            or (n.endswith(".attn.bias") and len(t.shape) == 4)  # GPT-2's causal mask
        )
    ]
    skip = aux | set(buffers)
    total = sum(logical.get(n, t.numel) for n, t in tensors.items() if n not in skip)
    quant = _quantization(tally, details, qbits, config_method)
    if quant is None and config_method is not None:
        warnings.append(
            f"config.json declares quantization {shown(config_method)} but no tensor is "
            "stored in a format this reader unpacks; parameters are counted as stored"
        )
    elif quant is not None and quant.confirmed is False:
        warnings.append(
            f"config.json declares quantization {shown(config_method)} but the tensors "
            f"are {quant.method}"
        )
    return total, slack, sorted(skip), quant


def _quantization(
    tally: dict[str, _Tally], details: dict[str, str], qbits: int, config_method: str | None
) -> Quantization | None:
    if not tally:
        return None
    order = sorted(tally, key=lambda m: -tally[m].params)
    widths = {"gptq": qbits, "awq": qbits, "bnb-4bit": 4, "bnb-8bit": 8, "fp8": 8}
    bit_set = {widths[m] for m in order}
    detail = [details[m] for m in order if m in details]
    if config_method in METHODS:
        confirmed: bool | None = config_method in order
    else:
        confirmed = None
    return Quantization(
        method="+".join(order),
        bits=bit_set.pop() if len(bit_set) == 1 else None,
        detail=", ".join(detail),
        quantized_tensors=sum(t.tensors for t in tally.values()),
        quantized_parameters=sum(t.params for t in tally.values()),
        config_method=config_method,
        confirmed=confirmed,
    )


def _present(path: Path, repository: str | None) -> bool:
    """Whether the folder's file ``path`` is there to be read. In a snapshot of the hub
    cache (``repository``: the real path of its model folder) by the cache's own rule,
    :func:`memfit.engine.hub_cache.held`: a link is followed only inside the model; elsewhere any
    entry is (a dangling link then fails with its reason when read)."""
    if repository is None:
        return os.path.lexists(path)
    return held(path, repository) is not None


def _read_config(
    folder: Path, warnings: list[str], repository: str | None
) -> Mapping[str, Any] | None:
    path = folder / "config.json"
    if not _present(path, repository):
        if os.path.lexists(path):
            warnings.append(f"config.json not read for its quantization_config ({NOT_HELD})")
        return None
    try:
        cfg = read_json(path, FIELD)
    except EstimateError as exc:
        warnings.append(f"config.json not read for its quantization_config ({exc.detail})")
        return None
    return cfg if isinstance(cfg, Mapping) else None


def _read_checkpoint(
    folder: Path,
    cfg: Mapping[str, Any] | None,
    warnings: list[str] | None = None,
    repository: str | None = None,
    watch: _Watch | None = None,
) -> CheckpointInfo:
    if not _is_folder(folder):
        raise EstimateError(FIELD, f"{folder} is not a folder")
    warnings = [] if warnings is None else warnings
    watch = watch or _Watch(None, None)
    weight_map: dict[str, str] | None = None
    index_total: int | None = None
    if _present(folder / INDEX_NAME, repository):
        files, weight_map, index_total = _index_files(folder)
    else:
        if os.path.lexists(folder / INDEX_NAME):
            warnings.append(f"{INDEX_NAME}: {NOT_HELD}; the folder's *.safetensors files are read")
        files = _folder_files(folder)
    if len(files) > MAX_FILES:
        raise EstimateError(
            FIELD,
            f"{folder.name or folder}: {len(files):,} safetensors files; over {MAX_FILES:,} "
            "are refused (the largest checkpoints have a few hundred)",
        )
    # first every header's length: the total for progress, and the folder's bound
    # checked before any header is parsed
    for file in files:
        watch.check()
        path = folder / file
        if not _present(path, repository):
            if weight_map is None:
                raise _error(path, NOT_HELD)
            why = NOT_HELD if repository is not None else "which is not in the folder"
            raise EstimateError(FIELD, f"{INDEX_NAME} names {file}, {why}")
        watch.total += _claimed_length(path)
        if watch.total > MAX_FOLDER_HEADER_BYTES:
            raise _folder_bound(path)
    by_name: dict[str, TensorInfo] = {}
    file_bytes = read = 0
    for file in files:
        path = folder / file
        watch.poll(read)
        _, tensors, size, length = _header_tensors(path, watch, MAX_FOLDER_HEADER_BYTES - read)
        file_bytes += size
        read += length
        for t in tensors:
            other = by_name.get(t.name)
            if other is not None:
                raise _error(path, f"tensor {shown(t.name)} is also in {other.file}")
            by_name[t.name] = t
    watch.poll(watch.total)
    if weight_map is not None:
        absent = [(n, f) for n, f in weight_map.items() if n not in by_name]
        if absent:
            n, f = absent[0]
            raise EstimateError(
                FIELD,
                f"{INDEX_NAME} lists {len(absent):,} tensor(s) not in their file "
                f"(first: {shown(n)} in {f})",
            )
        moved = [t.name for t in by_name.values() if weight_map.get(t.name) != t.file]
        if moved:
            warnings.append(
                f"{len(moved):,} tensor(s) not where {INDEX_NAME} says (first: {moved[0]})"
            )
    tensors_all = tuple(by_name.values())
    total_bytes = sum(t.nbytes for t in tensors_all)
    if index_total is not None and index_total != total_bytes:
        warnings.append(
            f"{INDEX_NAME} gives total_size {index_total:,} but the tensors take {total_bytes:,}"
        )
    if not tensors_all:
        warnings.append("the checkpoint holds no tensors")
    tally: dict[str, list[int]] = {}  # dtype -> [tensors, elements, bytes]
    for t in tensors_all:
        counts = tally.get(t.dtype)
        if counts is None:
            counts = tally[t.dtype] = [0, 0, 0]
            if t.dtype not in DTYPE_BITS:
                warnings.append(f"dtype {shown(t.dtype)} is not a safetensors dtype MemFit knows")
        counts[0] += 1
        counts[1] += t.numel
        counts[2] += t.nbytes
    stats = [DtypeStats(dtype, *counts) for dtype, counts in tally.items()]
    logical, slack, not_params, quant = _classify(by_name, _quant_config(cfg), warnings)
    return CheckpointInfo(
        folder=folder,
        files=tuple(files),
        tensors=tensors_all,
        by_dtype=tuple(sorted(stats, key=lambda s: (-s.bytes, s.dtype))),
        total_bytes=total_bytes,
        file_bytes=file_bytes,
        raw_elements=sum(s.elements for s in stats),
        logical_parameters=logical,
        logical_slack=slack,
        not_parameters=tuple(not_params),
        quantization=quant,
        warnings=tuple(warnings),
    )


def read_checkpoint(
    folder: str | os.PathLike[str],
    *,
    progress: Progress | None = None,
    cancelled: Cancelled | None = None,
) -> CheckpointInfo:
    """Every tensor of the safetensors checkpoint in ``folder``, counted and classified.

    The files are those ``model.safetensors.index.json`` maps tensors to when it exists
    (each must be there and hold the tensors listed for it), else every ``*.safetensors``
    in the folder, at most :data:`MAX_FILES` of them. Each header is checked as
    :func:`read_safetensors_header` checks it; together they may hold at most
    :data:`MAX_FOLDER_HEADER_BYTES`, checked from their lengths before any is parsed; a
    tensor in two files is an error. ``config.json``'s ``quantization_config``, if there,
    confirms the quantization found and gives GPTQ's and AWQ's bits (4 if not given).

    ``progress(done, total)`` is told the bytes of headers read, from ``(0, total)`` to
    ``(total, total)``; ``cancelled()`` is asked between files and every
    :data:`POLL_EVERY` tensors, and a true answer stops the reading with
    :class:`ReadCancelled`.
    """
    folder = Path(folder)
    warnings: list[str] = []
    repository = _repository(folder)
    cfg = _read_config(folder, warnings, repository) if _is_folder(folder) else None
    watch = _Watch(progress, cancelled)
    return _read_checkpoint(folder, cfg, warnings, repository, watch)


def _repository(folder: Path) -> str | None:
    """The real path of the model folder when ``folder`` is a snapshot of the hub cache."""
    found = snapshot_of(folder)
    return found[1] if found is not None else None


def _is_folder(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


# -- the model beside it ------------------------------------------------------------------


def folder_model_name(folder: Path) -> str:
    """``org/name`` for a snapshot of the hub cache, else the folder's name."""
    found = snapshot_of(folder)
    return found[0] if found is not None else Path(os.path.abspath(folder)).name or "model"


def model_config(folder: str | os.PathLike[str]) -> Mapping[str, Any]:
    """The JSON object of the model folder's ``config.json``; in a snapshot of the hub
    cache, read only by the cache's rule (:func:`memfit.engine.hub_cache.held`). Any problem is
    an :class:`EstimateError` for the field ``"model"``."""
    folder = Path(folder)
    path = folder / "config.json"
    if not _is_folder(folder):
        raise EstimateError("model", f"{folder} is not a folder")
    repository = _repository(folder)
    if repository is not None and not _present(path, repository):
        raise EstimateError("model", f"{folder_model_name(folder)}: config.json: {NOT_HELD}")
    if not os.path.lexists(path):
        raise EstimateError("model", f"{folder.name or folder} has no config.json")
    cfg = read_json(path, "model")
    if not isinstance(cfg, Mapping):
        raise EstimateError("model", f"config.json is a JSON {type(cfg).__name__}, not an object")
    return cfg


def model_from_folder(
    folder: str | os.PathLike[str],
    read_as: str | None = None,
    name: str | None = None,
    *,
    progress: Progress | None = None,
    cancelled: Cancelled | None = None,
) -> tuple[ModelSpec, CheckpointInfo]:
    """The :class:`ModelSpec` of ``folder``'s ``config.json`` and its checkpoint's
    :class:`CheckpointInfo`.

    The config is read by :func:`memfit.engine.hf_config.model_from_hf_config`, with ``read_as``
    passed on when given. ``name`` defaults to ``org/name`` for a hub-cache snapshot and
    to the folder's name otherwise. A missing or unreadable config is an
    :class:`EstimateError` for the field ``"model"``; checkpoint problems are for
    ``"checkpoint"``. ``progress`` and ``cancelled``: as :func:`read_checkpoint` takes
    them.
    """
    folder = Path(folder)
    cfg = model_config(folder)
    label = name or folder_model_name(folder)
    reader: Callable[..., ModelSpec] = model_from_hf_config
    if read_as is None:
        spec = reader(cfg, label)
    elif "read_as" in inspect.signature(reader).parameters:
        spec = reader(cfg, label, read_as=read_as)
    else:
        raise EstimateError("read_as", "the config reader of this version does not take read_as")
    watch = _Watch(progress, cancelled)
    return spec, _read_checkpoint(folder, cfg, repository=_repository(folder), watch=watch)


def _tied_head(info: CheckpointInfo) -> TensorInfo | None:
    """A head stored beside an embedding of its shape (a tied model saved with both)."""
    shapes = {t.shape for t in info.tensors if t.name.endswith(_EMBEDDINGS)}
    for t in info.tensors:
        if t.name.endswith(_HEADS) and t.shape in shapes and t.name not in info.not_parameters:
            return t
    return None


def compare(model: ModelSpec, info: CheckpointInfo, tolerance: float = 0.0) -> Comparison:
    """The engine's parameter count of ``model`` beside ``info``'s logical count.

    A tied model whose checkpoint stores the head beside the embedding counts that matrix
    once, as the engine does. ``mismatch`` is set when the checkpoint's count exceeds the
    engine's by more than :attr:`CheckpointInfo.logical_slack`, or falls short of it at
    all, unless the relative difference is within ``tolerance`` (0.01 is 1 %).
    """
    engine = count_parameters(model).total
    ckpt = info.logical_parameters
    notes: list[str] = []
    if model.tie_word_embeddings:
        head = _tied_head(info)
        if head is not None:
            ckpt -= head.numel
            notes.append(f"{head.name} is stored beside the tied embedding; counted once")
    diff = ckpt - engine
    rel = diff / engine if engine else (0.0 if diff == 0 else math.inf)
    mismatch = not (0 <= diff <= info.logical_slack or abs(rel) <= tolerance)
    matrix = model.vocab_size * model.hidden_size
    if mismatch and diff == -matrix and not model.tie_word_embeddings:
        notes.append(
            "the checkpoint has one vocabulary x hidden matrix fewer: "
            "it may tie its embeddings (tie_word_embeddings)"
        )
    elif mismatch and diff == matrix and model.tie_word_embeddings:
        notes.append(
            "the checkpoint has one vocabulary x hidden matrix more: "
            "its head may not be tied (tie_word_embeddings)"
        )
    if info.quantization is not None:
        notes.append(f"{info.quantization.method} weights counted unpacked")
    return Comparison(engine, ckpt, diff, rel, mismatch, tuple(notes))

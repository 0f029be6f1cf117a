"""Reading and writing the user's files safely: bounded reads, editor-like saves.

Everything MemFit reads from disk -- scenario files, Hugging Face ``config.json``, the
autosave -- goes through :func:`read_text`; everything it writes -- scenarios, data
exports, chart images -- through :func:`write_text` or :func:`write_bytes`.

Reading:

* only a regular file is read: a FIFO, a device (``/dev/zero``), a socket or a directory
  is refused at once, without blocking (the file is opened ``O_NONBLOCK`` and checked with
  ``fstat`` on the open descriptor, so a file swapped in between cannot slip through);
* at most :data:`MAX_READ_BYTES` are read; a larger file is refused with its size named;
* the text is UTF-8, with or without a byte-order mark;
* a file that one file names (a DeepSpeed config named by a training config, a model's
  files in the hub cache) is read only where :func:`resolves_inside` its folder.

Writing is what an editor does on save:

* a symbolic link is followed to its target, which is replaced (the link stays a link);
* a target that exists and is not a regular file is refused, and so is a read-only one
  (no write permission bit, or not writable by the user): it is not replaced behind the
  user's back, as editors refuse it;
* the new file keeps the old file's permission bits; a new file gets the user's default
  (``0o666`` minus the umask), never the ``0o600`` of a temporary file;
* the bytes go to a temporary file beside the target, which is flushed to disk and renamed
  over the target, so a crash leaves the old file or the new one, never half of one; the
  temporary file is removed on any failure, and one a killed save left behind
  (``.<name>.<8 random characters>.tmp``, a regular file of the user's, over
  :data:`STALE_TEMP_S` old) is removed by the next save of the same target;
* every error names the target.

>>> import tempfile, pathlib
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> write_text(folder / "a.json", "{}").name
'a.json'
>>> read_text(folder / "a.json")
'{}'
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

from memfit.engine.errors import EstimateError, shown

#: The largest file MemFit reads: a scenario or a ``config.json`` is a few KiB.
MAX_READ_BYTES = 4 << 20
#: The deepest nesting of objects and lists a file MemFit reads may have: a scenario, a
#: ``config.json`` or a training config nests a few levels, never dozens
MAX_DEPTH = 32

PathLike = str | os.PathLike[str]

#: A temporary file of a save older than this (seconds) is left over from a killed save;
#: a younger one may belong to a save under way in another process.
STALE_TEMP_S = 60.0
#: the random part of a name :func:`tempfile.mkstemp` makes
_TEMP_RANDOM = re.compile(r"[a-z0-9_]{8}")
_WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class FileRefused(OSError):
    """A file MemFit will not write; the message names the target and why."""


def _kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def is_within(real: str, folder: str) -> bool:
    """Whether the resolved path ``real`` is the resolved folder ``folder`` or lies inside
    it (both as :func:`os.path.realpath` gives them: compare real paths, never names)."""
    try:
        return os.path.commonpath([real, folder]) == folder
    except ValueError:  # one relative, one absolute; different drives
        return False


#: the flag that lets a config name files outside its folder (:func:`resolves_inside`), as
#: the command line takes it and the notes name it
ALLOW_FLAG = "--allow-outside-paths"


def resolves_inside(path: PathLike, folder: PathLike) -> bool:
    """Whether ``path``, with every symbolic link on the way followed, is inside
    ``folder`` (its links followed too): ``../`` and a link out of the folder are not,
    whatever the names say; a path that cannot be resolved is not inside."""
    try:
        return is_within(os.path.realpath(path), os.path.realpath(folder))
    except (OSError, ValueError):
        return False


def read_bytes(path: PathLike, field: str = "scenario", limit: int = MAX_READ_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; any problem is an
    :class:`EstimateError` for ``field`` that names the file."""
    name = Path(path).name or os.fspath(path)
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise EstimateError(field, f"cannot read {name}: {exc.strerror or exc}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise EstimateError(field, f"{name} is {_kind(info.st_mode)}, not a regular file")
        if info.st_size > limit:
            raise EstimateError(
                field, f"{name} is {info.st_size:,} bytes; files over {limit:,} bytes are refused"
            )
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # it grew while being read
            raise EstimateError(field, f"{name} is over {limit:,} bytes; refused")
        return b"".join(chunks)
    except OSError as exc:
        raise EstimateError(field, f"cannot read {name}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)


def read_text(path: PathLike, field: str = "scenario", limit: int = MAX_READ_BYTES) -> str:
    """:func:`read_bytes` decoded as UTF-8; a leading byte-order mark is dropped."""
    data = read_bytes(path, field, limit)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise EstimateError(
            field, f"{Path(path).name} is not UTF-8 text (byte {exc.start:,})"
        ) from exc


class NotJson(EstimateError):
    """Text that is not JSON at all (its syntax); what is JSON but refused -- nested too
    deeply, a duplicate key, an integer of over 4,300 digits -- is a plain
    :class:`EstimateError`."""


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


#: a JSON string (a key when a colon follows), or a bracket
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"(\s*:)?|[{}\[\]]')


def _first_duplicate(text: str) -> tuple[str, int] | None:
    """The first key of ``text`` that repeats a key of its own object, and its line; read
    only once the parser found a duplicate, and without recursion."""
    objects: list[set[str] | None] = []
    for match in _JSON_TOKENS.finditer(text):
        token = match.group()
        if token in "{[":
            objects.append(set() if token == "{" else None)
        elif token in "}]":
            if objects:
                objects.pop()
        elif match.group(1) and objects and objects[-1] is not None:
            key = json.loads(match.group()[: -len(match.group(1))])  # one string: flat
            if key in objects[-1]:
                return key, text.count("\n", 0, match.start()) + 1
            objects[-1].add(key)
    return None


def _depth(data: Any) -> int:
    """How deeply objects and lists nest in ``data`` (a scalar: 0, ``[1]``: 1), counted
    without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, level)
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, level + 1) for child in children)
    return deepest


def parse_json(text: str, field: str = "scenario", name: str = "the text") -> Any:
    """``json.loads`` whose every failure is an :class:`EstimateError`: bad syntax
    (:class:`NotJson`), a key twice in one object (two values for one setting: which is
    meant?), nesting deeper than :data:`MAX_DEPTH` (or than Python's recursion allows),
    integers over Python's digit limit. Every JSON text a user gives is read here.

    >>> try:
    ...     parse_json('{"a": 1,\\n "a": 2}')
    ... except EstimateError as exc:
    ...     print(exc.detail)
    the text is not valid JSON (line 2: the key 'a' appears twice)
    """
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise NotJson(
            field, f"{name} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from exc
    except _DuplicateKey as exc:
        found = _first_duplicate(text)
        key, where = (found[0], f"line {found[1]}: ") if found else (exc.key, "")
        raise EstimateError(
            field, f"{name} is not valid JSON ({where}the key {shown(key)} appears twice)"
        ) from None
    except RecursionError as exc:
        raise EstimateError(field, _too_deep(name)) from exc
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise EstimateError(field, f"{name} is not valid JSON: {exc}") from exc
    if _depth(data) > MAX_DEPTH:
        raise EstimateError(field, _too_deep(name))
    return data


def _too_deep(name: str) -> str:
    return f"{name} is nested too deeply (more than {MAX_DEPTH} levels of objects and lists)"


def read_json(path: PathLike, field: str = "scenario") -> Any:
    """The parsed JSON of the file ``path`` (see :func:`read_text` and :func:`parse_json`)."""
    return parse_json(read_text(path, field), field, Path(path).name)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_target(path: PathLike) -> tuple[Path, int]:
    """Where a save of ``path`` writes, with symbolic links followed, and the permission
    bits the new file gets; a target that exists but is not a regular file, or is
    read-only, is refused."""
    target = Path(os.path.realpath(os.fspath(path)))
    try:
        info = target.stat()
    except FileNotFoundError:
        return target, 0o666 & ~_umask()
    except OSError as exc:
        raise FileRefused(exc.errno or errno.EIO, f"cannot write {target}: {exc.strerror}") from exc
    if not stat.S_ISREG(info.st_mode):
        raise FileRefused(
            errno.EINVAL, f"cannot write {target}: it is {_kind(info.st_mode)}, not a file"
        )
    mode = stat.S_IMODE(info.st_mode)
    # the bits, not only access(): the superuser may write anything, yet 0444 says "keep"
    if not mode & _WRITE_BITS or not os.access(target, os.W_OK):
        raise FileRefused(
            errno.EACCES,
            f"cannot write {target}: it is read-only (save under another name, or make it "
            "writable first)",
        )
    return target, mode


def remove_stale_temps(target: Path) -> list[Path]:
    """Remove the temporary files that killed saves of ``target`` left beside it (see the
    module docstring); returns those removed. Anything else -- another name, a link, a
    folder, another user's file, a save under way -- is kept."""
    prefix, suffix = f".{target.name}.", ".tmp"
    uid = os.getuid() if hasattr(os, "getuid") else None
    removed: list[Path] = []
    try:
        entries = [e for e in os.scandir(target.parent) if e.name.startswith(prefix)]
    except OSError:
        return removed
    for entry in entries:
        middle = entry.name[len(prefix) : -len(suffix)]
        if not (entry.name.endswith(suffix) and _TEMP_RANDOM.fullmatch(middle)):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if (
                stat.S_ISREG(info.st_mode)
                and (uid is None or info.st_uid == uid)
                and time.time() - info.st_mtime > STALE_TEMP_S
            ):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            continue
    return removed


def write_bytes(path: PathLike, data: bytes) -> Path:
    """Save ``data`` to ``path`` as an editor would (see the module docstring); returns the
    file written (the target of a symbolic link)."""
    target, mode = save_target(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise FileRefused(
            exc.errno or errno.EIO, f"cannot write {target}: {exc.strerror or exc}"
        ) from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
            os.fchmod(handle.fileno(), mode)
        os.replace(tmp, target)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, FileRefused):
            raise FileRefused(
                exc.errno or errno.EIO, f"cannot write {target}: {exc.strerror or exc}"
            ) from exc
        raise
    remove_stale_temps(target)
    return target


def write_text(path: PathLike, text: str) -> Path:
    """:func:`write_bytes` of ``text`` in UTF-8."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise FileRefused(
            errno.EINVAL, f"cannot write {os.fspath(path)}: the text is not valid Unicode"
        ) from exc
    return write_bytes(path, data)

"""What survives a restart -- the recovery files and the settings file -- and never stops one.

* :class:`RecoveryFile`, :func:`recover` -- each window's own recovery file,
  ``recovery/<id>.memfit.json`` in the app's data folder, locked (a ``QLockFile`` beside
  it, ``.lock``) while its window lives: the working scenario, the document's path and
  whether it has unsaved changes, written at the first change of a burst and a moment
  after the last one, so that a crash or a ``kill -9`` loses nothing::

      {"memfit_autosave": 1, "path": "/home/me/run.memfit.json", "modified": true,
       "scenario": {"memfit_scenario": 1, ...}}

  A window that closes removes its file (the document was saved or its changes
  discarded). A start claims every *orphan* -- a recovery file whose owner is no longer
  running -- and restores the newest one with unsaved changes; the others are kept and
  offered, never dropped: several instances never share a file, and none removes
  another's. ``"scenario": null`` means "the file at ``path`` as it is on disk". The
  single ``last.memfit.json`` of earlier versions is read once: it moves into the folder
  as an orphan. A plain scenario file, the format before that one, is read too.
  Whatever is wrong with a file -- a FIFO, a device, too big, not JSON, a scenario the
  engine refuses -- gives a message saying what was not restored; a regular file that
  could not be read is kept beside it as ``*.unreadable``.
* :func:`open_settings` -- the settings file, checked before ``QSettings`` opens it
  (``QSettings`` would block on a FIFO and read a device or a huge file whole): a file
  that is not a regular one, too big or unreadable gives :class:`MemorySettings`, which
  keeps the settings for this session only, and a message saying so.
* :func:`put_setting`, :func:`seal_settings`, :func:`lost_settings` -- a damaged settings
  file never loses a preference silently. ``QSettings`` drops every line it cannot parse
  and takes the last of keys given twice, without a word; so the file carries a check
  (``written``, the first line: each key the app wrote with a CRC-32 of its value), and a
  start names every setting that is missing or differs from what was written. Without a
  readable check (a file of an earlier version, or the check line itself damaged), every
  setting is expected, and those missing are named.

Reads go through :func:`memfit.engine.files.read_json`, which never blocks.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import time
import uuid
import zlib
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QLockFile, QSettings, QStandardPaths

from memfit.engine.errors import EstimateError
from memfit.engine.files import read_json, write_text
from memfit.engine.scenario_io import load_scenario, scenario_from_dict, scenario_to_dict
from memfit.engine.specs import Scenario
from memfit.gui.store import default_scenario

AUTOSAVE_KEY = "memfit_autosave"
AUTOSAVE_VERSION = 1
#: the recovery files' folder in the data folder, and how their names end
RECOVERY_FOLDER = "recovery"
RECOVERY_SUFFIX = ".memfit.json"
#: the one recovery file of earlier versions, in the data folder: read once
LEGACY_NAME = "last.memfit.json"
#: a lock file that says no owner and is older than this (seconds) is left over, not one
#: being written
LOCK_WRITE_S = 10.0
#: a settings file is a few KiB; a bigger one is not read
SETTINGS_LIMIT = 1 << 20
#: every setting the app keeps, in the words a notice names it by
SETTING_NAMES = {
    "view/theme": "the colours",
    "window/geometry": "the window's size and place",
    "window/splitter": "the width of the left column",
    "view/table": "whether Breakdown Details show",
    "view/conventions": "whether Conventions is unfolded",
    "view/baseline": "the pinned baseline",
    "document/recent": "the recent files",
    "document/last": "the document to reopen",
}
#: the settings file's check: ``key:crc32 key:crc32 ...`` of the settings written
CHECK_KEY = "written"
_CHECK = re.compile(r"[a-z]+/[a-z]+:[0-9a-f]{8}(?: [a-z]+/[a-z]+:[0-9a-f]{8})*")
ORG_NAME = "MemFit"
APP_NAME = "MemFit"


def data_location() -> Path:
    """The app's data folder: the recovery files live in its ``recovery`` folder."""
    base = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation)
    return Path(base or Path.home() / ".memfit")


def settings_location() -> Path:
    """The settings file: ``MemFit/MemFit.conf`` in the user's configuration folder."""
    base = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.GenericConfigLocation)
    return Path(base or Path.home() / ".config") / ORG_NAME / f"{APP_NAME}.conf"


@dataclass(frozen=True, slots=True)
class Session:
    """The document to start with, and what to tell the user about it (``""``: nothing)."""

    scenario: Scenario
    path: Path | None = None
    modified: bool = False
    message: str = ""

    @property
    def name(self) -> str:
        """The document's file name, or "the untitled scenario"."""
        return self.path.name if self.path else "the untitled scenario"


def autosave_text(scenario: Scenario | None, path: Path | None, modified: bool) -> str:
    """The recovery file's text; ``scenario`` ``None``: the file at ``path`` as saved."""
    data = {
        AUTOSAVE_KEY: AUTOSAVE_VERSION,
        "path": str(path) if path is not None else None,
        "modified": modified,
        "scenario": scenario_to_dict(scenario) if scenario is not None else None,
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


class SessionError(Exception):
    """The recovery file's content cannot be used; the message says why."""


def _restore(file: Path) -> Session | str | None:
    """The session in the recovery file ``file``, ``None`` when there is none, or why it
    cannot be restored (a regular file is then kept as ``*.unreadable``, and the reason
    says so). Never raises."""
    if not os.path.lexists(file):
        return None
    try:
        data = read_json(file, field="recovery file")
    except Exception as exc:  # unreadable, a FIFO, too big, not JSON: start afresh
        reason = exc.detail if isinstance(exc, EstimateError) else _reason(exc)
        return reason + _set_aside(file)
    try:
        return _session(data)
    except Exception as exc:  # the engine refuses what it holds; its checks grow stricter
        return _reason(exc) + _set_aside(file)


def _session(data: Any) -> Session:
    if not (isinstance(data, dict) and AUTOSAVE_KEY in data):
        # a plain scenario: what the app autosaved on close before it kept the document
        scenario = scenario_from_dict(data)
        return Session(scenario, None, True, "recovered the scenario of the last session")
    if data[AUTOSAVE_KEY] != AUTOSAVE_VERSION:
        raise SessionError(f"{AUTOSAVE_KEY} is {data[AUTOSAVE_KEY]!r}, expected 1")
    raw_path, modified, raw = data.get("path"), data.get("modified", False), data.get("scenario")
    if raw_path is not None and not (isinstance(raw_path, str) and raw_path):
        raise SessionError(f"path is {raw_path!r}, expected a file name or null")
    if not isinstance(modified, bool):
        raise SessionError(f"modified is {modified!r}, expected true or false")
    path = Path(raw_path) if raw_path else None
    if raw is None:
        return reopen(path) if path is not None else Session(default_scenario())
    session = Session(scenario_from_dict(raw), path, modified)
    if modified:
        return replace(session, message=f"recovered unsaved changes to {session.name}")
    return session


def reopen(path: Path) -> Session:
    """The scenario file ``path`` as it is on disk (the document of the last session);
    the default scenario and a message when it cannot be opened."""
    try:
        return Session(load_scenario(path), path, False)
    except Exception as exc:
        return _fresh(f"could not reopen {path.name}: {_reason(exc)}")


def _reason(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


def _fresh(message: str) -> Session:
    return Session(default_scenario(), None, False, f"{message}; started with a new scenario")


def _set_aside(autosave: Path) -> str:
    """Keep a regular recovery file that could not be restored as ``*.unreadable``, so the
    next autosave does not overwrite what it held; says where (``""``: not kept)."""
    kept = autosave.with_name(autosave.name + ".unreadable")
    try:
        if stat.S_ISREG(os.lstat(autosave).st_mode):
            os.replace(autosave, kept)
            return f" (kept as {kept})"
    except OSError:
        pass
    return ""


# -- one recovery file per window ------------------------------------------------------


class RecoveryFile:
    """A window's recovery file and its lock (``QLockFile``, ``<file>.lock``): held while
    the window lives, released by the operating system with its process. A file whose
    lock nobody holds is an orphan, which the next start may claim."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = QLockFile(str(path) + ".lock")
        # a lock is stale when its process is gone, never by age: a window may stay open
        # for weeks
        self._lock.setStaleLockTime(0)

    @classmethod
    def new(cls, folder: Path) -> RecoveryFile:
        """A file of a name no other window has, locked for this one."""
        with contextlib.suppress(OSError):
            folder.mkdir(parents=True, exist_ok=True)
        own = cls(folder / f"{uuid.uuid4().hex}{RECOVERY_SUFFIX}")
        own.take()
        return own

    def take(self) -> bool:
        """Lock the file for this process; ``False`` while a running process holds it. A
        lock file naming no process (damaged) and not being written counts as stale."""
        if self._lock.isLocked() or self._lock.tryLock(0):
            return True
        if self._lock.error() != QLockFile.LockError.LockFailedError:
            return False
        pid = self._lock.getLockInfo()[0]
        lock_file = Path(self._lock.fileName())
        with contextlib.suppress(OSError):
            if not pid and time.time() - lock_file.stat().st_mtime > LOCK_WRITE_S:
                self._lock.removeStaleLockFile()
                return self._lock.tryLock(0)
        return False

    @property
    def owned(self) -> bool:
        return self._lock.isLocked()

    def write(self, text: str) -> None:
        """Replace the file's content (as every save does: :func:`memfit.engine.files.write_text`);
        a file another window has claimed since (its lock lost) is left to it, and this
        window takes a new name."""
        if not self.take():
            other = RecoveryFile.new(self.path.parent)
            self.path, self._lock = other.path, other._lock
        write_text(self.path, text)

    def release(self) -> None:
        """Unlock, keeping the file: the next start offers it."""
        self._lock.unlock()

    def remove(self) -> None:
        """Delete the file (only while this window holds it, and only a regular file) and
        unlock: its window closed, or what it held is elsewhere now."""
        if self._lock.isLocked():
            with contextlib.suppress(OSError):
                if stat.S_ISREG(os.lstat(self.path).st_mode):
                    self.path.unlink()
        self._lock.unlock()

    def changed_at(self) -> float:
        """When the file was last written (seconds since the epoch; 0 if unknown)."""
        try:
            return os.lstat(self.path).st_mtime
        except OSError:
            return 0.0


def claim_orphans(folder: Path) -> list[RecoveryFile]:
    """The recovery files in ``folder`` whose owner is no longer running, locked for this
    process, newest first. A lock left without its file (an owner that died before its
    first change) is removed."""
    try:
        names = {entry.name: entry for entry in os.scandir(folder)}
    except OSError:
        return []
    found: list[RecoveryFile] = []
    for name, entry in names.items():
        if name.endswith(RECOVERY_SUFFIX) and entry.is_file(follow_symlinks=False):
            orphan = RecoveryFile(Path(entry.path))
            if orphan.take():
                found.append(orphan)
        elif name.endswith(RECOVERY_SUFFIX + ".lock") and name[: -len(".lock")] not in names:
            left = RecoveryFile(Path(entry.path[: -len(".lock")]))
            if left.take():
                left.release()
    return sorted(found, key=RecoveryFile.changed_at, reverse=True)


@dataclass
class Recovered:
    """What a start found in the recovery folder: the window's own file (an orphan it
    restored, or a new one), the session to start with (``None``: none was left), the
    other orphans with unsaved changes (claimed, offered), and what to tell the user."""

    own: RecoveryFile
    session: Session | None = None
    others: list[tuple[RecoveryFile, Session]] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)


def recover(folder: Path, legacy: Path | None = None) -> Recovered:
    """Claim the orphans of ``folder`` (and ``legacy``, the single recovery file of
    earlier versions, moved in first): the newest with unsaved changes is restored and
    becomes the window's own file, the other unsaved ones are kept and offered, and those
    with nothing unsaved are removed (their documents are on disk); the newest of these is
    the session when nothing was unsaved and it came from ``legacy``."""
    moved, problem = _migrate(legacy, folder) if legacy is not None else (None, "")
    messages = [problem] if problem else []
    unsaved: list[tuple[RecoveryFile, Session]] = []
    saved: list[tuple[RecoveryFile, Session]] = []
    for orphan in claim_orphans(folder):
        restored = _restore(orphan.path)
        if isinstance(restored, str):
            which = "the last session" if moved and orphan.path == moved.path else "a session"
            messages.append(f"could not restore {which}: {restored}")
            orphan.release()
        elif restored is None:  # gone meanwhile
            orphan.release()
        else:
            (unsaved if restored.modified else saved).append((orphan, restored))
    last: Session | None = None
    for orphan, session in saved:
        if moved is not None and orphan.path == moved.path:
            last = session  # the last session of an earlier version: its document
        orphan.remove()
    if not unsaved:
        return Recovered(RecoveryFile.new(folder), last, [], messages)
    (own, session), others = unsaved[0], unsaved[1:]
    if others:
        names = ", ".join(f"{s.name} ({_when(f)})" for f, s in others)
        messages.append(
            f"{len(others)} more unsaved session{'s' * (len(others) > 1)} kept: {names}; "
            "File > Recover Unsaved Session opens each"
        )
    return Recovered(own, session, others, [session.message, *messages])


def _when(file: RecoveryFile) -> str:
    return datetime.fromtimestamp(file.changed_at()).strftime("%Y-%m-%d %H:%M")


def _migrate(legacy: Path, folder: Path) -> tuple[RecoveryFile | None, str]:
    """Move the single recovery file of earlier versions into ``folder`` as an orphan,
    atomically (a second start finds nothing to move); something other than a regular
    file in its place stays where it is, with a message saying what it is."""
    try:
        info = os.lstat(legacy)
    except OSError:
        return None, ""
    if not stat.S_ISREG(info.st_mode):
        problem = _restore(legacy)  # read as every file is: refused without blocking
        if not isinstance(problem, str):
            return None, ""
        return None, f"could not restore the last session: {problem}"
    file = RecoveryFile.new(folder)
    try:
        os.replace(legacy, file.path)
    except OSError as exc:
        file.remove()
        return None, f"could not restore the last session: {_reason(exc)}"
    file.release()  # an orphan now, which claim_orphans takes again
    return file, ""


class MemorySettings:
    """Settings kept for this session only (the settings file could not be used); the
    subset of ``QSettings`` the app calls."""

    def __init__(self, values: dict[str, Any] | None = None) -> None:
        self._values: dict[str, Any] = dict(values or {})

    def value(self, key: str, default: Any = None) -> Any:
        return self._values.get(key, default)

    def setValue(self, key: str, value: Any) -> None:  # QSettings' name
        self._values[key] = value

    def sync(self) -> None:
        pass

    def remove(self, key: str) -> None:  # QSettings' name
        self._values.pop(key, None)

    def fileName(self) -> str:  # QSettings' name
        return ""


Settings = QSettings | MemorySettings


def settings_problem(path: Path) -> str:
    """Why ``path`` cannot be the settings file (``""``: it can): a FIFO, a device or a
    link to one, a file too big, a file that cannot be read. Never blocks."""
    try:
        info = os.stat(path)  # follows a symbolic link to what QSettings would open
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    if not stat.S_ISREG(info.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(info.st_mode) else "not a regular file"
        return f"{path} is {kind}"
    if info.st_size > SETTINGS_LIMIT:
        return f"{path} is {info.st_size:,} bytes, too big for a settings file"
    if not os.access(path, os.R_OK | os.W_OK):
        return f"{path} cannot be read and written"
    return ""


def open_settings(path: Path) -> tuple[Settings, str]:
    """The settings in ``path``, or settings in memory and a message saying why not."""
    problem = settings_problem(path)
    if problem:
        return MemorySettings(), f"settings are kept for this session only: {problem}"
    return QSettings(str(path), QSettings.Format.IniFormat), ""


def setting_words(keys: list[str]) -> str:
    """``keys`` in words, each with its key: "the colours (view/theme), ..."."""
    return ", ".join(f"{SETTING_NAMES[k]} ({k})" if k in SETTING_NAMES else k for k in keys)


def _value(settings: Settings, key: str) -> Any:
    try:
        return settings.value(key, None)
    except Exception:  # a value QSettings cannot convert
        return None


def _crc(value: Any) -> str:
    """A CRC-32 of a setting's value, the same for what was written and what an ini file
    gives back (``True`` and ``"true"``, a one-item list and its item, ``[]`` and none)."""
    if isinstance(value, QByteArray):
        data = b"bytes:" + value.data()
    elif isinstance(value, bool):
        data = b"true" if value else b"false"
    elif value is None:
        data = b""
    elif isinstance(value, list | tuple):
        data = "\x1f".join(map(str, value)).encode("utf-8", "surrogatepass")
    else:
        data = str(value).encode("utf-8", "surrogatepass")
    return f"{zlib.crc32(data):08x}"


def _checks(settings: Settings) -> dict[str, str] | None:
    """The check the settings carry, ``None`` when there is none or it is damaged."""
    text = _value(settings, CHECK_KEY)
    if not (isinstance(text, str) and _CHECK.fullmatch(text)):
        return None
    return dict(item.split(":") for item in text.split(" "))


def _put_checks(settings: Settings, checks: dict[str, str]) -> None:
    settings.setValue(CHECK_KEY, " ".join(f"{k}:{v}" for k, v in sorted(checks.items())))


def put_setting(settings: Settings, key: str, value: Any) -> None:
    """Set ``key`` and its check together (a kill after the next write finds both)."""
    settings.setValue(key, value)
    checks = _checks(settings) or {}
    checks[key] = _crc(value)
    _put_checks(settings, checks)


def seal_settings(settings: Settings) -> None:
    """Write the settings with a check of every one the file holds: another instance's
    changes, read in by the first sync, are checked as they are."""
    settings.sync()
    _put_checks(
        settings,
        {k: _crc(_value(settings, k)) for k in SETTING_NAMES if _value(settings, k) is not None},
    )
    settings.sync()


def drop_lost_settings(settings: Settings) -> list[str]:
    """:func:`lost_settings`, removed with their checks: they start afresh, in the file
    too (a value not as written is not kept for a later check to vouch for)."""
    lost = lost_settings(settings)
    if lost:
        for key in lost:
            settings.remove(key)
        checks = _checks(settings)
        if checks is not None:
            _put_checks(settings, {k: v for k, v in checks.items() if k not in lost})
    return lost


def lost_settings(settings: Settings) -> list[str]:
    """The settings the file's check names that are missing or not as written -- every
    setting missing when the check itself is missing or damaged -- in the order of
    :data:`SETTING_NAMES`. Nothing for settings in memory or a file not written yet."""
    if not isinstance(settings, QSettings):
        return []
    try:
        if not stat.S_ISREG(os.stat(settings.fileName()).st_mode):
            return []
        keys = set(settings.allKeys())
    except (OSError, ValueError):
        return []
    checks = _checks(settings)
    if checks is None:
        return [key for key in SETTING_NAMES if key not in keys]
    return [
        key
        for key in SETTING_NAMES
        if key in checks and (key not in keys or _crc(_value(settings, key)) != checks[key])
    ]

"""What survives a restart -- the recovery file and the settings file -- and never stops one.

* :func:`autosave_text` and :func:`read_session` -- the recovery file (``last.memfit.json``
  in the app's data folder): the working scenario, the document's path and whether it has
  unsaved changes, written a moment after every change and on close, so that a crash or a
  ``kill -9`` loses nothing::

      {"memfit_autosave": 1, "path": "/home/me/run.memfit.json", "modified": true,
       "scenario": {"memfit_scenario": 1, ...}}

  ``"scenario": null`` means "the file at ``path`` as it is on disk" (a close that
  discarded the changes). A plain scenario file, the format before this one, is read too.
  Whatever is wrong with the file -- a FIFO, a device, too big, not JSON, a scenario the
  engine refuses -- gives the default scenario and a message saying what was not restored;
  a regular file that could not be read is kept beside it as ``*.unreadable``.
* :func:`open_settings` -- the settings file, checked before ``QSettings`` opens it
  (``QSettings`` would block on a FIFO and read a device or a huge file whole): a file
  that is not a regular one, too big or unreadable gives :class:`MemorySettings`, which
  keeps the settings for this session only, and a message saying so.

Reads go through :func:`engine.files.read_json`, which never blocks.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSettings, QStandardPaths

from engine.errors import EstimateError
from engine.files import read_json
from engine.scenario_io import load_scenario, scenario_from_dict, scenario_to_dict
from engine.specs import Scenario
from gui.store import default_scenario

AUTOSAVE_KEY = "memfit_autosave"
AUTOSAVE_VERSION = 1
#: a settings file is a few KiB; a bigger one is not read
SETTINGS_LIMIT = 1 << 20
ORG_NAME = "MemFit"
APP_NAME = "MemFit"


def autosave_location() -> Path:
    base = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation)
    return Path(base or Path.home() / ".memfit") / "last.memfit.json"


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


def read_session(autosave: Path) -> Session | None:
    """The document the last session left in ``autosave``; ``None`` when there is no
    recovery file (a first start). Never raises: a problem gives the default scenario with
    a message."""
    if not os.path.lexists(autosave):
        return None
    try:
        data = read_json(autosave, field="recovery file")
    except Exception as exc:  # unreadable, a FIFO, too big, not JSON: start afresh
        _set_aside(autosave)
        reason = exc.detail if isinstance(exc, EstimateError) else _reason(exc)
        return _fresh(f"could not restore the last session: {reason}")
    try:
        return _session(data)
    except Exception as exc:  # the engine refuses what it holds; its checks grow stricter
        _set_aside(autosave)
        return _fresh(f"could not restore the last session: {_reason(exc)}")


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
        if path is None:
            return Session(default_scenario())
        try:
            return Session(load_scenario(path), path, False)
        except Exception as exc:
            return _fresh(f"could not reopen {path.name}: {_reason(exc)}")
    scenario = scenario_from_dict(raw)
    if modified:
        name = path.name if path else "the untitled scenario"
        return Session(scenario, path, True, f"recovered unsaved changes to {name}")
    return Session(scenario, path, False)


def _reason(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


def _fresh(message: str) -> Session:
    return Session(default_scenario(), None, False, f"{message}; started with a new scenario")


def _set_aside(autosave: Path) -> None:
    """Keep a regular recovery file that could not be restored as ``*.unreadable``, so the
    next autosave does not overwrite what it held."""
    with contextlib.suppress(OSError):
        if stat.S_ISREG(os.lstat(autosave).st_mode):
            os.replace(autosave, autosave.with_name(autosave.name + ".unreadable"))


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
    settings = QSettings(str(path), QSettings.Format.IniFormat)
    if settings.status() == QSettings.Status.FormatError:
        return settings, f"could not read the settings in {path}; they start afresh"
    return settings, ""

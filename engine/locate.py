"""Where MemFit's data lives: the one module that knows the path of ``resources/``.

Two folders hold presets, each with ``models/``, ``gpus/`` and ``stacks/`` (one JSON file
per preset, named by its ``name``):

* **the built-in data**, the top-level ``resources/`` folder of the source tree. It installs
  as the package ``memfit.resources`` (``pyproject.toml`` maps the folder), and
  :func:`importlib.resources.files` finds it the same way in a source checkout, an
  installed wheel and the PyInstaller bundle. It also holds the icons (``icons/``) and the
  desktop entry (``desktop/``). ``$MEMFIT_RESOURCES`` names another folder to read
  instead (a test's, or a packager's);
* **the user's own presets**, :func:`user_presets_dir`, read beside the built-in ones
  (:mod:`memfit.engine.presets`). ``$MEMFIT_USER_PRESETS`` names another folder.

>>> sorted(p.name for p in resources().iterdir() if p.name in ("gpus", "models", "stacks"))
['gpus', 'models', 'stacks']
>>> user_presets_dir({"MEMFIT_USER_PRESETS": "/srv/presets"}, "linux").as_posix()
'/srv/presets'
"""

from __future__ import annotations

import atexit
import os
import re
import sys
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from importlib.resources import as_file, files
from importlib.resources.abc import Traversable
from pathlib import Path

from memfit.engine import memo

__all__ = [
    "KINDS",
    "RESOURCES_ENV",
    "USER_PRESETS_ENV",
    "PresetFiles",
    "preset_files",
    "resource_file",
    "resources",
    "user_presets_dir",
]

#: the kinds of preset, each a folder of JSON files in both places
KINDS = ("models", "gpus", "stacks")
#: a folder to read the built-in data from instead of the package's own
RESOURCES_ENV = "MEMFIT_RESOURCES"
#: the user's preset folder instead of the platform's (see :func:`user_presets_dir`)
USER_PRESETS_ENV = "MEMFIT_USER_PRESETS"

_extracted = ExitStack()
atexit.register(_extracted.close)


def resources() -> Traversable:
    """The built-in data: ``$MEMFIT_RESOURCES`` when it is set, else the package
    ``memfit.resources`` (the top-level ``resources/`` folder of the source tree).

    Possibly not a folder on disk (a zip import): read it with ``/``, ``iterdir()`` and
    ``read_text()``, or ask :func:`resource_file` for a path.
    """
    override = os.environ.get(RESOURCES_ENV)
    if override:
        return Path(override)
    return files("memfit.resources")


def resource_file(*parts: str) -> Path:
    """The built-in data file ``resources/<parts...>`` as a path on disk, for readers that
    need one (Qt reads an icon by its path).

    For data on disk (a checkout, a wheel, the bundle) this is the file itself; for data
    inside a zip, a temporary copy that lives until the process exits (Qt reads an SVG icon
    lazily).
    """
    return _extracted.enter_context(as_file(resources().joinpath(*parts)))


def user_presets_dir(environ: Mapping[str, str] | None = None, platform: str | None = None) -> Path:
    """The folder of the user's own presets (it need not exist):

    * ``$MEMFIT_USER_PRESETS`` when it is set;
    * Linux and other Unix: ``$XDG_CONFIG_HOME/MemFit/presets``, by default
      ``~/.config/MemFit/presets`` (beside the app's settings, ``MemFit/MemFit.conf``);
    * macOS: ``~/Library/Application Support/MemFit/presets``;
    * Windows: ``%APPDATA%\\MemFit\\presets``.

    ``environ`` and ``platform`` (``sys.platform``'s values) default to this process's.
    """
    env = os.environ if environ is None else environ
    if env.get(USER_PRESETS_ENV):
        return Path(env[USER_PRESETS_ENV])
    platform = sys.platform if platform is None else platform
    home = Path(env.get("HOME") or env.get("USERPROFILE") or Path.home())
    if platform == "win32":
        base = Path(env["APPDATA"]) if env.get("APPDATA") else home / "AppData" / "Roaming"
    elif platform == "darwin":
        base = home / "Library" / "Application Support"
    else:
        xdg = env.get("XDG_CONFIG_HOME")
        base = Path(xdg) if xdg and Path(xdg).is_absolute() else home / ".config"
    return base / "MemFit" / "presets"


#: a preset's name, as its file is named: what the CLI and a scenario file can spell
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")


@dataclass(frozen=True, slots=True)
class PresetFiles:
    """The preset files of one kind, built-in and the user's, by preset name."""

    #: every preset's file, built-in first, then the user's in name order
    files: dict[str, Traversable]
    #: the names that are the user's own
    custom: frozenset[str]
    #: one line for each file of the user's that is left out, naming the file and why
    problems: tuple[str, ...]


@memo.cached(maxsize=None)
def preset_files(kind: str) -> PresetFiles:
    """The preset files of ``kind`` (one of :data:`KINDS`): the built-in ones, and the
    user's (:func:`user_presets_dir`) whose name is well formed and no built-in's.

    A user's file is listed here by its name only; its reader (:mod:`memfit.engine.presets`,
    :mod:`memfit.engine.stacks`) checks what it says. Cached: ``memo.clear()`` reads the
    folders again.
    """
    if kind not in KINDS:
        raise ValueError(f"kind: got {kind!r}, expected one of {', '.join(KINDS)}")
    files: dict[str, Traversable] = {}
    folder = resources() / kind
    if folder.is_dir():
        for entry in sorted(folder.iterdir(), key=lambda p: p.name):
            if entry.name.endswith(".json"):
                files[entry.name.removesuffix(".json")] = entry
    custom: set[str] = set()
    problems: list[str] = []
    own = user_presets_dir() / kind
    try:
        entries = sorted(own.iterdir()) if own.is_dir() else []
    except OSError as exc:
        entries = []
        problems.append(f"custom presets in {own}: cannot be listed ({exc.strerror or exc})")
    for path in entries:
        if path.suffix != ".json" or path.name.startswith("."):
            continue
        name = path.name.removesuffix(".json")
        if not _NAME.fullmatch(name):
            problems.append(
                problem_line(
                    path,
                    f"name: {name!r} is not a preset name (letters, digits and . _ + -, "
                    "starting with a letter or digit, at most 64 characters)",
                )
            )
        elif name in files:
            problems.append(
                problem_line(
                    path,
                    f"name: {name!r} is a built-in preset's name; give the custom one a "
                    "name of its own",
                )
            )
        else:
            files[name] = path
            custom.add(name)
    return PresetFiles(files, frozenset(custom), tuple(problems))


def problem_line(path: Traversable, why: str) -> str:
    """One line on the user's preset file ``path``: ``custom preset models/x.json in
    FOLDER: why``. The kind and the file's name come first, so that a long folder cut
    short in a message (:func:`memfit.engine.errors.bounded`) still leaves them; a ``why``
    that names the file again (``stacks/x.json: ...``) says it once."""
    where = Path(str(path))
    file = f"{where.parent.name}/{where.name}"
    why = why.removeprefix(f"{file}: ") or why
    return f"custom preset {file} in {where.parent.parent}: {why}"


def loadable(kind: str, load: Callable[[str], object]) -> tuple[list[str], list[str]]:
    """The names of ``kind``'s presets (:func:`preset_files`, in its order) but the user's
    that ``load`` refuses, and one line (:func:`problem_line`) for each user's file left
    out. The built-in files are checked by the tests, not here."""
    listed = preset_files(kind)
    names, problems = [], list(listed.problems)
    for name, path in listed.files.items():
        if name in listed.custom:
            try:
                load(name)
            except (ValueError, TypeError) as exc:  # EstimateError is a ValueError
                problems.append(problem_line(path, str(exc)))
                continue
        names.append(name)
    return names, problems

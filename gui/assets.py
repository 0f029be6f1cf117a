"""The app's own files, shipped inside the package (``gui/icons/``: the SVG icon and its
renderings, see ``packaging/render_icons.py``) and found through :mod:`importlib.resources`,
so that an installed wheel and a frozen bundle have them as a source checkout does."""

from __future__ import annotations

import atexit
from contextlib import ExitStack
from functools import cache
from importlib.resources import as_file, files
from pathlib import Path

__all__ = ["icon_path"]

_extracted = ExitStack()
atexit.register(_extracted.close)


@cache
def icon_path(name: str = "memfit.svg") -> Path:
    """The icon file ``name`` of ``gui/icons`` as a path on disk, for Qt to read.

    For a package on disk (the usual case) this is the file itself; for one imported from a
    zip, a temporary copy that lives until the process exits (Qt reads an SVG icon lazily).
    """
    return _extracted.enter_context(as_file(files("gui") / "icons" / name))

"""The app's own files: the icons of the built-in data (``resources/icons/``: the SVG icon
and its renderings, see ``packaging/render_icons.py``), found by
:func:`memfit.engine.locate.resource_file`, so that an installed wheel and a frozen bundle
have them as a source checkout does."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from memfit.engine.locate import resource_file

__all__ = ["icon_path"]


@cache
def icon_path(name: str = "memfit.svg") -> Path:
    """The icon file ``name`` of ``resources/icons`` as a path on disk, for Qt to read."""
    return resource_file("icons", name)

"""The README shows the window at every size the screenshots are rendered at, in light and
dark: each picture it names is in docs/, a PNG of that window size, and a dark one is dark
(its median pixel), a light one light."""

from __future__ import annotations

import re
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtGui import QImage

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packaging"))
from screenshots import SIZES, THEMES, shot_name  # noqa: E402

README = (ROOT / "README.md").read_text(encoding="utf-8")
SHOTS = [(size, theme) for size in SIZES for theme in THEMES]


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's header (its IHDR chunk)."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", path
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_the_sizes_are_the_three_asked_for() -> None:
    assert SIZES == ((1024, 640), (1280, 800), (1920, 1080)) and set(THEMES) == {"light", "dark"}


@pytest.mark.parametrize(("size", "theme"), SHOTS, ids=[shot_name(*s) for s in SHOTS])
def test_each_screenshot_is_in_the_readme_at_its_size(size: tuple[int, int], theme: str) -> None:
    name = shot_name(size, theme)
    assert f"(docs/{name})" in README
    path = ROOT / "docs" / name
    assert png_size(path) == size
    image = QImage(str(path)).convertToFormat(QImage.Format.Format_Grayscale8)
    pixels = np.frombuffer(image.constBits(), np.uint8, image.sizeInBytes())
    assert (np.median(pixels) < 128) == (theme == "dark")


def test_every_picture_the_readme_names_exists() -> None:
    for name in re.findall(r"\]\((docs/[^)]+\.png)\)", README):
        assert (ROOT / name).is_file(), name

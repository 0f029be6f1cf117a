"""Render the application icon from ``resources/icons/memfit.svg`` (the source) to the
files that desktops and installers want:

* ``resources/icons/hicolor/<n>x<n>/apps/memfit.png`` for n in :data:`PNG_SIZES` -- the
  freedesktop icon theme layout, installed by ``packaging/install-desktop.sh``;
* ``resources/icons/memfit.ico`` -- Windows, one PNG-compressed image per size in
  :data:`ICO_SIZES` (the form Windows has read since Vista);
* ``resources/icons/memfit.icns`` -- macOS, PNG-compressed images under the icon types of
  :data:`ICNS_TYPES`.

The ICO and ICNS containers are assembled here rather than written through Qt's
image-format plugins (whose ``ico`` writer stores one size per file), so that every size
is rendered from the SVG instead of scaled down from one bitmap.

Run after editing the SVG, and commit the results:
``QT_QPA_PLATFORM=offscreen python packaging/render_icons.py``.
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

ICONS = Path(__file__).resolve().parent.parent / "resources" / "icons"
SOURCE = ICONS / "memfit.svg"
PNG_SIZES = (16, 32, 48, 64, 128, 256, 512)
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)
#: icns type code -> pixel size (the 2x "retina" types reuse the larger renderings)
ICNS_TYPES = {
    b"icp4": 16,
    b"icp5": 32,
    b"icp6": 64,
    b"ic07": 128,
    b"ic08": 256,
    b"ic09": 512,
    b"ic10": 1024,
    b"ic11": 32,
    b"ic12": 64,
    b"ic13": 256,
    b"ic14": 512,
}


def png_path(size: int, icons: Path = ICONS) -> Path:
    return icons / "hicolor" / f"{size}x{size}" / "apps" / "memfit.png"


def render(size: int, source: Path = SOURCE) -> QImage:
    """The SVG drawn into a transparent ``size`` x ``size`` ARGB image."""
    renderer = QSvgRenderer(str(source))
    if not renderer.isValid():
        raise ValueError(f"{source} is not a valid SVG file")
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
    renderer.render(painter)
    painter.end()
    return image


def png_bytes(image: QImage) -> bytes:
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    if not image.save(buffer, "PNG"):
        raise OSError("could not encode a PNG image")
    buffer.close()
    return bytes(data.data())


def ico_bytes(images: dict[int, bytes]) -> bytes:
    """An ICO file holding the PNG images ``{size: png}``.

    Layout: ICONDIR (reserved 0, type 1, count), one 16-byte ICONDIRENTRY per image
    (width and height with 0 meaning 256, colour count, reserved, planes, bits per pixel,
    byte size, offset), then the PNG data.
    """
    header = struct.pack("<HHH", 0, 1, len(images))
    offset = len(header) + 16 * len(images)
    entries, blobs = [], []
    for size, png in sorted(images.items()):
        if not 1 <= size <= 256:
            raise ValueError(f"an ICO image is 1 to 256 pixels wide, not {size}")
        side = size % 256  # 256 is written as 0
        entries.append(struct.pack("<BBBBHHII", side, side, 0, 0, 1, 32, len(png), offset))
        blobs.append(png)
        offset += len(png)
    return header + b"".join(entries) + b"".join(blobs)


def icns_bytes(images: dict[bytes, bytes]) -> bytes:
    """An ICNS file: ``b"icns"`` and the total length, then one (type, length, PNG) chunk
    per entry of ``images`` (lengths are big-endian and include the 8-byte headers)."""
    chunks = b"".join(kind + struct.pack(">I", 8 + len(png)) + png for kind, png in images.items())
    return b"icns" + struct.pack(">I", 8 + len(chunks)) + chunks


def render_all(icons: Path = ICONS, source: Path = SOURCE) -> list[Path]:
    """Write every PNG, the ICO and the ICNS under ``icons``; return their paths."""
    sizes = sorted(set(PNG_SIZES) | set(ICO_SIZES) | set(ICNS_TYPES.values()))
    pngs = {size: png_bytes(render(size, source)) for size in sizes}
    written = []
    for size in PNG_SIZES:
        path = png_path(size, icons)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pngs[size])
        written.append(path)
    ico = icons / "memfit.ico"
    ico.write_bytes(ico_bytes({size: pngs[size] for size in ICO_SIZES}))
    icns = icons / "memfit.icns"
    icns.write_bytes(icns_bytes({kind: pngs[size] for kind, size in ICNS_TYPES.items()}))
    return [*written, ico, icns]


def main() -> int:
    _app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])
    for path in render_all():
        print(f"{path.relative_to(ICONS.parent.parent)}  {path.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())

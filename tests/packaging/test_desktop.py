"""Desktop integration: the icons rendered from the SVG, the desktop entry, its installer,
and the packaging files that CI relies on."""

import configparser
import os
import shutil
import stat
import struct
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QBuffer, QByteArray, QIODevice
from PySide6.QtGui import QImage, QImageReader

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packaging"))
import render_icons  # noqa: E402

ICONS = ROOT / "resources" / "icons"
DESKTOP = ROOT / "resources" / "desktop" / "memfit.desktop"
INSTALL = ROOT / "packaging" / "install-desktop.sh"


def pixels(image: QImage) -> np.ndarray:
    image = image.convertToFormat(QImage.Format.Format_ARGB32)
    data = np.frombuffer(image.constBits(), np.uint8, count=image.sizeInBytes())
    return data.reshape(image.height(), image.bytesPerLine())[:, : image.width() * 4].astype(int)


def decode(png: bytes) -> QImage:
    image = QImage()
    assert image.loadFromData(png, "PNG")
    return image


@pytest.mark.parametrize("size", render_icons.PNG_SIZES)
def test_checked_in_png_matches_the_svg(qapp, size: int) -> None:  # type: ignore[no-untyped-def]
    image = QImage(str(render_icons.png_path(size)))
    assert (image.width(), image.height()) == (size, size)
    assert image.hasAlphaChannel()
    fresh = render_icons.render(size)
    # re-run packaging/render_icons.py after editing memfit.svg
    assert np.abs(pixels(image) - pixels(fresh)).max() <= 2


def test_ico_holds_every_size(qapp) -> None:  # type: ignore[no-untyped-def]
    data = (ICONS / "memfit.ico").read_bytes()
    reserved, kind, count = struct.unpack_from("<HHH", data)
    assert (reserved, kind, count) == (0, 1, len(render_icons.ICO_SIZES))
    for i, size in enumerate(render_icons.ICO_SIZES):
        width, height, _, _, planes, bits, length, offset = struct.unpack_from(
            "<BBBBHHII", data, 6 + 16 * i
        )
        assert width == height == size % 256 and (planes, bits) == (1, 32)
        image = decode(data[offset : offset + length])
        assert (image.width(), image.height()) == (size, size)
    # and Qt's own reader (as Windows does) sees all of them
    reader = QImageReader(str(ICONS / "memfit.ico"))
    assert reader.imageCount() == len(render_icons.ICO_SIZES)


def test_icns_chunks_decode_at_their_sizes(qapp) -> None:  # type: ignore[no-untyped-def]
    data = (ICONS / "memfit.icns").read_bytes()
    assert data[:4] == b"icns" and struct.unpack_from(">I", data, 4)[0] == len(data)
    seen = {}
    at = 8
    while at < len(data):
        kind, length = data[at : at + 4], struct.unpack_from(">I", data, at + 4)[0]
        seen[kind] = decode(data[at + 8 : at + length]).width()
        at += length
    assert seen == render_icons.ICNS_TYPES


def test_ico_writer_rejects_sizes_it_cannot_hold() -> None:
    with pytest.raises(ValueError, match="1 to 256 pixels"):
        render_icons.ico_bytes({512: b""})


def test_render_all_writes_every_file(qapp, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    written = render_icons.render_all(tmp_path)
    assert len(written) == len(render_icons.PNG_SIZES) + 2
    assert (tmp_path / "hicolor" / "512x512" / "apps" / "memfit.png").is_file()
    buffer = QBuffer()
    buffer.setData(QByteArray((tmp_path / "memfit.ico").read_bytes()))
    buffer.open(QIODevice.OpenModeFlag.ReadOnly)
    assert QImageReader(buffer, QByteArray(b"ico")).imageCount() == len(render_icons.ICO_SIZES)


def desktop_entry(path: Path) -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(path, encoding="utf-8")
    return dict(parser["Desktop Entry"])


def test_desktop_entry_names_the_app_its_icon_and_window() -> None:
    entry = desktop_entry(DESKTOP)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert entry["Type"] == "Application" and entry["Name"] == "MemFit" and entry["Comment"]
    assert entry["Exec"] in scripts
    assert entry["Icon"] == "memfit" == render_icons.png_path(16).stem
    assert entry["Terminal"] == "false"
    assert entry["Categories"] == "Development;Science;"
    # the window manager matches windows to the entry by the name the app gives itself
    # (pytest-qt's application is not made by make_app, so ask a fresh process)
    app_says = subprocess.run(
        [
            sys.executable,
            "-c",
            "from memfit.gui.app import make_app; print(make_app().desktopFileName())",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, QT_QPA_PLATFORM="offscreen"),
        cwd=ROOT,
        check=True,
    ).stdout.strip()
    assert entry["StartupWMClass"] == app_says == DESKTOP.stem


@pytest.mark.skipif(not shutil.which("desktop-file-validate"), reason="desktop-file-utils")
def test_desktop_entry_validates() -> None:
    proc = subprocess.run(["desktop-file-validate", str(DESKTOP)], capture_output=True, text=True)
    # the one hint left: two main categories, as asked for (Development and Science)
    problems = [ln for ln in proc.stdout.splitlines() if ": hint: " not in ln]
    assert proc.returncode == 0 and not problems, proc.stdout + proc.stderr


def run_install(script: Path, data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, XDG_DATA_HOME=str(data), HOME=str(data.parent))
    return subprocess.run(
        ["bash", str(script), *args], capture_output=True, text=True, env=env, check=False
    )


def test_install_desktop_from_source_and_uninstall(tmp_path: Path) -> None:
    data = tmp_path / "share"
    proc = run_install(INSTALL, data)
    assert proc.returncode == 0, proc.stderr
    installed = data / "applications" / "memfit.desktop"
    assert desktop_entry(installed)["Exec"] == "memfit"
    for size in render_icons.PNG_SIZES:
        assert (data / "icons" / "hicolor" / f"{size}x{size}" / "apps" / "memfit.png").is_file()
    assert (data / "icons" / "hicolor" / "scalable" / "apps" / "memfit.svg").is_file()

    proc = run_install(INSTALL, data, "--uninstall")
    assert proc.returncode == 0, proc.stderr
    assert not installed.exists() and not list((data / "icons").rglob("memfit.*"))


def test_install_desktop_from_a_bundle_starts_that_bundle(tmp_path: Path) -> None:
    bundle = tmp_path / "my apps" / "memfit"  # a space, to see the Exec line quoted
    # the bundle's data as the spec lays it out: resources/ under _internal/memfit/
    data_dir = bundle / "_internal" / "memfit" / "resources"
    shutil.copytree(ICONS, data_dir / "icons")
    shutil.copytree(DESKTOP.parent, data_dir / "desktop")
    shutil.copy(INSTALL, bundle)
    program = bundle / "memfit"
    program.write_text("#!/bin/sh\n")
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    data = tmp_path / "share"
    proc = run_install(bundle / INSTALL.name, data)
    assert proc.returncode == 0, proc.stderr
    assert desktop_entry(data / "applications" / "memfit.desktop")["Exec"] == f'"{program}"'


def test_install_desktop_refuses_a_missing_program(tmp_path: Path) -> None:
    proc = run_install(INSTALL, tmp_path / "share", "--exec", str(tmp_path / "nothing"))
    assert proc.returncode == 2 and "not an executable" in proc.stderr


def test_packaging_files_ci_relies_on() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    (pin,) = extras["package"]
    assert pin.startswith("pyinstaller==")
    compile((ROOT / "packaging" / "memfit.spec").read_text(), "memfit.spec", "exec")
    for script in ("build.sh", "install-desktop.sh"):
        assert subprocess.run(["bash", "-n", str(ROOT / "packaging" / script)]).returncode == 0
    lines = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert "packaging/build.sh" in "\n".join(lines[:-1])
    assert "--selftest" in "\n".join(lines[:-1])
    assert lines[-1] == "bash install.sh >/dev/null && .venv/bin/pytest"

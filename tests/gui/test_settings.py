"""A damaged settings file never resets a preference without saying so.

A settings file the app wrote is damaged in every way a file gets damaged -- cut short
anywhere, bytes flipped, NUL bytes, bytes that are not UTF-8, a section header lost, keys
given twice, values no setting takes, binary garbage, an empty file, other line ends --
and the next start either restores each setting as it was written or names it (the
colours by name) in the notice; nothing is lost silently.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest
from PySide6.QtCore import QByteArray, QSettings
from PySide6.QtWidgets import QSplitter
from pytestqt.qtbot import QtBot

from memfit.engine.scenario_io import save_scenario
from memfit.gui.main_window import MainWindow
from memfit.gui.store import default_scenario


@dataclass(frozen=True)
class Written:
    """A settings file as the app writes it, and what it holds."""

    data: bytes
    document: Path
    recent: list[str]
    geometry: bytes
    splitter: bytes


@pytest.fixture(scope="module")
def written(qapp, tmp_path_factory: pytest.TempPathFactory) -> Written:  # type: ignore[no-untyped-def]
    """Dark colours, two recent files, the details hidden, Conventions unfolded, a
    window of 1100x700 with a 500-pixel column, and a document to reopen."""
    folder = tmp_path_factory.mktemp("written")
    document = folder / "run, 1 <b>.memfit.json"
    save_scenario(default_scenario(), document)
    path = folder / "MemFit.conf"
    window = MainWindow(settings_path=path, data_dir=folder)
    window.show()
    window.set_theme("dark")
    window.add_recent(folder / "other.memfit.json")
    assert window.open_path(document)  # the last document, and the first recent file
    window.table_act.setChecked(False)
    window.training_panel.conventions.set_expanded(True)
    window.resize(1100, 700)
    window.splitter.setSizes([500, 600])
    recent = window.recent_files()
    window.close()
    window.set_theme("system", save=False)
    window.deleteLater()
    settings = QSettings(str(path), QSettings.Format.IniFormat)
    geometry, splitter = settings.value("window/geometry"), settings.value("window/splitter")
    assert isinstance(geometry, QByteArray) and isinstance(splitter, QByteArray)
    return Written(path.read_bytes(), document, recent, geometry.data(), splitter.data())


@pytest.fixture
def layouts(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[bytes]]:
    """The window geometries and splitter states the window restores (the offscreen
    screen is too small to tell a restored size by looking)."""
    seen: dict[str, list[bytes]] = {"window/geometry": [], "window/splitter": []}
    geometry, state = MainWindow.restoreGeometry, QSplitter.restoreState

    def restore_geometry(self: MainWindow, data: QByteArray) -> bool:
        seen["window/geometry"].append(data.data())
        return geometry(self, data)

    def restore_state(self: QSplitter, data: QByteArray) -> bool:
        seen["window/splitter"].append(data.data())
        return state(self, data)

    monkeypatch.setattr(MainWindow, "restoreGeometry", restore_geometry)
    monkeypatch.setattr(QSplitter, "restoreState", restore_state)
    return seen


def corruptions(good: bytes) -> dict[str, bytes]:
    """The settings file ``good`` damaged in many ways, each by name."""

    def at(text: bytes) -> int:
        return good.index(text)

    theme = at(b"theme=dark")
    out = {f"cut at {p} %": good[: len(good) * p // 100] for p in (5, 20, 35, 50, 65, 80, 95)}
    out |= {
        "cut inside the colours": good[: theme + 8],
        "cut after the colours' key": good[: theme + 6],
        "cut before the last line end": good[:-1],
        "a flipped byte in the [view] header": good.replace(b"[view]", b"[vixw]"),
        "a flipped byte in the colours' key": good.replace(b"theme=", b"thyme="),
        "a flipped byte in the colours' value": good.replace(b"theme=dark", b"theme=dbrk"),
        "a flipped byte in place of =": good.replace(b"theme=dark", b"theme<dark"),
        "a flipped byte in the check line": good.replace(b"written=", b"wrmtten="),
        "a NUL byte in a key": good.replace(b"theme=dark", b"the\0me=dark"),
        "a NUL byte in place of a line end": good.replace(b"table=false\n", b"table=false\0"),
        "NUL bytes at the start": b"\0" * 16 + good,
        "a byte that is not UTF-8 in a value": good.replace(b"theme=dark", b"theme=d\xffrk"),
        "bytes that are not UTF-8 before a header": good.replace(b"[view]", b"\xff\xfe[view]"),
        "the [view] header missing": good.replace(b"[view]\n", b""),
        "the [General] header missing": good.replace(b"[General]\n", b""),
        "the colours given twice": good.replace(b"theme=dark", b"theme=dark\ntheme=light"),
        "the [view] section given twice": good + b"\n[view]\ntheme=light\ntable=true\n",
        "a colours value no choice has": good.replace(b"theme=dark", b"theme=purple"),
        "a yes-or-no value that is neither": good.replace(b"table=false", b"table=banana"),
        "a window size that is not bytes": good.replace(b"geometry=@ByteArray(", b"geometry=(("),
        "binary garbage": random.Random(21).randbytes(2048),
        "an empty file": b"",
        "blank lines only": b"\n\n  \n",
        "CRLF line ends": good.replace(b"\n", b"\r\n"),
        "CR line ends": good.replace(b"\n", b"\r"),
        "a UTF-8 byte-order mark": b"\xef\xbb\xbf" + good,
        "UTF-16": good.decode("latin-1").encode("utf-16"),
        "all on one line": good.replace(b"\n", b" "),
        "a header left open": good.replace(b"[view]", b"[view"),
        "a line without =": good.replace(b"theme=dark", b"theme dark"),
        "the colours commented out": good.replace(b"theme=dark", b";theme=dark"),
        "an open quote": good.replace(b"theme=dark", b'theme="dark'),
        "a long line of junk": good.replace(b"[view]", b"x=" + b"y" * 100_000 + b"\n[view]"),
    }
    return out


CASES = corruptions(b"[General]\nwritten=\n[view]\ntable=false\ntheme=dark\n")


def restored(
    window: MainWindow, written: Written, layouts: dict[str, list[bytes]]
) -> dict[str, bool]:
    """Each setting the app wrote: whether the window came back with it."""
    return {
        "view/theme": window.theme_acts["dark"].isChecked(),
        "document/recent": window.recent_files() == written.recent,
        "document/last": window.store.path == written.document,
        "view/table": not window.table_act.isChecked(),
        "view/conventions": window.training_panel.conventions.is_expanded(),
        "window/geometry": layouts["window/geometry"] == [written.geometry],
        "window/splitter": layouts["window/splitter"] == [written.splitter],
    }


def test_the_file_as_written_restores_every_setting(
    written: Written, qtbot: QtBot, tmp_path: Path, layouts: dict[str, list[bytes]]
) -> None:
    path = tmp_path / "MemFit.conf"
    path.write_bytes(written.data)
    window = MainWindow(settings_path=path, data_dir=tmp_path)
    qtbot.addWidget(window)
    window.show()
    try:
        assert all(restored(window, written, layouts).values()), restored(window, written, layouts)
        assert window.notice.messages() == []
    finally:
        window.set_theme("system", save=False)


@pytest.mark.parametrize("name", CASES)
def test_a_damaged_settings_file_restores_or_names_each_setting(
    written: Written, qtbot: QtBot, tmp_path: Path, name: str, layouts: dict[str, list[bytes]]
) -> None:
    path = tmp_path / "MemFit.conf"
    path.write_bytes(corruptions(written.data)[name])
    window = MainWindow(settings_path=path, data_dir=tmp_path)
    qtbot.addWidget(window)
    window.show()
    try:
        said = " ".join(window.notice.messages())
        back = restored(window, written, layouts)
        silent = [k for k, ok in back.items() if not ok and k not in said]
        assert silent == [], (said, silent)
        if not window.theme_acts["dark"].isChecked():
            assert "colours (view/theme)" in said
        # what the next close writes is whole again
        window.close()
        again = QSettings(str(path), QSettings.Format.IniFormat)
        assert again.value("view/theme") == window._theme
    finally:
        window.set_theme("system", save=False)


def test_there_are_enough_kinds_of_damage(written: Written) -> None:
    cases = corruptions(written.data)
    assert len(cases) >= 21 and len(set(cases.values())) == len(cases)
    assert set(cases) == set(CASES)

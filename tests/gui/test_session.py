"""The app always starts, and never loses or resurrects edits.

A scenario the estimate rejects, a broken recovery file or settings file give a working
window with the default scenario and a notice; the document's path and modified state
survive a restart, a crash (``kill -9``) included, right after the first change too;
each window has a recovery file of its own, and a start restores the newest one whose
window is gone and offers the others; closing asks Save / Discard / Cancel.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PySide6.QtCore import QByteArray, QLockFile, QSettings, QSysInfo
from PySide6.QtWidgets import QFileDialog, QMessageBox
from pytestqt.qtbot import QtBot

from memfit.engine.scenario_io import load_scenario, save_scenario, scenario_to_dict
from memfit.gui.main_window import MainWindow
from memfit.gui.monkey import MessageBoxes
from memfit.gui.session import MemorySettings
from memfit.gui.store import ScenarioStore, default_scenario
from tests.gui.helpers import ROOT, bad_mesh, ini, run_offscreen

Button = QMessageBox.StandardButton


# -- a scenario the estimate rejects ---------------------------------------------------


def test_the_store_holds_a_scenario_the_estimate_rejects(qtbot: QtBot) -> None:
    store = ScenarioStore(bad_mesh())
    assert store.scenario == bad_mesh()
    assert store.estimate is None
    assert store.error.startswith("training.parallelism")


def test_a_rejected_scenario_left_open_at_close_starts_again(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bad-mesh.memfit.json"
    save_scenario(bad_mesh(), path)
    window = start(scenario=default_scenario())
    assert window.open_path(path)
    window.close()
    again = start()
    assert again.store.scenario == bad_mesh() and again.store.path == path
    assert not again.store.modified and again.store.estimate is None
    assert again.chart.is_stale() and again.chart.current_bar_count() == 0
    assert again.chart.verdict_text().startswith("No estimate: Parallelism: ")  # in words
    tp = again.parallelism_panel.rows["training.parallelism.tp"]
    assert not tp.error.isHidden() and tp.error.text() in again.in_user_words(again.store.error)


def test_a_rejected_scenario_in_the_old_autosave_format_starts(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    save_scenario(bad_mesh(), tmp_path / "last.memfit.json")  # a plain scenario file
    window = start()
    assert window.store.scenario == bad_mesh()
    assert window.store.modified and window.store.path is None  # never lost unsaved
    assert window.chart.is_stale()
    assert any("recovered" in m.lower() for m in window.notice.messages())


# -- broken recovery files ---------------------------------------------------------------


def wrapper(**fields: object) -> str:
    data = {
        "memfit_autosave": 1,
        "path": None,
        "modified": False,
        "scenario": scenario_to_dict(default_scenario()),
    }
    data.update(fields)
    return json.dumps(data)


BROKEN = {
    "not JSON": b"{oops",
    "not UTF-8": b"\xff\xfe\x00junk",
    "empty": b"",
    "too big": b" " * (5 << 20),
    "a list": b"[1, 2, 3]",
    "modified of the wrong type": wrapper(modified="yes").encode(),
    "path of the wrong type": wrapper(path=12).encode(),
    "a newer version": wrapper(memfit_autosave=2).encode(),
    "an unknown scenario key": wrapper(
        scenario={**scenario_to_dict(default_scenario()), "colour": "red"}
    ).encode(),
    "a scenario of the wrong shape": wrapper(scenario=[1]).encode(),
    "an unknown preset": wrapper(
        scenario={**scenario_to_dict(default_scenario()), "model": {"preset": "no-such"}}
    ).encode(),
}


def recovery_files(tmp_path: Path, pattern: str = "*.memfit.json") -> list[Path]:
    return sorted((tmp_path / "recovery").glob(pattern))


@pytest.mark.parametrize("where", ["the file of earlier versions", "a window's own file"])
@pytest.mark.parametrize("content", BROKEN.values(), ids=BROKEN.keys())
def test_a_broken_recovery_file_starts_with_the_default_and_says_so(
    start, tmp_path: Path, content: bytes, where: str
) -> None:  # type: ignore[no-untyped-def]
    if where == "a window's own file":  # its window is gone: no lock
        (tmp_path / "recovery").mkdir()
        (tmp_path / "recovery" / "0123abcd.memfit.json").write_bytes(content)
        said = "Could not restore a session"
    else:
        (tmp_path / "last.memfit.json").write_bytes(content)
        said = "Could not restore the last session"
    window = start()
    assert window.store.scenario == default_scenario() and not window.store.modified
    assert window.store.estimate is not None and not window.chart.is_stale()
    notices = window.notice.messages()
    assert len(notices) == 1 and notices[0].startswith(said)
    assert window.notice.isVisible()
    assert window.statusBar().currentMessage() == notices[0]
    # what it held is kept, not overwritten by the next autosave, and the notice says where
    (kept,) = recovery_files(tmp_path, "*.unreadable")
    assert kept.read_bytes() == content and f"(kept as {kept})" in notices[0]
    assert not (tmp_path / "last.memfit.json").exists()


def test_no_recovery_file_can_be_written(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "last.memfit.json").mkdir()  # in place of the file of earlier versions
    (tmp_path / "recovery").write_text("a file in place of the folder")
    window = start()
    assert window.store.scenario == default_scenario()
    assert "directory" in window.notice.messages()[0]
    assert not window.write_autosave()  # refused, and said once
    assert not window.write_autosave()
    assert sum("write the recovery file" in m for m in window.notice.messages()) == 1


@pytest.mark.parametrize("how", ["the file of earlier versions", "the settings"])
def test_the_document_file_gone_since_a_discarded_close(start, tmp_path: Path, how: str) -> None:  # type: ignore[no-untyped-def]
    missing = tmp_path / "gone.memfit.json"
    if how == "the settings":
        settings = ini(tmp_path)
        settings.setValue("document/last", str(missing))
        settings.sync()
    else:
        (tmp_path / "last.memfit.json").write_text(wrapper(path=str(missing), scenario=None))
    window = start()
    assert window.store.scenario == default_scenario() and window.store.path is None
    assert "gone.memfit.json" in window.notice.messages()[0]


FIFO_START = """
import os, sys
from pathlib import Path
from memfit.gui.app import make_app
make_app()
from memfit.gui.main_window import MainWindow
folder = Path(sys.argv[1])
os.mkfifo(folder / "last.memfit.json")
os.mkfifo(folder / "MemFit.conf")
window = MainWindow(settings_path=folder / "MemFit.conf", data_dir=folder)
window.show()
print("notices:", " | ".join(window.notice.messages()), flush=True)
print("settings:", type(window.settings).__name__, flush=True)
window.add_recent(folder / "x.memfit.json")
window.close()
print("closed", flush=True)
"""


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifos_in_place_of_the_recovery_and_settings_files_do_not_block(tmp_path: Path) -> None:
    proc = run_offscreen(FIFO_START, str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "settings: MemorySettings" in proc.stdout
    assert "MemFit.conf is a FIFO" in proc.stdout and "kept for this session only" in proc.stdout
    assert "Could not restore the last session" in proc.stdout and "FIFO" in proc.stdout
    assert "closed" in proc.stdout
    # nothing replaced the FIFOs: the settings stayed in memory, the recovery was refused
    assert (tmp_path / "MemFit.conf").is_fifo() and (tmp_path / "last.memfit.json").is_fifo()


# -- broken settings -------------------------------------------------------------------


def test_settings_of_the_wrong_type_start_afresh(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "settings.ini").write_text(
        "[window]\ngeometry=12\nsplitter=@ByteArray(junk)\n"
        "[view]\ntable=banana\ntheme=purple\n[document]\nrecent=@Invalid()\n"
    )
    window = start()
    assert window.size().width() == 1280  # the default size
    assert window.table_act.isChecked() and window.theme_acts["system"].isChecked()
    (note,) = window.notice.messages()
    for key in ("window/geometry", "window/splitter", "view/table", "view/theme"):
        assert key in note


def test_an_oversized_settings_file_is_not_read_or_written(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "MemFit.conf"
    path.write_bytes(b"[view]\n" + b"#" * (2 << 20))
    window = start(settings_path=path)
    assert isinstance(window.settings, MemorySettings)
    assert "too big" in window.notice.messages()[0]
    window.set_theme("system")
    window.close()
    assert path.stat().st_size == 7 + (2 << 20)


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="needs /dev/null")
def test_settings_linked_to_a_device_stay_in_memory(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "MemFit.conf"
    path.symlink_to("/dev/null")
    window = start(settings_path=path)
    assert isinstance(window.settings, MemorySettings)
    assert "not a regular file" in window.notice.messages()[0]
    window.add_recent(tmp_path / "a.memfit.json")
    assert window.recent_files() == [str(tmp_path / "a.memfit.json")]
    window.close()
    assert path.is_symlink()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_settings_file_that_becomes_a_fifo_is_left_alone(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    window = start()
    path = Path(window.settings.fileName())
    os.mkfifo(path)  # no settings were written yet: QSettings has nothing to flush
    window.add_recent(tmp_path / "a.memfit.json")
    window.add_recent(tmp_path / "b.memfit.json")
    assert isinstance(window.settings, MemorySettings)
    assert sum("session only" in m for m in window.notice.messages()) == 1  # said once
    assert window.recent_files()[0] == str(tmp_path / "b.memfit.json")
    window.close()
    assert path.is_fifo()


# -- the document keeps its identity -----------------------------------------------------


def recovered_modified(autosave: Path) -> bool:
    return autosave.exists() and '"modified": true' in autosave.read_text()


def gone(window: MainWindow) -> None:
    """What a crash or ``kill -9`` of ``window``'s process does to its recovery file: the
    lock goes with the process, the file stays."""
    window.recovery.release()


def test_closing_asks_save_discard_cancel(
    start, tmp_path: Path, message_boxes: MessageBoxes
) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "run.memfit.json"
    save_scenario(default_scenario(), path)
    window = start(scenario=default_scenario())
    assert window.open_path(path)
    window.training_panel.rows["training.micro_batch_size"].widget.setValue(7)
    message_boxes.queue(Button.Cancel)
    assert not window.close() and window.isVisible()
    asked = message_boxes.shown[-1]
    assert asked.buttons == (Button.Save, Button.Discard, Button.Cancel)
    assert "run.memfit.json" in asked.text
    message_boxes.queue(Button.Save)
    assert window.close()
    assert load_scenario(path).training.micro_batch_size == 7


def test_a_restart_keeps_the_path_and_the_unsaved_changes(
    start, tmp_path: Path, qtbot: QtBot, message_boxes: MessageBoxes, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "run.memfit.json"
    save_scenario(default_scenario(), path)
    first = start(scenario=default_scenario())
    assert first.open_path(path)
    first.training_panel.rows["training.sequence_length"].widget.setValue(1024)
    edited = first.store.scenario
    autosave = first.recovery.path
    assert autosave.parent == tmp_path / "recovery"
    # written at once, or a moment after the open that began this burst of changes
    qtbot.waitUntil(lambda: recovered_modified(autosave), timeout=5000)
    data = json.loads(autosave.read_text())
    assert data["path"] == str(path) and data["memfit_autosave"] == 1
    # the first window is gone without closing (as after a crash): the next start recovers
    gone(first)
    second = start()
    assert second.recovery.path == autosave  # the recovered file is the second's now
    assert second.store.scenario == edited and second.store.path == path
    assert second.store.modified and second.isWindowModified()
    assert "run.memfit.json" in second.windowTitle()
    assert "Recovered unsaved changes to run.memfit.json." in second.notice.messages()
    # Open asks first, instead of replacing the recovered edits silently
    other = tmp_path / "other.memfit.json"
    save_scenario(bad_mesh(), other)
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(other), ""))
    message_boxes.queue(Button.Cancel)
    second.open_act.trigger()
    assert message_boxes.shown[-1].text == "Save the changes to run.memfit.json?"
    assert second.store.scenario == edited
    first.store.undo_stack.clear()  # nothing for the first window's teardown to ask about
    first.store.undo_stack.setClean()


def test_a_discarded_close_does_not_bring_the_edits_back(
    start, tmp_path: Path, qtbot: QtBot, message_boxes: MessageBoxes
) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "run.memfit.json"
    save_scenario(default_scenario(), path)
    window = start(scenario=default_scenario())
    assert window.open_path(path)
    window.training_panel.rows["training.micro_batch_size"].widget.setValue(9)
    qtbot.waitUntil(lambda: recovered_modified(window.recovery.path), timeout=5000)
    message_boxes.queue(Button.Discard)
    assert window.close()
    assert recovery_files(tmp_path) == [] and recovery_files(tmp_path, "*.lock") == []
    again = start()
    assert again.store.scenario == default_scenario() and again.store.path == path
    assert not again.store.modified and again.notice.messages() == []


def test_a_discarded_untitled_document_starts_afresh(
    start, tmp_path: Path, message_boxes: MessageBoxes
) -> None:  # type: ignore[no-untyped-def]
    window = start(scenario=default_scenario())
    window.training_panel.rows["training.micro_batch_size"].widget.setValue(9)
    message_boxes.queue(Button.Discard)
    assert window.close()
    assert recovery_files(tmp_path) == []
    again = start()
    assert again.store.scenario == default_scenario() and again.store.path is None
    assert not again.store.modified and again.notice.messages() == []


#: a process of its own with a shown window, its data folder the first argument
WINDOW_PROCESS = """
import os, signal, sys, time
from pathlib import Path
from PySide6.QtCore import QSettings
from memfit.gui.app import make_app
app = make_app()
from memfit.gui.main_window import MainWindow
folder = Path(sys.argv[1])
window = MainWindow(settings=QSettings(str(folder / "s.ini"), QSettings.Format.IniFormat),
                    data_dir=folder)
window.show()
"""
KILLED = (
    WINDOW_PROCESS
    + """
window.training_panel.rows["training.micro_batch_size"].widget.setValue(3)
window.model_panel.rows["model.num_layers"].widget.setValue(20)
recovery = window.recovery.path
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    app.processEvents()
    if recovery.exists() and '"num_layers": 20' in recovery.read_text():
        break
    time.sleep(0.02)
os.kill(os.getpid(), signal.SIGKILL)
"""
)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs kill -9")
def test_edits_survive_kill_9(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = run_offscreen(KILLED, str(tmp_path))
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    window = start()
    t, m = window.store.scenario.training, window.store.scenario.model
    assert (t.micro_batch_size, m.num_layers) == (3, 20)
    assert window.store.modified and window.store.path is None
    assert window.notice.messages() == ["Recovered unsaved changes to the untitled scenario."]


def test_geometry_is_still_restored(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    window = start(scenario=default_scenario())
    window.resize(1100, 700)
    window.close()
    geometry = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat).value(
        "window/geometry"
    )
    assert isinstance(geometry, QByteArray) and not geometry.isEmpty()
    again = start(scenario=default_scenario())
    assert again.notice.messages() == []


# -- the first change at once, one recovery file per window -----------------------------


def autosaved(window: MainWindow) -> dict:  # type: ignore[type-arg]
    return json.loads(window.recovery.path.read_text())


def test_the_first_change_is_in_the_recovery_file_at_once(start, qtbot: QtBot) -> None:  # type: ignore[no-untyped-def]
    window = start(scenario=default_scenario())
    assert not window.recovery.path.exists()  # nothing to recover yet
    box = window.training_panel.rows["training.micro_batch_size"].widget
    box.setValue(7)  # no event is processed after it, no timer runs
    data = autosaved(window)
    assert data["modified"] is True and data["scenario"]["training"]["micro_batch_size"] == 7
    # the rest of a burst is written a moment after its last change
    box.setValue(8)
    box.setValue(9)
    assert autosaved(window)["scenario"]["training"]["micro_batch_size"] == 7
    qtbot.waitUntil(
        lambda: autosaved(window)["scenario"]["training"]["micro_batch_size"] == 9, timeout=5000
    )


KILLED_AT_ONCE = (
    WINDOW_PROCESS
    + """
window.training_panel.rows["training.micro_batch_size"].widget.setValue(3)
os.kill(os.getpid(), signal.SIGKILL)  # at once: no event processed, no timer run
"""
)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs kill -9")
def test_an_edit_killed_at_once_survives(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = run_offscreen(KILLED_AT_ONCE, str(tmp_path))
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    window = start()
    assert window.store.scenario.training.micro_batch_size == 3 and window.store.modified
    assert window.notice.messages() == ["Recovered unsaved changes to the untitled scenario."]


def test_two_windows_never_share_a_recovery_file(
    start, tmp_path: Path, message_boxes: MessageBoxes
) -> None:  # type: ignore[no-untyped-def]
    first = start(scenario=default_scenario())
    first.training_panel.rows["training.micro_batch_size"].widget.setValue(5)
    edited = first.store.scenario
    second = start()  # the first is running: its edits are its own
    assert second.store.scenario == default_scenario() and not second.store.modified
    assert second.notice.messages() == [] and second.recovery.path != first.recovery.path
    second.training_panel.rows["training.micro_batch_size"].widget.setValue(6)
    message_boxes.queue(Button.Discard)
    assert second.close()
    assert recovery_files(tmp_path) == [first.recovery.path]  # only its own file went
    gone(first)
    third = start()
    assert third.store.scenario == edited and third.store.modified
    assert third.notice.messages() == ["Recovered unsaved changes to the untitled scenario."]


OTHER_INSTANCE = (
    WINDOW_PROCESS
    + """
window.training_panel.rows["training.micro_batch_size"].widget.setValue(5)
print("edited", flush=True)
sys.stdin.readline()  # runs until it is killed
"""
)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs kill -9")
def test_a_second_instance_that_discards_does_not_lose_the_firsts_edits(
    start, tmp_path: Path, message_boxes: MessageBoxes
) -> None:  # type: ignore[no-untyped-def]
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONPATH=str(ROOT))
    first = subprocess.Popen(
        [sys.executable, "-c", OTHER_INSTANCE, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == "edited"
        second = start()
        assert second.store.scenario.training.micro_batch_size == 4  # not the first's edit
        second.training_panel.rows["training.micro_batch_size"].widget.setValue(6)
        message_boxes.queue(Button.Discard)
        assert second.close()
    finally:
        first.kill()
        first.communicate(timeout=60)
    third = start()
    assert third.store.scenario.training.micro_batch_size == 5 and third.store.modified
    assert third.notice.messages() == ["Recovered unsaved changes to the untitled scenario."]


def orphan(tmp_path: Path, name: str, age_s: float, **fields: object) -> Path:
    """A recovery file left by a window whose process is gone, last written ``age_s``
    seconds ago."""
    folder = tmp_path / "recovery"
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.memfit.json"
    path.write_text(wrapper(**fields))
    when = time.time() - age_s
    os.utime(path, (when, when))
    return path


def with_batch(n: int) -> dict:  # type: ignore[type-arg]
    return scenario_to_dict(
        dataclasses.replace(
            default_scenario(),
            training=dataclasses.replace(default_scenario().training, micro_batch_size=n),
        )
    )


LOCKS = {
    "of a process that is gone": f"999999999\npython3\n{QSysInfo.machineHostName()}\n",
    "damaged, and old": "not a lock\n",
    "empty, and old": "",
}


@pytest.mark.parametrize("lock", LOCKS.values(), ids=LOCKS.keys())
def test_a_recovery_file_whose_lock_is_stale_is_restored(start, tmp_path: Path, lock: str) -> None:  # type: ignore[no-untyped-def]
    path = orphan(tmp_path, "dead", 60, modified=True, scenario=with_batch(11))
    stale = path.with_name(path.name + ".lock")
    stale.write_text(lock)
    os.utime(stale, (time.time() - 600,) * 2)
    window = start()
    assert window.store.scenario.training.micro_batch_size == 11 and window.store.modified
    assert window.recovery.path == path and window.recovery.owned


def test_a_recovery_file_of_a_running_window_is_left_alone(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = orphan(tmp_path, "alive", 60, modified=True, scenario=with_batch(11))
    held = QLockFile(str(path) + ".lock")  # this process is running
    assert held.tryLock(0)
    try:
        window = start()
        assert window.store.scenario == default_scenario() and window.notice.messages() == []
        window.close()
        assert path.exists() and json.loads(path.read_text())["modified"] is True
    finally:
        held.unlock()


def test_every_orphan_is_restored_or_offered(
    start, tmp_path: Path, message_boxes: MessageBoxes
) -> None:  # type: ignore[no-untyped-def]
    doc = tmp_path / "run.memfit.json"
    newest = orphan(tmp_path, "newest", 10, modified=True, scenario=with_batch(12))
    older = orphan(tmp_path, "older", 100, modified=True, path=str(doc), scenario=with_batch(13))
    oldest = orphan(tmp_path, "oldest", 1000, modified=True, scenario=with_batch(14))
    saved = orphan(tmp_path, "saved", 1, modified=False, scenario=with_batch(15))
    window = start()
    assert window.store.scenario.training.micro_batch_size == 12 and window.store.modified
    assert window.recovery.path == newest
    notices = window.notice.messages()
    assert notices[0] == "Recovered unsaved changes to the untitled scenario."
    assert notices[1].startswith("2 more unsaved sessions kept: run.memfit.json (")
    assert "the untitled scenario (" in notices[1] and "Recover Unsaved Session" in notices[1]
    assert not saved.exists()  # it held nothing unsaved
    items = window.recover_menu.actions()
    assert window.recover_menu.menuAction().isVisible() and len(items) == 2
    assert items[0].text().startswith("&1 run.memfit.json, unsaved changes of ")
    # recovering one asks about the changes in the window first
    message_boxes.queue(Button.Cancel)
    items[0].trigger()
    assert window.store.scenario.training.micro_batch_size == 12 and older.exists()
    message_boxes.queue(Button.Discard)
    items[0].trigger()
    assert window.store.scenario.training.micro_batch_size == 13
    assert window.store.path == doc and window.store.modified
    assert not older.exists() and autosaved(window)["scenario"] == with_batch(13)
    assert len(window.recover_menu.actions()) == 1
    # a close leaves the one not recovered for the next start
    message_boxes.queue(Button.Discard)
    assert window.close()
    assert recovery_files(tmp_path) == [oldest] and recovery_files(tmp_path, "*.lock") == []
    again = start()
    assert again.store.scenario.training.micro_batch_size == 14
    assert not again.recover_menu.menuAction().isVisible()


def test_the_recovery_file_of_earlier_versions_is_read_once(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    legacy = tmp_path / "last.memfit.json"
    legacy.write_text(wrapper(modified=True, scenario=with_batch(21)))
    window = start()
    assert window.store.scenario.training.micro_batch_size == 21 and window.store.modified
    assert not legacy.exists() and window.recovery.path.parent == tmp_path / "recovery"
    assert autosaved(window)["scenario"] == with_batch(21)
    gone(window)
    again = start()  # from the recovery folder now
    assert again.store.scenario.training.micro_batch_size == 21 and again.store.modified

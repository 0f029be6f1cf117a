"""``memfit --selftest [DIR]``: check, without a display, that this copy of the app works.

It is meant for a built bundle (``dist/memfit/memfit --selftest DIR`` in CI) as much as for
the source tree. Each check prints one line; the first failure stops the run with a non-zero
exit status and the reason. The checks, in order:

* ``platform`` -- a Qt platform plugin loads (``offscreen`` when there is no display);
* ``version`` -- the package version is known (a bundle must carry the metadata);
* ``resources`` -- the model and GPU presets and the SVG icon are found and load;
* ``window`` -- the main window builds and shows, its settings in a temporary ini file
  and its autosave in a temporary folder, so the user's own are never read or written;
* ``estimate`` -- a preset scenario (the README's: Llama 3 8B, full fine-tuning on an
  L40S, every what-if shown) estimates, and the window shows that estimate;
* ``png``, ``svg``, ``csv`` -- the chart and the breakdown exported into ``DIR`` through
  :meth:`~memfit.gui.main_window.MainWindow.export_chart` and
  :meth:`~memfit.gui.main_window.MainWindow.export_data`, then read back: the PNG decodes at the
  chart's size, the SVG parses, the CSV's items sum to the estimate's device bytes;
* ``fonts`` -- text renders: a label drawn into an image has dark pixels, and "H" and "I"
  come out different (a machine without fonts draws nothing or the same box for both).

``DIR`` also receives ``selftest.txt``, the same lines (for a windowed build whose output
goes nowhere). Without ``DIR`` a new temporary folder is used and named.

``memfit --selftest --first-paint-probe`` does not run the checks: it starts the app as a
user would (with throw-away settings), prints ``first-paint <time.monotonic()>`` when the
chart is first painted, and quits -- the start-up figure of ``benchmarks/bundle.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, QSettings, Qt, QTimer
from PySide6.QtGui import QColor, QFontInfo, QGuiApplication, QImage, QPalette
from PySide6.QtWidgets import QLabel

from memfit.engine.cli import version
from memfit.engine.estimate import GIB, estimate
from memfit.engine.files import write_text
from memfit.engine.locate import resources
from memfit.engine.model_state import CATEGORIES
from memfit.engine.presets import gpu_names, load_gpu, load_model, model_names
from memfit.engine.specs import HardwareSpec, Scenario, TrainingSpec
from memfit.gui.app import make_app
from memfit.gui.lifetime import delete_now
from memfit.gui.main_window import MainWindow, app_icon

REPORT_NAME = "selftest.txt"
PNG_NAME = "memfit-selftest.png"
SVG_NAME = "memfit-selftest.svg"
CSV_NAME = "memfit-selftest.csv"
SVG_NS = "{http://www.w3.org/2000/svg}"


class SelfTestError(RuntimeError):
    """A check failed: ``check`` names it, ``lines`` holds the lines of the checks passed."""

    def __init__(self, check: str, reason: str, lines: Sequence[str] = ()) -> None:
        super().__init__(f"{check}: {reason}")
        self.check = check
        self.reason = reason
        self.lines = list(lines)


class CheckFailed(Exception):
    """Raised inside a check with the reason; :func:`run_selftest` adds the check's name."""


def use_offscreen_without_display() -> None:
    """Choose Qt's ``offscreen`` platform when none is chosen and there is no display.

    Has an effect only before the ``QApplication`` exists.
    """
    has_display = os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    if sys.platform == "linux" and not os.environ.get("QT_QPA_PLATFORM") and not has_display:
        os.environ["QT_QPA_PLATFORM"] = "offscreen"


def selftest_scenario() -> Scenario:
    """The README's scenario: full fine-tuning of Llama 3 8B on one L40S (it does not fit)."""
    return Scenario(
        load_model("llama-3-8b"),
        HardwareSpec(load_gpu("l40s")),
        TrainingSpec(method="full", micro_batch_size=2, sequence_length=2048),
    )


def run_selftest(out_dir: Path, report: Callable[[str], object] | None = None) -> list[str]:
    """Run every check, writing the exports into ``out_dir``; return one line per check.

    ``report`` receives each line as soon as its check has passed. The first failing check
    raises :class:`SelfTestError` naming it. A ``QApplication`` is made if there is none.
    """
    lines: list[str] = []

    def step(check: str, work: Callable[[], str]) -> None:
        started = time.perf_counter()
        try:
            detail = work()
        except CheckFailed as exc:
            raise SelfTestError(check, str(exc), lines) from None
        except Exception as exc:  # a crash is a failed check, named, not a bare traceback
            raise SelfTestError(check, f"{type(exc).__name__}: {exc}", lines) from exc
        line = f"ok  {check:<9} {detail} ({(time.perf_counter() - started) * 1e3:.0f} ms)"
        lines.append(line)
        if report is not None:
            report(line)

    step("platform", check_platform)
    step("version", check_version)
    step("resources", check_resources)
    with tempfile.TemporaryDirectory(prefix="memfit-selftest-") as private:
        windows: list[MainWindow] = []
        try:
            step("window", lambda: build_window(Path(private), windows))
            window = windows[0]
            step("estimate", lambda: check_estimate(window, selftest_scenario()))
            step("png", lambda: check_png(window, out_dir / PNG_NAME))
            step("svg", lambda: check_svg(window, out_dir / SVG_NAME))
            step("csv", lambda: check_csv(window, out_dir / CSV_NAME))
        finally:
            for window in windows:  # closing autosaves, into the private folder
                window.close()
            delete_now(*windows)
    step("fonts", check_fonts)
    return lines


def check_platform() -> str:
    make_app()
    platform = QGuiApplication.platformName()
    if not platform:
        raise CheckFailed("no Qt platform plugin is loaded")
    return f"Qt platform plugin {platform!r}"


def check_version() -> str:
    if version() == "0+unknown":
        raise CheckFailed("the package metadata of memfit is missing")
    return f"MemFit {version()}"


def check_resources() -> str:
    models, gpus = model_names(), gpu_names()
    if not models or not gpus:
        raise CheckFailed(f"no presets under {resources()}")
    if app_icon().pixmap(64, 64).isNull():
        raise CheckFailed("the SVG icon does not load (are Qt's SVG plugins missing?)")
    return f"{len(models)} model and {len(gpus)} GPU presets, the SVG icon"


def build_window(private: Path, windows: list[MainWindow]) -> str:
    """The main window on :func:`selftest_scenario` with settings and autosave under
    ``private``, shown at 1280x800 with every what-if; appended to ``windows``."""
    settings = QSettings(str(private / "settings.ini"), QSettings.Format.IniFormat)
    window = MainWindow(settings=settings, data_dir=private, scenario=selftest_scenario())
    windows.append(window)
    window.resize(1280, 800)
    window.show()
    window.compare_all()
    QGuiApplication.processEvents()
    shown = sum(button.isChecked() for button in window.whatif.buttons.values())
    return f"{window.width()}x{window.height()}, {shown} what-if ghost bars"


def check_estimate(window: MainWindow, scenario: Scenario) -> str:
    expected = estimate(scenario)
    shown = window.store.estimate
    if shown is None:
        raise CheckFailed(f"the window has no estimate: {window.store.error}")
    if shown.device_bytes != expected.device_bytes or expected.device_bytes <= 0:
        raise CheckFailed(
            f"the window shows {shown.device_bytes:,} device bytes, "
            f"the engine says {expected.device_bytes:,}"
        )
    return (
        f"{scenario.model.label} on {scenario.hardware.gpu.display_name}: "
        f"{expected.device_bytes / GIB:,.2f} GiB per GPU, {expected.verdict}"
    )


def check_png(window: MainWindow, path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    window.export_chart(path, 1)
    image = QImage(str(path))
    if image.isNull():
        raise CheckFailed(f"{path.name} does not decode as an image")
    want = window.chart.size()
    # the chart as shown, under a caption strip that names the scenario
    if image.width() != want.width() or image.height() < want.height():
        raise CheckFailed(
            f"{path.name} is {image.width()}x{image.height()}, "
            f"the chart {want.width()}x{want.height()} (with its caption above)"
        )
    colours = {
        image.pixel(x, y) for x in range(0, image.width(), 5) for y in range(0, image.height(), 5)
    }
    if len(colours) < 8:
        raise CheckFailed(f"{path.name} is almost blank ({len(colours)} colours)")
    return f"{path.name} {image.width()}x{image.height()}, {len(colours)} colours"


def check_svg(window: MainWindow, path: Path) -> str:
    window.export_chart(path)
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise CheckFailed(f"{path.name} does not parse: {exc}") from None
    if root.tag != f"{SVG_NS}svg":
        raise CheckFailed(f"{path.name}'s root element is {root.tag!r}, not an SVG element")
    elements = sum(1 for _ in root.iter())
    if elements < 20:
        raise CheckFailed(f"{path.name} holds only {elements} elements")
    texts = sum(1 for _ in root.iter(f"{SVG_NS}text"))
    return f"{path.name} parses, {elements} elements ({texts} text)"


def check_csv(window: MainWindow, path: Path) -> str:
    window.export_data(path)
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    items = [r for r in rows if r["category"] in CATEGORIES]  # not totals, ranks or host
    totals = {r["item"]: int(r["bytes"]) for r in rows if r["category"] == "total"}
    item_sum = sum(int(r["bytes"]) for r in items)
    shown = window.store.estimate
    if shown is None:
        raise CheckFailed(f"the window has no estimate: {window.store.error}")
    device = shown.device_bytes
    if item_sum != device or totals.get("device") != device:
        raise CheckFailed(
            f"{path.name}: the items sum to {item_sum:,} bytes and the device total reads "
            f"{totals.get('device')}, but the estimate's device bytes are {device:,}"
        )
    return f"{path.name} {len(items)} items sum to the {device:,} device bytes"


def render_text(text: str, size: tuple[int, int] | None = None) -> QImage:
    """``text`` in a black-on-white ``QLabel`` rendered into an image (its own size, or
    ``size``)."""
    label = QLabel(text)
    palette = label.palette()
    palette.setColor(QPalette.ColorRole.Window, QColor("white"))
    palette.setColor(QPalette.ColorRole.WindowText, QColor("black"))
    label.setPalette(palette)
    label.setAutoFillBackground(True)
    label.setAlignment(Qt.AlignmentFlag.AlignCenter)
    if size is None:
        label.adjustSize()
    else:
        label.resize(*size)
    image = QImage(label.size(), QImage.Format.Format_ARGB32)
    image.fill(QColor("white"))
    label.render(image)
    return image


def check_fonts() -> str:
    sample = render_text("MemFit 0123")
    dark = sum(
        QColor(sample.pixel(x, y)).lightness() < 128
        for x in range(sample.width())
        for y in range(sample.height())
    )
    if dark < 20:
        raise CheckFailed(f"'MemFit 0123' drew {dark} dark pixels: is there no usable font?")
    if render_text("H", (40, 40)) == render_text("I", (40, 40)):
        raise CheckFailed("'H' and 'I' render the same: is there no usable font?")
    family = QFontInfo(QLabel().font()).family()
    return f"'MemFit 0123' drew {dark} dark pixels in {family!r}; 'H' differs from 'I'"


def first_paint_probe(timeout_s: float = 60.0) -> int:
    """Start the app as ``memfit`` does, print ``first-paint <time.monotonic()>`` when the
    chart is first painted, and quit; settings and autosave go to a temporary folder.

    Linux's monotonic clock is shared by all processes, so a parent that read the clock
    before starting this process gets the time from start to first paint.
    """
    app = make_app()
    painted: list[float] = []

    class FirstPaint(QObject):
        def eventFilter(self, watched: QObject, event: QEvent) -> bool:
            if event.type() == QEvent.Type.Paint and not painted:
                painted.append(time.monotonic())
                print(f"first-paint {painted[0]:.6f}", flush=True)
                QTimer.singleShot(0, app.quit)
            return False

    with tempfile.TemporaryDirectory(prefix="memfit-probe-") as private:
        app.setWindowIcon(app_icon())
        window = MainWindow(
            settings=QSettings(str(Path(private) / "settings.ini"), QSettings.Format.IniFormat),
            data_dir=Path(private),
        )
        spy = FirstPaint()
        viewport = window.chart.plot.viewport()
        viewport.installEventFilter(spy)
        QTimer.singleShot(int(timeout_s * 1000), app.quit)
        window.show()
        app.exec()
        viewport.removeEventFilter(spy)
        window.close()
    if not painted:
        print(f"selftest: the chart was not painted within {timeout_s:.0f} s", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``memfit --selftest [DIR] [--first-paint-probe]``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="memfit --selftest",
        description="Check, without a display, that this copy of MemFit works.",
    )
    parser.add_argument("dir", nargs="?", type=Path, help="where the exports go")
    parser.add_argument(
        "--first-paint-probe",
        action="store_true",
        help="start the app, print the time of the first chart paint, and quit",
    )
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    use_offscreen_without_display()
    if args.first_paint_probe:
        return first_paint_probe()
    out_dir: Path = args.dir or Path(tempfile.mkdtemp(prefix="memfit-selftest-"))
    print(f"MemFit self-test, writing into {out_dir}", flush=True)
    try:
        lines = run_selftest(out_dir, report=lambda line: print(line, flush=True))
    except SelfTestError as exc:
        message = f"FAIL {exc.check}: {exc.reason}"
        print(f"selftest: {message}", file=sys.stderr, flush=True)
        write_report(out_dir, [*exc.lines, message])
        return 1
    write_report(out_dir, lines)
    print(f"selftest: all {len(lines)} checks passed", flush=True)
    return 0


def write_report(out_dir: Path, lines: Sequence[str]) -> None:
    """``lines`` into ``out_dir/selftest.txt``, where that folder can be written."""
    # the reason of a failure is already on stderr; a missing report is no new failure
    with contextlib.suppress(OSError):
        write_text(out_dir / REPORT_NAME, "\n".join(lines) + "\n")

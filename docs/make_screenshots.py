"""Render the Tradeoffs view offscreen at 1280x800 for the README: the strategy map after a
sweep, the curves, the hardware comparison and the changes that make a run fit.

Run: ``QT_QPA_PLATFORM=offscreen python docs/make_screenshots.py [OUT_DIR]`` (default
``docs/``). The scenario is Llama 3 8B, full fine-tuning with FSDP (ZeRO-3) on 8 x H100
SXM, micro-batch 2, gradient accumulation 4, sequence 4,096 and a budget of 10 billion
tokens. No price per GPU-hour is given, so the costs read "—". The Make it fit picture is
of a run that does not fit: Llama 3 8B full fine-tuning, micro-batch 8, sequence 4,096 on
one H100 SXM.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication

from memfit.engine.presets import load_gpu, load_model
from memfit.engine.specs import HardwareSpec, ParallelismSpec, Scenario, TrainingSpec
from memfit.gui.app import make_app

SHOTS = (
    "tradeoffs-map.png",
    "tradeoffs-curves.png",
    "tradeoffs-hardware.png",
    "tradeoffs-fit.png",
)


def scenario() -> Scenario:
    return Scenario(
        load_model("llama-3-8b"),
        HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8),
        TrainingSpec(
            method="full",
            micro_batch_size=2,
            gradient_accumulation_steps=4,
            sequence_length=4096,
            token_budget=10_000_000_000,
            parallelism=ParallelismSpec(zero_stage=3),
        ),
    )


def too_big() -> Scenario:
    return Scenario(
        load_model("llama-3-8b"),
        HardwareSpec(load_gpu("h100-sxm-80gb")),
        TrainingSpec(method="full", micro_batch_size=8, sequence_length=4096),
    )


def settle(app: QApplication, busy: object, timeout: float = 120.0) -> None:
    """Process events until ``busy()`` is false (a worker has delivered)."""
    end = time.monotonic() + timeout
    while True:
        app.processEvents()
        if not busy():  # type: ignore[operator]
            break
        if time.monotonic() > end:
            raise TimeoutError("the Tradeoffs view did not finish in time")
        time.sleep(0.02)
    for _ in range(5):
        app.processEvents()
        time.sleep(0.02)


def main(out: Path) -> list[Path]:
    app = make_app()
    from memfit.gui.main_window import MainWindow

    out.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        settings = QSettings(str(Path(tmp) / "light.ini"), QSettings.Format.IniFormat)
        window = MainWindow(settings=settings, data_dir=Path(tmp), scenario=scenario())
        window.set_theme("light")
        window.resize(1280, 800)
        window.show()
        window.views.setCurrentWidget(window.tradeoffs)
        view = window.tradeoffs
        app.processEvents()

        view.tabs.setCurrentIndex(0)
        view.start_sweep()
        settle(app, lambda: view.sweeper.busy)
        path = out / SHOTS[0]
        window.grab().save(str(path))
        written.append(path)

        view.tabs.setCurrentIndex(1)
        settle(app, lambda: view.curver.busy or view.curves_view.curves() is None)
        path = out / SHOTS[1]
        window.grab().save(str(path))
        written.append(path)

        view.hardware_view.set_checked(
            ["h100-sxm-80gb", "a100-sxm-80gb", "h200-sxm-141gb", "b200-sxm-180gb", "mi300x",
             "gaudi3", "l40s"]
        )  # fmt: skip
        view.tabs.setCurrentIndex(2)
        settle(app, lambda: view.comparer.busy or not view.hardware_view.rows())
        path = out / SHOTS[2]
        window.grab().save(str(path))
        written.append(path)

        window.store.reset(too_big())
        view.tabs.setCurrentIndex(3)

        def fixing() -> bool:
            result = view.fit_view.result()
            return view.fitter.busy or result is None or result.scenario != too_big()

        settle(app, fixing)
        window.statusBar().clearMessage()  # the sweep's summary, of another scenario
        path = out / SHOTS[3]
        window.grab().save(str(path))
        written.append(path)
        window.close()
    return written


if __name__ == "__main__":
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent
    for p in main(folder):
        print(p)

"""Render the main window offscreen at 1280x800 in light and dark colours, for the README.

Run: ``QT_QPA_PLATFORM=offscreen python packaging/screenshots.py [OUT_DIR]`` (default
``docs/``). The scenario is a full fine-tune of Llama 3 8B on an L40S that does not fit,
with every what-if shown, so the picture answers "which change makes it fit?".
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QSettings

from engine.presets import load_gpu, load_model
from engine.specs import HardwareSpec, ParallelismSpec, Scenario, TrainingSpec
from gui.app import make_app


def main(out: Path) -> list[Path]:
    app = make_app()
    from gui.main_window import MainWindow

    out.mkdir(parents=True, exist_ok=True)
    scenario = Scenario(
        load_model("llama-3-8b"),
        HardwareSpec(load_gpu("l40s")),
        TrainingSpec(method="full", micro_batch_size=2, sequence_length=2048),
    )
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        for theme in ("light", "dark"):
            settings = QSettings(str(Path(tmp) / f"{theme}.ini"), QSettings.Format.IniFormat)
            window = MainWindow(
                settings=settings, autosave=Path(tmp) / "last.json", scenario=scenario
            )
            window.set_theme(theme)
            window.resize(1280, 800)
            window.show()
            window.compare_all()
            app.processEvents()
            path = out / f"memfit-{theme}.png"
            window.grab().save(str(path))
            written.append(path)
            window.close()
        # a cluster run: Llama 3.1 70B on 2 nodes x 8 H100, tp=8 with sequence parallelism,
        # pp=2: one bar per stage, the worst outlined; the left column shows the split
        cluster = Scenario(
            load_model("llama-3.1-70b"),
            HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8, nodes=2),
            TrainingSpec(
                method="full",
                micro_batch_size=1,
                sequence_length=4096,
                gradient_accumulation_steps=8,
                activation_checkpointing="full",
                optimizer_impl="fused",
                parallelism=ParallelismSpec(tp=8, pp=2, zero_stage=1, sequence_parallel=True),
            ),
        )
        settings = QSettings(str(Path(tmp) / "cluster.ini"), QSettings.Format.IniFormat)
        window = MainWindow(settings=settings, autosave=Path(tmp) / "last.json", scenario=cluster)
        window.set_theme("light")
        window.resize(1280, 800)
        window.show()
        app.processEvents()
        # scrolled down to the parallelism panel, as far as the column goes
        panel = window.parallelism_panel
        top = panel.mapTo(window.scroll.widget(), panel.rect().topLeft()).y()
        window.scroll.verticalScrollBar().setValue(max(0, top - 24))
        app.processEvents()
        path = out / "memfit-pipeline.png"
        window.grab().save(str(path))
        written.append(path)
        window.close()
    return written


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent.parent / "docs"
    for p in main(target):
        print(p)

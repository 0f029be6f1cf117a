"""Render the main window offscreen for the README: at 1024x640, 1280x800 and 1920x1080,
in light and dark colours, and the two tabs under the chart that explain the activations.

Run: ``QT_QPA_PLATFORM=offscreen python packaging/screenshots.py [OUT_DIR]`` (default
``docs/``). The scenario is a full fine-tune of Llama 3 8B on an L40S that does not fit,
with every what-if shown, so the picture answers "which change makes it fit?". The tabs
are of a LoRA run of Llama 3 8B at 8,192 tokens on an H100, whose activations are mostly
the logits and the loss's buffers.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QSettings

from memfit.engine.presets import load_gpu, load_model
from memfit.engine.specs import HardwareSpec, ParallelismSpec, Scenario, TrainingSpec
from memfit.gui.app import make_app

#: the window sizes of the README's screenshots (width, height)
SIZES = ((1024, 640), (1280, 800), (1920, 1080))
THEMES = ("light", "dark")


def shot_name(size: tuple[int, int], theme: str) -> str:
    """``memfit-1280x800-light.png``."""
    return f"memfit-{size[0]}x{size[1]}-{theme}.png"


def main(out: Path) -> list[Path]:
    app = make_app()
    from memfit.gui.main_window import MainWindow

    out.mkdir(parents=True, exist_ok=True)
    scenario = Scenario(
        load_model("llama-3-8b"),
        HardwareSpec(load_gpu("l40s")),
        TrainingSpec(method="full", micro_batch_size=2, sequence_length=2048),
    )
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        for theme in THEMES:
            for size in SIZES:
                settings = QSettings(str(Path(tmp) / f"{theme}.ini"), QSettings.Format.IniFormat)
                window = MainWindow(settings=settings, data_dir=Path(tmp), scenario=scenario)
                window.set_theme(theme)
                window.resize(*size)
                window.show()
                if size == SIZES[0]:  # a small window: the two changes that make it fit
                    for key in ("lora", "qlora"):
                        window.whatif.buttons[key].setChecked(True)
                else:
                    window.compare_all()
                app.processEvents()
                path = out / shot_name(size, theme)
                window.grab().save(str(path))
                written.append(path)
                window.close()
        # the activations by source and the memory over time of a long-sequence LoRA run
        long_run = Scenario(
            load_model("llama-3-8b"),
            HardwareSpec(load_gpu("h100-sxm-80gb")),
            TrainingSpec(
                method="lora",
                precision="bf16-mixed",
                micro_batch_size=4,
                sequence_length=8192,
                activation_checkpointing="full",
            ),
        )
        settings = QSettings(str(Path(tmp) / "tabs.ini"), QSettings.Format.IniFormat)
        window = MainWindow(settings=settings, data_dir=Path(tmp), scenario=long_run)
        window.set_theme("light")
        window.resize(1280, 800)
        window.show()
        for page, name in ((window.activations, "activations"), (window.step_view, "timeline")):
            window.show_details(page)
            app.processEvents()
            path = out / f"memfit-{name}.png"
            window.views.grab().save(str(path))
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
        window = MainWindow(settings=settings, data_dir=Path(tmp), scenario=cluster)
        window.set_theme("light")
        window.resize(1280, 800)
        window.show()
        app.processEvents()
        # scrolled down to the parallelism panel, as far as the column goes
        panel = window.parallelism_panel
        top = panel.mapTo(window.column_scroll.widget(), panel.rect().topLeft()).y()
        window.column_scroll.verticalScrollBar().setValue(max(0, top - 24))
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

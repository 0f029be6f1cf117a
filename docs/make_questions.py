"""Render the seven questions of the README's "Questions MemFit answers" at 1280x800, and
print the figures each answer quotes.

Run: ``QT_QPA_PLATFORM=offscreen python docs/make_questions.py [OUT_DIR]`` (default
``docs/``). Each picture is the app as a user leaves it after asking: the scenario set,
the view that answers in front.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_screenshots import settle
from PySide6.QtCore import QSettings

from memfit.engine.presets import load_gpu, load_model
from memfit.engine.solve import largest_model, search
from memfit.engine.specs import HardwareSpec, ParallelismSpec, Scenario, TrainingSpec
from memfit.gui.app import make_app

ROOT = Path(__file__).resolve().parents[1]


def full_8b_on_one_h100() -> Scenario:
    return Scenario(
        load_model("llama-3-8b"),
        HardwareSpec(load_gpu("h100-sxm-80gb")),
        TrainingSpec(method="full", micro_batch_size=4, sequence_length=2048),
    )


def lora_on_two_4090s(model: str = "gpt2") -> Scenario:
    return Scenario(
        load_model(model),
        HardwareSpec(load_gpu("rtx-4090"), gpus_per_node=2),
        TrainingSpec(
            method="lora", micro_batch_size=1, sequence_length=2048,
            activation_checkpointing="full", parallelism=ParallelismSpec(zero_stage=3),
        ),
    )  # fmt: skip


def pretrain_70b_on_64_h100s() -> Scenario:
    return Scenario(
        load_model("llama-3-70b"),
        HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8, nodes=8),
        TrainingSpec(
            method="full", micro_batch_size=1, gradient_accumulation_steps=16,
            sequence_length=8192, stack="torchtitan", token_budget=1_000_000_000_000,
            parallelism=ParallelismSpec(zero_stage=3),
        ),
    )  # fmt: skip


def main(out: Path) -> list[Path]:
    app = make_app()
    from memfit.gui.main_window import MainWindow

    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def shot(window: MainWindow, name: str) -> None:
        for _ in range(10):
            app.processEvents()
            time.sleep(0.02)
        path = out / name
        window.grab().save(str(path))
        written.append(path)

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)

        def done(w: MainWindow) -> None:
            w.store.undo_stack.setClean()  # nothing to ask about: the picture is taken
            w.close()

        def window_on(s: Scenario) -> MainWindow:
            settings = QSettings(str(folder / "q.ini"), QSettings.Format.IniFormat)
            w = MainWindow(settings=settings, data_dir=folder, scenario=s)
            w.set_theme("light")
            w.resize(1280, 800)
            w.show()
            return w

        # 1. can I fully fine-tune Llama 3 8B on one H100?
        w = window_on(full_8b_on_one_h100())
        est = w.store.estimate
        assert est is not None
        found = search(full_8b_on_one_h100(), top=3)
        print(f"q1: {est.device_bytes / 2**30:.1f} GiB of {est.capacity_bytes / 2**30:.1f}")
        for f in found.fixes:
            print("q1 fix:", " + ".join(f.labels), f"{f.device_bytes / 2**30:.1f} GiB",
                  f"{f.time.tokens_per_s:,.0f} tokens/s")  # fmt: skip
        w.compare_all_act.trigger()
        settle(app, lambda: False)
        shot(w, "q1-full-8b-on-one-h100.png")
        done(w)

        # 2. the largest model I can LoRA on 2 x RTX 4090
        best = largest_model(lora_on_two_4090s())
        assert best is not None
        print(f"q2: {best.name} {best.params / 1e9:.1f} B, {best.device_bytes / 2**30:.1f} GiB")
        w = window_on(lora_on_two_4090s(best.name))
        shot(w, "q2-largest-lora-on-two-4090s.png")
        done(w)

        # 3. a 70B pretraining layout for 64 H100s (torchtitan: every axis it runs)
        w = window_on(pretrain_70b_on_64_h100s())
        view = w.tradeoffs
        w.views.setCurrentWidget(view)
        view.tabs.setCurrentIndex(0)
        app.processEvents()
        view.start_sweep()
        settle(app, lambda: view.sweeper.busy)
        print("q3:", view.sweep_status.text())
        shot(w, "q3-70b-on-64-h100s.png")
        done(w)

        # 4. why are activations so big?
        w = window_on(dataclasses.replace(
            full_8b_on_one_h100(),
            training=dataclasses.replace(full_8b_on_one_h100().training, sequence_length=4096),
        ))  # fmt: skip
        w.show_details(w.activations)
        shot(w, "q4-activations-by-source.png")
        done(w)

        # 5. import my model and my Axolotl config
        w = window_on(full_8b_on_one_h100())
        fixtures = ROOT / "tests" / "fixtures"
        w.importer.import_path(fixtures / "hf_configs" / "qwen2.json")
        w.importer.import_path(fixtures / "train_configs" / "axolotl-llama3-8b-lora-zero2.yml")
        print("q5:", " | ".join(w.notice.messages()))
        shot(w, "q5-import-config-and-axolotl.png")
        done(w)

        # 6. export for a design doc: the current scenario beside the pinned baseline
        w = window_on(full_8b_on_one_h100())
        w.pin_baseline_act.trigger()
        s = w.store.scenario
        w.store.edit(
            dataclasses.replace(s, training=dataclasses.replace(
                s.training, activation_checkpointing="full", optimizer="adamw-8bit")),
            "Checkpointing and 8-bit AdamW",
        )  # fmt: skip
        compare = w.compare_with([])
        assert compare is not None
        compare.resize(1280, 800)
        for _ in range(10):
            app.processEvents()
        path = out / "q6-compare-for-a-design-doc.png"
        compare.grab().save(str(path))
        written.append(path)
        compare.close()
        done(w)

        # 7. save, close, undo: edits are one undo step each, the document title says it
        w = window_on(full_8b_on_one_h100())
        w.save_to(folder / "run.memfit.json")
        s = w.store.scenario
        w.store.edit(
            dataclasses.replace(s, training=dataclasses.replace(s.training, micro_batch_size=2)),
            "Micro-batch 2",
        )
        print("q7:", w.windowTitle(), "|", w.undo_act.text())
        shot(w, "q7-save-close-undo.png")
        done(w)
    return written


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent
    for p in main(target):
        print(p)

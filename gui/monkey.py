"""A monkey test of the real main window: random user actions through its real widgets.

:class:`Monkey` drives a :class:`~memfit.gui.main_window.MainWindow` with seeded random actions,
each the way a user does it:

* spin boxes: select the text, type a value -- in range, out of range, or junk -- and
  press Enter; or press Up / Down;
* combos (the fields, the preset picker and its filters): Up, Down, Home, End or PageDown
  on the focused combo; any item of the preset list, as a click in its popup picks it
  (after a training field is set to one of the model's sizes, sometimes); the preset
  search box: type a word;
* check boxes (fields and LoRA targets), the what-if toggles and the heading of a folding
  section (Conventions): Space; a row's reset button: a click;
* undo and redo, New, Open (valid files, files the estimate rejects, malformed files, a
  FIFO, a folder, a file too big, a missing one), Open Recent, Save, Compare all / Clear
  what-ifs, and double-clicking a ghost bar to apply it;
* paste (Edit > Paste Configuration) and drop on the window (real drop events) of
  what :func:`import_corpus` holds -- scenarios, ``config.json`` files, training
  configurations, junk, JSON nested 50,000 deep, huge integers, markup, configurations
  that name files outside their folder -- as text or as files, model folders too (one of
  a tensor of absurd shape among them); File > Import and Import Model Folder of them;
* the Tradeoffs tab: its four views in turn, a sweep started and mostly cancelled;
* markup typed into the GPU name field.

File dialogs are stubbed (``QFileDialog``'s static methods return a file the monkey
chose), message boxes are answered at random (:class:`MessageBoxes`) and so is the
read-as prompt. Exceptions are counted through ``sys.excepthook`` (Qt slots report there)
and around each action. After every action the monkey checks that every visible form row
shows the scenario's value -- or holds a rejected value and shows its error --, that the
model preset combo shows the current model, that the chart is stale exactly when the
store has an error (and, when it is not, shows the store's estimate), that no label,
tooltip or chart text of the window, message box or prompt renders a user's markup
(:func:`rendered_markup`), and that no file a configuration names outside its folder has
its content shown (a notice, a message box, the status bar).

``benchmarks/monkey.py`` runs it for thousands of actions and prints the figures;
``tests/gui/test_monkey.py`` runs a few hundred and wants no exception and no mismatch.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import random
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from PySide6 import QtGui
from PySide6.QtCore import QAbstractItemModel, QMimeData, QModelIndex, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QColor, QDragEnterEvent, QDropEvent, QGuiApplication, QImage
from PySide6.QtTest import QTest
from PySide6.QtWidgets import (
    QAbstractItemView,
    QAbstractSpinBox,
    QApplication,
    QCheckBox,
    QComboBox,
    QDialog,
    QDoubleSpinBox,
    QFileDialog,
    QGraphicsTextItem,
    QGraphicsView,
    QInputDialog,
    QLabel,
    QMessageBox,
    QSpinBox,
    QTabBar,
    QWidget,
)

from memfit.engine.presets import model_names
from memfit.engine.scenario_io import save_scenario
from memfit.engine.specs import HardwareSpec, ParallelismSpec, Scenario, TrainingSpec
from memfit.gui.chart import VERDICTS, gib_text
from memfit.gui.forms import Collapsible, FormPanel, Row
from memfit.gui.lifetime import delete_now
from memfit.gui.store import default_scenario

Button = QMessageBox.StandardButton
#: the buttons a message box may offer, in the order an answer is looked for
ANSWERS = (Button.Save, Button.Discard, Button.Cancel, Button.Ok)


@dataclass(frozen=True, slots=True)
class Shown:
    """A message box as it was shown."""

    text: str
    text_format: Qt.TextFormat
    icon: QMessageBox.Icon
    buttons: tuple[QMessageBox.StandardButton, ...]


class MessageBoxes:
    """Answers ``QMessageBox.exec`` without showing anything: the answers queued with
    :meth:`queue` first, then a random one of those offered (with ``rng``), else Discard
    when offered, else OK. Every box is recorded in :attr:`shown`."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng
        self.shown: list[Shown] = []
        self._queued: list[QMessageBox.StandardButton] = []

    def queue(self, *answers: QMessageBox.StandardButton) -> None:
        self._queued.extend(answers)

    def answer(self, box: QMessageBox) -> int:
        buttons = box.standardButtons()
        offered = tuple(b for b in ANSWERS if buttons & b)
        self.shown.append(Shown(box.text(), box.textFormat(), box.icon(), offered))
        if self._queued:
            choice = self._queued.pop(0)
        elif self.rng is not None and offered:
            choice = self.rng.choice(offered)
        elif Button.Discard in offered:
            choice = Button.Discard
        else:
            choice = offered[0] if offered else Button.Ok
        return int(choice.value)

    def exec_function(self) -> Callable[[QMessageBox], int]:
        """A function to stand in for ``QMessageBox.exec`` (a method binds the box)."""

        def exec_(box: QMessageBox) -> int:
            return self.answer(box)

        return exec_

    def texts(self) -> list[str]:
        return [box.text for box in self.shown]


#: how many of the slowest actions a report keeps
SLOWEST = 5


@dataclass
class MonkeyReport:
    """What a run did and found."""

    actions: int = 0
    seconds: float = 0.0
    kinds: Counter[str] = field(default_factory=Counter)
    exceptions: list[str] = field(default_factory=list)
    field_mismatches: list[str] = field(default_factory=list)
    stale_mismatches: list[str] = field(default_factory=list)
    #: where a user's markup was rendered as rich text
    markup: list[str] = field(default_factory=list)
    #: where the content of a file a configuration names was shown
    leaks: list[str] = field(default_factory=list)
    message_boxes: int = 0
    #: the slowest actions, slowest first: (seconds, the action's number from 1, its
    #: name, the scenario it left, in words) -- a state where the app is slow shows here
    slowest: list[tuple[float, int, str, str]] = field(default_factory=list)
    #: the longest pause of Python's cycle collector in the run, in seconds: it stops
    #: whichever action it falls in (:mod:`memfit.gui.collector`)
    longest_collection: float = 0.0

    def timed(self, seconds: float, name: str, scenario: str, keep: int = SLOWEST) -> None:
        """Record the action just made (the :attr:`actions` th) if it is among the slowest."""
        self.slowest.append((seconds, self.actions, name, scenario))
        self.slowest.sort(key=lambda s: -s[0])
        del self.slowest[keep:]

    def problems(self) -> dict[str, list[str]]:
        """Every kind of problem found, by name."""
        return {
            "exceptions": self.exceptions,
            "field mismatches": self.field_mismatches,
            "stale mismatches": self.stale_mismatches,
            "markup rendered": self.markup,
            "file contents shown": self.leaks,
        }

    def summary(self) -> str:
        rate = self.actions / self.seconds if self.seconds > 0 else float("inf")
        found = "; ".join(f"{kind} {len(found)}" for kind, found in self.problems().items())
        return f"actions {self.actions:,} in {self.seconds:.1f} s ({rate:,.0f} actions/s); {found}"


JUNK = ("", "abc", "-", "--3", "1e5", "12,,4", "0x10", "½", "9" * 30, " ", "-0", "3.5.1")


def scenario_files(folder: Path) -> list[Path]:
    """The files the monkey opens, written into ``folder``: valid scenarios, scenarios the
    estimate rejects, values no combo lists, malformed files, a FIFO, a folder, a file too
    big and a missing one."""
    folder.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []

    def scenario(name: str, s: Scenario) -> None:
        save_scenario(s, folder / name)
        files.append(folder / name)

    def text(name: str, body: str | dict[str, Any]) -> None:
        path = folder / name
        path.write_text(body if isinstance(body, str) else json.dumps(body), encoding="utf-8")
        files.append(path)

    base = default_scenario()
    scenario("default.memfit.json", base)
    scenario(
        "bad-mesh.memfit.json",
        Scenario(
            base.model,
            HardwareSpec(base.hardware.gpu, gpus_per_node=8),
            TrainingSpec(method="full", parallelism=ParallelismSpec(tp=3)),
        ),
    )
    hardware = {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "nodes": 2}
    text(
        "pipeline.memfit.json",
        {
            "memfit_scenario": 1,
            "model": {"preset": "llama-3.1-70b"},
            "hardware": hardware,
            "training": {
                "method": "full",
                "micro_batch_size": 1,
                "gradient_accumulation_steps": 8,
                "activation_checkpointing": "full",
                "parallelism": {"tp": 8, "pp": 2, "zero_stage": 1},
            },
        },
    )
    text(
        "custom-gpu.memfit.json",
        {
            "memfit_scenario": 1,
            "model": {"preset": "qwen2.5-7b"},
            "hardware": {"gpu": "custom", "memory_gib": 20.5, "utilization_target": 0.855},
            "training": {
                "method": "freeze",
                "freeze": {"trainable": ["norms", "embeddings"], "last_layers": 2},
                "lora": {"rank": 8, "alpha": 16.25, "targets": ["v_proj", "q_proj", "q_proj"]},
            },
        },
    )
    text(
        "hf-config.memfit.json",
        {
            "memfit_scenario": 1,
            "model": {
                "model_type": "llama",
                "name": "<b>tiny</b> llama",
                "num_hidden_layers": 6,
                "hidden_size": 512,
                "num_attention_heads": 8,
                "num_key_value_heads": 2,
                "intermediate_size": 1376,
                "vocab_size": 32000,
            },
            "hardware": {"gpu": "l4"},
            "training": {"method": "lora", "lora": {"targets": ["all-linear", "q_proj"]}},
        },
    )
    text(
        "mla.memfit.json",
        {
            "memfit_scenario": 1,
            "model": {"preset": "deepseek-v3"},
            "hardware": {"gpu": "h200-sxm-141gb", "gpus_per_node": 8, "nodes": 4},
            "training": {"method": "lora", "lora": {"targets": ["kv_a_proj"]}},
        },
    )
    text(
        "stack.memfit.json",
        {
            "memfit_scenario": 1,
            "model": {"preset": "qwen2.5-7b"},
            "hardware": {"gpu": "l4"},
            "training": {
                "method": "qlora",
                "stack": "lightning",
                "outputs_held_through_backward": False,
                "frozen_weights_dtype": "bf16",
                "loss": "chunked-output",
                "loss_chunks": 4,
                "model_implementation": "transformers",
                "previous_step_held": False,
                "lora": {"adapter_dtype": "bf16"},
                "qlora": {"quantize_lm_head": False, "dequant_dtype": "fp32"},
            },
        },
    )
    text(
        "bad-stack.memfit.json",
        {
            "memfit_scenario": 1,
            "model": {"preset": "gpt2"},
            "hardware": {"gpu": "l4"},
            "training": {"stack": "no-such-stack"},
        },
    )
    text("<img src=x onerror=alert(1)>.memfit.json", '{"memfit_scenario": 1, "model": 5}')
    text("malformed.memfit.json", "{oops")
    text(
        "wrong-field.memfit.json",
        '{"memfit_scenario": 1, "model": {"preset": "gpt2"}, "hardware": {"gpu": 5}}',
    )
    text("not-a-scenario.json", '{"hello": "world"}')
    big = folder / "huge.memfit.json"
    big.write_bytes(b" " * (5 << 20))
    files.append(big)
    folder_path = folder / "a-folder.memfit.json"
    folder_path.mkdir(exist_ok=True)
    files.append(folder_path)
    if hasattr(os, "mkfifo"):
        fifo = folder / "fifo.memfit.json"
        if not fifo.exists():
            os.mkfifo(fifo)
        files.append(fifo)
    files.append(folder / "missing.memfit.json")
    return files


#: the content of a file that configurations name outside their folder: never shown
SECRET = "hf_monkeyToken0123456789abcdef"
#: where the project's test fixtures are, when the app runs from its source tree
FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
_LLAMA = {
    "model_type": "llama",
    "hidden_size": 512,
    "intermediate_size": 1376,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 32000,
}


def markups(image: Path) -> list[str]:
    """Markup a user may type or a file may hold: an image (a real one), a heading,
    bold, a link, braces (a format string's fields), an entity."""
    return [
        f'<img src="{image}"><h1>GPU',
        "<h1>Lab</h1> card",
        "<b>bold</b> {x} & <i>it</i>",
        '<a href="file:///">link</a>',
        "{0} {value} &amp; &lt;",
    ]


@dataclass(frozen=True)
class Corpus:
    """What the monkey pastes, drops and imports (:func:`import_corpus`): texts and the
    files holding them, by kind, and model folders."""

    texts: dict[str, list[str]]
    files: dict[str, list[Path]]
    folders: list[Path]

    def text(self, rng: random.Random) -> str:
        """A text of a kind drawn first (each kind as likely, however many it holds)."""
        return rng.choice(self.texts[rng.choice(list(self.texts))])

    def file(self, rng: random.Random) -> Path:
        """A file or a model folder, of a kind drawn first."""
        kind = rng.choice([*self.files, "model folder"])
        return rng.choice(self.folders if kind == "model folder" else self.files[kind])


def import_corpus(folder: Path, scenarios: list[Path]) -> Corpus:
    """Texts, files and model folders to paste, drop and import, written into
    ``folder``: the readable ones of ``scenarios``, the ``config.json`` files and training
    configurations of the project's fixtures (when present) or one of its own, junk, JSON
    nested 50,000 deep, integers of hundreds and thousands of digits, markup, training
    configurations naming a file outside their folder (holding :data:`SECRET`), and model
    folders: a config alone, with a small checkpoint, with a tensor of absurd shape (of
    10^400 elements, or none), an empty one."""
    folder.mkdir(parents=True, exist_ok=True)
    image = folder / "image.png"  # an image a rendered <img> would really show
    picture = QImage(8, 8, QImage.Format.Format_RGB32)
    picture.fill(QColor("red"))
    picture.save(str(image))
    secret = folder / "private" / "token"
    secret.parent.mkdir(exist_ok=True)
    secret.write_text(SECRET + "\n")
    texts: dict[str, list[str]] = {"scenario": []}
    for path in scenarios:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            if path.is_file() and path.stat().st_size < 1 << 16:
                texts["scenario"].append(path.read_text(encoding="utf-8"))
    fixtures = sorted(FIXTURES.glob("*/*"))
    texts["config.json"] = [
        p.read_text(encoding="utf-8") for p in fixtures if p.parent.name == "hf_configs"
    ] or [json.dumps(_LLAMA)]
    texts["training configuration"] = [
        p.read_text(encoding="utf-8") for p in fixtures if p.parent.name == "train_configs"
    ] or ["base_model: gpt2\nadapter: lora\nmicro_batch_size: 2\n"]
    texts["junk"] = ["", " ", "hello", "{oops", "[1, 2", "- a\n- b", "null", "42", "\x00\x01"]
    deep = 50_000
    texts["deep nesting"] = [
        '{"a":' * deep + "1" + "}" * deep,
        "[" * deep + "]" * deep,
        '{"memfit_scenario": 1, "model": ' + '{"a":' * deep + "1" + "}" * deep + "}",
        "a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 200)),
    ]
    huge = "1" + "0" * 400
    texts["huge integers"] = [
        json.dumps({**_LLAMA, "hidden_size": 10**400}),
        '{"memfit_scenario": 1, "model": {"preset": "gpt2"}, "hardware": {"gpu": "l4"}, '
        f'"training": {{"method": "lora", "lora": {{"alpha": {huge}}}}}}}',
        '{"memfit_scenario": 1, "model": {"preset": "gpt2"}, "hardware": {"gpu": "l4"}, '
        f'"training": {{"micro_batch_size": 1{"0" * 5000}}}}}',
        f"base_model: gpt2\nlora_alpha: {huge}\nmicro_batch_size: {huge}\n",
    ]
    texts["markup"] = []
    # a family MemFit does not read: the read-as prompt, which quotes the model_type
    texts["unknown family"] = [json.dumps({**_LLAMA, "model_type": "mpt-like"})]
    for mark in markups(image):
        texts["unknown family"].append(json.dumps({**_LLAMA, "model_type": mark}))
        texts["markup"] += [
            json.dumps({**_LLAMA, "name": mark}),
            json.dumps(
                {
                    "memfit_scenario": 1,
                    "model": {**_LLAMA, "name": mark},
                    "hardware": {"gpu": "l4", "gpu_name": mark[:64]},
                }
            ),
            f"base_model: '{mark}'\nadapter: lora\n",
        ]
    texts["a path out of its folder"] = [
        text
        for where in (str(secret), "../private/token", "private/token")
        for text in (
            f"base_model: gpt2\ndeepspeed: {where}\n",
            json.dumps({"model_name_or_path": "gpt2", "deepspeed": where}),
        )
    ]
    files: dict[str, list[Path]] = {}
    for kind, some in texts.items():
        for text in some:
            suffix = ".json" if text.lstrip().startswith(("{", "[")) else ".yaml"
            path = folder / f"import-{sum(map(len, files.values()))}{suffix}"
            path.write_text(text, encoding="utf-8")
            files.setdefault(kind, []).append(path)
    folders = [
        _model_folder(folder / "model-config-only", None),
        _model_folder(folder / "model-small", [2, 4]),
        _model_folder(folder / "model-absurd-shape", [10**400]),
        _model_folder(folder / "model-absurd-empty-shape", [10**400, 0]),
        _model_folder(folder / "model-empty", None, config=False),
    ]
    return Corpus(texts, files, folders)


def _model_folder(path: Path, shape: list[int] | None, *, config: bool = True) -> Path:
    """A model folder: its ``config.json`` and, for ``shape``, a safetensors file of one
    float16 tensor of that shape (its data as long as the shape says, when small)."""
    path.mkdir(parents=True, exist_ok=True)
    if config:
        (path / "config.json").write_text(json.dumps(_LLAMA))
    if shape is not None:
        size = 2 * math.prod(shape) if math.prod(shape) < 1 << 20 else 2
        header = json.dumps(
            {
                "model.embed_tokens.weight": {
                    "dtype": "F16",
                    "shape": shape,
                    "data_offsets": [0, size],
                }
            }
        ).encode()
        data = len(header).to_bytes(8, "little") + header + b"\0" * size
        (path / "model.safetensors").write_bytes(data)
    return path


class Monkey:
    """Random real-widget actions on ``window``; see the module docstring."""

    def __init__(self, window: Any, seed: int, folder: Path) -> None:
        self.window = window
        self.rng = random.Random(seed)
        self.folder = folder
        self.files = scenario_files(folder / "files")
        self.corpus = import_corpus(folder / "imports", self.files)
        self.boxes = MessageBoxes(self.rng)
        self.report = MonkeyReport()
        self._saves = 0
        self._boxes_seen = 0
        self._markup_seen: set[str] = set()
        self._import_dialog = False  # the open dialog stubbed is File > Import's
        self.actions: list[tuple[str, int, Callable[[], None]]] = [
            ("spin", 30, self.spin),
            ("combo", 20, self.combo),
            ("preset", 4, self.preset),
            ("refit", 3, self.refit),
            ("check", 8, self.check),
            ("whatif", 8, self.whatif),
            ("fold", 3, self.fold),
            ("reset", 2, self.reset),
            ("search", 3, self.search),
            ("undo", 8, self.undo),
            ("redo", 4, self.redo),
            ("new", 1, self.new),
            ("open", 5, self.open),
            ("recent", 1, self.recent),
            ("save", 3, self.save),
            ("ghost", 4, self.ghost),
            ("compare", 1, self.compare),
            ("paste", 5, self.paste),
            ("drop", 5, self.drop),
            ("import", 4, self.import_),
            ("tradeoffs", 3, self.tradeoffs),
            ("gpu name", 2, self.gpu_name),
        ]

    # -- running -------------------------------------------------------------------------
    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Stub the file dialogs and message boxes and count exceptions, then restore."""
        old_hook = sys.excepthook
        old_exec = QMessageBox.exec
        old_open = QFileDialog.getOpenFileName
        old_save = QFileDialog.getSaveFileName
        old_folder = QFileDialog.getExistingDirectory
        old_input = QInputDialog.exec

        def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
            self.report.exceptions.append("".join(traceback.format_exception(kind, exc, tb)))

        sys.excepthook = hook
        QMessageBox.exec = self.boxes.exec_function()  # type: ignore[method-assign,assignment]
        QFileDialog.getOpenFileName = staticmethod(self._open_name)  # type: ignore[method-assign]
        QFileDialog.getSaveFileName = staticmethod(self._save_name)  # type: ignore[method-assign]
        QFileDialog.getExistingDirectory = staticmethod(self._folder_name)  # type: ignore[method-assign]
        QInputDialog.exec = self._answer_input_function()  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            sys.excepthook = old_hook
            QMessageBox.exec = old_exec  # type: ignore[method-assign]
            QFileDialog.getOpenFileName = old_open  # type: ignore[method-assign]
            QFileDialog.getSaveFileName = old_save  # type: ignore[method-assign]
            QFileDialog.getExistingDirectory = old_folder  # type: ignore[method-assign]
            QInputDialog.exec = old_input  # type: ignore[method-assign]

    def run(self, n: int) -> MonkeyReport:
        """``n`` random actions, each followed by the checks."""
        names = [name for name, _w, _a in self.actions]
        weights = [w for _n, w, _a in self.actions]
        work = {name: action for name, _w, action in self.actions}
        started = time.perf_counter()
        with self.installed(), self._collections_timed():
            for _ in range(n):
                name = self.rng.choices(names, weights)[0]
                if self.window.store.error and self.rng.random() < 0.25:
                    name = "undo"  # users fix what the engine rejects, often by undoing
                begun = time.perf_counter()
                try:
                    work[name]()
                    QApplication.processEvents()
                except Exception:
                    self.report.exceptions.append(f"{name}: {traceback.format_exc()}")
                self.report.actions += 1
                self.report.kinds[name] += 1
                caption = self.window.chart.export_context().caption or "no valid estimate"
                self.report.timed(time.perf_counter() - begun, name, caption)
                self.verify(name)
        self.report.seconds = time.perf_counter() - started
        self.report.message_boxes = len(self.boxes.shown)
        return self.report

    @contextlib.contextmanager
    def _collections_timed(self) -> Iterator[None]:
        """The cycle collector's pauses timed while the monkey runs (the longest kept)."""
        began = [0.0]

        def timed(phase: str, _info: dict[str, int]) -> None:
            if phase == "start":
                began[0] = time.perf_counter()
            else:
                pause = time.perf_counter() - began[0]
                self.report.longest_collection = max(self.report.longest_collection, pause)

        gc.callbacks.append(timed)
        try:
            yield
        finally:
            gc.callbacks.remove(timed)

    # -- checks --------------------------------------------------------------------------
    def verify(self, after: str) -> None:
        """The checks of the module docstring; mismatches go into the report."""
        w = self.window
        scenario = w.store.scenario
        where = f"#{self.report.actions} after {after}"
        for panel in w.panels:
            for row in panel.rows.values():
                if not row.widget.isVisibleTo(panel):
                    continue
                shown, value = row.read(), row.get(scenario)
                if agree(row, shown, value):
                    continue
                if panel.is_pending(row.path) and not row.error.isHidden():
                    continue
                self.report.field_mismatches.append(
                    f"{where}: {row.path} shows {shown!r}, the scenario holds {value!r}"
                )
        if not w.model_panel.preset_shows_current():
            self.report.field_mismatches.append(
                f"{where}: the preset combo shows {w.model_panel.preset.currentText()!r} for "
                f"{w.model_panel.current_preset_text()!r}"
            )
        stale, error = w.chart.is_stale(), w.store.error
        if stale != bool(error):
            self.report.stale_mismatches.append(
                f"{where}: chart stale {stale}, store error {error!r}"
            )
        elif not stale:
            est, chart = w.store.estimate, w.chart
            words = VERDICTS[est.verdict][0] if est is not None else "?"
            if chart._current != est:
                self.report.stale_mismatches.append(f"{where}: the chart shows another estimate")
            elif not chart.verdict_text().startswith(words):
                self.report.stale_mismatches.append(
                    f"{where}: the banner says {chart.verdict_text()!r} for {est.verdict}"
                )
            elif gib_text(est.capacity_bytes) not in chart.capacity_line.label.toPlainText():
                self.report.stale_mismatches.append(f"{where}: the capacity line is not labelled")
        self._markup(where, rendered_markup([w]))
        boxes, self._boxes_seen = self.boxes.shown[self._boxes_seen :], len(self.boxes.shown)
        for box in boxes:
            if any(sign in box.text for sign in MARKUP_SIGNS) and (
                box.text_format != Qt.TextFormat.PlainText
            ):
                self._markup(where, [f"a message box in rich text: {box.text!r}"])
        said = [box.text for box in boxes] + w.notice.messages() + [w.statusBar().currentMessage()]
        self.report.leaks += [f"{where}: {text[:300]!r}" for text in said if SECRET in text]

    def _markup(self, where: str, problems: list[str]) -> None:
        """Report each markup rendered once, where it was first seen (it stays shown)."""
        for problem in problems:
            if problem not in self._markup_seen:
                self._markup_seen.add(problem)
                self.report.markup.append(f"{where}: {problem}")

    # -- actions -------------------------------------------------------------------------
    def _rows(self, kind: type[QWidget] | tuple[type[QWidget], ...]) -> list[tuple[FormPanel, Row]]:
        return [
            (panel, row)
            for panel in self.window.panels
            for row in panel.rows.values()
            if isinstance(row.widget, kind)
            and row.widget.isVisibleTo(panel)
            and row.widget.isEnabled()
        ]

    def spin(self) -> None:
        rows = self._rows((QSpinBox, QDoubleSpinBox))
        if not rows:
            return
        _panel, row = self.rng.choice(rows)
        box = row.widget
        assert isinstance(box, QAbstractSpinBox)
        roll = self.rng.random()
        if roll < 0.1:
            key = self.rng.choice((Qt.Key.Key_Up, Qt.Key.Key_Down, Qt.Key.Key_PageUp))
            QTest.keyClick(box, key)
            return
        _type_into(box, self._number(box, roll))

    def _model_sizes(self) -> tuple[int, ...]:
        """The current model's sizes: the bounds other fields are checked against (a LoRA
        rank up to the hidden size)."""
        m = self.window.store.scenario.model
        return (m.hidden_size, m.num_layers, m.num_attention_heads, m.intermediate_size)

    def _number(self, box: QAbstractSpinBox, roll: float) -> str:
        assert isinstance(box, QSpinBox | QDoubleSpinBox)
        lo, hi, now = box.minimum(), box.maximum(), box.value()
        if roll < 0.5:  # near the current value: the edits users make
            value: float = self.rng.choice((now + 1, now - 1, now * 2, now / 2, now + 8))
        elif roll < 0.6:  # one of the model's sizes
            value = self.rng.choice(self._model_sizes())
        elif roll < 0.7:  # anywhere in range, log-uniform
            value = math.exp(self.rng.uniform(math.log(max(lo, 1)), math.log(max(hi, 2))))
        elif roll < 0.85:  # out of range
            value = self.rng.choice((hi + 1, hi * 10, lo - 1, -5))
        else:
            return self.rng.choice(JUNK)
        if isinstance(box, QSpinBox):
            return str(round(value))
        return f"{value:.{box.decimals()}f}"

    def combo(self) -> None:
        combos: list[QComboBox] = [r.widget for _p, r in self._rows(QComboBox)]  # type: ignore[misc]
        model = self.window.model_panel
        combos += [model.preset, model.preset, model.family, model.size_filter]
        combo = self.rng.choice(combos)
        key = self.rng.choice(
            (Qt.Key.Key_Down, Qt.Key.Key_Up, Qt.Key.Key_Home, Qt.Key.Key_End, Qt.Key.Key_PageDown)
        )
        QTest.keyClick(combo, key)

    def preset(self) -> None:
        """Pick any item of the preset list, as a click in its open popup does: a jump to
        a model far from the current one (a smaller hidden size than the LoRA rank)."""
        combo = self.window.model_panel.preset
        if combo.count():
            index = self.rng.randrange(combo.count())
            combo.setCurrentIndex(index)
            combo.activated.emit(index)

    def refit(self) -> None:
        """A training field set to one of the model's sizes (the bound some are checked
        against: a LoRA rank up to the hidden size), then another preset picked: a model
        the other sections may no longer fit."""
        rows = [(p, r) for p, r in self._rows(QSpinBox) if p is self.window.training_panel]
        if rows:
            box = self.rng.choice(rows)[1].widget
            assert isinstance(box, QSpinBox)
            _type_into(box, str(self.rng.choice(self._model_sizes())))
        self.preset()

    def check(self) -> None:
        boxes: list[QWidget] = [r.widget for _p, r in self._rows(QCheckBox)]
        targets = self.window.training_panel.targets
        if targets.isVisibleTo(self.window.training_panel):
            boxes += [b for b in targets.boxes.values() if b.isVisibleTo(targets) and b.isEnabled()]
        if boxes:
            QTest.keyClick(self.rng.choice(boxes), Qt.Key.Key_Space)

    def whatif(self) -> None:
        buttons = [b for b in self.window.whatif.buttons.values() if b.isEnabled()]
        if buttons:
            QTest.keyClick(self.rng.choice(buttons), Qt.Key.Key_Space)

    def fold(self) -> None:
        sections = [c for p in self.window.panels for c in p.findChildren(Collapsible)]
        if sections:
            QTest.keyClick(self.rng.choice(sections).button, Qt.Key.Key_Space)

    def reset(self) -> None:
        panel = self.window.training_panel
        buttons = [b for b in panel.resets.values() if b.isVisibleTo(panel) and b.isEnabled()]
        if buttons:
            QTest.mouseClick(self.rng.choice(buttons), Qt.MouseButton.LeftButton)

    def search(self) -> None:
        words = ["", "llama", "8b", "qwen", "mixtral", "zzz", "gemma 2", "deepseek"]
        words += self.rng.sample(model_names(), 2)
        search = self.window.model_panel.search
        search.selectAll()
        QTest.keyClick(search, Qt.Key.Key_Delete)
        QTest.keyClicks(search, self.rng.choice(words))

    def undo(self) -> None:
        self.window.undo_act.trigger()

    def redo(self) -> None:
        self.window.redo_act.trigger()

    def new(self) -> None:
        self.window.new_act.trigger()

    def open(self) -> None:
        self.window.open_act.trigger()

    def recent(self) -> None:
        actions = self.window.recent_menu.actions()
        if actions:
            self.rng.choice(actions).trigger()

    def save(self) -> None:
        self.window.save_act.trigger()

    def compare(self) -> None:
        act = self.rng.choice((self.window.compare_all_act, self.window.clear_whatifs_act))
        act.trigger()

    def ghost(self) -> None:
        """Double-click the middle of a ghost bar, as a user applies it."""
        chart = self.window.chart
        ghosts = [i for i in range(len(chart._bars)) if chart.ghost_key(i) is not None]
        if not ghosts:
            return
        index = self.rng.choice(ghosts)
        bottom, height = 0.0, 0.0
        for y0, h in chart.segments(index).values():
            if h > 0:
                bottom, height = y0, h
                break
        if height <= 0:
            return
        view = chart.plot_item.getViewBox()
        scene = view.mapViewToScene(QPointF(float(index), bottom + height / 2))
        pos: QPoint = chart.plot.mapFromScene(scene)
        # press and release, double-click, release: pyqtgraph reports clicks on release
        viewport, left = chart.plot.viewport(), Qt.MouseButton.LeftButton
        QTest.mouseClick(viewport, left, pos=pos)
        QTest.mouseDClick(viewport, left, pos=pos)
        QTest.mouseRelease(viewport, left, pos=pos)

    def paste(self) -> None:
        """Edit > Paste Configuration of a text of the corpus."""
        QGuiApplication.clipboard().setText(self.corpus.text(self.rng))
        self.window.importer.paste_act.trigger()

    def drop(self, enter: bool = True) -> None:
        """A drag entering the window and a drop: one to three files or folders, or a
        text (real events, through the window's event handling)."""
        mime = QMimeData()
        if self.rng.random() < 0.4:
            mime.setText(self.corpus.text(self.rng))
        else:
            paths = [self._dropped() for _ in range(self.rng.randint(1, 3))]
            mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
        window, pos = self.window, QPointF(self.window.rect().center())
        action, button = Qt.DropAction.CopyAction, Qt.MouseButton.LeftButton
        modifiers = Qt.KeyboardModifier.NoModifier
        entered = QDragEnterEvent(pos.toPoint(), action, mime, button, modifiers)
        QApplication.sendEvent(window, entered)
        if entered.isAccepted():
            QApplication.sendEvent(window, QDropEvent(pos, action, mime, button, modifiers))

    def import_(self) -> None:
        """File > Import (a file) or Import Model Folder, through the stubbed dialogs."""
        if self.rng.random() < 0.3:
            self.window.importer.import_folder_act.trigger()
            return
        self._import_dialog = True
        try:
            self.window.importer.import_act.trigger()
        finally:
            self._import_dialog = False

    def tradeoffs(self) -> None:
        """The Tradeoffs tab, one of its views; on the map a sweep, mostly cancelled at
        once (a sweep can take minutes); now and then back to the memory view."""
        w = self.window
        if self.rng.random() < 0.25:
            w.memory_view_act.trigger()
            return
        w.tradeoffs_view_act.trigger()
        view = w.tradeoffs
        view.tabs.setCurrentIndex(self.rng.randrange(view.tabs.count()))
        QApplication.processEvents()
        if view.tabs.currentIndex() == 0 and view.sweep_button.isEnabled():
            QTest.mouseClick(view.sweep_button, Qt.MouseButton.LeftButton)
        for cancel in (view.cancel_button, view.hardware_cancel):
            if cancel.isVisibleTo(view) and cancel.isEnabled() and self.rng.random() < 0.8:
                QTest.mouseClick(cancel, Qt.MouseButton.LeftButton)

    def gpu_name(self) -> None:
        """Type a name -- markup, mostly -- into the GPU name field and press Enter."""
        panel = self.window.hardware_panel
        field = panel.gpu_name
        if not field.isVisibleTo(panel):
            QTest.keyClick(panel.more.button, Qt.Key.Key_Space)  # unfold More hardware
        if not (field.isVisibleTo(panel) and field.isEnabled()):
            return
        names = [*markups(self.folder / "imports" / "image.png"), "Lab card", ""]
        field.selectAll()
        QTest.keyClick(field, Qt.Key.Key_Delete)
        QTest.keyClicks(field, self.rng.choice(names))
        QTest.keyClick(field, Qt.Key.Key_Return)

    # -- stubbed dialogs -----------------------------------------------------------------
    def _answer_input_function(self) -> Callable[[QInputDialog], int]:
        """A function to stand in for ``QInputDialog.exec`` (a method binds the dialog)."""

        def exec_(dialog: QInputDialog) -> int:
            return self._answer_input(dialog)

        return exec_

    def _answer_input(self, dialog: QInputDialog) -> int:
        """The read-as prompt: checked for rendered markup, then answered at random."""
        self._markup(f"#{self.report.actions} the read-as prompt", rendered_markup([dialog]))
        if self.rng.random() < 0.3:
            return int(QDialog.DialogCode.Rejected.value)
        items = dialog.comboBoxItems()
        if items:
            dialog.setTextValue(self.rng.choice(items))
        return int(QDialog.DialogCode.Accepted.value)

    def _open_name(self, *_args: object, **_kwargs: object) -> tuple[str, str]:
        if self.rng.random() < 0.1:
            return "", ""  # cancelled
        if self._import_dialog:
            return str(self.corpus.file(self.rng)), ""
        return str(self.rng.choice(self.files)), ""

    def _dropped(self) -> Path:
        """A file or folder to drop: of the corpus, or a scenario file."""
        return (
            self.rng.choice(self.files) if self.rng.random() < 0.2 else self.corpus.file(self.rng)
        )

    def _folder_name(self, *_args: object, **_kwargs: object) -> str:
        if self.rng.random() < 0.1:
            return ""
        return str(self.rng.choice([*self.corpus.folders, self.folder / "no-such-folder"]))

    def _save_name(self, *_args: object, **_kwargs: object) -> tuple[str, str]:
        roll = self.rng.random()
        if roll < 0.1:
            return "", ""
        if roll < 0.15:
            return str(self.folder / "no-such-folder" / "x.memfit.json"), ""
        if roll < 0.2 and hasattr(os, "mkfifo"):
            return str(self.folder / "files" / "fifo.memfit.json"), ""
        self._saves += 1
        return str(self.folder / f"saved-{self._saves % 5}.memfit.json"), ""


#: what a markup in a user's text looks like once rendered, or still raw in rich text
MARKUP_SIGNS = ("<img", "<h1")


def rendered_markup(widgets: Iterable[QWidget], signs: Sequence[str] = MARKUP_SIGNS) -> list[str]:
    """Where ``widgets`` and everything inside them would render a user's markup (raw
    ``<img``/``<h1``) as rich text: a label of rich or automatic format holding it, a
    tooltip (of a widget, an action, a tab, an item of a table, list, tree or combo, a
    chart item) holding it unescaped, a text of a chart whose document has a real image or
    heading. Empty: every user text is shown as plain text."""

    def raw(text: str) -> bool:
        return any(sign in text for sign in signs)

    def rich(text: str) -> bool:
        return raw(text) and QtGui.Qt.mightBeRichText(text)

    found: list[str] = []
    for top in widgets:
        for widget in [top, *top.findChildren(QWidget)]:
            name = f"{type(widget).__name__} {widget.objectName()}".strip()
            if rich(widget.toolTip()):
                found.append(f"{name}: tooltip {widget.toolTip()!r}")
            if isinstance(widget, QLabel) and raw(widget.text()):
                kind = widget.textFormat()
                if kind == Qt.TextFormat.RichText or (
                    kind == Qt.TextFormat.AutoText and QtGui.Qt.mightBeRichText(widget.text())
                ):
                    found.append(f"{name}: rich label {widget.text()!r}")
            for action in widget.actions():
                if rich(action.toolTip()):
                    found.append(f"{name}: action tooltip {action.toolTip()!r}")
            if isinstance(widget, QTabBar):
                tips = [widget.tabToolTip(i) for i in range(widget.count())]
                found += [f"{name}: tab tooltip {tip!r}" for tip in tips if rich(tip)]
            models = []
            if isinstance(widget, QAbstractItemView) and widget.model() is not None:
                models.append(widget.model())
            if isinstance(widget, QComboBox):
                models.append(widget.model())
            for model in models:
                for tip in _item_tips(model):
                    if rich(tip):
                        found.append(f"{name}: item tooltip {tip!r}")
            if isinstance(widget, QGraphicsView) and widget.scene() is not None:
                for item in widget.scene().items():
                    if rich(item.toolTip()):
                        found.append(f"{name}: chart item tooltip {item.toolTip()!r}")
                    if isinstance(item, QGraphicsTextItem):
                        shown = item.toHtml().lower()
                        if any(sign in shown for sign in signs):
                            found.append(f"{name}: chart text {item.toPlainText()!r}")
    return found


def _item_tips(model: QAbstractItemModel, parent: QModelIndex | None = None) -> Iterator[str]:
    """The tooltips of every item of ``model`` (a tree's children too)."""
    parent = QModelIndex() if parent is None else parent
    try:
        rows, columns = model.rowCount(parent), model.columnCount(parent)
    except TypeError:  # Qt's empty model of a view without one keeps them private
        return
    for row in range(rows):
        for column in range(columns):
            index = model.index(row, column, parent)
            tip = model.data(index, Qt.ItemDataRole.ToolTipRole)
            if isinstance(tip, str):
                yield tip
            if column == 0 and model.rowCount(index) > 0:
                yield from _item_tips(model, index)


def agree(row: Row, shown: Any, value: Any) -> bool:
    """Whether a row's widget value ``shown`` is the scenario's ``value`` (a decimal box to
    its decimals)."""
    if isinstance(row.widget, QDoubleSpinBox) and isinstance(value, int | float):
        return bool(abs(float(shown) - float(value)) <= 0.5 * 10 ** -row.widget.decimals() + 1e-9)
    return bool(shown == value)


def _type_into(box: QAbstractSpinBox, text: str) -> None:
    """Select the spin box's text, type ``text`` and press Enter, as a user edits it."""
    box.selectAll()
    QTest.keyClicks(box, text)
    QTest.keyClick(box, Qt.Key.Key_Return)


def run_monkey(
    actions: int,
    seed: int,
    folder: Path,
    size: tuple[int, int] = (1280, 800),
    collector: bool = True,
) -> Any:
    """A fresh main window (settings and recovery file in ``folder``), ``actions`` random
    actions on it; returns the :class:`MonkeyReport`. With ``collector``, the cycle
    collector runs as the app runs it (:class:`~memfit.gui.collector.Collector`), stopped
    after."""
    from PySide6.QtCore import QSettings

    from memfit.gui.collector import Collector
    from memfit.gui.main_window import MainWindow

    folder.mkdir(parents=True, exist_ok=True)
    settings = QSettings(str(folder / "settings.ini"), QSettings.Format.IniFormat)
    window = MainWindow(settings=settings, data_dir=folder)
    window.resize(*size)
    window.show()
    QApplication.processEvents()
    monkey = Monkey(window, seed, folder)
    app = QGuiApplication.instance()
    kept = Collector(app) if collector and isinstance(app, QGuiApplication) else None
    try:
        return monkey.run(actions)
    finally:
        if kept is not None:
            kept.stop()
            kept.deleteLater()
        with monkey.installed():
            window.close()  # the monkey answers the question, if asked, and may cancel
            if window.isVisible():  # closed anyway, its changes discarded: the close
                # stops the window's workers, which must not outlive it
                monkey.boxes.queue(Button.Discard)
                window.close()
        delete_now(window)

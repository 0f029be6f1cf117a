"""The Tradeoffs view: what memory costs in speed and money, beside the breakdown chart.

Four tabs, all about the store's current scenario:

* **Map** -- a strategy sweep (:func:`memfit.engine.sweep.sweep` over
  :func:`memfit.engine.sweep.default_space`) as a :class:`~memfit.gui.sweep_map.SweepMap`; it runs
  when asked (Sweep), in a worker thread, with a progress bar and Cancel. Clicking a dot
  makes its configuration the current scenario through the store (Ctrl+Z undoes). An
  edit while a sweep runs restarts it for the new scenario; an edit after it has
  finished marks the map out of date, unless the new scenario is one of its dots (a dot
  just applied, or the sweep's own scenario after an undo).
* **Curves** -- memory and step time against the micro-batch and the sequence length
  (:mod:`memfit.gui.curves`);
* **Hardware** -- the same run on each ticked GPU preset (:mod:`memfit.gui.hardware_compare`);
* **Make it fit** -- the changes that bring the scenario under its budget, fastest first
  (:mod:`memfit.gui.make_fit`); double-clicking one (or Apply) makes it the current scenario
  through the store, as a map dot does.

Curves, the hardware table and the fixes follow the scenario by themselves: a moment
after an edit, and only while they are shown, they are recomputed in a worker thread
(:class:`~memfit.gui.background.Channel`); the window never waits for the engine. Each tab
exports its plot as PNG or SVG and its data as CSV.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QSignalBlocker, QSize, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QAction, QHideEvent, QShowEvent, QStandardItemModel
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QGraphicsItem,
    QHBoxLayout,
    QLabel,
    QMenu,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from memfit.engine.files import write_text
from memfit.engine.presets import gpu_names
from memfit.engine.solve import Fix
from memfit.engine.specs import Scenario
from memfit.engine.sweep import (
    LOCK_WORDS,
    LOCKS,
    Beyond,
    Point,
    Space,
    beyond_stack,
    default_space,
    describe,
    locked,
    pareto,
    points_csv,
    sweep,
)
from memfit.gui.background import Channel, KeepGoing
from memfit.gui.chart import rich_text
from memfit.gui.chart_export import export_png, export_svg
from memfit.gui.curves import Curves, CurvesView, compute_curves, curves_csv
from memfit.gui.forms import guard_field
from memfit.gui.hardware_compare import COMMON_GPUS, HardwareRow, HardwareView, compare
from memfit.gui.make_fit import FitResult, FitView, find_fixes
from memfit.gui.shape_grid import ShapeGridView, Shapes, compute_shapes
from memfit.gui.store import ScenarioStore
from memfit.gui.sweep_map import NO_SWEEP, SweepMap

#: curves, the hardware table and the fixes are recomputed this long after the last edit
FOLLOW_DELAY_MS = 250
EXPORT_KINDS = (
    ("Image (PNG)...", "png", 1),
    ("Image, 2x (PNG)...", "png", 2),
    ("Drawing (SVG)...", "svg", 1),
    ("Data (CSV)...", "csv", 1),
)


@dataclass(frozen=True, slots=True)
class SweepResult:
    """A sweep around ``scenario``: its points (all ``total`` of them unless cancelled)."""

    scenario: Scenario
    points: tuple[Point, ...]
    total: int
    complete: bool
    seconds: float
    #: every scenario the map holds a dot for, and the sweep's own
    scenarios: frozenset[Scenario]
    #: what the training stack cannot run, left out (said under the map)
    beyond: Beyond | None = None


def run_sweep(scenario: Scenario, space: Space, keep_going: KeepGoing) -> SweepResult:
    """The sweep as a worker runs it (no Qt)."""
    start = time.perf_counter()
    total = [0]
    stopped = [False]

    def progress(done: int, of: int) -> bool:
        total[0] = of
        if not keep_going(done, of):
            stopped[0] = True
        return not stopped[0]

    left: list[Scenario] = []
    points = tuple(sweep(scenario, space, progress=progress, beyond=left))
    beyond = beyond_stack(scenario, space, left)
    return SweepResult(
        scenario,
        points,
        total[0],
        not stopped[0],
        time.perf_counter() - start,
        frozenset([scenario, *(p.scenario for p in points)]),
        beyond,
    )


def current_point(store: ScenarioStore) -> Point | None:
    """The store's current scenario as a point of the map (``None`` when invalid)."""
    est = store.estimate
    if est is None:
        return None
    return Point(
        est.scenario, est.device_bytes, est.budget_bytes, est.capacity_bytes, est.verdict, est.time
    )


def _lay_out(tab: QWidget, bar: Sequence[QWidget | tuple[QWidget, int]], view: QWidget) -> QWidget:
    """A sub-tab: a bar of controls (a widget, or a widget and its stretch) over its view."""
    row = QHBoxLayout()
    row.setContentsMargins(4, 4, 4, 0)
    for item in bar:
        widget, stretch = item if isinstance(item, tuple) else (item, 0)
        row.addWidget(widget, stretch)
    layout = QVBoxLayout(tab)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.setSpacing(2)
    layout.addLayout(row)
    layout.addWidget(view, 1)
    return tab


def _export_button(
    owner: QWidget, slot: Callable[[str, int], None], kinds: tuple[str, ...]
) -> QToolButton:
    button = QToolButton(owner)
    button.setText("Export")
    button.setToolTip("Save this plot as PNG or SVG, or its data as CSV")
    button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
    menu = QMenu(button)
    for text, kind, scale in EXPORT_KINDS:
        if kind in kinds:
            action = QAction(text, menu)
            action.triggered.connect(lambda _c=False, k=kind, s=scale: slot(k, s))
            menu.addAction(action)
    button.setMenu(menu)
    return button


class TradeoffsView(QWidget):
    """Map, curves and hardware comparison of the store's current scenario.

    ``space`` gives the sweep's space for a scenario (default
    :func:`memfit.engine.sweep.default_space`). :attr:`message` carries short notes for the
    status bar. :meth:`shutdown` stops the workers (the window is closing).
    """

    message = Signal(str)
    map: SweepMap  # built with its tab, wired up after

    def __init__(
        self,
        store: ScenarioStore,
        parent: QWidget | None = None,
        *,
        space: Callable[[Scenario], Space] = default_space,
    ) -> None:
        super().__init__(parent)
        self.store = store
        self.space_for = space
        self._space: Space | None = None  # the space of the sweep asked for last
        self._sweep: SweepResult | None = None
        self._curves_for: Scenario | None = None  # what the curves shown are of
        self._hardware_for: tuple[Scenario, tuple[str, ...]] | None = None
        self._fixes_for: Scenario | None = None

        self.sweeper = Channel(self)
        self.curver = Channel(self)
        self.comparer = Channel(self)
        self.fitter = Channel(self)
        self.shaper = Channel(self)
        self._shapes_for: Scenario | None = None

        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(self._build_map_tab(), "Map")
        self.tabs.addTab(self._build_curves_tab(), "Curves")
        self.tabs.addTab(self._build_hardware_tab(), "Hardware")
        self.tabs.addTab(self._build_fit_tab(), "Make it fit")
        self.tabs.addTab(self._build_shapes_tab(), "Shapes")
        self.tabs.setTabToolTip(0, "Every strategy around this scenario: memory against speed")
        self.tabs.setTabToolTip(1, "Memory and step time against micro-batch and sequence")
        self.tabs.setTabToolTip(2, "This run on other GPUs: how many, how fast, what cost")
        self.tabs.setTabToolTip(3, "The changes that make this scenario fit, fastest first")
        self.tabs.setTabToolTip(
            4, "Memory and tokens/s at every micro-batch and sequence length: a heat map"
        )
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.tabs)

        self._follow = QTimer(self)
        self._follow.setSingleShot(True)
        self._follow.setInterval(FOLLOW_DELAY_MS)
        self._follow.timeout.connect(self.update_shown)
        # a show catches up at the next turn of the event loop; the view's own timer goes
        # with it (a single shot bound to the view would outlive a view deleted first)
        self._catch_up = QTimer(self)
        self._catch_up.setSingleShot(True)
        self._catch_up.setInterval(0)
        self._catch_up.timeout.connect(self.update_shown)

        self.sweeper.progressed.connect(self._on_sweep_progress)
        self.sweeper.finished.connect(self._on_sweep_finished)
        self.sweeper.failed.connect(self._on_sweep_failed)
        self.sweeper.busyChanged.connect(self._on_sweep_busy)
        self.curver.finished.connect(self._on_curves)
        self.curver.failed.connect(self._on_curves_failed)
        self.curver.busyChanged.connect(self._on_curves_busy)
        self.comparer.progressed.connect(self._on_hardware_progress)
        self.comparer.finished.connect(self._on_hardware)
        self.comparer.failed.connect(self._on_hardware_failed)
        self.comparer.busyChanged.connect(self._on_hardware_busy)
        self.shaper.finished.connect(self._on_shapes)
        self.shaper.failed.connect(lambda m: self.shapes_view.set_stale(f"No grid: {m}"))
        self.shapes_view.shapeActivated.connect(self.apply_shape)
        self.fitter.finished.connect(self._on_fixes)
        self.fitter.failed.connect(self._on_fixes_failed)
        self.fit_view.fixActivated.connect(self.apply_fix)
        self.tabs.currentChanged.connect(lambda _i: self.update_shown())
        self.map.pointActivated.connect(self.apply_point)
        store.scenarioChanged.connect(self.on_scenario)
        store.documentReset.connect(self.on_document_reset)
        self._tick_defaults(store.scenario)
        self._on_sweep_busy(False)

    # -- construction ----------------------------------------------------------------------

    def _build_map_tab(self) -> QWidget:
        tab = QWidget()
        self.sweep_button = QPushButton("Sweep")
        self.sweep_button.setToolTip(
            "Estimate every precision, optimizer, checkpointing, ZeRO stage, parallel "
            "layout, offload and micro-batch around this scenario (global batch kept)"
        )
        self.sweep_button.clicked.connect(lambda: self.start_sweep())
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop the sweep; the dots so far stay")
        self.cancel_button.clicked.connect(self.cancel_sweep)
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(160)
        self.progress.setTextVisible(True)
        self.sweep_status = QLabel()
        self.sweep_status.setObjectName("sweepStatus")
        self.sweep_status.setTextFormat(Qt.TextFormat.PlainText)
        self.sweep_status.setWordWrap(True)
        self.metric_box = QComboBox()
        self.metric_box.addItem("Tokens/s", "tokens")
        self.metric_box.addItem("Cost / 1M tokens", "cost")
        self.metric_box.setToolTip("What the vertical axis shows")
        self.metric_box.setAccessibleName("Vertical axis")
        guard_field(self.metric_box)
        self.metric_box.currentIndexChanged.connect(self._on_metric)
        self.show_oom = QCheckBox("Does not fit")
        self.show_oom.setChecked(True)
        self.show_oom.setToolTip("Show the configurations that do not fit the capacity")
        self.show_oom.toggled.connect(lambda on: self.map.set_show_oom(on))
        reset = QToolButton()
        reset.setText("Reset view")
        reset.setToolTip("Back to the whole map (scroll to zoom, drag to pan)")
        reset.clicked.connect(lambda: self.map.reset_view())
        export = _export_button(tab, self._export_map_dialog, ("png", "svg", "csv"))

        # what no plan may change (the map's sweep and make-it-fit): each a checkable item
        self.lock_button = QToolButton()
        self.lock_button.setText("Keep as set")
        self.lock_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.lock_button.setToolTip(
            "Settings no plan may change: the map sweeps only the scenario's value and "
            "Make it fit leaves out the changes that would alter them"
        )
        menu = QMenu(self.lock_button)
        self.lock_actions: dict[str, QAction] = {}
        for key in LOCKS:
            action = menu.addAction(LOCK_WORDS.get(key, key))
            action.setCheckable(True)
            action.toggled.connect(self._on_locks)
            self.lock_actions[key] = action
        self.lock_button.setMenu(menu)

        self.map = SweepMap()
        _lay_out(
            tab,
            [self.sweep_button, self.cancel_button, self.lock_button, self.progress,
             (self.sweep_status, 1), QLabel("Y axis:"), self.metric_box, self.show_oom,
             reset, export],
            self.map,
        )  # fmt: skip
        self._update_metric_choice()
        return tab

    def _build_curves_tab(self) -> QWidget:
        tab = QWidget()
        self.curves_status = QLabel()
        self.curves_status.setTextFormat(Qt.TextFormat.PlainText)
        export = _export_button(tab, self._export_curves_dialog, ("png", "svg", "csv"))
        self.curves_view = CurvesView()
        return _lay_out(tab, [(self.curves_status, 1), export], self.curves_view)

    def _build_hardware_tab(self) -> QWidget:
        tab = QWidget()
        self.hardware_progress = QProgressBar()
        self.hardware_progress.setMaximumWidth(160)
        self.hardware_cancel = QPushButton("Cancel")
        self.hardware_cancel.setToolTip("Stop the comparison; the rows so far stay")
        self.hardware_cancel.clicked.connect(lambda: self.comparer.cancel())
        self.hardware_status = QLabel()
        self.hardware_status.setTextFormat(Qt.TextFormat.PlainText)
        export = _export_button(tab, self._export_hardware_dialog, ("png", "svg", "csv"))
        self.hardware_view = HardwareView()
        self.hardware_view.selectionChanged.connect(self._on_gpus_ticked)
        _lay_out(
            tab,
            [(self.hardware_status, 1), self.hardware_progress, self.hardware_cancel, export],
            self.hardware_view,
        )
        self._on_hardware_busy(False)
        return tab

    def _build_fit_tab(self) -> QWidget:
        tab = QWidget()
        self.fit_status = QLabel()
        self.fit_status.setTextFormat(Qt.TextFormat.PlainText)
        export = _export_button(tab, self._export_fixes_dialog, ("png", "svg", "csv"))
        export.setToolTip("Save this table as PNG or SVG, or its rows as CSV")
        self.fit_view = FitView()
        return _lay_out(tab, [(self.fit_status, 1), export], self.fit_view)

    def _build_shapes_tab(self) -> QWidget:
        tab = QWidget()
        self.shapes_status = QLabel()
        self.shapes_status.setTextFormat(Qt.TextFormat.PlainText)
        self.shapes_view = ShapeGridView()
        return _lay_out(tab, [(self.shapes_status, 1)], self.shapes_view)

    def update_shapes(self) -> None:
        scenario = self.store.scenario
        if self.store.estimate is None:
            self.shaper.cancel(emit=False)
            self._shapes_for = None
            self.shapes_view.set_stale(f"No grid: {self.store.error}")
            return
        if scenario == self._shapes_for:
            return
        self._shapes_for = scenario
        self.shapes_status.setText("Estimating every shape...")
        self.shaper.start(lambda keep: compute_shapes(scenario, keep))

    @Slot(object, bool)
    def _on_shapes(self, shapes: Shapes | None, complete: bool) -> None:
        if shapes is None or not complete:
            return
        est = self.store.estimate
        capacity = est.capacity_bytes if est is not None else 0
        self.shapes_view.set_shapes(shapes, capacity)
        self.shapes_status.setText(
            f"Memory per GPU and tokens/s for {describe(shapes.scenario)} at each "
            "micro-batch (down) and sequence length (across); double-click one to use it"
        )

    @Slot(int, int)
    def apply_shape(self, micro_batch: int, sequence_length: int) -> None:
        """Make a cell's shape the scenario's (one undoable step)."""
        s = self.store.scenario
        training = dataclasses.replace(
            s.training, micro_batch_size=micro_batch, sequence_length=sequence_length
        )
        text = f"micro-batch {micro_batch} x {sequence_length:,} tokens"
        if self.store.edit(dataclasses.replace(s, training=training), f"Apply {text}"):
            self.message.emit(f"Applied {text} (Ctrl+Z undoes)")

    def sizeHint(self) -> QSize:
        return QSize(900, 700)

    # -- following the store ---------------------------------------------------------------

    def _tick_defaults(self, scenario: Scenario) -> None:
        """The scenario's GPU and a few common ones."""
        self.hardware_view.set_checked([scenario.hardware.gpu.name, *COMMON_GPUS])

    @Slot(object)
    def on_scenario(self, scenario: Scenario) -> None:
        if scenario.hardware.gpu.name in gpu_names():
            self.hardware_view.check(scenario.hardware.gpu.name)
        if self.sweeper.busy:  # the sweep running is of another scenario: start afresh
            self.start_sweep(self._space)
        self._update_map_state()
        self._update_fixes_state()
        if self.isVisible():
            self._follow.start()

    @Slot()
    def on_document_reset(self) -> None:
        """A new document: the old one's results go."""
        for channel in (self.sweeper, self.curver, self.comparer, self.fitter, self.shaper):
            channel.cancel(emit=False)
        self._sweep = None
        self._curves_for = None
        self._shapes_for = None
        self._hardware_for = None
        self._fixes_for = None
        self.map.clear()
        self.curves_view.set_curves(None)
        self.hardware_view.set_rows([], self.store.scenario)
        self.fit_view.set_result(None)
        self.fit_status.setText("")
        self.sweep_status.setText("")
        self._tick_defaults(self.store.scenario)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self._catch_up.start()

    def hideEvent(self, event: QHideEvent) -> None:
        self._follow.stop()
        super().hideEvent(event)

    @Slot()
    def update_shown(self) -> None:
        """Bring the tab shown up to date with the current scenario."""
        if not self.isVisible():
            return
        index = self.tabs.currentIndex()
        if index == 0:
            self._update_map_state()
        elif index == 1:
            self.update_curves()
        elif index == 2:
            self.update_hardware()
        elif index == 3:
            self.update_fixes()
        else:
            self.update_shapes()

    # -- map -------------------------------------------------------------------------------

    def start_sweep(self, space: Space | None = None) -> bool:
        """Sweep around the current scenario over ``space`` (default: the view's space
        for it); ``False`` when the scenario has no valid estimate."""
        scenario = self.store.scenario
        if self.store.estimate is None:
            self.sweeper.cancel(emit=False)
            self.map.set_empty(NO_SWEEP)
            self.sweep_status.setText(f"Nothing to sweep: {self.store.error}")
            self._update_map_state()
            return False
        self._space = space
        chosen = space if space is not None else self.space_for(scenario)
        chosen = locked(chosen, scenario, self.locks())
        self.progress.setRange(0, 0)  # busy until the first progress report
        self.sweep_status.setText(f"Sweeping around {describe(scenario)}...")
        self.map.set_empty("Sweeping...")
        self.sweeper.start(lambda keep: run_sweep(scenario, chosen, keep))
        self._update_map_state()
        return True

    def locks(self) -> tuple[str, ...]:
        """The settings the user keeps as set (:data:`memfit.engine.sweep.LOCKS`)."""
        return tuple(k for k, a in self.lock_actions.items() if a.isChecked())

    @Slot()
    def _on_locks(self, *_: object) -> None:
        n = len(self.locks())
        self.lock_button.setText(f"Keep as set ({n})" if n else "Keep as set")
        self._fixes_for = None  # make-it-fit looks again with the changes it may make
        if self._sweep is not None:
            self.start_sweep(self._space)
        self.update_shown()

    @Slot()
    def cancel_sweep(self) -> None:
        self.sweeper.cancel()

    @Slot(int, int)
    def _on_sweep_progress(self, done: int, total: int) -> None:
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(done)
        self.sweep_status.setText(f"Sweeping: {done:,} of {total:,} configurations")

    @Slot(bool)
    def _on_sweep_busy(self, busy: bool) -> None:
        self.sweep_button.setEnabled(not busy)
        self.cancel_button.setEnabled(busy)
        self.progress.setVisible(busy)
        if not busy:
            self.progress.setRange(0, 1)
            self.progress.setValue(0)

    @Slot(object, bool)
    def _on_sweep_finished(self, result: SweepResult | None, complete: bool) -> None:
        if result is None:
            self.sweep_status.setText("Sweep cancelled before it started")
            self.map.set_empty(NO_SWEEP)
            return
        self._sweep = result
        fits = sum(p.fits for p in result.points)
        front = len(pareto(result.points))
        if complete and result.complete:
            head = f"{len(result.points):,} configurations"
        else:
            done = len(result.points)
            head = f"Cancelled: {done:,} of {result.total:,} configurations swept"
        summary = f"{head} · {fits:,} fit the budget · {front:,} on the Pareto front"
        beyond = result.beyond
        left_out = beyond.sentence() if beyond is not None else ""
        short = ""
        if beyond is not None and left_out:
            short = f" · {beyond.strategies:,} left out: {beyond.stack} cannot run them"
        self.sweep_status.setText(f"{head} in {result.seconds:.1f} s{short}")
        self.sweep_status.setToolTip(
            rich_text(
                f"{left_out}.\nThe map holds only what the scenario's training stack can run "
                "(its abilities, in the stack's file); switching the stack in the Training "
                "strategy panel is a change of its own."
            )
            if left_out
            else ""
        )
        self.map.set_points(
            result.points,
            f"{summary} · swept around {describe(result.scenario)}",
            empty="No configuration of this space is valid for the scenario",
            base=result.scenario,
        )
        self._update_metric_choice()
        self._update_map_state()
        self.message.emit(summary)

    @Slot(str)
    def _on_sweep_failed(self, message: str) -> None:
        self.map.set_empty(NO_SWEEP)
        self.sweep_status.setText(f"The sweep stopped: {message}")

    @Slot(int)
    def _on_metric(self, _index: int) -> None:
        self.map.set_metric(str(self.metric_box.currentData()))
        shown = self.metric_box.findData(self.map.y_metric())
        if shown != self.metric_box.currentIndex():  # the cost without a price: not offered
            with QSignalBlocker(self.metric_box):
                self.metric_box.setCurrentIndex(shown)

    def _update_metric_choice(self) -> None:
        known = self.map.cost_known()
        model = self.metric_box.model()
        item = model.item(1) if isinstance(model, QStandardItemModel) else None
        if item is not None:
            item.setEnabled(known)
            item.setToolTip(
                "" if known else "Give a price per GPU-hour (Hardware panel) to see the cost"
            )
        if not known and self.metric_box.currentIndex() == 1:
            self.metric_box.setCurrentIndex(0)

    def _update_map_state(self) -> None:
        """The current scenario's star, and whether the dots are about it."""
        scenario = self.store.scenario
        if self.isVisible():  # the step time of a deep pipeline takes a moment: when shown
            self.map.set_current(current_point(self.store))
        result = self._sweep
        if result is None:
            return
        if scenario in result.scenarios:
            self.map.set_stale(None)
        elif self.sweeper.busy:
            self.map.set_stale("Out of date: sweeping around the current scenario...")
        else:
            self.map.set_stale(
                "Out of date: the scenario changed since this sweep. Sweep again for the "
                "dots around it."
            )

    @Slot(object)
    def apply_point(self, p: Point) -> None:
        """Make ``p``'s configuration the current scenario (one undoable step)."""
        if self.map.is_stale():
            return
        text = describe(p.scenario)
        if self.store.edit(p.scenario, f"Apply {text}"):
            self.message.emit(f"Applied {text} (Ctrl+Z undoes)")

    # -- curves ----------------------------------------------------------------------------

    def update_curves(self) -> None:
        scenario = self.store.scenario
        if self.store.estimate is None:
            self.curver.cancel(emit=False)
            self._curves_for = None
            self.curves_view.set_stale(f"No curves: {self.store.error}")
            self.curves_status.setText("")
            return
        if scenario == self._curves_for:
            return
        self._curves_for = scenario
        self.curver.start(lambda keep: compute_curves(scenario, keep))

    @Slot(object, bool)
    def _on_curves(self, curves: Curves | None, complete: bool) -> None:
        if curves is None or not complete:
            return
        self.curves_view.set_curves(curves)
        self.curves_status.setText(f"For {describe(curves.scenario)}")

    @Slot(str)
    def _on_curves_failed(self, message: str) -> None:
        self._curves_for = None
        self.curves_view.set_stale(f"No curves: {message}")

    @Slot(bool)
    def _on_curves_busy(self, busy: bool) -> None:
        if busy:
            self.curves_status.setText("Updating for the current scenario...")

    # -- hardware --------------------------------------------------------------------------

    def hardware_gpus(self) -> tuple[str, ...]:
        """The GPUs to compare: the ticked presets, and the scenario's own GPU when it
        has no preset."""
        names = self.hardware_view.checked()
        own = self.store.scenario.hardware.gpu.name
        if own not in gpu_names():
            names.insert(0, own)
        return tuple(names)

    @Slot()
    def _on_gpus_ticked(self) -> None:
        self.update_hardware()

    def update_hardware(self) -> None:
        scenario = self.store.scenario
        if self.store.estimate is None:
            self.comparer.cancel(emit=False)
            self._hardware_for = None
            self.hardware_view.set_stale(f"No comparison: {self.store.error}")
            return
        gpus = self.hardware_gpus()
        if (scenario, gpus) == self._hardware_for:
            return
        self._hardware_for = (scenario, gpus)
        self.hardware_progress.setRange(0, max(len(gpus), 1))
        self.hardware_progress.setValue(0)
        self.comparer.start(lambda keep: (scenario, compare(scenario, gpus, keep)))

    @Slot(int, int)
    def _on_hardware_progress(self, done: int, total: int) -> None:
        self.hardware_progress.setRange(0, max(total, 1))
        self.hardware_progress.setValue(done)
        self.hardware_status.setText(f"Comparing: {done:,} of {total:,} GPUs")

    @Slot(object, bool)
    def _on_hardware(
        self, result: tuple[Scenario, list[HardwareRow]] | None, complete: bool
    ) -> None:
        if result is None:
            self._hardware_for = None
            self.hardware_status.setText("Comparison cancelled")
            return
        scenario, rows = result
        self.hardware_view.set_rows(rows, scenario)
        if complete:
            self.hardware_status.setText(f"{len(rows)} GPUs compared")
        else:
            self._hardware_for = None  # come back to it
            self.hardware_status.setText(f"Cancelled: {len(rows)} GPUs compared")

    @Slot(str)
    def _on_hardware_failed(self, message: str) -> None:
        self._hardware_for = None
        self.hardware_view.set_stale(f"No comparison: {message}")

    @Slot(bool)
    def _on_hardware_busy(self, busy: bool) -> None:
        self.hardware_progress.setVisible(busy)
        self.hardware_cancel.setVisible(busy)

    # -- make it fit -----------------------------------------------------------------------

    def update_fixes(self) -> None:
        scenario = self.store.scenario
        if self.store.estimate is None:
            self.fitter.cancel(emit=False)
            self._fixes_for = None
            self.fit_status.setText("")
            self.fit_view.set_stale(f"Nothing to fit: {self.store.error}")
            return
        if scenario == self._fixes_for:
            return
        self._fixes_for = scenario
        self.fit_status.setText("Looking for changes that make it fit...")
        leave_out = tuple(c for lock in self.locks() for c in LOCKS[lock])
        self.fitter.start(lambda keep: find_fixes(scenario, keep, leave_out))

    def _update_fixes_state(self) -> None:
        """Fixes of another scenario are greyed and cannot be applied; they are current
        again when their scenario is (an undo)."""
        result = self.fit_view.result()
        if result is None:
            return
        if result.scenario == self.store.scenario:
            self.fit_view.set_stale(None)
        else:
            self.fit_view.set_stale("Out of date: updating for the current scenario...")

    @Slot(object, bool)
    def _on_fixes(self, result: FitResult | None, complete: bool) -> None:
        if result is None or not complete:
            self._fixes_for = None
            return
        self.fit_view.set_result(result)
        self.fit_status.setText(f"For {describe(result.scenario)}")
        self._update_fixes_state()  # an edit may have come meanwhile

    @Slot(str)
    def _on_fixes_failed(self, message: str) -> None:
        self._fixes_for = None
        self.fit_status.setText("")
        self.fit_view.set_stale(f"No fixes: {message}")

    @Slot(object)
    def apply_fix(self, fix: Fix) -> None:
        """Make ``fix``'s scenario the current one (one undoable step)."""
        result = self.fit_view.result()
        if result is None or result.scenario != self.store.scenario:
            return  # a fix of another scenario
        text = " + ".join(fix.labels)
        if self.store.edit(fix.scenario, f"Apply {text}"):
            self.message.emit(f"Applied {text} (Ctrl+Z undoes)")

    # -- export ----------------------------------------------------------------------------

    def export_map(self, path: Path, scale: int = 1) -> None:
        """The map as PNG (at ``scale``) or SVG, or its points as CSV, by extension."""
        suffix = path.suffix.lower()
        if suffix == ".csv":
            if self._sweep is None:
                raise ValueError("no sweep to export yet: press Sweep first")
            write_text(path, points_csv(self._sweep.points))
        else:
            self._export_image(self.map, path, scale, self.map.plot_item, "MemFit sweep map")

    def export_curves(self, path: Path, scale: int = 1) -> None:
        suffix = path.suffix.lower()
        if suffix == ".csv":
            curves = self.curves_view.curves()
            if curves is None:
                raise ValueError("no curves to export yet")
            write_text(path, curves_csv(curves))
        else:
            view = self.curves_view
            self._export_image(view, path, scale, view.graphics, "MemFit curves")

    def export_hardware(self, path: Path, scale: int = 1) -> None:
        if path.suffix.lower() == ".csv":
            write_text(path, self.hardware_view.csv_text())
        else:
            view = self.hardware_view
            self._export_image(view, path, scale, None, "MemFit hardware comparison")

    def export_fixes(self, path: Path, scale: int = 1) -> None:
        if path.suffix.lower() == ".csv":
            if self.fit_view.result() is None:
                raise ValueError("no fixes to export yet")
            write_text(path, self.fit_view.csv_text())
        else:
            view = self.fit_view
            self._export_image(view, path, scale, None, "MemFit make it fit")

    @staticmethod
    def _export_image(
        widget: QWidget, path: Path, scale: int, item: QGraphicsItem | None, title: str
    ) -> None:
        suffix = path.suffix.lower()
        if suffix == ".svg":
            export_svg(widget, path, item, title=title)
        elif suffix == ".png":
            export_png(widget, path, scale)
        else:
            raise ValueError(f"unknown format {path.suffix!r}; use .png, .svg or .csv")

    def _export_dialog(
        self, kind: str, scale: int, name: str, export: Callable[[Path, int], None]
    ) -> None:
        filters = {"png": "PNG image (*.png)", "svg": "SVG drawing (*.svg)", "csv": "CSV (*.csv)"}
        folder = self.store.path.parent if self.store.path else Path.home()
        chosen, _ = QFileDialog.getSaveFileName(
            self, "Export", str(folder / f"{name}.{kind}"), filters[kind]
        )
        if not chosen:
            return
        path = Path(chosen)
        if path.suffix.lower() != "." + kind:
            path = path.with_name(path.name + "." + kind)
        try:
            export(path, scale)
        except (OSError, ValueError) as exc:
            box = QMessageBox(QMessageBox.Icon.Warning, "MemFit", f"Export failed:\n{exc}")
            box.setTextFormat(Qt.TextFormat.PlainText)
            box.exec()
            return
        self.message.emit(f"Exported {path.name}")

    def _export_map_dialog(self, kind: str, scale: int) -> None:
        self._export_dialog(kind, scale, "memfit-sweep", self.export_map)

    def _export_curves_dialog(self, kind: str, scale: int) -> None:
        self._export_dialog(kind, scale, "memfit-curves", self.export_curves)

    def _export_hardware_dialog(self, kind: str, scale: int) -> None:
        self._export_dialog(kind, scale, "memfit-hardware", self.export_hardware)

    def _export_fixes_dialog(self, kind: str, scale: int) -> None:
        self._export_dialog(kind, scale, "memfit-fixes", self.export_fixes)

    # -- closing ---------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop every worker and wait for them (the window is closing)."""
        self._follow.stop()
        self._catch_up.stop()
        for channel in (self.sweeper, self.curver, self.comparer, self.fitter, self.shaper):
            channel.shutdown()

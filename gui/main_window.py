"""MemFit's main window, built in named steps (actions, menus, tool bar, status bar, settings).

Layout: the left column holds the Model, Hardware, Training and Parallelism panels in a
scroll area; the right side holds a notice bar (what could not be restored at start-up)
over two tabs: *Memory* -- the what-if toggles, the breakdown chart and the item table --
and *Tradeoffs* (:mod:`memfit.gui.tradeoffs`: the strategy map, curves, other GPUs and the
changes that make it fit). All of them read from and write to one
:class:`~memfit.gui.store.ScenarioStore`.

The window always starts: a scenario the estimate rejects, a broken recovery file or
settings file give a working window and a notice (:mod:`memfit.gui.session`). It never loses
edits: closing asks Save / Discard / Cancel, and the window's own recovery file is written
at the first change of a burst and a moment after the last one, with the document's path
and modified state; a clean close removes it, and a start restores the newest that a
window left behind (killed, crashed) and offers the others (File > Recover Unsaved
Session). Text from files and the engine is shown as plain text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer, Slot
from PySide6.QtGui import (
    QAction,
    QCloseEvent,
    QDragEnterEvent,
    QDropEvent,
    QGuiApplication,
    QIcon,
    QKeySequence,
    QResizeEvent,
    QShowEvent,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMainWindow,
    QMenu,
    QMessageBox,
    QScrollArea,
    QSplitter,
    QStyle,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QToolBar,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from memfit.engine.compare import compare as compare_scenarios
from memfit.engine.errors import EstimateError
from memfit.engine.estimate import GIB, Estimate, estimate
from memfit.engine.files import write_text
from memfit.engine.presets import preset_problems
from memfit.engine.report import to_csv, to_json, to_markdown
from memfit.engine.scenario_io import (
    load_scenario,
    save_scenario,
    scenario_from_dict,
    scenario_to_dict,
)
from memfit.engine.specs import Scenario
from memfit.engine.whatif import COMBINED_KEY, WhatIfResult
from memfit.gui.assets import icon_path
from memfit.gui.chart import BreakdownChart, Ghost, baseline_summary, rich_text
from memfit.gui.chart_export import (
    IMAGE_SIZES,
    ImageSize,
    captioned_image,
    export_png,
    export_svg,
    image_pixels,
)
from memfit.gui.compare_view import CompareWindow
from memfit.gui.forms import FormPanel, give_mnemonics, in_user_words, redo_keys
from memfit.gui.importing import Importer
from memfit.gui.importing import is_scenario_file as _is_scenario_file
from memfit.gui.panels import HardwarePanel, ModelPanel, ParallelismPanel, TrainingPanel
from memfit.gui.readout import (
    HELP_TITLE,
    Readout,
    StepReadout,
    gib_cell,
    show_help,
    status_summary,
)
from memfit.gui.session import (
    LEGACY_NAME,
    RECOVERY_FOLDER,
    MemorySettings,
    RecoveryFile,
    Session,
    Settings,
    autosave_text,
    data_location,
    drop_lost_settings,
    open_settings,
    put_setting,
    recover,
    reopen,
    seal_settings,
    setting_words,
    settings_location,
    settings_problem,
)
from memfit.gui.step_view import ActivationsView, StepTimelineView
from memfit.gui.store import ScenarioStore, default_scenario
from memfit.gui.theme import apply_theme, repolish_window
from memfit.gui.tradeoffs import TradeoffsView
from memfit.gui.whatif_bar import WhatIfBar

__all__ = ["MainWindow", "app_icon", "message_box"]

APP_NAME = "MemFit"
MAX_RECENT = 8
SCENARIO_FILTER = "MemFit scenario (*.memfit.json);;JSON (*.json)"
#: the window height from which the step time has a line of its own under the memory
#: readout; below it the chart keeps that height (the status bar says the step time)
STEP_LINE_HEIGHT = 720
#: what File > Open reads: a scenario, or a model or training config to import
OPEN_FILTER = (
    "Scenario, model config or training config (*.json *.yaml *.yml);;"
    "MemFit scenario (*.memfit.json);;All files (*)"
)
#: the chart export's file type for an SVG (the PNG types name their size, see chart_filters)
SVG_FILTER = "SVG drawing, vector (*.svg)"
DATA_FILTERS = {"CSV (*.csv)": "csv", "JSON (*.json)": "json", "Markdown table (*.md)": "md"}
#: the first change of a burst is written to the recovery file at once, the others this
#: long after the last one
AUTOSAVE_DELAY_MS = 500
#: what a close, New or Open does with unsaved changes
SAVED, DISCARDED, CANCELLED = "saved", "discarded", "cancelled"

Button = QMessageBox.StandardButton


def app_icon() -> QIcon:
    return QIcon(str(icon_path("memfit.svg")))


def message_box(
    parent: QWidget | None,
    icon: QMessageBox.Icon,
    text: str,
    buttons: QMessageBox.StandardButton = Button.Ok,
    default: QMessageBox.StandardButton = Button.NoButton,
) -> QMessageBox.StandardButton:
    """A modal message whose ``text`` is shown as plain text (it names files and carries
    the engine's messages); returns the button chosen."""
    box = QMessageBox(icon, APP_NAME, text, buttons, parent)
    box.setTextFormat(Qt.TextFormat.PlainText)
    if default != Button.NoButton:
        box.setDefaultButton(default)
    return Button(box.exec())


class NoticeBar(QFrame):
    """A non-modal notice above the chart: what could not be restored or written, in plain
    text, until the user closes it. It grows to :attr:`MAX_LINES` lines and scrolls beyond
    them, showing the newest (each import added its notes, and the chart shrank under it to
    a strip); it keeps the newest :attr:`MAX_MESSAGES`."""

    MAX_LINES = 4
    MAX_MESSAGES = 200

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("noticeBar")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setStyleSheet(
            "QFrame#noticeBar { background: palette(alternate-base);"
            " border: 1px solid #F0B400; border-radius: 4px; }"
        )
        self.label = QLabel()
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.label.setWordWrap(True)
        close = QToolButton()
        close.setText("✕")
        close.setAutoRaise(True)
        close.setToolTip("Dismiss")
        close.setAccessibleName("Dismiss the notice")
        close.clicked.connect(self.dismiss)
        self.label.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        self.area = QScrollArea()
        self.area.setWidget(self.label)
        self.area.setWidgetResizable(True)
        self.area.setFrameShape(QFrame.Shape.NoFrame)
        self.area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.area.setStyleSheet(
            "QScrollArea, QScrollArea > QWidget > QWidget { background: transparent; }"
        )
        # the newest message in view: to the end whenever the text grows
        bar = self.area.verticalScrollBar()
        bar.rangeChanged.connect(lambda _lo, hi: bar.setValue(hi))
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 4, 4, 4)
        layout.addWidget(self.area, 1)
        layout.addWidget(close, 0, Qt.AlignmentFlag.AlignTop)
        self._messages: list[str] = []
        self.hide()

    def add(self, text: str) -> None:
        if text in self._messages:
            return
        self._messages = [*self._messages, text][-self.MAX_MESSAGES :]
        self.label.setText("\n".join(self._messages))
        self._fit()
        self.show()

    def _fit(self) -> None:
        """The scroll area as tall as the text, up to :attr:`MAX_LINES` lines."""
        width = max(self.area.viewport().width(), 200)
        needed = self.label.heightForWidth(width)
        cap = self.MAX_LINES * self.label.fontMetrics().lineSpacing() + 4
        self.area.setFixedHeight(max(self.label.fontMetrics().lineSpacing(), min(needed, cap)))

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        if self._messages:
            self._fit()

    def messages(self) -> list[str]:
        return list(self._messages)

    @Slot()
    def dismiss(self) -> None:
        self._messages.clear()
        self.label.clear()
        self.hide()


def _sentence(text: str) -> str:
    text = text.strip()
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


class MainWindow(QMainWindow):
    #: the size (its label) or "svg" last chosen in the chart export, offered first next time
    _chart_export_choice: str = IMAGE_SIZES[0].label

    def __init__(
        self,
        settings: Settings | None = None,
        data_dir: Path | None = None,
        scenario: Scenario | None = None,
        *,
        settings_path: Path | None = None,
    ) -> None:
        """``settings`` or the settings file ``settings_path`` (checked before it is
        opened); the recovery files in ``data_dir``'s ``recovery`` folder (the app's data
        folder by default); ``scenario`` to start with, else what the last session left:
        the newest recovery file no running window owns, or the document last closed."""
        super().__init__()
        notes: list[str] = []
        if settings is None:
            settings, problem = open_settings(settings_path or settings_location())
            if problem:
                notes.append(problem)
        self.settings: Settings = settings
        #: settings the file lost or holds not as written: they start afresh (the note of
        #: read_settings names them)
        self._lost_settings = drop_lost_settings(settings)
        data_dir = data_dir or data_location()
        self._autosave_failed = False
        #: other windows' unsaved sessions found at start, claimed, offered in the menu
        self.unsaved_sessions: list[tuple[RecoveryFile, Session]] = []
        if scenario is not None:
            self.recovery = RecoveryFile.new(data_dir / RECOVERY_FOLDER)
            session = Session(scenario)
        else:
            found = recover(data_dir / RECOVERY_FOLDER, data_dir / LEGACY_NAME)
            self.recovery, self.unsaved_sessions = found.own, found.others
            notes += found.messages
            session = found.session or self._last_document()
        if session.message:
            notes.append(session.message)
        self.store = ScenarioStore(
            session.scenario, self, path=session.path, modified=session.modified
        )
        self._ghosts: list[Ghost] = []
        #: the pinned baseline: a frozen estimate, never re-estimated (see pin_baseline)
        self.baseline: Estimate | None = None
        self._theme = "system"
        self._shown_once = False  # see showEvent
        self.setWindowIcon(app_icon())
        self.setMinimumSize(960, 600)
        self.setAcceptDrops(True)
        self.create_widgets()
        self.create_actions()
        self.create_menus()
        # Alt+letter into each field, apart from the menus' letters (File, Edit, View, Help)
        give_mnemonics(self.panels, taken="fevh")
        self.create_tool_bars()
        self.create_status_bar()
        self.connect_store()
        notes += self.read_settings()
        # the user's own preset files that do not load: each named, the rest are listed
        notes += preset_problems()
        for panel in self.panels:
            panel.refresh(self.store.scenario)  # shows the store's error, if any
        self.sync_view()
        self.update_title()
        self.update_undo_action()
        self._autosave_timer = QTimer(self)
        self._autosave_timer.setSingleShot(True)
        self._autosave_timer.setInterval(AUTOSAVE_DELAY_MS)
        self._autosave_timer.timeout.connect(self._autosave_due)
        self._autosave_pending = False
        self.store.documentChanged.connect(self.schedule_autosave)
        if session.modified:  # a recovered session is this window's from now on
            self.write_autosave()
        for note in notes:
            self.notify(note)

    # -- construction --------------------------------------------------------------------
    def create_widgets(self) -> None:
        self.model_panel = ModelPanel(self.store)
        self.hardware_panel = HardwarePanel(self.store)
        self.training_panel = TrainingPanel(self.store)
        self.parallelism_panel = ParallelismPanel(self.store)
        self.panels: tuple[FormPanel, ...] = (
            self.model_panel,
            self.hardware_panel,
            self.training_panel,
            self.parallelism_panel,
        )
        column = QWidget()
        col = QVBoxLayout(column)
        col.setContentsMargins(6, 6, 6, 6)
        panels = (self.model_panel, self.hardware_panel, self.training_panel)
        for panel in (*panels, self.parallelism_panel):
            col.addWidget(panel)
        col.addStretch(1)
        self.column_scroll = QScrollArea()
        self.column_scroll.setWidget(column)
        self.column_scroll.setWidgetResizable(True)
        self.column_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.column_scroll.setMinimumWidth(340)

        self.whatif = WhatIfBar(self.store)
        self.chart = BreakdownChart()
        self.table = QTableWidget(0, 4)
        self.table.setHorizontalHeaderLabels(["Item", "Category", "GiB", "Formula"])
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        # compact rows, never fewer than three shown (six at 1280x800: see the splitter)
        row_height = self.table.fontMetrics().height() + 8
        self.table.verticalHeader().setDefaultSectionSize(row_height)
        self.table.setMinimumHeight(
            header.sizeHint().height() + 3 * row_height + 2 * self.table.frameWidth()
        )
        self.notice = NoticeBar()

        memory = self.memory_split = QSplitter(Qt.Orientation.Vertical)
        top = QWidget()
        # opaque, so that a repaint inside it (every edit's) paints nothing behind it
        top.setAutoFillBackground(True)
        memory.setAutoFillBackground(True)
        top_layout = QVBoxLayout(top)
        top_layout.setContentsMargins(6, 6, 6, 0)
        top_layout.addWidget(self.whatif)
        self.readout = Readout(self.store)  # allocated, reserved, device, by the banner
        top_layout.addWidget(self.readout)
        # the step time beside the memory; a short window keeps its height for the chart
        # (the status bar says the step time too)
        self.step_readout = StepReadout(self.store)
        top_layout.addWidget(self.step_readout)
        top_layout.addWidget(self.chart, 1)
        memory.addWidget(top)
        # under the chart: the items, the activations by source, the step over time
        self.activations = ActivationsView(self.store)
        self.step_view = StepTimelineView(self.store)
        self.details = QTabWidget()
        self.details.setDocumentMode(True)
        self.details.addTab(self.table, "Items")
        self.details.addTab(self.activations, "Activations by Source")
        self.details.addTab(self.step_view, "Memory over Time")
        self.details.setTabToolTip(0, "Every memory item at the peak, with its formula")
        self.details.setTabToolTip(
            1, "The activations at the peak told apart by source, and what removes each"
        )
        self.details.setTabToolTip(
            2, "The memory of every moment of the step, stacked by category, the peak marked"
        )
        memory.addWidget(self.details)
        self.details.currentChanged.connect(self._room_for_details)
        self.table.cellDoubleClicked.connect(self._open_item)
        # the chart over the table, 8:3 at every height: six rows of the table at 1280x800
        memory.setStretchFactor(0, 8)
        memory.setStretchFactor(1, 3)
        memory.setSizes([800, 300])
        self.tradeoffs = TradeoffsView(self.store)
        # the breakdown and, beside it, what memory costs in speed and money
        self.views = QTabWidget()
        # no frame around the pages (as the details' tabs): the style drew one across the
        # whole page at every repaint of the chart
        self.views.setDocumentMode(True)
        self.views.addTab(memory, "Memory")
        self.views.addTab(self.tradeoffs, "Tradeoffs")
        self.views.setTabToolTip(0, "Where the memory goes: the breakdown and what-ifs")
        self.views.setTabToolTip(
            1, "Memory against speed and cost: strategy map, curves, other GPUs"
        )
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.setSpacing(0)
        notice_box = QVBoxLayout()
        notice_box.setContentsMargins(6, 6, 6, 0)
        notice_box.addWidget(self.notice)
        right_layout.addLayout(notice_box)
        right_layout.addWidget(self.views, 1)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(self.column_scroll)
        self.splitter.addWidget(right)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 1)
        # the left column wide enough for its fields' longest choices at 1280 px
        self.splitter.setSizes([440, 840])
        self.setCentralWidget(self.splitter)

    def _action(
        self,
        text: str,
        slot: object,
        shortcut: QKeySequence | QKeySequence.StandardKey | str | None = None,
        tip: str = "",
        icon: QStyle.StandardPixmap | None = None,
    ) -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        action.setStatusTip(tip)
        action.setToolTip(tip or text.replace("&", ""))
        if icon is not None:
            action.setIcon(self.style().standardIcon(icon))
        action.triggered.connect(slot)
        return action

    def create_actions(self) -> None:
        sp = QStyle.StandardPixmap
        keys = QKeySequence.StandardKey
        self.new_act = self._action(
            "&New", self.new_scenario, keys.New, "Start a new scenario", sp.SP_FileIcon
        )
        self.open_act = self._action(
            "&Open...",
            self.open_dialog,
            keys.Open,
            "Open a scenario file, or import a model's config.json or a training config",
            sp.SP_DialogOpenButton,
        )
        self.save_act = self._action(
            "&Save", self.save, keys.Save, "Save the scenario", sp.SP_DialogSaveButton
        )
        self.save_as_act = self._action(
            "Save &As...", self.save_as_dialog, keys.SaveAs, "Save the scenario under a new name"
        )
        self.export_chart_act = self._action(
            "Export &Chart...",
            self.export_chart_dialog,
            "Ctrl+E",
            "Save the chart as PNG or SVG",
            sp.SP_DialogApplyButton,
        )
        self.export_data_act = self._action(
            "Export &Data...",
            self.export_data_dialog,
            "Ctrl+Shift+E",
            "Save the breakdown as CSV, JSON or Markdown",
        )
        self.copy_chart_act = self._action(
            "Cop&y Chart",
            self.copy_chart,
            "Ctrl+Shift+C",
            "Copy the chart, under its caption, to the clipboard as an image",
        )
        self.copy_summary_act = self._action(
            "Copy Summary as &Markdown",
            self.copy_summary,
            "Ctrl+Shift+M",
            "Copy the scenario, verdict, breakdown and shown what-ifs as Markdown",
        )
        self.quit_act = self._action("&Quit", self.close, keys.Quit, "Quit MemFit")
        self.close_act = self._action("&Close Window", self.close, keys.Close, "Close MemFit")
        self.find_act = self._action(
            "&Find Model...", self.find_model, keys.Find, "Search the model presets"
        )
        self.apply_whatif_act = self._action(
            "A&pply Shown What-if",
            self.apply_shown_whatif,
            "Ctrl+Return",
            "Make the ghost bar shown (the first checked what-if) the current scenario",
        )
        # Undo first discards a value a field holds that the spec rejected, then undoes
        self.undo_act = self._action("&Undo", self.undo, keys.Undo, "", sp.SP_ArrowBack)
        self.redo_act = self.store.undo_stack.createRedoAction(self, "&Redo")
        self.redo_act.setShortcuts(redo_keys())
        self.redo_act.setIcon(self.style().standardIcon(sp.SP_ArrowForward))
        self.compare_all_act = self._action(
            "Compare &All What-ifs",
            self.compare_all,
            "Ctrl+Shift+A",
            "Show a ghost bar for every what-if at once",
        )
        self.clear_whatifs_act = self._action(
            "C&lear What-ifs", self.clear_whatifs, None, "Hide all ghost bars"
        )
        self.compare_act = self._action(
            "Co&mpare Scenarios...",
            self.compare_dialog,
            None,
            "The current scenario, the pinned baseline and saved scenario files side by side",
        )
        self.pin_baseline_act = self._action(
            "&Pin as Baseline",
            self.pin_baseline,
            "Ctrl+Shift+P",
            "Keep the current estimate as a bar of its own to compare later scenarios with",
        )
        self.clear_baseline_act = self._action(
            "Clear &Baseline", self.clear_baseline, None, "Remove the pinned baseline's bar"
        )
        self.clear_baseline_act.setEnabled(False)
        self.table_act = QAction("Breakdown &Details", self, checkable=True, checked=True)
        self.table_act.setStatusTip(
            "Show the items, the activations by source and the step over time under the chart"
        )
        self.table_act.toggled.connect(self.details.setVisible)
        self.theme_acts: dict[str, QAction] = {}
        for key, text in (("system", "&System Colours"), ("light", "&Light"), ("dark", "&Dark")):
            act = QAction(text, self, checkable=True)
            act.setStatusTip(f"Use the {key} colour scheme")
            act.triggered.connect(lambda _c=False, k=key: self.set_theme(k))
            self.theme_acts[key] = act
        self.memory_view_act = self._action(
            "&Memory Breakdown",
            lambda: self.views.setCurrentIndex(0),
            "Ctrl+1",
            "Show where the memory goes",
        )
        self.tradeoffs_view_act = self._action(
            "T&radeoffs",
            lambda: self.views.setCurrentIndex(1),
            "Ctrl+2",
            "Show memory against speed and cost: strategy map, curves, other GPUs",
        )
        self.activations_act = self._action(
            "&Activations by Source",
            lambda: self.show_details(self.activations),
            "Ctrl+3",
            "Show the activations at the peak by source, and what removes each",
        )
        self.step_view_act = self._action(
            "Memory over &Time",
            lambda: self.show_details(self.step_view),
            "Ctrl+4",
            "Show the memory of every moment of the step, the peak marked",
        )
        self.about_act = self._action("&About MemFit", self.about, None, "About MemFit")
        self.numbers_act = self._action(
            "&What the Numbers Mean", lambda: show_help(self), None, HELP_TITLE
        )
        self.readout.helpRequested.connect(self.numbers_act.trigger)

    def create_menus(self) -> None:
        self.importer = Importer(self)
        bar = self.menuBar()
        self.file_menu = file_menu = bar.addMenu("&File")
        file_menu.addActions([self.new_act, self.open_act])
        self.recent_menu = QMenu("Open &Recent", self)
        file_menu.addMenu(self.recent_menu)
        self.recover_menu = QMenu("Recover Unsaved &Session", self)
        file_menu.addMenu(self.recover_menu)
        self.update_recover_menu()
        file_menu.addActions([self.save_act, self.save_as_act])
        file_menu.addSeparator()
        file_menu.addActions(self.importer.actions)
        file_menu.addSeparator()
        file_menu.addActions([self.export_chart_act, self.export_data_act, self.copy_chart_act])
        file_menu.addAction(self.compare_act)
        file_menu.addSeparator()
        file_menu.addActions([self.close_act, self.quit_act])
        edit_menu = bar.addMenu("&Edit")
        edit_menu.addActions([self.undo_act, self.redo_act])
        edit_menu.addSeparator()
        edit_menu.addAction(self.importer.paste_act)
        edit_menu.addAction(self.find_act)
        edit_menu.addSeparator()
        edit_menu.addAction(self.copy_summary_act)
        view_menu = bar.addMenu("&View")
        view_menu.addActions([self.memory_view_act, self.tradeoffs_view_act])
        view_menu.addActions([self.activations_act, self.step_view_act])
        view_menu.addSeparator()
        view_menu.addActions(
            [self.compare_all_act, self.apply_whatif_act, self.clear_whatifs_act, self.table_act]
        )
        view_menu.addSeparator()
        view_menu.addActions([self.pin_baseline_act, self.clear_baseline_act])
        view_menu.addSeparator()
        theme_menu = view_menu.addMenu("&Colours")
        theme_menu.addActions(list(self.theme_acts.values()))
        help_menu = bar.addMenu("&Help")
        help_menu.addActions([self.numbers_act, self.about_act])

    def create_tool_bars(self) -> None:
        tools = QToolBar("Main", self)
        tools.setObjectName("mainToolBar")
        tools.setMovable(False)
        tools.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        tools.addActions([self.new_act, self.open_act, self.save_act])
        tools.addSeparator()
        tools.addActions([self.undo_act, self.redo_act])
        tools.addSeparator()
        tools.addAction(self.export_chart_act)
        self.addToolBar(tools)

    def create_status_bar(self) -> None:
        self.summary = QLabel()
        self.summary.setTextFormat(Qt.TextFormat.PlainText)
        self.summary.setToolTip(f"The banner's figure: device bytes per GPU. Help > {HELP_TITLE}")
        self.statusBar().addPermanentWidget(self.summary)
        self.statusBar().showMessage("Ready", 2000)

    def connect_store(self) -> None:
        self.store.documentReset.connect(self.on_document_reset)
        self.store.estimateChanged.connect(self.on_estimate)
        self.store.errorChanged.connect(self.on_error)
        self.store.modifiedChanged.connect(self.update_title)
        self.store.pathChanged.connect(self.update_title)
        stack = self.store.undo_stack
        stack.canUndoChanged.connect(self.update_undo_action)
        stack.undoTextChanged.connect(self.update_undo_action)
        for panel in self.panels:
            panel.pendingChanged.connect(self.update_undo_action)
        self.whatif.ghostsChanged.connect(self.on_ghosts)
        self.chart.ghostActivated.connect(self.whatif.apply)
        self.tradeoffs.message.connect(lambda text: self.statusBar().showMessage(text, 5000))
        self.model_panel.refused.connect(self.notify)
        QGuiApplication.styleHints().colorSchemeChanged.connect(self.on_system_scheme)

    # -- settings ------------------------------------------------------------------------
    def read_settings(self) -> list[str]:
        """Apply the saved preferences; returns a note naming those that could not be."""
        bad: list[str] = list(self._lost_settings)
        geometry = self._setting("window/geometry", bad, QByteArray)
        if not (isinstance(geometry, QByteArray) and self.restoreGeometry(geometry)):
            if geometry is not None:
                bad.append("window/geometry")
            self.resize(1280, 800)
        state = self._setting("window/splitter", bad, QByteArray)
        if isinstance(state, QByteArray) and not self.splitter.restoreState(state):
            bad.append("window/splitter")
        table = self._setting("view/table", bad, bool)
        self.table_act.setChecked(table if isinstance(table, bool) else True)
        conventions = self._setting("view/conventions", bad, bool)
        self.training_panel.conventions.set_expanded(conventions is True)
        theme = self._setting("view/theme", bad, str)
        if theme is not None and theme not in self.theme_acts:
            bad.append("view/theme")
        self.set_theme(theme if theme in self.theme_acts else "system", save=False)
        self._restore_baseline(bad)
        self._recent_ok = True
        self.recent_files()
        if not self._recent_ok:
            bad.append("document/recent")
        self.update_recent_menu()
        if not bad:
            return []
        return [
            "some settings could not be restored and start afresh: "
            + setting_words(list(dict.fromkeys(bad)))
        ]

    def _restore_baseline(self, bad: list[str]) -> None:
        """The baseline pinned when the app last ran, estimated again from its scenario;
        one that no longer reads or estimates is named in ``bad`` and dropped."""
        text = self._setting("view/baseline", bad, str)
        if not text:
            return
        try:
            self.baseline = estimate(scenario_from_dict(json.loads(text)))
        except (EstimateError, ValueError, TypeError, KeyError, RecursionError):
            bad.append("view/baseline")
            self._put_setting("view/baseline", "")
            return
        self.clear_baseline_act.setEnabled(True)

    def _setting(self, key: str, bad: list[str], kind: type) -> Any:
        """The setting ``key`` if it is a ``kind`` (``None`` when absent); a value of the
        wrong type is named in ``bad`` and read as ``None``."""
        try:
            value = self.settings.value(key, None)
        except Exception:  # a value QSettings cannot convert: start without it
            bad.append(key)
            return None
        if value is None:
            return None
        if kind is bool and isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"  # an ini file holds booleans as words
        if kind is QByteArray and isinstance(value, QByteArray):
            return value if not value.isEmpty() else None
        if isinstance(value, kind) and kind is not QByteArray:
            return value
        bad.append(key)
        return None

    def _put_setting(self, key: str, value: object) -> None:
        """Set a preference, unless the settings file has become something that cannot be
        written (a FIFO, a link to a device): then the settings stay in memory."""
        if isinstance(self.settings, QSettings):
            problem = settings_problem(Path(self.settings.fileName()))
            if problem:
                kept = {k: self.settings.value(k) for k in ("document/recent", "view/theme")}
                self.settings = MemorySettings({k: v for k, v in kept.items() if v is not None})
                self.notify(f"settings are kept for this session only: {problem}")
        put_setting(self.settings, key, value)

    def write_settings(self) -> None:
        """At close: every preference, the document to reopen (saved, or discarded back
        to its file as saved), and the settings file's check."""
        path = self.store.path
        self._put_setting("document/last", str(path) if path else "")
        self._put_setting("window/geometry", self.saveGeometry())
        self._put_setting("window/splitter", self.splitter.saveState())
        self._put_setting("view/table", self.table_act.isChecked())
        self._put_setting("view/conventions", self.training_panel.conventions.is_expanded())
        self._put_setting("view/theme", self._theme)
        if isinstance(self.settings, QSettings) and settings_problem(
            Path(self.settings.fileName())
        ):
            return
        seal_settings(self.settings)

    def recent_files(self) -> list[str]:
        try:
            value = self.settings.value("document/recent", [])
        except Exception:
            value = []
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            self._recent_ok = False
            value = (
                [v for v in value if isinstance(v, str) and v] if isinstance(value, list) else []
            )
        return value[:MAX_RECENT]

    def add_recent(self, path: Path) -> None:
        files = [str(path)] + [f for f in self.recent_files() if f != str(path)]
        self._put_setting("document/recent", files[:MAX_RECENT])
        self.update_recent_menu()

    def update_recover_menu(self) -> None:
        """File > Recover Unsaved Session: one item per other window's unsaved session
        found at start; shown only while there is one."""
        self.recover_menu.clear()
        for i, (file, session) in enumerate(self.unsaved_sessions, 1):
            when = datetime.fromtimestamp(file.changed_at()).strftime("%Y-%m-%d %H:%M")
            name = session.name.replace("&", "&&")
            act = self.recover_menu.addAction(f"&{i} {name}, unsaved changes of {when}")
            tip = f"Open the unsaved changes to {session.name} kept in {file.path}"
            act.setStatusTip(tip)
            act.setToolTip(rich_text(tip))
            act.triggered.connect(lambda _c=False, f=file: self.recover_session(f))
        self.recover_menu.menuAction().setVisible(bool(self.unsaved_sessions))

    def recover_session(self, file: RecoveryFile) -> bool:
        """Open another window's unsaved session (after asking about this one's changes);
        its recovery file goes once this window's own holds it."""
        found = [(f, s) for f, s in self.unsaved_sessions if f is file]
        if not found or not self.maybe_save():
            return False
        session = found[0][1]
        self.store.reset(session.scenario, session.path, modified=True)
        if self.write_autosave():
            file.remove()
        else:
            file.release()  # kept for the next start: this window could not take it over
        self.unsaved_sessions.remove(found[0])
        self.update_recover_menu()
        self.statusBar().showMessage(f"Recovered unsaved changes to {session.name}", 5000)
        return True

    def _last_document(self) -> Session:
        """The document the last window closed with (``document/last``), as saved."""
        try:
            last = self.settings.value("document/last", "")
        except Exception:  # a value QSettings cannot convert
            last = ""
        if isinstance(last, str) and last:
            return reopen(Path(last))
        return Session(default_scenario())

    def update_recent_menu(self) -> None:
        self.recent_menu.clear()
        files = self.recent_files()
        for i, name in enumerate(files, 1):
            act = self.recent_menu.addAction(f"&{i} {Path(name).name.replace('&', '&&')}")
            act.setStatusTip(name)
            act.setToolTip(rich_text(name))  # not its text, which Qt would take as markup
            act.triggered.connect(lambda _c=False, n=name: self.open_recent(Path(n)))
        self.recent_menu.setEnabled(bool(files))

    # -- notices -------------------------------------------------------------------------
    def notify(self, text: str) -> None:
        """Say ``text`` without blocking: in the notice bar and the status bar."""
        sentence = _sentence(text)
        self.notice.add(sentence)
        self.statusBar().showMessage(sentence, 15000)

    # -- reacting to the store -----------------------------------------------------------
    @Slot()
    def on_document_reset(self) -> None:
        """A new document replaces the current one: its results go."""
        self.chart.clear()
        self.table.setRowCount(0)

    @Slot(object)
    def on_estimate(self, _est: Estimate | None) -> None:
        self.sync_view()

    @Slot(str)
    def on_error(self, _message: str) -> None:
        self.sync_view()

    def sync_view(self) -> None:
        """Chart, table and summary from the store: the current estimate, or -- when the
        engine rejects the scenario -- marked out of date with the engine's message."""
        est = self.store.estimate
        if est is None:
            self.chart.set_stale(self.in_user_words(self.store.refusal or self.store.error))
            self.table.setEnabled(False)
            self.table.setToolTip("Out of date: the current scenario has no valid estimate")
            self.summary.setText("No current estimate: the scenario is invalid")
            return
        # the what-if bar, which hears the store first, has already redrawn the chart with
        # the new ghosts; this call is then a no-op
        self.chart.set_estimates(est, self._ghosts, self.baseline)
        self.chart.set_stale(None)
        self.table.setEnabled(True)
        self.table.setToolTip("")
        self.fill_table(est)
        summary = status_summary(est)  # the banner's words and rounding
        if est.host_node_bytes:
            summary += f" · host RAM {est.host_node_bytes / GIB:,.1f} GiB per node"
            if est.host_capacity_bytes is not None:
                summary += f" of {est.host_capacity_bytes / GIB:,.1f} · {est.host_verdict}"
        self.summary.setText(summary)
        self.summary.setToolTip(
            rich_text(
                f"Per GPU of {est.scenario.hardware.gpu.display_name}: the banner's figure, "
                f"device bytes. Help > {HELP_TITLE}"
            )
        )

    @Slot(list)
    def on_ghosts(self, ghosts: list[Ghost]) -> None:
        self._ghosts = ghosts
        if self.store.estimate is not None:
            self.chart.set_estimates(self.store.estimate, ghosts, self.baseline)

    @Slot()
    def pin_baseline(self) -> None:
        """Ctrl+Shift+P: keep the current estimate, as it is now, as the baseline bar; it
        stays through edits and new documents until cleared or replaced."""
        est = self.store.estimate
        if est is None:
            self.statusBar().showMessage("Nothing to pin: the scenario has no valid estimate", 5000)
            return
        self.baseline = est
        self.clear_baseline_act.setEnabled(True)
        self.chart.set_estimates(est, self._ghosts, self.baseline)
        self.statusBar().showMessage(f"Pinned as the baseline: {baseline_summary(est)}", 5000)
        # kept for the next start (its scenario: the estimate is made again from it)
        self._put_setting("view/baseline", json.dumps(scenario_to_dict(est.scenario)))

    @Slot()
    def compare_dialog(self) -> None:
        """Pick scenario files to compare with the current scenario (and the baseline)."""
        names, _ = QFileDialog.getOpenFileNames(
            self, "Compare with scenarios", self._last_dir(), SCENARIO_FILTER
        )
        self.compare_with([Path(n) for n in names])

    def compare_with(self, paths: Sequence[Path]) -> CompareWindow | None:
        """A window with the current scenario, the pinned baseline (if any) and the
        scenario files ``paths`` side by side; a file that does not read, or a scenario
        the engine rejects, is named in a message instead."""
        named: list[tuple[str, Scenario]] = [(f"current: {self.store.scenario.model.label}",
                                              self.store.scenario)]  # fmt: skip
        if self.baseline is not None:
            named.append(("pinned baseline", self.baseline.scenario))
        try:
            named += [(p.name, load_scenario(p)) for p in paths]
            if len(named) < 2:
                self.statusBar().showMessage(
                    "Nothing to compare with: pick a scenario file or pin a baseline", 5000
                )
                return None
            compared = compare_scenarios(named)
        except (EstimateError, OSError) as exc:
            message_box(self, QMessageBox.Icon.Warning, f"Could not compare:\n{exc}")
            return None
        window = CompareWindow(compared, self)
        window.show()
        self._compare_window = window
        return window

    @Slot()
    def clear_baseline(self) -> None:
        self.baseline = None
        self.clear_baseline_act.setEnabled(False)
        self._put_setting("view/baseline", "")
        if self.store.estimate is not None:
            self.chart.set_estimates(self.store.estimate, self._ghosts)

    def show_details(self, page: QWidget) -> None:
        """The memory view with ``page`` of the details under the chart in front."""
        self.views.setCurrentIndex(0)
        self.table_act.setChecked(True)
        self.details.setCurrentWidget(page)

    @Slot(int)
    def _room_for_details(self, index: int) -> None:
        """A plot or tree under the chart gets at least 40 % of the height when shown."""
        sizes = self.memory_split.sizes()
        total = sum(sizes)
        if index > 0 and total and sizes[1] < 0.4 * total:
            self.memory_split.setSizes([int(0.6 * total), total - int(0.6 * total)])

    @Slot(int, int)
    def _open_item(self, row: int, _column: int) -> None:
        """Double-clicking an activations item opens them told apart by source."""
        cell = self.table.item(row, 1)
        if cell is not None and cell.text() == "activations":
            self.show_details(self.activations)

    def fill_table(self, est: Estimate) -> None:
        """One row per item; cells are reused, only their texts change."""
        self.table.setRowCount(len(est.items))
        right = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
        for row, item in enumerate(est.items):
            texts = (item.name, item.category, gib_cell(item.bytes), item.formula)
            for col, text in enumerate(texts):
                cell = self.table.item(row, col)
                if cell is None:
                    cell = QTableWidgetItem()
                    if col == 2:
                        cell.setTextAlignment(right)
                    self.table.setItem(row, col, cell)
                if cell.text() != text:
                    cell.setText(text)
                tip = rich_text(item.source) if item.source else ""
                if item.category == "activations":
                    tip += rich_text("\nDouble-click: the activations by source (Ctrl+3)")
                if cell.toolTip() != tip:
                    cell.setToolTip(tip)

    @Slot()
    def update_title(self, *_: object) -> None:
        path = self.store.path
        name = path.name if path else "Untitled"
        self.setWindowTitle(f"{name}[*] — {APP_NAME}")
        self.setWindowModified(self.store.modified)

    # -- undo ----------------------------------------------------------------------------
    def pending_rows(self) -> list[str]:
        """The fields holding a value the spec rejected (not stored)."""
        return [label for panel in self.panels for label in panel.pending()]

    @Slot()
    def undo(self) -> None:
        """Discard the rejected values the fields hold, if any; else undo the last edit."""
        discarded = [panel.discard_pending() for panel in self.panels]
        if any(discarded):
            self.statusBar().showMessage("Discarded the rejected value", 3000)
            return
        self.store.undo_stack.undo()

    @Slot()
    def update_undo_action(self, *_: object) -> None:
        pending = self.pending_rows()
        stack = self.store.undo_stack
        if pending:
            text = f"&Undo Rejected {pending[0]}"
            tip = f"Put {pending[0]} back to the scenario's value"
        elif stack.canUndo():
            text = f"&Undo {stack.undoText()}"
            tip = f"Undo {stack.undoText()}"
        else:
            text, tip = "&Undo", "Nothing to undo"
        self.undo_act.setText(text)
        self.undo_act.setToolTip(tip.replace("&", ""))
        self.undo_act.setStatusTip(tip.replace("&", ""))
        self.undo_act.setEnabled(bool(pending) or stack.canUndo())

    # -- documents -----------------------------------------------------------------------
    def ask_to_save(self) -> str:
        """With unsaved changes, ask Save / Discard / Cancel: :data:`SAVED` (or nothing to
        save), :data:`DISCARDED` or :data:`CANCELLED`."""
        if not self.store.modified:
            return SAVED
        name = self.store.path.name if self.store.path else "the untitled scenario"
        answer = message_box(
            self,
            QMessageBox.Icon.Warning,
            f"Save the changes to {name}?",
            Button.Save | Button.Discard | Button.Cancel,
            Button.Save,
        )
        if answer == Button.Save:
            return SAVED if self.save() else CANCELLED
        return DISCARDED if answer == Button.Discard else CANCELLED

    def maybe_save(self) -> bool:
        """``True`` when it is fine to replace the current document."""
        return self.ask_to_save() != CANCELLED

    @Slot()
    def new_scenario(self) -> None:
        if self.maybe_save():
            self.store.reset(default_scenario())
            self.statusBar().showMessage("New scenario", 3000)

    @Slot()
    def open_dialog(self) -> None:
        """Open what the user picks: a scenario becomes the document (after asking about
        unsaved changes); a model's ``config.json`` or a training configuration is imported
        into the current one, as File > Import does (Open had refused them as scenarios)."""
        name, _ = QFileDialog.getOpenFileName(self, "Open", self._last_dir(), OPEN_FILTER)
        if name:
            self.open_any(Path(name))

    def open_any(self, path: Path) -> bool:
        """A scenario file opens as the document; any other file is imported."""
        if path.is_file() and _is_scenario_file(path):
            return self.maybe_save() and self.open_path(path)
        return self.importer.import_path(path)

    def open_recent(self, path: Path) -> bool:
        """A recent scenario opens; a recent import (a config, a model folder, a training
        configuration) is imported again."""
        if path.is_dir() or not _is_scenario_file(path):
            return self.importer.import_path(path)
        return self.maybe_save() and self.open_path(path)

    # -- drag and drop: files, folders, text ---------------------------------------------
    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        mime = event.mimeData()
        local = mime.hasUrls() and any(url.isLocalFile() for url in mime.urls())
        if local or mime.hasText():
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        mime = event.mimeData()
        paths = [Path(url.toLocalFile()) for url in mime.urls() if url.isLocalFile()]
        if paths:
            event.acceptProposedAction()
            scenarios = [p for p in paths if p.is_file() and _is_scenario_file(p)]
            if scenarios and self.maybe_save():  # a scenario opens; the rest are imports
                self.open_path(scenarios[0])
            self.importer.import_paths([p for p in paths if p not in scenarios])
        elif mime.hasText():
            event.acceptProposedAction()
            self.importer.import_pasted(mime.text(), "the dropped text")

    def open_path(self, path: Path) -> bool:
        """Open a scenario file (the caller has asked about unsaved changes); a malformed
        one shows a message naming the problem and changes nothing."""
        try:
            scenario = load_scenario(path)
        except (EstimateError, OSError) as exc:
            message_box(self, QMessageBox.Icon.Warning, f"Could not open {path.name}:\n{exc}")
            return False
        self.store.reset(scenario, path)
        self.add_recent(path)
        if self.store.error:
            self.statusBar().showMessage(
                f"Opened {path.name}; its estimate is rejected: {self.store.error}", 8000
            )
        else:
            self.statusBar().showMessage(f"Opened {path.name}", 3000)
        return True

    @Slot()
    def save(self) -> bool:
        if self.store.path is None:
            return self.save_as_dialog()
        return self.save_to(self.store.path)

    @Slot()
    def save_as_dialog(self) -> bool:
        start = str(Path(self._last_dir()) / "scenario.memfit.json")
        name, _ = QFileDialog.getSaveFileName(self, "Save scenario", start, SCENARIO_FILTER)
        return self.save_to(Path(name)) if name else False

    def save_to(self, path: Path) -> bool:
        if not path.name.endswith(".json"):
            path = path.with_name(path.name + ".memfit.json")
        try:
            save_scenario(self.store.scenario, path)
        except OSError as exc:
            message_box(self, QMessageBox.Icon.Warning, f"Could not save {path.name}:\n{exc}")
            return False
        self.store.mark_saved(path)
        self.add_recent(path)
        self.statusBar().showMessage(f"Saved {path.name}", 3000)
        return True

    def _last_dir(self) -> str:
        path = self.store.path
        return str(path.parent) if path else str(Path.home())

    # -- export --------------------------------------------------------------------------
    def export_chart(self, path: Path, scale: int = 1, *, width: int | None = None) -> None:
        """Write the chart to ``path``: SVG by extension, else PNG at ``scale`` x the
        on-screen size or ``width`` pixels wide."""
        if path.suffix.lower() == ".svg":
            export_svg(self.chart, path)
        else:
            export_png(self.chart, path, scale, width=width)

    def shown_whatifs(self) -> list[WhatIfResult]:
        """The what-ifs whose ghost bars the chart shows, in their order."""
        combined = getattr(self.whatif, "combined", None)
        found = [
            combined if g.key == COMBINED_KEY else self.whatif.results.get(g.key)
            for g in self._ghosts
        ]
        return [w for w in found if w is not None]

    def export_data(self, path: Path) -> None:
        """Write the breakdown, the shown what-ifs and the pinned baseline to ``path`` as
        CSV, JSON or Markdown, by extension."""
        writers = {".csv": to_csv, ".json": to_json, ".md": to_markdown}
        writer = writers.get(path.suffix.lower())
        if writer is None:
            raise ValueError(f"unknown data format {path.suffix!r}; use .csv, .json or .md")
        if self.store.estimate is None:
            raise ValueError(f"the scenario has no valid estimate to export: {self.store.error}")
        est, whatifs = self.store.estimate, self.shown_whatifs()
        write_text(path, writer(est, whatifs=whatifs, baseline=self.baseline))

    def chart_filters(self) -> dict[str, ImageSize | None]:
        """The chart export's file types: a PNG per size of :data:`IMAGE_SIZES`, naming
        the pixels it gives now, then the SVG (``None``: vector, the on-screen size)."""
        out: dict[str, ImageSize | None] = {}
        for size in IMAGE_SIZES:
            px = image_pixels(self.chart, size)
            out[f"PNG image, {size.label}: {px.width()} x {px.height()} px (*.png)"] = size
        out[SVG_FILTER] = None
        return out

    @Slot()
    def export_chart_dialog(self) -> None:
        """Ctrl+E: the file, its type and the PNG's size in one dialog; the last size or
        SVG chosen is offered first."""
        filters = self.chart_filters()
        last = self._chart_export_choice
        selected = next(
            (f for f, size in filters.items() if (size.label if size else "svg") == last),
            next(iter(filters)),
        )
        suffix = ".svg" if last == "svg" else ".png"
        name, chosen = QFileDialog.getSaveFileName(
            self,
            "Export chart",
            str(Path(self._last_dir()) / f"memfit-chart{suffix}"),
            ";;".join(filters),
            selected,
        )
        if not name:
            return
        size = filters.get(chosen, IMAGE_SIZES[0])
        path = Path(name)
        if path.suffix.lower() not in (".png", ".svg"):
            path = path.with_suffix(".png" if size else ".svg")
        if path.suffix.lower() == ".svg":
            size = None
        self._chart_export_choice = size.label if size else "svg"
        done = f"Exported {path.name}"
        scale, width = 1, None
        if size is not None:
            scale, width = size.scale, size.width
            px = image_pixels(self.chart, size)
            done += f" ({px.width()} x {px.height()} px)"
        self._guarded(lambda: self.export_chart(path, scale, width=width), done)

    @Slot()
    def export_data_dialog(self) -> None:
        name, chosen = QFileDialog.getSaveFileName(
            self,
            "Export data",
            str(Path(self._last_dir()) / "memfit-breakdown.csv"),
            ";;".join(DATA_FILTERS),
        )
        if not name:
            return
        path = Path(name)
        if path.suffix.lower() not in (".csv", ".json", ".md"):
            path = path.with_suffix("." + DATA_FILTERS.get(chosen, "csv"))
        self._guarded(lambda: self.export_data(path), f"Exported {path.name}")

    def _guarded(self, work: Callable[[], object], done: str) -> None:
        try:
            work()
        except (OSError, ValueError) as exc:
            message_box(self, QMessageBox.Icon.Warning, f"Export failed:\n{exc}")
            return
        self.statusBar().showMessage(done, 3000)

    @Slot()
    def copy_chart(self) -> None:
        """Ctrl+Shift+C: the chart under its caption, as the PNG export draws it."""
        QGuiApplication.clipboard().setImage(captioned_image(self.chart))
        self.statusBar().showMessage("Chart copied to the clipboard", 3000)

    @Slot()
    def copy_summary(self) -> None:
        """Ctrl+Shift+M: the scenario, verdict, totals, breakdown and the shown what-ifs
        as Markdown (:func:`memfit.engine.report.to_markdown`), for an issue or a chat."""
        est = self.store.estimate
        if est is None:
            self.statusBar().showMessage("No summary: the scenario has no valid estimate", 5000)
            return
        QGuiApplication.clipboard().setText(
            to_markdown(est, whatifs=self.shown_whatifs(), baseline=self.baseline)
        )
        self.statusBar().showMessage("Summary copied to the clipboard as Markdown", 3000)

    # -- view ----------------------------------------------------------------------------
    @Slot()
    def in_user_words(self, message: str | EstimateError) -> str:
        """The engine's ``message`` in the panels' words (:func:`memfit.gui.forms.in_user_words`):
        ``training.lora.rank: ...`` reads ``LoRA rank: ...``."""
        return in_user_words(message)

    def find_model(self) -> None:
        """Ctrl+F: the preset search, focused and selected."""
        self.views.setCurrentIndex(0)
        self.column_scroll.ensureWidgetVisible(self.model_panel.search)
        self.model_panel.search.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.model_panel.search.selectAll()

    def apply_shown_whatif(self) -> None:
        """Ctrl+Return: the first checked what-if's ghost becomes the current scenario."""
        checked = self.whatif.checked()
        if not checked:
            self.statusBar().showMessage("No what-if is shown: tick one first", 5000)
            return
        self.whatif.apply(checked[0])

    def compare_all(self) -> None:
        for button in self.whatif.buttons.values():
            if button.isEnabled():
                button.setChecked(True)

    @Slot()
    def clear_whatifs(self) -> None:
        for button in self.whatif.buttons.values():
            button.setChecked(False)

    def set_theme(self, key: str, save: bool = True) -> None:
        self._theme = key
        for name, act in self.theme_acts.items():
            act.setChecked(name == key)
        app = QApplication.instance()
        if isinstance(app, QApplication):
            apply_theme(app, key)
        if self._shown_once:  # before the first show, showEvent polishes them
            repolish_window(self)
        if save:
            self._put_setting("view/theme", key)

    @Slot(Qt.ColorScheme)
    def on_system_scheme(self, _scheme: Qt.ColorScheme) -> None:
        """The desktop switched light/dark: follow it unless a scheme was chosen."""
        if self._theme == "system":
            self.set_theme("system", save=False)

    @Slot()
    def about(self) -> None:
        from memfit.engine.cli import version

        QMessageBox.about(
            self,
            f"About {APP_NAME}",
            f"<h3>{APP_NAME} {version()}</h3>"
            "<p>How much GPU memory will this training run take, where does it go, and "
            "which change makes it fit?</p><p>Sizes in GiB (2<sup>30</sup> bytes).</p>",
        )

    # -- recovery ------------------------------------------------------------------------
    @Slot()
    def schedule_autosave(self, *_: object) -> None:
        """The first change of a burst is written to the recovery file at once (a kill
        right after it loses nothing); the others a moment after the last one."""
        if self._autosave_timer.isActive():
            self._autosave_pending = True
        else:
            self.write_autosave()
        self._autosave_timer.start(AUTOSAVE_DELAY_MS)

    @Slot()
    def _autosave_due(self) -> None:
        if self._autosave_pending:
            self.write_autosave()

    @Slot()
    def write_autosave(self) -> bool:
        """Write the recovery file: the working scenario, its path and modified state.
        ``False`` (and a notice, once) when it cannot be written."""
        self._autosave_pending = False
        store = self.store
        text = autosave_text(store.scenario, store.path, store.modified)
        try:
            self.recovery.write(text)
        except OSError as exc:
            if not self._autosave_failed:
                self._autosave_failed = True
                self.notify(
                    f"could not write the recovery file ({exc}); unsaved changes will not "
                    "survive a crash"
                )
            return False
        return True

    # -- closing -------------------------------------------------------------------------
    def showEvent(self, event: QShowEvent) -> None:
        """The first show takes the palette a theme set before it (a start in dark)."""
        super().showEvent(event)
        if not self._shown_once:
            self._shown_once = True
            repolish_window(self)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self.step_readout.setVisible(self.height() >= STEP_LINE_HEIGHT)

    def closeEvent(self, event: QCloseEvent) -> None:
        choice = self.ask_to_save()
        if choice == CANCELLED:
            event.ignore()
            return
        self._autosave_timer.stop()
        self.write_settings()
        # the document is saved or its changes discarded: nothing left to recover
        self.recovery.remove()
        for file, _session in self.unsaved_sessions:
            file.release()  # still unsaved: the next start offers them again
        self.tradeoffs.shutdown()
        self.importer.shutdown()
        event.accept()

"""MemFit's main window, built in named steps (actions, menus, tool bar, status bar, settings).

Layout: the left column holds the Model, Hardware, Training and Parallelism panels in a
scroll area; the right side holds the what-if toggles, the breakdown chart and the item
table. All of them read from and write to one :class:`~gui.store.ScenarioStore`.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings, QStandardPaths, Qt, Slot
from PySide6.QtGui import QAction, QCloseEvent, QGuiApplication, QIcon, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QFileDialog,
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
    QToolBar,
    QVBoxLayout,
    QWidget,
)

from engine.errors import EstimateError
from engine.estimate import GIB, Estimate
from engine.presets import resources_dir
from engine.report import to_csv, to_json, to_markdown
from engine.files import write_text
from engine.scenario_io import load_scenario, save_scenario
from engine.specs import Scenario
from gui.chart import BreakdownChart, Ghost
from gui.chart_export import chart_image, export_png, export_svg
from gui.panels import HardwarePanel, ModelPanel, ParallelismPanel, TrainingPanel
from gui.store import ScenarioStore, default_scenario
from gui.theme import apply_theme
from gui.whatif_bar import WhatIfBar

APP_NAME = "MemFit"
MAX_RECENT = 8
SCENARIO_FILTER = "MemFit scenario (*.memfit.json);;JSON (*.json)"
CHART_FILTERS = {"PNG image (*.png)": ("png", 1), "PNG image, 2x (*.png)": ("png", 2),
                 "SVG drawing (*.svg)": ("svg", 1)}  # fmt: skip
DATA_FILTERS = {"CSV (*.csv)": "csv", "JSON (*.json)": "json", "Markdown table (*.md)": "md"}


def app_icon() -> QIcon:
    return QIcon(str(resources_dir() / "icons" / "memfit.svg"))


def autosave_location() -> Path:
    base = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation)
    return Path(base or Path.home() / ".memfit") / "last.memfit.json"


class MainWindow(QMainWindow):
    def __init__(
        self,
        settings: QSettings | None = None,
        autosave: Path | None = None,
        scenario: Scenario | None = None,
    ) -> None:
        super().__init__()
        self.settings = settings or QSettings()
        self.autosave_path = autosave or autosave_location()
        self.store = ScenarioStore(scenario or self._restore_scenario(), self)
        self._ghosts: list[Ghost] = []
        self._theme = "system"
        self.setWindowIcon(app_icon())
        self.setMinimumSize(960, 600)
        self.create_widgets()
        self.create_actions()
        self.create_menus()
        self.create_tool_bars()
        self.create_status_bar()
        self.connect_store()
        self.read_settings()
        self.on_estimate(self.store.estimate)
        self.update_title()

    # -- construction --------------------------------------------------------------------
    def create_widgets(self) -> None:
        self.model_panel = ModelPanel(self.store)
        self.hardware_panel = HardwarePanel(self.store)
        self.training_panel = TrainingPanel(self.store)
        self.parallelism_panel = ParallelismPanel(self.store)
        column = QWidget()
        col = QVBoxLayout(column)
        col.setContentsMargins(6, 6, 6, 6)
        panels = (self.model_panel, self.hardware_panel, self.training_panel)
        for panel in (*panels, self.parallelism_panel):
            col.addWidget(panel)
        col.addStretch(1)
        self.scroll = QScrollArea()
        self.scroll.setWidget(column)
        self.scroll.setWidgetResizable(True)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll.setMinimumWidth(340)

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
        self.error_label = QLabel()
        self.error_label.setObjectName("scenarioError")
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #d1242f;")
        self.error_label.hide()

        right = QSplitter(Qt.Orientation.Vertical)
        top = QWidget()
        top_layout = QVBoxLayout(top)
        top_layout.setContentsMargins(6, 6, 6, 0)
        top_layout.addWidget(self.whatif)
        top_layout.addWidget(self.error_label)
        top_layout.addWidget(self.chart, 1)
        right.addWidget(top)
        right.addWidget(self.table)
        right.setStretchFactor(0, 4)
        right.setStretchFactor(1, 1)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(self.scroll)
        self.splitter.addWidget(right)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([380, 900])
        self.setCentralWidget(self.splitter)

    def _action(
        self,
        text: str,
        slot: object,
        shortcut: QKeySequence | str | None = None,
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
            "&Open...", self.open_dialog, keys.Open, "Open a scenario file", sp.SP_DialogOpenButton
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
            "Copy the chart to the clipboard as an image",
        )
        self.quit_act = self._action("&Quit", self.close, keys.Quit, "Quit MemFit")
        self.undo_act = self.store.undo_stack.createUndoAction(self, "&Undo")
        self.undo_act.setShortcut(QKeySequence(keys.Undo))
        self.undo_act.setIcon(self.style().standardIcon(sp.SP_ArrowBack))
        self.redo_act = self.store.undo_stack.createRedoAction(self, "&Redo")
        self.redo_act.setShortcuts([QKeySequence("Ctrl+Shift+Z"), QKeySequence(keys.Redo)])
        self.redo_act.setIcon(self.style().standardIcon(sp.SP_ArrowForward))
        self.compare_all_act = self._action(
            "Compare &All What-ifs",
            self.compare_all,
            "Ctrl+W",
            "Show a ghost bar for every what-if at once",
        )
        self.clear_whatifs_act = self._action(
            "C&lear What-ifs", self.clear_whatifs, None, "Hide all ghost bars"
        )
        self.table_act = QAction("Breakdown &Table", self, checkable=True, checked=True)
        self.table_act.setStatusTip("Show the table of every memory item")
        self.table_act.toggled.connect(self.table.setVisible)
        self.theme_acts: dict[str, QAction] = {}
        for key, text in (("system", "&System Colours"), ("light", "&Light"), ("dark", "&Dark")):
            act = QAction(text, self, checkable=True)
            act.setStatusTip(f"Use the {key} colour scheme")
            act.triggered.connect(lambda _c=False, k=key: self.set_theme(k))
            self.theme_acts[key] = act
        self.about_act = self._action("&About MemFit", self.about, None, "About MemFit")

    def create_menus(self) -> None:
        bar = self.menuBar()
        self.file_menu = file_menu = bar.addMenu("&File")
        file_menu.addActions([self.new_act, self.open_act])
        self.recent_menu = QMenu("Open &Recent", self)
        file_menu.addMenu(self.recent_menu)
        file_menu.addActions([self.save_act, self.save_as_act])
        file_menu.addSeparator()
        file_menu.addActions([self.export_chart_act, self.export_data_act, self.copy_chart_act])
        file_menu.addSeparator()
        file_menu.addAction(self.quit_act)
        edit_menu = bar.addMenu("&Edit")
        edit_menu.addActions([self.undo_act, self.redo_act])
        view_menu = bar.addMenu("&View")
        view_menu.addActions([self.compare_all_act, self.clear_whatifs_act, self.table_act])
        theme_menu = view_menu.addMenu("&Colours")
        theme_menu.addActions(list(self.theme_acts.values()))
        help_menu = bar.addMenu("&Help")
        help_menu.addAction(self.about_act)

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
        self.statusBar().addPermanentWidget(self.summary)
        self.statusBar().showMessage("Ready", 2000)

    def connect_store(self) -> None:
        self.store.estimateChanged.connect(self.on_estimate)
        self.store.errorChanged.connect(self.on_error)
        self.store.modifiedChanged.connect(self.update_title)
        self.store.pathChanged.connect(self.update_title)
        self.whatif.ghostsChanged.connect(self.on_ghosts)
        self.chart.ghostActivated.connect(self.whatif.apply)
        QGuiApplication.styleHints().colorSchemeChanged.connect(self.on_system_scheme)

    # -- settings ------------------------------------------------------------------------
    def read_settings(self) -> None:
        geometry = self.settings.value("window/geometry", QByteArray())
        if isinstance(geometry, QByteArray) and not geometry.isEmpty():
            self.restoreGeometry(geometry)
        else:
            self.resize(1280, 800)
        state = self.settings.value("window/splitter", QByteArray())
        if isinstance(state, QByteArray) and not state.isEmpty():
            self.splitter.restoreState(state)
        self.table_act.setChecked(self.settings.value("view/table", True, type=bool))
        theme = str(self.settings.value("view/theme", "system"))
        self.set_theme(theme if theme in self.theme_acts else "system", save=False)
        self.update_recent_menu()

    def write_settings(self) -> None:
        self.settings.setValue("window/geometry", self.saveGeometry())
        self.settings.setValue("window/splitter", self.splitter.saveState())
        self.settings.setValue("view/table", self.table_act.isChecked())
        path = self.store.path
        self.settings.setValue("document/path", str(path) if path else "")
        self.settings.sync()

    def _restore_scenario(self) -> Scenario:
        """The scenario of the last session (autosaved on close), else the default."""
        try:
            return load_scenario(self.autosave_path)
        except (EstimateError, OSError):
            return default_scenario()

    def recent_files(self) -> list[str]:
        value = self.settings.value("document/recent", [])
        if isinstance(value, str):
            value = [value]
        return [str(v) for v in value or []]

    def add_recent(self, path: Path) -> None:
        files = [str(path)] + [f for f in self.recent_files() if f != str(path)]
        self.settings.setValue("document/recent", files[:MAX_RECENT])
        self.update_recent_menu()

    def update_recent_menu(self) -> None:
        self.recent_menu.clear()
        files = self.recent_files()
        for i, name in enumerate(files, 1):
            act = self.recent_menu.addAction(f"&{i} {Path(name).name}")
            act.setStatusTip(name)
            act.triggered.connect(lambda _c=False, n=name: self.open_path(Path(n)))
        self.recent_menu.setEnabled(bool(files))

    # -- reacting to the store -----------------------------------------------------------
    @Slot(object)
    def on_estimate(self, est: Estimate) -> None:
        # the what-if bar, which hears the store first, has already redrawn the chart with
        # the new ghosts; this call is then a no-op
        self.chart.set_estimates(est, self._ghosts)
        self.fill_table(est)
        summary = (
            f"{est.device_bytes / GIB:,.2f} of {est.capacity_bytes / GIB:,.2f} GiB per GPU"
            f" · {est.verdict}"
        )
        if est.host_node_bytes:
            summary += f" · host RAM {est.host_node_bytes / GIB:,.1f} GiB per node"
            if est.host_capacity_bytes is not None:
                summary += f" of {est.host_capacity_bytes / GIB:,.1f} · {est.host_verdict}"
        self.summary.setText(summary)

    @Slot(list)
    def on_ghosts(self, ghosts: list[Ghost]) -> None:
        self._ghosts = ghosts
        self.chart.set_estimates(self.store.estimate, ghosts)

    @Slot(str)
    def on_error(self, message: str) -> None:
        self.error_label.setText(
            f"{message}\nThe chart shows the last valid scenario." if message else ""
        )
        self.error_label.setVisible(bool(message))

    def fill_table(self, est: Estimate) -> None:
        """One row per item; cells are reused, only their texts change."""
        self.table.setRowCount(len(est.items))
        right = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
        for row, item in enumerate(est.items):
            texts = (item.name, item.category, f"{item.bytes / GIB:,.3f}", item.formula)
            for col, text in enumerate(texts):
                cell = self.table.item(row, col)
                if cell is None:
                    cell = QTableWidgetItem()
                    if col == 2:
                        cell.setTextAlignment(right)
                    self.table.setItem(row, col, cell)
                if cell.text() != text:
                    cell.setText(text)
                if cell.toolTip() != item.source:
                    cell.setToolTip(item.source)

    @Slot()
    def update_title(self, *_: object) -> None:
        path = self.store.path
        name = path.name if path else "Untitled"
        self.setWindowTitle(f"{name}[*] — {APP_NAME}")
        self.setWindowModified(self.store.modified)

    # -- documents -----------------------------------------------------------------------
    def maybe_save(self) -> bool:
        """``True`` when it is fine to replace the current document."""
        if not self.store.modified:
            return True
        answer = QMessageBox.warning(
            self,
            APP_NAME,
            "The scenario has unsaved changes. Save them?",
            QMessageBox.StandardButton.Save
            | QMessageBox.StandardButton.Discard
            | QMessageBox.StandardButton.Cancel,
        )
        if answer == QMessageBox.StandardButton.Save:
            return self.save()
        return answer == QMessageBox.StandardButton.Discard

    @Slot()
    def new_scenario(self) -> None:
        if self.maybe_save():
            self.store.reset(default_scenario())
            self.statusBar().showMessage("New scenario", 3000)

    @Slot()
    def open_dialog(self) -> None:
        if not self.maybe_save():
            return
        name, _ = QFileDialog.getOpenFileName(
            self, "Open scenario", self._last_dir(), SCENARIO_FILTER
        )
        if name:
            self.open_path(Path(name))

    def open_path(self, path: Path) -> bool:
        """Open a scenario file; a malformed one shows a message naming the problem."""
        try:
            scenario = load_scenario(path)
        except EstimateError as exc:
            QMessageBox.warning(self, APP_NAME, f"Could not open {path.name}:\n{exc}")
            return False
        self.store.reset(scenario, path)
        self.add_recent(path)
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
            QMessageBox.warning(self, APP_NAME, f"Could not save {path.name}:\n{exc}")
            return False
        self.store.mark_saved(path)
        self.add_recent(path)
        self.statusBar().showMessage(f"Saved {path.name}", 3000)
        return True

    def _last_dir(self) -> str:
        path = self.store.path
        return str(path.parent) if path else str(Path.home())

    # -- export --------------------------------------------------------------------------
    def export_chart(self, path: Path, scale: int = 1) -> None:
        """Write the chart to ``path``: SVG by extension, else PNG at ``scale``."""
        if path.suffix.lower() == ".svg":
            export_svg(self.chart, path)
        else:
            export_png(self.chart, path, scale)

    def export_data(self, path: Path) -> None:
        """Write the breakdown to ``path`` as CSV, JSON or Markdown, by extension."""
        writers = {".csv": to_csv, ".json": to_json, ".md": to_markdown}
        writer = writers.get(path.suffix.lower())
        if writer is None:
            raise ValueError(f"unknown data format {path.suffix!r}; use .csv, .json or .md")
        write_text(path, writer(self.store.estimate))

    @Slot()
    def export_chart_dialog(self) -> None:
        name, chosen = QFileDialog.getSaveFileName(
            self,
            "Export chart",
            str(Path(self._last_dir()) / "memfit-chart.png"),
            ";;".join(CHART_FILTERS),
        )
        if not name:
            return
        kind, scale = CHART_FILTERS.get(chosen, ("png", 1))
        path = Path(name)
        if path.suffix.lower() not in (".png", ".svg"):
            path = path.with_suffix("." + kind)
        self._guarded(lambda: self.export_chart(path, scale), f"Exported {path.name}")

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

    def _guarded(self, work: object, done: str) -> None:
        try:
            work()  # type: ignore[operator]
        except (OSError, ValueError) as exc:
            QMessageBox.warning(self, APP_NAME, f"Export failed:\n{exc}")
            return
        self.statusBar().showMessage(done, 3000)

    @Slot()
    def copy_chart(self) -> None:
        QGuiApplication.clipboard().setImage(chart_image(self.chart))
        self.statusBar().showMessage("Chart copied to the clipboard", 3000)

    # -- view ----------------------------------------------------------------------------
    @Slot()
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
        if save:
            self.settings.setValue("view/theme", key)

    @Slot(Qt.ColorScheme)
    def on_system_scheme(self, _scheme: Qt.ColorScheme) -> None:
        """The desktop switched light/dark: follow it unless a scheme was chosen."""
        if self._theme == "system":
            self.set_theme("system", save=False)

    @Slot()
    def about(self) -> None:
        from gui.app import version

        QMessageBox.about(
            self,
            f"About {APP_NAME}",
            f"<h3>{APP_NAME} {version()}</h3>"
            "<p>How much GPU memory will this training run take, where does it go, and "
            "which change makes it fit?</p><p>Sizes in GiB (2<sup>30</sup> bytes).</p>",
        )

    # -- closing -------------------------------------------------------------------------
    def closeEvent(self, event: QCloseEvent) -> None:
        self.write_settings()
        try:  # the working scenario reopens on the next start, saved or not
            self.autosave_path.parent.mkdir(parents=True, exist_ok=True)
            save_scenario(self.store.scenario, self.autosave_path)
        except OSError:
            pass
        event.accept()

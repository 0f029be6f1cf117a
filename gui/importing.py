"""Bringing the user's own run into the app: File > Import, drag and drop, paste, the
model browser over the local Hugging Face cache.

Everything is read by :mod:`memfit.engine.imports` (the CLI reads the same way); this module only
asks for the file, folder, text or cached model, applies the result to the store -- a
scenario file opens as a document, anything else is one undoable edit -- and says what the
import assumed and what MemFit cannot model.

A model folder or a cached model is read off the GUI thread (:mod:`memfit.gui.background`): its
safetensors headers can take seconds. A window-modal progress dialog shows the header
bytes read and has a Cancel that stops the reading at its next poll, leaving the
scenario as it was. Imports asked for meanwhile (several dropped files) wait their turn,
so they still apply in order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QSortFilterProxyModel, Qt, Slot
from PySide6.QtGui import QGuiApplication, QKeySequence, QStandardItem, QStandardItemModel
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHeaderView,
    QInputDialog,
    QLabel,
    QLineEdit,
    QMessageBox,
    QProgressDialog,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from memfit.engine.checkpoint import Cancelled, Progress, ReadCancelled
from memfit.engine.errors import EstimateError
from memfit.engine.files import read_bytes
from memfit.engine.hf_config import supported_families
from memfit.engine.imports import (
    Imported,
    asks_for_read_as,
    import_cached,
    import_path,
    import_text,
)
from memfit.engine.specs import Scenario
from memfit.gui.background import Channel, KeepGoing

if TYPE_CHECKING:
    from memfit.engine.hub_cache import CachedModel
    from memfit.gui.main_window import MainWindow

IMPORT_FILTER = (
    "Model and training configurations (*.json *.yaml *.yml);;"
    "Hugging Face config.json (config.json);;All files (*)"
)


def is_scenario_file(path: Path) -> bool:
    """Whether ``path`` names a MemFit scenario (by name: ``*.memfit.json``, or a JSON file
    whose first bytes hold the ``memfit_scenario`` key)."""
    if path.name.endswith(".memfit.json"):
        return True
    if path.suffix.lower() != ".json":
        return False
    try:  # read as every file is: a FIFO or a device is refused without blocking
        return b'"memfit_scenario"' in read_bytes(path, "import")[:4096]
    except EstimateError:
        return False


#: a background read: the base scenario, the look-alike family (or None), progress and
#: cancel as :func:`memfit.engine.checkpoint.read_checkpoint` takes them
Read = Callable[[Scenario, str | None, Progress, Cancelled], Imported]


@dataclass(frozen=True)
class FolderImport:
    """A model folder or a cached model to read in the background."""

    read: Read
    name: str
    #: the folder, for the recent list (None for a cached model)
    path: Path | None = None


def read_in_background(
    read: Read, base: Scenario, read_as: str | None, keep_going: KeepGoing
) -> Imported | EstimateError | OSError | None:
    """``read`` run on a worker thread: the import, the error to show on the GUI thread
    (where a look-alike family can be asked for), or ``None`` once cancelled."""
    latest = [0, 0]

    def progress(done: int, total: int) -> None:
        latest[:] = [done, total]
        keep_going(done, total)

    def cancelled() -> bool:
        return not keep_going(*latest)

    try:
        return read(base, read_as, progress, cancelled)
    except ReadCancelled:
        return None
    except (EstimateError, OSError) as exc:
        return exc


def human_bytes(n: int) -> str:
    """``n`` bytes in GiB (2^30) or MiB (2^20), as the app shows sizes."""
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    return f"{n / (1 << 20):.1f} MiB"


class Importer(QObject):
    """The import actions of a main window and how their results reach its store."""

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.window = window
        w = window
        self.import_act = w._action(
            "&Import...",
            self.import_dialog,
            "Ctrl+I",
            "Import a config.json, a training configuration or a scenario",
        )
        self.import_folder_act = w._action(
            "Import Model &Folder...",
            self.import_folder_dialog,
            "Ctrl+Shift+I",
            "Import a folder with a model's config.json and safetensors checkpoint",
        )
        self.browse_act = w._action(
            "&Browse Local Models...",
            self.browse_dialog,
            "Ctrl+Shift+B",
            "Choose a model from the local Hugging Face cache",
        )
        self.paste_act = w._action(
            "&Paste Configuration",
            self.paste,
            QKeySequence("Ctrl+Shift+V"),
            "Read a scenario, a config.json or a training configuration from the clipboard",
        )
        #: reads model folders and cached models off the GUI thread, one at a time
        self.reader = Channel(self)
        self.reader.progressed.connect(self._on_progress)
        self.reader.finished.connect(self._on_read)
        self.reader.failed.connect(self._on_failed)
        #: the progress dialog of the background read, while one runs
        self.progress: QProgressDialog | None = None
        self._current: FolderImport | None = None
        #: imports asked for while a background read runs, in order
        self._waiting: deque[Callable[[], object]] = deque()

    @property
    def actions(self) -> list:  # type: ignore[type-arg]
        return [self.import_act, self.import_folder_act, self.browse_act]

    # -- asking -----------------------------------------------------------------------
    def import_dialog(self) -> None:
        name, _ = QFileDialog.getOpenFileName(
            self.window, "Import", self.window._last_dir(), IMPORT_FILTER
        )
        if name:
            self.import_path(Path(name))

    def import_folder_dialog(self) -> None:
        name = QFileDialog.getExistingDirectory(
            self.window, "Import model folder", self.window._last_dir()
        )
        if name:
            self.import_path(Path(name))

    def browse_dialog(self) -> None:
        dialog = ModelBrowser(self.window)
        if dialog.exec() == QDialog.DialogCode.Accepted and dialog.chosen:
            repo, revision = dialog.chosen
            self.start(
                FolderImport(
                    lambda base, r, progress, cancelled: import_cached(
                        repo, base, revision, r, progress=progress, cancelled=cancelled
                    ),
                    repo,
                )
            )

    def paste(self) -> None:
        self.import_pasted(QGuiApplication.clipboard().text(), "the clipboard")

    def import_pasted(self, text: str, name: str) -> bool:
        if self.busy:
            self._waiting.append(lambda: self.import_pasted(text, name))
            return True
        return self.run(lambda r: import_text(text, self.window.store.scenario, name, r), name)

    # -- doing ------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """A model folder or a cached model is being read in the background."""
        return self.reader.busy

    def import_path(self, path: Path) -> bool:
        """Import the file or folder ``path``: a file at once (``True`` if it applied), a
        folder in the background (``True``: started; it applies when read). While a
        folder is read, the import waits its turn."""
        if self.busy:
            self._waiting.append(lambda: self.import_path(path))
            return True
        if path.is_dir():
            self.start(
                FolderImport(
                    lambda base, r, progress, cancelled: import_path(
                        path, base, r, progress=progress, cancelled=cancelled
                    ),
                    path.name,
                    path,
                )
            )
            return True
        return self.run(lambda r: import_path(path, self.window.store.scenario, r), path.name, path)

    def import_paths(self, paths: Sequence[Path]) -> bool:
        """Several dropped files, in order; each one is its own step."""
        done = False
        for path in paths:
            done = self.import_path(path) or done
        return done

    def run(
        self, read: Callable[[str | None], Imported], name: str, path: Path | None = None
    ) -> bool:
        """Read an import and apply it; a problem is shown and changes nothing. A config
        of a family MemFit does not read is offered to be read as a look-alike, which the
        estimate then reports."""
        try:
            try:
                imported = read(None)
            except EstimateError as exc:
                if not asks_for_read_as(exc):
                    raise
                family = self.ask_read_as(name, str(exc))
                if family is None:
                    return False
                imported = read(family)
        except (EstimateError, OSError) as exc:
            from memfit.gui.main_window import message_box

            message_box(self.window, QMessageBox.Icon.Warning, f"Could not import {name}:\n{exc}")
            return False
        return self.apply(imported, path)

    def start(self, job: FolderImport, read_as: str | None = None) -> None:
        """Read ``job`` in the background on the current scenario, with a progress
        dialog; it applies as :meth:`run` applies an import when it is read."""
        self._current = job
        base = self.window.store.scenario
        self._show_progress(job.name)
        self.reader.start(lambda keep: read_in_background(job.read, base, read_as, keep))

    def cancel(self) -> None:
        """Stop the background read; the scenario stays as it was."""
        if self.busy:
            self.reader.cancel()

    def shutdown(self) -> None:
        """Stop the background read and wait for it (the window is closing)."""
        self._waiting.clear()
        self.reader.shutdown()
        self._close_progress()

    def _show_progress(self, name: str) -> None:
        self._close_progress()
        dialog = QProgressDialog(self.window)
        label = QLabel(f"Reading the checkpoint headers of {name}")
        label.setTextFormat(Qt.TextFormat.PlainText)  # a folder's name is no markup
        dialog.setLabel(label)
        dialog.setCancelButtonText("Cancel")
        dialog.setWindowTitle("Importing")
        dialog.setWindowModality(Qt.WindowModality.WindowModal)  # no edits meanwhile
        dialog.setAutoClose(False)
        dialog.setAutoReset(False)
        dialog.setRange(0, 0)  # busy until the total is known
        dialog.canceled.connect(self.cancel)
        dialog.show()  # at once: the window takes no edits while the import reads
        self.progress = dialog

    def _close_progress(self) -> None:
        if self.progress is not None:
            self.progress.canceled.disconnect(self.cancel)
            self.progress.reset()
            self.progress.hide()
            self.progress.deleteLater()
            self.progress = None

    @Slot(int, int)
    def _on_progress(self, done: int, total: int) -> None:
        if self.progress is not None and total > 0:
            self.progress.setRange(0, total)
            self.progress.setValue(done)

    @Slot(object, bool)
    def _on_read(self, result: object, complete: bool) -> None:
        job, self._current = self._current, None
        self._close_progress()
        if job is None:
            return
        if result is None or not complete:
            self.window.statusBar().showMessage(f"Import of {job.name} cancelled", 5000)
        elif isinstance(result, EstimateError) and asks_for_read_as(result):
            family = self.ask_read_as(job.name, str(result))
            if family is not None:
                self.start(job, family)
                return
        elif isinstance(result, EstimateError | OSError):
            self._could_not(job.name, str(result))
        elif isinstance(result, Imported):
            self.apply(result, job.path)
        self._next()

    @Slot(str)
    def _on_failed(self, message: str) -> None:
        job, self._current = self._current, None
        self._close_progress()
        self._could_not(job.name if job is not None else "the folder", message)
        self._next()

    def _could_not(self, name: str, problem: str) -> None:
        from memfit.gui.main_window import message_box

        message_box(self.window, QMessageBox.Icon.Warning, f"Could not import {name}:\n{problem}")

    def _next(self) -> None:
        """The imports that waited for the background read, in order, until one of them
        starts another."""
        while self._waiting and not self.busy:
            self._waiting.popleft()()

    def ask_read_as(self, name: str, problem: str) -> str | None:
        """The family to read an unknown config as, chosen by the user (None: cancel).
        The prompt names the file and quotes the config's ``model_type``: plain text."""
        dialog = QInputDialog(self.window)
        dialog.setWindowTitle("Read as a look-alike?")
        dialog.setLabelText(
            f"{problem}\n\nRead {name} as the family it is built like (the estimate will "
            "say so), or cancel:"
        )
        for label in dialog.findChildren(QLabel):
            label.setTextFormat(Qt.TextFormat.PlainText)
        dialog.setComboBoxItems(list(supported_families()))
        dialog.setComboBoxEditable(False)
        dialog.setTextValue("llama")
        if dialog.exec() != QDialog.DialogCode.Accepted:
            return None
        return dialog.textValue() or None

    def apply(self, imported: Imported, path: Path | None = None) -> bool:
        w = self.window
        if imported.kind == "scenario":
            if not w.maybe_save():
                return False
            w.store.reset(imported.scenario, path)
        elif not w.store.edit(imported.scenario, f"Import {imported.label} {_name(imported)}"):
            w.statusBar().showMessage(f"{_name(imported)}: nothing to change", 5000)
        if path is not None:
            w.add_recent(path)
        w.notify(f"Imported {imported.label} {_name(imported)}")
        for message in imported.messages:
            w.notice.add(message)
        return True


def _name(imported: Imported) -> str:
    return Path(imported.source).name or imported.source


class ModelBrowser(QDialog):
    """The models of the local Hugging Face cache: name, revision, size on disk; a filter
    and one click (or Enter) to import."""

    def __init__(self, parent: QWidget | None = None, root: Path | None = None) -> None:
        super().__init__(parent)
        from memfit.engine.hub_cache import cache_root, scan_cache

        self.setWindowTitle("Local models")
        self.chosen: tuple[str, str | None] | None = None
        where = root or cache_root()
        try:
            found = scan_cache(root)
            problem = ""
        except (EstimateError, OSError) as exc:
            found, problem = [], str(exc)
        self.items = QStandardItemModel(0, 3, self)
        self.items.setHorizontalHeaderLabels(["Model", "Revision", "Size on disk"])
        for model in found:
            for revision, refs in _revisions(model):
                row = [
                    QStandardItem(model.repo_id),
                    QStandardItem(", ".join(refs) or revision[:12]),
                    QStandardItem(human_bytes(model.size_on_disk)),
                ]
                row[0].setData((model.repo_id, revision), Qt.ItemDataRole.UserRole)
                self.items.appendRow(row)
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.items)
        self.proxy.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        self.proxy.setFilterKeyColumn(0)
        self.search = QLineEdit(placeholderText="Filter (e.g. llama)")
        self.search.textChanged.connect(self.proxy.setFilterFixedString)
        self.view = QTableView()
        self.view.setModel(self.proxy)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.view.verticalHeader().hide()
        self.view.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.view.doubleClicked.connect(self.accept)
        self.view.setSortingEnabled(True)
        if self.items.rowCount():
            self.view.selectRow(0)
        text = f"{self.items.rowCount()} models in {where}"
        if problem:
            text = f"The cache could not be read: {problem}"
        elif not self.items.rowCount():
            text = f"No models in {where} (set HF_HOME or HF_HUB_CACHE to another cache)"
        self.where = QLabel(text)
        self.where.setWordWrap(True)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Import")
        buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(bool(self.items.rowCount()))
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.where)
        layout.addWidget(self.search)
        layout.addWidget(self.view, 1)
        layout.addWidget(buttons)
        self.resize(640, 420)

    def accept(self) -> None:
        rows = self.view.selectionModel().selectedRows()
        if not rows:
            return
        source = self.proxy.mapToSource(rows[0])
        self.chosen = self.items.item(source.row(), 0).data(Qt.ItemDataRole.UserRole)
        super().accept()


def _revisions(model: CachedModel) -> list[tuple[str, list[str]]]:
    """(commit, the ref names pointing at it) of each snapshot of a cached model, newest
    first."""
    return [(snap.commit, list(snap.refs)) for snap in model.revisions]

"""A form panel bound to the :class:`~memfit.gui.store.ScenarioStore`, without echo.

Each row binds one scenario field (its dotted path, e.g. ``training.micro_batch_size``) to
a widget: user edits build a new scenario and hand it to the store; store changes update
the widgets under :class:`QSignalBlocker`, so programmatic updates never re-enter.

Every row shows the scenario's value: a combo gets an item for a value it has no choice
for (a custom GPU, trainable parts from a file), a spin box widens its range and a
decimal box its decimals to hold the value. Two kinds of rejected input exist:

* the spec rejects the value itself (KV heads = 5 with 32 heads): nothing is stored, the
  widget keeps the user's value with the message in red under it -- a *pending* value,
  which Undo discards first (:meth:`FormPanel.discard_pending`);
* the scenario is stored but the estimate rejects it (tp = 3 on 8 GPUs): the message
  appears under the field it names, and the chart says its bars are out of date.

Each row's tooltip says in words what the field is and what it changes in memory
(:data:`memfit.gui.tooltips.TIPS`, unless the panel gives its own), then the accepted range of
a number box.

Rows can go into a folding section (:class:`Collapsible`, with :meth:`FormPanel.rows_in`);
a message shown under one of its rows unfolds it.

Messages are plain text: they carry file and model names.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from functools import cache
from typing import Any, ClassVar

from PySide6.QtCore import QEvent, QObject, QSignalBlocker, Qt, Signal, Slot
from PySide6.QtGui import QKeyEvent, QKeySequence, QValidator
from PySide6.QtWidgets import (
    QAbstractScrollArea,
    QApplication,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QSizePolicy,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from memfit.engine.errors import EstimateError
from memfit.engine.specs import Scenario
from memfit.gui.chart import rich_text
from memfit.gui.store import ScenarioStore
from memfit.gui.theme import error_color
from memfit.gui.tooltips import TIPS, with_range

Getter = Callable[[Scenario], Any]
Setter = Callable[[Scenario, Any], Scenario]


def training_field(name: str) -> tuple[Getter, Setter]:
    """Getter and setter of ``scenario.training.<name>``; ``name`` may be ``lora.rank``."""
    parts = name.split(".")

    def get(s: Scenario) -> Any:
        value: Any = s.training
        for p in parts:
            value = getattr(value, p)
        return value

    def set_(s: Scenario, value: Any) -> Scenario:
        if len(parts) == 1:
            training = dataclasses.replace(s.training, **{parts[0]: value})
        else:
            section = getattr(s.training, parts[0])
            training = dataclasses.replace(
                s.training, **{parts[0]: dataclasses.replace(section, **{parts[1]: value})}
            )
        return dataclasses.replace(s, training=training)

    return get, set_


def model_field(name: str) -> tuple[Getter, Setter]:
    def get(s: Scenario) -> Any:
        return getattr(s.model, name)

    def set_(s: Scenario, value: Any) -> Scenario:
        return dataclasses.replace(s, model=dataclasses.replace(s.model, **{name: value}))

    return get, set_


def hardware_field(name: str) -> tuple[Getter, Setter]:
    def get(s: Scenario) -> Any:
        return getattr(s.hardware, name)

    def set_(s: Scenario, value: Any) -> Scenario:
        return dataclasses.replace(s, hardware=dataclasses.replace(s.hardware, **{name: value}))

    return get, set_


def describe(value: Any) -> str:
    """The text of a combo item made for a value the combo has no choice for."""
    if isinstance(value, tuple | list):
        return ", ".join(str(v) for v in value) or "(none)"
    return str(value)


def decimals_of(value: float, at_least: int, at_most: int = 6) -> int:
    """The decimals that show ``value`` exactly (up to ``at_most``), and ``at_least``."""
    for decimals in range(at_least, at_most + 1):
        if abs(round(value, decimals) - value) < 10 ** -(at_most + 3):
            return decimals
    return at_most


#: the largest value a QSpinBox holds (a C int)
SPIN_MAX = 2**31 - 1


def number_text(value: float) -> str:
    """``65,536``, ``0.5``, ``10,000,000``: a bound of a range in a tooltip."""
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:g}"


def range_text(lo: float, hi: float, suffix: str = "") -> str:
    """``1 to 65,536``, ``10 to 100 %``: the accepted range of a number box."""
    return f"{number_text(lo)} to {number_text(hi)}{suffix}"


#: every field a panel shows, by its scenario path, in the words of its row's label
_LABELS: dict[str, str] = {}


def register_label(path: str, label: str) -> None:
    """Name the field ``path`` as its row does (:func:`in_user_words`)."""
    words = label.replace("&", "").rstrip(":").strip()
    if _LABELS.get(path) != words:
        _LABELS[path] = words
        _names.cache_clear()  # every window's panels register the same labels again


def _leaves() -> dict[str, str]:
    """The last part of each registered path that is an identifier no user types
    (``num_attention_heads``, ``gpus_per_node``), where only one row has it."""
    seen: dict[str, list[str]] = {}
    for path, label in _LABELS.items():
        leaf = path.rsplit(".", 1)[-1]
        if "_" in leaf:
            seen.setdefault(leaf, []).append(label)
    return {leaf: labels[0] for leaf, labels in seen.items() if len(set(labels)) == 1}


@cache
def _names() -> tuple[dict[str, str], re.Pattern[str] | None]:
    """Each name :func:`in_user_words` replaces, with its label, and the pattern that finds
    them (the longest first), built once per set of registered labels."""
    names = {**_leaves(), **_LABELS}
    if not names:
        return names, None
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return names, re.compile(r"(?<![\w.])(" + alternatives + r")(?![\w.])")


def in_user_words(message: str | EstimateError) -> str:
    """The engine's ``message`` in the words of the panels: the field it names
    (``training.lora.rank: ...``) and every field its text names (``num_attention_heads``,
    ``gpus_per_node``) as their rows' labels; a field no row shows keeps its name. An
    :class:`~memfit.engine.errors.EstimateError` gives its field as it is; a text is read as
    ``field: detail`` when it has that form."""
    if isinstance(message, EstimateError):
        field, rest = message.field, message.detail
    else:
        field, sep, rest = message.partition(": ")
        if not sep:
            field, rest = "", message
    names, pattern = _names()
    if pattern is not None:
        rest = pattern.sub(lambda m: names[m.group(1)], rest)
    if not field:
        return rest
    if field in _LABELS:
        return f"{_LABELS[field]}: {rest}"
    if any(path.startswith(field + ".") for path in _LABELS):  # a section of the scenario
        return f"{field.rsplit('.', 1)[-1].replace('_', ' ').capitalize()}: {rest}"
    return f"{field}: {rest}"


class ErrorLabel(QLabel):
    """The message under a field: plain text, wrapped, in an error red that keeps WCAG AA
    contrast on the light and the dark palette (it follows a theme switch)."""

    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("fieldError")
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setWordWrap(True)
        self._restyle()

    def _restyle(self) -> None:
        color = error_color(self.palette()).name()
        style = f"color: {color}; font-size: 11px;"
        if style != self.styleSheet():  # a style sheet changes the palette in turn
            self.setStyleSheet(style)

    def changeEvent(self, event: QEvent) -> None:
        if event.type() == QEvent.Type.PaletteChange:
            self._restyle()
        super().changeEvent(event)


def undo_keys() -> list[QKeySequence]:
    """The platform's Undo keys (Ctrl+Z)."""
    return list(QKeySequence.keyBindings(QKeySequence.StandardKey.Undo))


def redo_keys() -> list[QKeySequence]:
    """The platform's Redo keys, then Ctrl+Shift+Z and Ctrl+Y, each once: a key registered
    twice is an ambiguous shortcut, which Qt never fires (Linux's Redo is Ctrl+Shift+Z)."""
    out: list[QKeySequence] = []
    for key in (
        *QKeySequence.keyBindings(QKeySequence.StandardKey.Redo),
        QKeySequence("Ctrl+Shift+Z"),
        QKeySequence("Ctrl+Y"),
    ):
        if not key.isEmpty() and key not in out:
            out.append(key)
    return out


class FieldGuard(QObject):
    """What a form's field takes from the mouse wheel and the keyboard (an event filter).

    * The wheel changes a number or a choice only while the field has the keyboard focus
      (clicked or tabbed into): over any other field it scrolls the form, as the user meant.
      Qt's default let a form scrolled by the wheel change every field that passed under
      the pointer.
    * Undo and Redo keys are the window's even while the cursor is in a field: a field's
      own text undo would take them (Qt sends it the key first) and change nothing stored.
    """

    def __init__(self) -> None:
        super().__init__()
        #: the window's Undo and Redo keys, read once (the platform's bindings)
        self.keys = (*undo_keys(), *redo_keys())

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        kind = event.type()
        if kind == QEvent.Type.Wheel and isinstance(watched, QWidget) and not watched.hasFocus():
            # handed to the scroll area the field is in, which scrolls (Qt would not pass
            # on a synthesized wheel event, and a passed-on real one would come back here)
            area = watched.parentWidget()
            while area is not None and not isinstance(area, QAbstractScrollArea):
                area = area.parentWidget()
            if area is not None:
                QApplication.sendEvent(area.viewport(), event)
            event.accept()
            return True
        if kind == QEvent.Type.ShortcutOverride and isinstance(event, QKeyEvent):
            combo = QKeySequence(event.keyCombination())
            if combo in self.keys:
                event.ignore()  # not taken by the field: the window's action gets the key
                return True
        return False


_GUARD: FieldGuard | None = None


def guard_field(widget: QWidget) -> None:
    """Give ``widget`` (a number box, a choice or a line of text) :class:`FieldGuard`'s
    rules: focus from a click or Tab, never from the wheel."""
    global _GUARD
    if _GUARD is None:
        _GUARD = FieldGuard()
    widget.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
    widget.installEventFilter(_GUARD)


#: the suffixes a count takes (case-insensitive): thousand, million, billion, trillion
COUNT_SUFFIXES = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_COUNT = re.compile(r"(\d+\.?\d*|\.\d+)(e[+-]?\d+)?([kmbgt]?)")
#: what may still become a count as the user types it
_COUNT_PREFIX = re.compile(r"(\d*\.?\d*)(e[+-]?\d*)?([kmbgt]?)")


def parse_count(text: str) -> int | None:
    """A count as a user writes it: ``1000000000``, ``1,000,000,000``, ``1e9``, ``10B``,
    ``500M``, ``2.5T``, ``1.5e3k`` (optionally followed by ``tokens``); None if it is not one.

    >>> [parse_count(t) for t in ("1e9", "10B", "500 M tokens", "1,000,000", "2.5t", "x")]
    [1000000000, 10000000000, 500000000, 1000000, 2500000000000, None]
    """
    compact = re.sub(r"[\s,_]", "", text.lower()).removesuffix("tokens").removesuffix("token")
    match = _COUNT.fullmatch(compact)
    if not match:
        return None
    number, exponent, suffix = match.groups()
    value = Decimal(number + (exponent or "")) * COUNT_SUFFIXES.get(suffix, 1)
    return int(value.to_integral_value())


def count_text(value: int) -> str:
    """A count in the largest suffix it has at least one of, to 4 significant figures:
    ``10 B``, ``500 M``, ``1.234 T``, ``950``."""
    for suffix, unit in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if value >= unit:
            return f"{value / unit:.4g} {suffix}"
    return str(value)


class CountBox(QDoubleSpinBox):
    """A count of tokens (or any large count): typed plainly, in scientific notation or
    with a suffix (``1000000000``, ``1e9``, ``10B``, ``500M``), shown with its suffix and
    unit (``10 B tokens``). A plain number box read ``1e9`` as 19 and clamped
    1000000000 billion to its maximum."""

    def __init__(self, unit: str = "tokens") -> None:
        super().__init__()
        self.unit = unit
        self.setDecimals(0)
        self.setSingleStep(1e9)

    def textFromValue(self, value: float) -> str:
        return f"{count_text(round(value))} {self.unit}"

    def valueFromText(self, text: str) -> float:
        count = parse_count(text)
        return float(count) if count is not None else self.value()

    def validate(self, text: str, pos: int) -> object:
        state = QValidator.State
        if text == self.specialValueText() or parse_count(text) is not None:
            return state.Acceptable, text, pos
        compact = re.sub(r"[\s,_]", "", text.lower())
        for word in (self.unit, "token"):
            for n in range(len(word), 0, -1):
                if compact.endswith(word[:n]):
                    compact = compact[:-n]
                    break
        if _COUNT_PREFIX.fullmatch(compact):
            return state.Intermediate, text, pos
        return state.Invalid, text, pos

    def fixup(self, text: str) -> str:
        count = parse_count(text)
        return self.textFromValue(count) if count is not None else text


def with_mnemonic(text: str, index: int) -> str:
    """``text`` with an ampersand before its character ``index`` (Qt underlines it and
    Alt+it is the shortcut); the text's own ampersands doubled, shown as they are."""
    return text[:index].replace("&", "&&") + "&" + text[index:].replace("&", "&&")


def _letter_order(text: str) -> list[int]:
    """Where a mnemonic may go in ``text``, best first: the first letters of its words,
    then its other letters."""
    letters = [i for i, c in enumerate(text) if c.isascii() and c.isalpha()]
    starts = [i for i in letters if i == 0 or not text[i - 1].isalnum()]
    return starts + [i for i in letters if i not in starts]


def _folds(widget: QWidget, panel: QWidget) -> bool:
    """Whether ``widget`` is in a folding section (:class:`Collapsible`) of ``panel``."""
    parent = widget.parentWidget()
    while parent is not None and parent is not panel:
        if isinstance(parent, Collapsible):
            return True
        parent = parent.parentWidget()
    return False


def give_mnemonics(panels: Sequence[FormPanel], taken: str = "") -> dict[str, str]:
    """An Alt+letter for each row of ``panels``, in order: the first letter of a word of
    its label (then any other letter) that no earlier row and no letter of ``taken`` (the
    menus') has, the rows in view before those of folding sections. The label shows it
    underlined and Alt+letter puts the focus in the row's field; a row left without a
    free letter keeps its plain label. Returns path -> letter."""
    used = set(taken.lower())
    out: dict[str, str] = {}
    # the rows always in view first, panel by panel; then those of folding sections
    rows = [r for p in panels for r in p.rows.values() if not _folds(r.widget, p)]
    rows += [r for p in panels for r in p.rows.values() if _folds(r.widget, p)]
    for row in rows:
        box = row.widget.parentWidget()
        label = row.form.labelForField(box) if box is not None else None
        if not isinstance(label, QLabel):
            continue
        for i in _letter_order(row.label):
            letter = row.label[i].lower()
            if letter not in used:
                used.add(letter)
                out[row.path] = letter
                label.setText(with_mnemonic(row.label, i))
                label.setBuddy(row.widget)
                break
    return out


@dataclasses.dataclass
class Row:
    path: str
    label: str
    widget: QWidget
    error: QLabel
    get: Getter
    set: Setter
    read: Callable[[], Any]
    write: Callable[[Any], None]
    #: the form the row is in: the panel's, or one of a :class:`Collapsible` section
    form: QFormLayout


class FormPanel(QGroupBox):
    """A titled group of bound rows. Subclasses add rows in ``__init__``.

    An engine error names a field. It appears under that field's row; an error that names
    a whole section (``training.parallelism``) appears under the row whose edit produced
    the rejected scenario, else under the row :attr:`section_rows` names for the section.
    """

    #: section path -> the row that explains errors naming the whole section
    section_rows: ClassVar[dict[str, str]] = {}

    #: a rejected value appeared in a row or went away (see :meth:`pending`)
    pendingChanged = Signal()

    def __init__(self, title: str, store: ScenarioStore, parent: QWidget | None = None) -> None:
        super().__init__(title, parent)
        self.store = store
        self.rows: dict[str, Row] = {}
        # rows whose widget holds a value the spec rejected (nothing was stored)
        self._pending: dict[str, Row] = {}
        # the row the user edited last, and the scenario that edit handed to the store
        self._last_row: Row | None = None
        self._last_scenario: Scenario | None = None
        outer = QVBoxLayout(self)
        outer.setContentsMargins(8, 8, 8, 8)
        self.header = QVBoxLayout()
        outer.addLayout(self.header)
        self.form = QFormLayout()
        self.form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self.form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.DontWrapRows)
        outer.addLayout(self.form)
        # the form new rows go into (see :meth:`rows_in`)
        self._target = self.form
        # errors change only with the scenario: refresh shows the store's error too
        store.scenarioChanged.connect(self.refresh)

    # -- building rows -------------------------------------------------------------------
    def _add(
        self,
        path: str,
        label: str,
        widget: QWidget,
        get: Getter,
        set_: Setter,
        read: Callable[[], Any],
        write: Callable[[Any], None],
        tip: str,
    ) -> Row:
        # let fields shrink with the column instead of sizing to their widest possible text
        widget.setSizePolicy(QSizePolicy.Policy.Ignored, widget.sizePolicy().verticalPolicy())
        widget.setMinimumWidth(90)
        error = ErrorLabel()
        error.hide()
        box = QWidget()
        lay = QVBoxLayout(box)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(1)
        lay.addWidget(widget)
        lay.addWidget(error)
        widget.setToolTip(rich_text(tip))
        widget.setStatusTip(tip.replace("\n", " "))
        widget.setAccessibleName(label)
        guard_field(widget)
        self._target.addRow(label, box)
        row = Row(path, label, widget, error, get, set_, read, write, self._target)
        self.rows[path] = row
        register_label(path, label)
        write(get(self.store.scenario))
        return row

    @contextlib.contextmanager
    def rows_in(self, form: QFormLayout) -> Iterator[None]:
        """Put the rows added inside the ``with`` block into ``form`` (a section's)."""
        outer, self._target = self._target, form
        try:
            yield
        finally:
            self._target = outer

    def add_beside(self, path: str, widget: QWidget) -> None:
        """Put ``widget`` (a small button) at the right of the field of ``path``."""
        field = self.rows[path].widget
        box = field.parentWidget()
        assert box is not None
        lay = box.layout()
        assert isinstance(lay, QVBoxLayout)
        lay.removeWidget(field)
        line = QHBoxLayout()
        line.setContentsMargins(0, 0, 0, 0)
        line.setSpacing(2)
        line.addWidget(field, 1)
        line.addWidget(widget)
        lay.insertLayout(0, line)

    @staticmethod
    def words(path: str, label: str, tip: str = "") -> str:
        """What the row of ``path`` means: the panel's ``tip``, else :data:`TIPS`'s."""
        return tip or TIPS.get(path, label)

    def add_spin(
        self,
        path: str,
        label: str,
        lo: int,
        hi: int,
        field: tuple[Getter, Setter],
        tip: str = "",
        step: int = 1,
        suffix: str = "",
    ) -> QSpinBox:
        w = QSpinBox()
        w.setRange(lo, hi)
        w.setSingleStep(step)
        w.setGroupSeparatorShown(True)
        w.setKeyboardTracking(False)
        if suffix:
            w.setSuffix(suffix)

        def write(value: int) -> None:
            # a file may hold more than the usual range: widen it rather than clamp
            if value > w.maximum():
                w.setMaximum(min(value, SPIN_MAX))
            if value < w.minimum():
                w.setMinimum(max(value, -SPIN_MAX))
            w.setValue(max(-SPIN_MAX, min(value, SPIN_MAX)))

        row = self._add(
            path,
            label,
            w,
            field[0],
            field[1],
            w.value,
            write,
            with_range(self.words(path, label, tip), range_text(lo, hi, suffix)),
        )
        w.valueChanged.connect(lambda v, r=row: self.commit(r, v))
        return w

    def add_double(
        self,
        path: str,
        label: str,
        lo: float,
        hi: float,
        field: tuple[Getter, Setter],
        tip: str = "",
        decimals: int = 2,
        scale: float = 1.0,
        suffix: str = "",
    ) -> QDoubleSpinBox:
        w = QDoubleSpinBox()
        w.setRange(lo, hi)
        w.setDecimals(decimals)
        w.setKeyboardTracking(False)
        if suffix:
            w.setSuffix(suffix)
        get, set_ = field

        def write(value: float) -> None:
            w.setDecimals(decimals_of(value, decimals))
            if value > w.maximum():
                w.setMaximum(value)
            if value < w.minimum():
                w.setMinimum(value)
            w.setValue(value)

        def read() -> float:
            return round(w.value(), w.decimals())

        row = self._add(
            path,
            label,
            w,
            lambda s: round(get(s) * scale, 9),
            lambda s, v: set_(s, v / scale),
            read,
            write,
            with_range(self.words(path, label, tip), range_text(lo, hi, suffix)),
        )
        w.valueChanged.connect(lambda v, r=row: self.commit(r, v))
        return w

    def add_count(
        self,
        path: str,
        label: str,
        hi: int,
        field: tuple[Getter, Setter],
        tip: str = "",
        unit: str = "tokens",
    ) -> CountBox:
        """A count (:class:`CountBox`): 0 shows the box's special value text; a typed count
        above ``hi`` is handed to the spec, whose range check names it."""
        w = CountBox(unit)
        w.setRange(0, 100 * float(hi))
        w.setKeyboardTracking(False)

        def write(value: int) -> None:
            w.setMaximum(max(w.maximum(), float(value)))
            w.setValue(float(value))

        row = self._add(
            path,
            label,
            w,
            field[0],
            field[1],
            lambda: round(w.value()),
            write,
            with_range(self.words(path, label, tip), f"0 to {count_text(hi)} {unit}"),
        )
        w.valueChanged.connect(lambda v, r=row: self.commit(r, round(v)))
        return w

    def add_combo(
        self,
        path: str,
        label: str,
        choices: Sequence[tuple[str, Any]],
        field: tuple[Getter, Setter],
        tip: str = "",
    ) -> QComboBox:
        w = QComboBox()
        for text, value in choices:
            w.addItem(text, value)
        fixed = w.count()

        def write(value: Any) -> None:
            # the items after the fixed choices show a value of the scenario that none of
            # them is (a custom GPU, trainable parts from a file); only the current one stays
            with QSignalBlocker(w):
                index = w.findData(value)
                if 0 <= index < fixed:
                    while w.count() > fixed:
                        w.removeItem(w.count() - 1)
                else:
                    while w.count() > fixed:
                        w.removeItem(w.count() - 1)
                    w.addItem(describe(value), value)
                    index = fixed
                w.setCurrentIndex(index)

        row = self._add(
            path,
            label,
            w,
            field[0],
            field[1],
            w.currentData,
            write,
            self.words(path, label, tip),
        )
        w.currentIndexChanged.connect(lambda _i, r=row: self.commit(r, w.currentData()))
        return w

    def add_check(
        self, path: str, label: str, field: tuple[Getter, Setter], tip: str = ""
    ) -> QCheckBox:
        w = QCheckBox()
        tip = self.words(path, label, tip)
        row = self._add(path, label, w, field[0], field[1], w.isChecked, w.setChecked, tip)
        w.toggled.connect(lambda v, r=row: self.commit(r, v))
        return w

    def add_text(
        self,
        path: str,
        label: str,
        field: tuple[Getter, Setter],
        tip: str = "",
        max_length: int = 64,
    ) -> QLineEdit:
        """A line of text, stored when the user presses Enter or leaves the field."""
        w = QLineEdit()
        w.setMaxLength(max_length)
        w.setClearButtonEnabled(True)

        def write(value: str) -> None:
            if w.text() != value:
                w.setText(value)

        tip = with_range(self.words(path, label, tip), f"up to {max_length} characters")
        row = self._add(path, label, w, field[0], field[1], w.text, write, tip)
        w.editingFinished.connect(lambda r=row: self.commit(r, w.text()))
        return w

    # -- binding -------------------------------------------------------------------------
    def commit(self, row: Row, value: Any) -> None:
        """A user edit of ``row``: build the new scenario and hand it to the store.

        A value the spec rejects stays in the widget with its message, pending; nothing is
        stored."""
        try:
            scenario = row.set(self.store.scenario, value)
        except EstimateError as exc:
            # under the edited row, which holds the rejected value, whichever field it names
            self._show_on(row, exc.field, str(exc))
            self._pending[row.path] = row
            self.pendingChanged.emit()
            return
        self._last_row, self._last_scenario = row, scenario
        if not self.store.edit(scenario, f"Change {row.label.rstrip(':')}"):
            # the value is the scenario's own (or maps to it): drop what was pending
            self.refresh(self.store.scenario)

    def pending(self) -> list[str]:
        """The labels of the rows whose widget holds a value the spec rejected."""
        return [row.label for row in self._pending.values()]

    def is_pending(self, path: str) -> bool:
        """Whether the row of ``path`` holds a value the spec rejected."""
        return path in self._pending

    def discard_pending(self) -> bool:
        """Put every row holding a rejected value back to the scenario's value and clear
        its message; ``True`` if there was one."""
        if not self._pending:
            return False
        self.refresh(self.store.scenario)
        return True

    @Slot(object)
    def refresh(self, scenario: Scenario) -> None:
        """Update every widget from ``scenario`` without emitting edits, then show what
        the engine says about it."""
        for row in self.rows.values():
            value = row.get(scenario)
            # a combo is written even when it shows the value: it drops an item made for
            # a value the scenario no longer holds
            if row.read() != value or isinstance(row.widget, QComboBox):
                with QSignalBlocker(row.widget):
                    row.write(value)
        self.clear_errors()
        had_pending = bool(self._pending)
        self._pending.clear()
        self.after_refresh(scenario)
        if scenario is self.store.scenario:
            self.show_store_error(self.store.error)
        if had_pending:
            self.pendingChanged.emit()

    def after_refresh(self, scenario: Scenario) -> None:
        """Hook for panels with derived labels (the parameter count)."""

    def clear_errors(self) -> None:
        for row in self.rows.values():
            row.error.hide()

    def show_error(self, field: str, message: str, fallback: Row | None = None) -> bool:
        """Show ``message`` under the row of ``field`` (or ``fallback``); ``True`` if shown."""
        row = self.rows.get(field) or self._row_for_prefix(field) or fallback
        if row is None:
            return False
        self._show_on(row, field, message)
        return True

    def _show_on(self, row: Row, field: str, message: str) -> None:
        detail = message.split(": ", 1)[1] if message.startswith(field + ": ") else message
        row.error.setText(in_user_words(detail))
        row.error.show()
        self.set_row_visible(row.path, True)  # never a hidden error
        parent = row.widget.parentWidget()
        while parent is not None and parent is not self:
            if isinstance(parent, Collapsible):
                parent.set_expanded(True)
            parent = parent.parentWidget()

    def set_row_visible(self, path: str, visible: bool) -> None:
        """Show or hide the row of ``path`` with its label (options that need another)."""
        row = self.rows[path]
        box = row.widget.parentWidget()
        if box is not None:
            row.form.setRowVisible(box, visible)

    def _row_for_prefix(self, field: str) -> Row | None:
        if field in self.section_rows:
            return self.rows[self.section_rows[field]]
        for path, row in self.rows.items():
            if field.startswith(path + ".") or path.startswith(field + "."):
                return row
        return None

    def show_store_error(self, message: str) -> None:
        """Show the engine's message about the current scenario under the row it names."""
        if not message:
            return
        refusal = self.store.refusal
        if refusal is None or str(refusal) != message:
            return
        field = refusal.field
        # the last edited row explains the error only if its edit made the current scenario
        last = self._last_row if self._last_scenario is self.store.scenario else None
        if field not in self.rows and last is not None and last.path.startswith(field + "."):
            self.show_error(last.path, message.replace(field + ": ", last.path + ": ", 1))
            return
        self.show_error(field, message)


class Collapsible(QWidget):
    """A section that folds: a header button with an arrow, a one-line :attr:`summary`
    that stays visible while folded, and a :attr:`form` of rows shown when unfolded.

    A panel adds its rows with ``with panel.rows_in(section.form): ...``; an error shown
    under one of them unfolds the section (:meth:`FormPanel._show_on`)."""

    expandedChanged = Signal(bool)

    def __init__(self, title: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.button = QToolButton()
        self.button.setText(title)
        self.button.setCheckable(True)
        self.button.setAutoRaise(True)
        self.button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.button.setArrowType(Qt.ArrowType.RightArrow)
        font = self.button.font()
        font.setBold(True)
        self.button.setFont(font)
        # a heading, not a push button: no sunken look while unfolded
        self.button.setStyleSheet("QToolButton { border: none; padding: 1px 0; }")
        self.button.setAccessibleName(f"Show or hide {title}")
        self.button.toggled.connect(self._toggled)
        self.summary = QLabel()
        self.summary.setObjectName("sectionSummary")
        self.summary.setTextFormat(Qt.TextFormat.PlainText)
        self.summary.setWordWrap(True)
        self.summary.setContentsMargins(4, 0, 0, 0)
        self.body = QWidget()
        self.form = QFormLayout(self.body)
        self.form.setContentsMargins(12, 0, 0, 0)
        self.form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self.form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.DontWrapRows)
        self.body.hide()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 2, 0, 2)
        lay.setSpacing(2)
        lay.addWidget(self.button)
        lay.addWidget(self.summary)
        lay.addWidget(self.body)

    def is_expanded(self) -> bool:
        return self.button.isChecked()

    def set_expanded(self, expanded: bool) -> None:
        self.button.setChecked(expanded)

    @Slot(bool)
    def _toggled(self, expanded: bool) -> None:
        self.button.setArrowType(Qt.ArrowType.DownArrow if expanded else Qt.ArrowType.RightArrow)
        self.body.setVisible(expanded)
        self.expandedChanged.emit(expanded)


def section(form: QFormLayout, text: str) -> QLabel:
    """A small bold heading across ``form``, to group the rows below it."""
    label = QLabel(text)
    label.setObjectName("formSection")
    font = label.font()
    font.setBold(True)
    label.setFont(font)
    label.setContentsMargins(0, 6, 0, 0)
    form.addRow(label)
    return label


def heading(text: str) -> QLabel:
    label = QLabel(text)
    label.setTextFormat(Qt.TextFormat.PlainText)
    return label

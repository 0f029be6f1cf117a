"""The numbers named: allocated, reserved and device side by side, and what they mean.

* :class:`Readout` -- a one-line strip above the chart: the three totals of the current
  estimate in GiB (2^30 bytes), formatted as the item table formats them, and the overhead
  split into allocator slack (reserved - allocated) and context (device - reserved). Each
  value's tooltip says what it equals and how to measure it in PyTorch;
* :data:`HELP_TITLE` / :data:`HELP_TEXT` -- the Help > "What the numbers mean" page, and
  :func:`show_help`, which shows it;
* :func:`status_summary` -- the status bar's summary, which states the banner's figure
  with the banner's rounding and verdict word;
* :class:`StepReadout` -- the step time beside the memory: a line under the readout with
  the terms on the critical path, the bound, tokens/s and MFU (:func:`step_words`).
"""

from __future__ import annotations

import html
import re

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QMessageBox, QToolButton, QWidget

from memfit.engine.estimate import GIB, Estimate
from memfit.gui.chart import gib_text
from memfit.gui.store import ScenarioStore

__all__ = [
    "BOUND_WORDS",
    "HELP_TEXT",
    "HELP_TITLE",
    "VERDICT_WORDS",
    "Readout",
    "StepReadout",
    "gib_cell",
    "overhead_split",
    "seconds_text",
    "show_help",
    "status_summary",
    "step_words",
]

#: the overhead items between allocated and reserved bytes (the caching allocator's slack)
SLACK_ITEMS = ("allocator rounding", "allocator fragmentation")
#: the overhead items between reserved and device bytes (outside PyTorch's pool)
CONTEXT_ITEMS = ("CUDA context", "cuBLAS workspace", "NCCL")

#: the verdict word the banner starts with, for the status bar
VERDICT_WORDS = {"fits": "Fits", "tight": "Tight", "oom": "Does not fit"}

HELP_TITLE = "What the numbers mean"
#: the readout's heading, and the one it takes when the line is narrow
HEADING = "Peak per GPU in GiB (2^30 bytes):"
SHORT_HEADING = "GiB (2^30 B):"

HELP_TEXT = """\
<h3>What the numbers mean</h3>
<p>Every size is per GPU, at the peak of one training step, in <b>GiB</b>:
1 GiB = 2<sup>30</sup> bytes = 1,073,741,824 bytes.</p>
<p><b>Allocated</b>: what live tensors hold (weights, gradients, optimizer states,
activations). In PyTorch: <code>torch.cuda.max_memory_allocated()</code>.</p>
<p><b>Reserved</b>: allocated plus the <i>allocator slack</i>. PyTorch's caching
allocator rounds blocks up to 2 MiB and keeps freed blocks that later requests do not
fit (fragmentation). In PyTorch: <code>torch.cuda.max_memory_reserved()</code>.</p>
<p><b>Device</b>: reserved plus the <i>context</i>, which lies outside PyTorch's pool:
the CUDA context, the cuBLAS workspace and NCCL's buffers. It is about what
<code>nvidia-smi</code> shows for the process. The banner, the bars and the status bar
use this figure.</p>
<p><b>GiB, not GB.</b> GPUs are sold in round GB. An "80 GB" H100 SXM has 81,559 MiB,
that is 79.6 GiB: the total the driver reports (nvidia-smi's "Total"; in PyTorch,
<code>torch.cuda.get_device_properties(0).total_memory</code>, in bytes). That total is
the capacity MemFit checks against. ECC can take a share: an L40S "48 GB" (ECC on by
default) reports 45.0 GiB, an RTX A6000 "48 GB" (ECC off by default) 48.0 GiB.
nvidia-smi's Memory-Usage counts every process on the GPU, each with its own CUDA
context.</p>
<p><b>The budget line</b> is the share of the capacity to plan for (Budget line in the
Hardware panel, 85 % by default): the allocator needs room and these are estimates.
Under it the scenario fits; between it and the capacity it is tight; over the capacity
it does not fit.</p>
"""


def gib_cell(n_bytes: int) -> str:
    """``n_bytes`` in GiB (2^30 bytes) as the item table shows it: three decimals."""
    return f"{n_bytes / GIB:,.3f}"


def _named(item_name: str, names: tuple[str, ...]) -> bool:
    return any(item_name.startswith(name) for name in names)


def overhead_split(est: Estimate) -> tuple[int, int]:
    """(allocator slack, context) bytes: reserved - allocated and device - reserved."""
    return est.reserved_bytes - est.allocated_bytes, est.device_bytes - est.reserved_bytes


def status_summary(est: Estimate) -> str:
    """The status bar's words for ``est``: the banner's verdict word and figure, then the
    step time and tokens/s, e.g. ``Does not fit · 150.2 GiB per GPU of 45.0 GiB · step
    1.23 s · 13,300 tokens/s`` (the step is there too where a short window has no room
    for its own line: :class:`StepReadout`)."""
    t = est.time
    return (
        f"{VERDICT_WORDS[est.verdict]} · {gib_text(est.device_bytes)} per GPU of "
        f"{gib_text(est.capacity_bytes)} · step {seconds_text(t.step_time_s)} · "
        f"{t.tokens_per_s:,.0f} tokens/s"
    )


def show_help(parent: QWidget | None) -> None:
    """Help > What the numbers mean."""
    box = QMessageBox(QMessageBox.Icon.Information, HELP_TITLE, HELP_TEXT, parent=parent)
    box.setTextFormat(Qt.TextFormat.RichText)
    box.exec()


def _tip(title: str, body: str, n_bytes: int | None = None) -> str:
    exact = f"<br>= {n_bytes:,} bytes" if n_bytes is not None else ""
    return f"<qt><b>{title}</b><br>{body}{exact}<br>GiB = 2<sup>30</sup> bytes.</qt>"


ALLOCATED_TIP = (
    "What live tensors hold at the step's peak.<br>"
    "In PyTorch: <code>torch.cuda.max_memory_allocated()</code> after the step, with "
    "<code>torch.cuda.reset_peak_memory_stats()</code> before it."
)
RESERVED_TIP = (
    "Allocated plus what PyTorch's caching allocator keeps in its pool but no tensor uses "
    "(rounding to 2 MiB blocks and fragmentation).<br>"
    "In PyTorch: <code>torch.cuda.max_memory_reserved()</code>."
)
DEVICE_TIP = (
    "Reserved plus what lies outside PyTorch's pool: the CUDA context, the cuBLAS "
    "workspace and NCCL's buffers. About what <code>nvidia-smi</code> shows for this "
    "process (<code>nvidia-smi --query-compute-apps=pid,used_memory --format=csv</code>)."
    "<br>The banner, the bars and the status bar use this figure."
)


class Readout(QFrame):
    """The current estimate's allocated, reserved and device bytes in one line."""

    #: the "?" button: show :data:`HELP_TEXT`
    helpRequested = Signal()

    def __init__(self, store: ScenarioStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("readout")
        self.store = store
        self.heading = QLabel(HEADING)
        self._splits = ("", "")
        self.allocated = QLabel()
        self.reserved = QLabel()
        self.device = QLabel()
        self.split = QLabel()
        self.help_button = QToolButton()
        self.help_button.setText("?")
        self.help_button.setAutoRaise(True)
        self.help_button.setToolTip(HELP_TITLE)
        self.help_button.setAccessibleName(HELP_TITLE)
        self.help_button.clicked.connect(self.helpRequested)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.setSpacing(14)
        for label in (self.heading, self.allocated, self.reserved, self.device, self.split):
            label.setTextFormat(Qt.TextFormat.PlainText)
            layout.addWidget(label)
        layout.addStretch(1)
        layout.addWidget(self.help_button)
        self.heading.setToolTip(_tip("Three peaks of one step", "allocated ≤ reserved ≤ device"))
        store.estimateChanged.connect(self.refresh)
        store.errorChanged.connect(self.refresh)
        self.refresh()

    def values(self) -> tuple[str, str, str]:
        """The texts of allocated, reserved and device, for tests."""
        return self.allocated.text(), self.reserved.text(), self.device.text()

    @Slot()
    def refresh(self, *_: object) -> None:
        est = self.store.estimate
        if est is None:
            for label, name in (
                (self.allocated, "allocated"),
                (self.reserved, "reserved"),
                (self.device, "device"),
            ):
                label.setText(f"{name} —")
                label.setToolTip("Out of date: the current scenario has no valid estimate")
                label.setEnabled(False)  # greyed; the "?" and the tooltips still work
            self._splits = ("", "")
            self.split.setText("")
            self.split.setToolTip("")
            self._fit()
            return
        for label in (self.allocated, self.reserved, self.device):
            label.setEnabled(True)
        self.allocated.setText(f"allocated {gib_cell(est.allocated_bytes)}")
        self.reserved.setText(f"reserved {gib_cell(est.reserved_bytes)}")
        self.device.setText(f"device {gib_cell(est.device_bytes)}")
        self.allocated.setToolTip(_tip("Allocated", ALLOCATED_TIP, est.allocated_bytes))
        self.reserved.setToolTip(_tip("Reserved", RESERVED_TIP, est.reserved_bytes))
        self.device.setToolTip(_tip("Device", DEVICE_TIP, est.device_bytes))
        slack, context = overhead_split(est)
        self._splits = (
            f"allocator slack +{gib_cell(slack)} · context +{gib_cell(context)}",
            f"slack +{gib_cell(slack)} · context +{gib_cell(context)}",
        )
        self.split.setText(self._splits[0])
        self.split.setToolTip(self._split_tip(est, slack, context))
        self._fit()

    def _split_tip(self, est: Estimate, slack: int, context: int) -> str:
        def rows(names: tuple[str, ...]) -> str:
            return "".join(
                f"<br>&nbsp;&nbsp;{item.name}: {gib_cell(item.bytes)}"
                for item in est.items
                if item.category == "overhead" and _named(item.name, names)
            )

        return (
            "<qt><b>Overhead, split</b><br>"
            f"Allocator slack = reserved − allocated = {gib_cell(slack)} GiB"
            f"{rows(SLACK_ITEMS)}<br>"
            f"Context = device − reserved = {gib_cell(context)} GiB"
            f"{rows(CONTEXT_ITEMS)}<br>"
            "GiB = 2<sup>30</sup> bytes.</qt>"
        )

    def _fit(self) -> None:
        """Shorten the heading and the split, then hide the split, when the line is too
        narrow for them (the tooltips keep both); a value is never cut."""
        layout = self.layout()
        assert layout is not None  # built in __init__
        margins = layout.contentsMargins()
        spacing = layout.spacing()
        parts = (self.allocated, self.reserved, self.device, self.help_button)
        need = sum(w.sizeHint().width() + spacing for w in parts)
        need += margins.left() + margins.right()
        metrics = self.heading.fontMetrics()
        width = self.width()
        long_split, short_split = self._splits
        for heading, split in (
            (HEADING, long_split),
            (HEADING, short_split),
            (SHORT_HEADING, short_split),
        ):
            if (
                need + sum(metrics.horizontalAdvance(t) + spacing for t in (heading, split))
                <= width
            ):
                self.heading.setText(heading)
                self.split.setText(split)
                self.split.setVisible(bool(split))
                return
        self.heading.setText(SHORT_HEADING)
        self.split.setVisible(False)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit()


#: the bound of a step in words (:data:`memfit.engine.steptime.BOUNDS`)
BOUND_WORDS = {
    "compute": "compute-bound",
    "memory_bandwidth": "memory-bandwidth-bound",
    "communication": "communication-bound",
    "host_transfer": "host-transfer-bound",
    "pipeline_bubble": "bubble-bound",
}
#: terms shorter than this share of the step are left to the tooltip
MINOR_TERM = 0.005


def seconds_text(seconds: float) -> str:
    """A duration as a step time is read: ``0.650 s``, ``12.3 ms``, ``84 µs``."""
    if seconds >= 1.0:
        return f"{seconds:,.2f} s"
    if seconds >= 0.1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.0f} µs"


def short_term(name: str) -> str:
    """A step term's name for the one-line readout: ``forward``, ``element-wise``,
    ``ZeRO-3 / FSDP gathers and reduce-scatters`` (its words in parentheses and the
    ``matmuls and attention`` of the compute terms left to the tooltip)."""
    short = re.sub(r" \([^)]*\)", "", name).replace(" matmuls and attention", "")
    return short.replace("elementwise ops", "element-wise")


def step_words(est: Estimate) -> tuple[str, str, str]:
    """The step time in one line, in a short line (the terms left out, for a narrow
    window), and in full for the tooltip: the time, each term on the critical path
    (forward, backward, recomputation, exposed communication, optimizer, pipeline bubble,
    host transfers) with its seconds, the bound, tokens/s and MFU."""
    t = est.time
    total = t.step_time_s or 1.0
    shown = [x for x in t.terms if x.seconds >= MINOR_TERM * total]
    terms = " + ".join(f"{short_term(x.name)} {seconds_text(x.seconds)}" for x in shown)
    tail = (
        f"{BOUND_WORDS.get(t.bound, t.bound)} · {t.tokens_per_s:,.0f} tokens/s · "
        f"MFU {t.mfu * 100:.1f} %"
    )
    line = f"Step {seconds_text(t.step_time_s)} = {terms} · {tail}"
    short = f"Step {seconds_text(t.step_time_s)} · {tail}"
    rows = "".join(
        f"<br>&nbsp;&nbsp;{html.escape(x.name)}: {seconds_text(x.seconds)}"
        + (
            f" on the critical path ({seconds_text(x.busy_s)} of work)"
            if abs(x.busy_s - x.seconds) > 1e-9
            else ""
        )
        + f" <i>{html.escape(x.formula)}</i>"
        for x in t.terms
    )
    tip = (
        f"<qt><b>One optimizer step: {seconds_text(t.step_time_s)}</b>{rows}<br>"
        f"{BOUND_WORDS.get(t.bound, t.bound)}; {t.tokens_per_s:,.0f} tokens/s over "
        f"{t.gpus:,} GPU(s), {t.tokens_per_s_per_gpu:,.0f} per GPU; MFU {t.mfu * 100:.1f} % "
        "(model FLOPs over the dense 16-bit peak). Each what-if's ghost bar says its step "
        "time change; Tradeoffs weighs them.</qt>"
    )
    return line, short, tip


class StepReadout(QLabel):
    """The step time beside the memory: one line under the memory readout (the half of
    every tradeoff the bars do not show), its terms in the tooltip. Where the line does
    not fit the width, the terms go (they stay in the tooltip): it never takes a second
    line from the chart."""

    def __init__(self, store: ScenarioStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("stepReadout")
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setMinimumWidth(1)  # the text follows the width, not the other way round
        self._lines = ("", "")
        self.store = store
        store.estimateChanged.connect(self.refresh)
        store.errorChanged.connect(self.refresh)
        self.refresh()

    @Slot()
    def refresh(self, *_: object) -> None:
        est = self.store.estimate
        if est is None:
            self.setText("Step —")
            self.setToolTip("Out of date: the current scenario has no valid estimate")
            self.setEnabled(False)
            return
        self.setEnabled(True)
        line, short, tip = step_words(est)
        self._lines = (line, short)
        self.setToolTip(tip)
        self._fit()

    def _fit(self) -> None:
        line, short = self._lines
        if not line:
            return
        roomy = self.fontMetrics().horizontalAdvance(line) <= self.width()
        self.setText(line if roomy else short)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit()

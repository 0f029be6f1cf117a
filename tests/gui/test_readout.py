"""The numbers named: the allocated / reserved / device readout, the help page that says
what they mean, and a status bar that states the banner's figure."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication, QLabel, QMenu
from pytestqt.qtbot import QtBot

from memfit.gui.chart import VERDICTS
from memfit.gui.main_window import MainWindow
from memfit.gui.monkey import MessageBoxes
from memfit.gui.readout import (
    HELP_TEXT,
    VERDICT_WORDS,
    Readout,
    gib_cell,
    overhead_split,
    status_summary,
)
from memfit.gui.store import ScenarioStore, default_scenario
from tests.gui.helpers import bad_mesh


@pytest.fixture
def readout(qtbot: QtBot) -> Readout:
    """The readout alone on a store of the default scenario, shown."""
    readout = Readout(ScenarioStore(default_scenario()))
    qtbot.addWidget(readout)
    readout.show()
    return readout


def table_gib(window: MainWindow, row: int) -> str:
    cell = window.table.item(row, 2)
    assert cell is not None
    return cell.text()


def test_the_readout_shows_the_three_totals_as_the_table_formats_them(
    window: MainWindow,
) -> None:
    est = window.store.estimate
    assert est is not None
    allocated, reserved, device = window.readout.values()
    assert allocated == f"allocated {gib_cell(est.allocated_bytes)}"
    assert reserved == f"reserved {gib_cell(est.reserved_bytes)}"
    assert device == f"device {gib_cell(est.device_bytes)}"
    # the table's own format: three decimals, thousands separated
    assert (
        table_gib(window, 0) == f"{est.items[0].bytes / 2**30:,.3f}" == gib_cell(est.items[0].bytes)
    )
    assert window.readout.isVisibleTo(window) and window.readout.device.isEnabled()
    assert "GiB" in window.readout.heading.text() and "2^30" in window.readout.heading.text()


def test_the_readout_follows_the_scenario(window: MainWindow) -> None:
    before = window.readout.values()
    window.training_panel.rows["training.micro_batch_size"].widget.setValue(8)
    est = window.store.estimate
    assert est is not None
    after = window.readout.values()
    assert after != before
    assert after[2] == f"device {gib_cell(est.device_bytes)}"


def test_the_overhead_is_split_into_slack_and_context(readout: Readout) -> None:
    est = readout.store.estimate
    assert est is not None
    slack, context = overhead_split(est)
    named = {i.name: i.bytes for i in est.items if i.category == "overhead"}
    rounding = next(v for k, v in named.items() if k.startswith("allocator rounding"))
    assert slack == rounding + named["allocator fragmentation"] > 0
    outside = named["CUDA context"] + named["cuBLAS workspace"]
    outside += sum(v for k, v in named.items() if k.startswith("NCCL"))
    assert context == outside > 0
    split = readout.split
    assert gib_cell(slack) in split.text() and gib_cell(context) in split.text()
    tip = split.toolTip()
    for words in ("reserved − allocated", "device − reserved", "CUDA context", "cuBLAS"):
        assert words in tip


def test_the_tooltips_say_how_to_measure_each(readout: Readout) -> None:
    est = readout.store.estimate
    assert est is not None
    assert "torch.cuda.max_memory_allocated()" in readout.allocated.toolTip()
    assert "torch.cuda.max_memory_reserved()" in readout.reserved.toolTip()
    assert "nvidia-smi" in readout.device.toolTip()
    for label, n in (
        (readout.allocated, est.allocated_bytes),
        (readout.reserved, est.reserved_bytes),
        (readout.device, est.device_bytes),
    ):
        assert f"{n:,} bytes" in label.toolTip() and "2<sup>30</sup>" in label.toolTip()


def test_the_readout_of_a_rejected_scenario_shows_no_numbers(readout: Readout) -> None:
    readout.store.reset(bad_mesh())
    assert readout.store.estimate is None
    assert all(text.endswith("—") for text in readout.values())
    assert not readout.device.isEnabled() and readout.help_button.isEnabled()
    assert "no valid estimate" in readout.device.toolTip()
    readout.store.reset(default_scenario())
    assert readout.device.isEnabled() and readout.split.text()


def test_help_says_what_the_numbers_mean(window: MainWindow, message_boxes: MessageBoxes) -> None:
    menus = window.menuBar().findChildren(QMenu)
    help_actions = next(m for m in menus if m.title() == "&Help").actions()
    assert window.numbers_act in help_actions and window.about_act in help_actions
    assert window.numbers_act.text().replace("&", "") == "What the Numbers Mean"
    window.numbers_act.trigger()
    shown = message_boxes.shown[-1].text
    assert shown == HELP_TEXT
    for words in (
        "GiB",
        "2<sup>30</sup>",
        "max_memory_allocated",
        "max_memory_reserved",
        "nvidia-smi",
        "get_device_properties",
        "79.6 GiB",
        "ECC",
        "budget line",
    ):
        assert words in shown, words
    window.readout.help_button.click()  # the readout's "?" shows the same page
    assert message_boxes.shown[-1].text == HELP_TEXT


@pytest.mark.parametrize(
    ("verdict", "capacity_over_device"), [("fits", 2.0), ("tight", 1 / 0.92), ("oom", 0.8)]
)
def test_banner_and_status_bar_state_the_same_figure(
    window: MainWindow, verdict: str, capacity_over_device: float
) -> None:
    est = window.store.estimate
    assert est is not None
    memory = round(est.device_bytes / 2**30 * capacity_over_device, 1)
    window.hardware_panel.rows["hardware.memory_gib"].widget.setValue(memory)
    est = window.store.estimate
    assert est is not None and est.verdict == verdict
    banner = window.chart.verdict_text()
    status = window.summary.text()
    assert status == status_summary(est)
    words, figure, step, speed = status.split(" · ")
    assert words == VERDICT_WORDS[verdict]
    assert banner.startswith(VERDICTS[verdict][0]) and VERDICTS[verdict][0].startswith(words)
    assert banner.endswith(f" · {figure}")
    assert step.startswith("step ") and speed.endswith(" tokens/s")  # the step beside it


def test_the_readout_is_readable_in_dark_mode(window: MainWindow, qapp: QApplication) -> None:
    try:
        for theme in ("dark", "light"):
            window.set_theme(theme)
            qapp.processEvents()
            labels: list[QLabel] = [
                window.readout.heading,
                window.readout.allocated,
                window.readout.device,
            ]
            background = window.readout.palette().color(QPalette.ColorRole.Window)
            for label in labels:
                text = label.palette().color(label.foregroundRole())
                assert abs(text.lightness() - background.lightness()) > 120, theme
            dark = background.lightness() < 128
            assert dark == (theme == "dark")
    finally:
        window.set_theme("system", save=False)
        qapp.processEvents()

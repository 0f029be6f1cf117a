"""A short monkey run on the real window: random real-widget actions -- pasting, dropping
and importing hostile texts, files and model folders, the Tradeoffs tab, markup typed
into the GPU name included --, no exception, every field showing the scenario's value,
the chart stale exactly when the store has an error, no user markup rendered, no named
file's content shown (``benchmarks/monkey.py`` runs thousands)."""

import dataclasses
from pathlib import Path

from memfit.gui.main_window import MainWindow
from memfit.gui.monkey import Monkey, run_monkey


def test_a_monkey_finds_nothing(qapp, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # the collector left to itself: freezing it would move when every later test's
    # garbage is collected (tests/gui/test_collector.py checks the collector alone)
    report = run_monkey(300, seed=7, folder=tmp_path, collector=False)
    assert report.actions == 300 and len(report.kinds) >= 15  # most kinds of action ran
    for kind in ("paste", "drop", "import", "tradeoffs", "gpu name"):
        assert report.kinds[kind] > 0, kind
    assert report.exceptions == []
    assert report.field_mismatches == []
    assert report.stale_mismatches == []
    assert report.markup == []
    assert report.leaks == []
    assert report.message_boxes > 0  # files that fail to open, questions before closing
    # the slowest actions, slowest first, each with the scenario it left
    times = [seconds for seconds, _n, _name, _s in report.slowest]
    assert len(times) == 5 and times == sorted(times, reverse=True) and times[-1] > 0
    assert all(1 <= n <= 300 and name in report.kinds for _t, n, name, _s in report.slowest)
    assert report.longest_collection > 0  # the cycle collector's pauses timed


def test_the_monkey_picks_models_the_training_section_does_not_fit(
    window: MainWindow, tmp_path: Path
) -> None:
    s = window.store.scenario
    lora = dataclasses.replace(s.training, method="lora")
    window.store.edit(dataclasses.replace(s, training=lora))
    monkey = Monkey(window, 1, tmp_path)
    with monkey.installed():
        for _ in range(60):
            monkey.refit()
    assert monkey.report.exceptions == []
    # the class was produced: a rank at one model's hidden size, a smaller model picked
    assert any(m.startswith("Could not choose") for m in window.notice.messages())

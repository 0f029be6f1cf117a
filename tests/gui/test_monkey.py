"""A short monkey run on the real window: random real-widget actions, no exception, every
field showing the scenario's value, the chart stale exactly when the store has an error
(``benchmarks/monkey.py`` runs thousands)."""

from pathlib import Path

from gui.monkey import run_monkey


def test_a_monkey_finds_nothing(qapp, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    report = run_monkey(300, seed=7, folder=tmp_path)
    assert report.actions == 300 and len(report.kinds) >= 10  # most kinds of action ran
    assert report.exceptions == []
    assert report.field_mismatches == []
    assert report.stale_mismatches == []
    assert report.message_boxes > 0  # files that fail to open, questions before closing

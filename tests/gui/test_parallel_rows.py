"""The parallelism panel has a row for each parallel axis of the registry
(:data:`memfit.engine.specs.PARALLEL_AXES`), labelled and explained by it, with the
settings that belong to an axis right after it; the mesh line reads the registry too."""

from __future__ import annotations

import html

from pytestqt.qtbot import QtBot

from memfit.engine.specs import PARALLEL_AXES
from memfit.gui.panels import ParallelismPanel
from memfit.gui.store import ScenarioStore, default_scenario
from memfit.gui.tooltips import TIPS


def test_a_row_for_each_axis_with_its_words(qtbot: QtBot) -> None:
    store = ScenarioStore(default_scenario())
    panel = ParallelismPanel(store)
    qtbot.addWidget(panel)
    paths = list(panel.rows)
    for axis in PARALLEL_AXES:
        path = f"training.parallelism.{axis.key}"
        assert panel.rows[path].label == axis.label
        assert TIPS[path] == f"{axis.label}: {axis.help}"
        assert html.escape(axis.help) in panel.rows[path].widget.toolTip()
    # the settings of an axis follow it
    tp = paths.index("training.parallelism.tp")
    assert paths[tp + 1] == "training.parallelism.sequence_parallel"
    pp = paths.index("training.parallelism.pp")
    assert paths[pp + 1 : pp + 4] == [
        "training.parallelism.pp_schedule",
        "training.parallelism.pp_split",
        "training.parallelism.vpp",
    ]
    ep = paths.index("training.parallelism.ep")
    assert paths[ep + 1] == "training.parallelism.expert_capacity_factor"
    assert panel.mesh.text().endswith("= tp 1 × pp 1 × cp 1 × dp 1")
    # an axis of the data-parallel section comes after hybrid shard, before model parallel
    for axis in PARALLEL_AXES:
        row = paths.index(f"training.parallelism.{axis.key}")
        if axis.section == "data":
            assert paths.index("training.parallelism.hybrid_shard") < row < tp
        else:
            assert row >= tp

"""The scenario store: one source of truth, emits only on real change, undoable."""

import dataclasses

from memfit.engine.presets import load_model
from memfit.gui.store import ScenarioStore, default_scenario


def test_emits_only_on_real_change(qtbot) -> None:  # type: ignore[no-untyped-def]
    store = ScenarioStore(default_scenario())
    seen: list[object] = []
    store.scenarioChanged.connect(seen.append)
    assert not store.edit(default_scenario())  # equal value: nothing happens
    assert seen == []
    changed = dataclasses.replace(default_scenario(), model=load_model("gpt2"))
    with qtbot.waitSignal(store.estimateChanged):
        assert store.edit(changed, "Choose GPT-2")
    assert seen == [changed]
    assert store.estimate.total_params > 124_000_000


def test_undo_and_redo(qtbot) -> None:  # type: ignore[no-untyped-def]
    store = ScenarioStore(default_scenario())
    changed = dataclasses.replace(default_scenario(), model=load_model("gpt2"))
    store.edit(changed)
    assert store.modified
    store.undo_stack.undo()
    assert store.scenario == default_scenario() and not store.modified
    store.undo_stack.redo()
    assert store.scenario == changed


def test_a_rejected_scenario_has_no_estimate(qtbot) -> None:  # type: ignore[no-untyped-def]
    store = ScenarioStore(default_scenario())
    bad = dataclasses.replace(default_scenario(), model=load_model("deepseek-v3"))
    estimates: list[object] = []
    store.estimateChanged.connect(estimates.append)
    with qtbot.waitSignal(store.errorChanged) as blocker:
        store.edit(bad)
    assert blocker.args[0].startswith("training.lora.targets:")
    assert store.scenario == bad and store.estimate is None and estimates == [None]
    store.undo_stack.undo()
    assert store.error == "" and store.estimate is not None
    assert estimates[-1] is store.estimate


def test_an_engine_failure_is_an_error_not_a_crash(qtbot, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import sys

    from memfit.gui import store as store_module

    def broken(_scenario: object) -> None:
        raise ZeroDivisionError("division by zero")

    reported: list[BaseException] = []
    monkeypatch.setattr(store_module, "estimate", broken)
    monkeypatch.setattr(sys, "excepthook", lambda kind, exc, tb: reported.append(exc))
    store = ScenarioStore(default_scenario())
    assert store.estimate is None and "ZeroDivisionError" in store.error
    assert len(reported) == 1  # reported where uncaught errors go, not swallowed


def test_the_document_is_whole_when_it_says_it_changed(qtbot, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Each edit, undo, redo, reset and save says so once, with the scenario, the path and
    the modified state of after the change all in place."""
    store = ScenarioStore(default_scenario())
    seen: list[tuple[object, object, bool]] = []
    store.documentChanged.connect(lambda: seen.append((store.scenario, store.path, store.modified)))
    changed = dataclasses.replace(default_scenario(), model=load_model("gpt2"))
    store.edit(changed)
    store.undo_stack.undo()
    store.undo_stack.redo()
    store.mark_saved(tmp_path / "a.memfit.json")
    other = dataclasses.replace(default_scenario(), model=load_model("qwen2.5-7b"))
    store.reset(other, tmp_path / "b.memfit.json", modified=True)
    store.reset(default_scenario())
    assert seen == [
        (changed, None, True),
        (default_scenario(), None, False),
        (changed, None, True),
        (changed, tmp_path / "a.memfit.json", False),
        (other, tmp_path / "b.memfit.json", True),
        (default_scenario(), None, False),
    ]

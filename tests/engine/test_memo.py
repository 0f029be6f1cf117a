"""memfit.engine.memo: every cache of the engine is registered, ``memo.clear()`` empties every one,
an answer is the same before and after a clear, and threads that share the caches get the
answers one thread gets."""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import memfit.engine as engine
from memfit.engine import memo
from memfit.engine.batch import totals_over
from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.specs import Scenario
from memfit.engine.steptime import step_time, step_times
from tests.engine.helpers import preset_scenario, tiny_model

ENGINE = Path(engine.__file__).resolve().parent
MODULES = [
    importlib.import_module(m.name)
    for m in pkgutil.walk_packages(engine.__path__, "memfit.engine.")
    if m.name != "memfit.engine.__main__"  # runs the command line
]
#: a cache written without the registry: functools' decorators, anywhere but engine.memo
UNREGISTERED = re.compile(
    r"\blru_cache\b|\bfunctools\.cache\b|^\s*@cache\b|^from functools import [^\n]*\bcache\b",
    re.MULTILINE,
)
SHAPES = [(1, 512, 1), (2, 1024, 4), (3, 2048, 2)]


def scenarios() -> list[Scenario]:
    """Strategies that reach every cache: LoRA and QLoRA, ZeRO-3 and pipelines on 8
    GPUs, expert parallelism, checkpointing of each kind, a tiny custom model."""
    eight = {"gpus_per_node": 8}
    return [
        preset_scenario("gpt2", "rtx-4090", {}),
        preset_scenario("llama-3.2-1b", "h100-sxm-80gb", {"method": "lora", "micro_batch_size": 2}),
        preset_scenario(
            "qwen2.5-7b",
            "a100-sxm-80gb",
            {"method": "qlora", "activation_checkpointing": "per-op"},
        ),
        preset_scenario("llama-3-8b", "h100-sxm-80gb", {"parallelism": {"zero_stage": 3}}, **eight),
        preset_scenario(
            "llama-3-8b",
            "h100-sxm-80gb",
            {"parallelism": {"pp": 2, "tp": 2}, "activation_checkpointing": "full"},
            **eight,
        ),
        preset_scenario(
            "mixtral-8x7b",
            "h100-sxm-80gb",
            {"parallelism": {"ep": 8, "zero_stage": 1}, "activation_checkpointing": "selective"},
            **eight,
        ),
        preset_scenario(
            "llama-3.2-1b",
            "l4",
            {
                "precision": "fp16-mixed",
                "activation_checkpointing": "every-k-layers",
                "checkpoint_every_k": 4,
            },
        ),
        Scenario(tiny_model(), preset_scenario("gpt2", "t4", {}).hardware),
    ]


def answers(scenario: Scenario) -> tuple[object, ...]:
    """Everything the app asks of a scenario: its estimate, step time, and the totals and
    step times of other shapes (an error is an answer too, by its message)."""
    try:
        return (estimate(scenario), step_time(scenario))
    except EstimateError as error:
        return (str(error),)


def sweep(scenario: Scenario) -> tuple[object, ...]:
    found = [
        t if not isinstance(t, EstimateError) else str(t) for t in totals_over(scenario, SHAPES)
    ]
    try:
        return (found, step_times(scenario, SHAPES))
    except EstimateError as error:
        return (found, str(error))


def workload() -> list[tuple[object, ...]]:
    return [(*answers(s), *sweep(s)) for s in scenarios()]


def caches_of(module: ModuleType) -> Iterator[tuple[str, Any, Any]]:
    """Every lru_cache wrapper a module defines (at module level or in a class) and every
    table it holds: the name it should be registered under, the cache, its clear."""
    for attr, value in vars(module).items():
        if isinstance(value, functools._lru_cache_wrapper):
            if value.__module__ == module.__name__:
                yield f"{module.__name__}.{value.__qualname__}", value, value.cache_clear
        elif isinstance(value, memo.Table):
            yield f"{module.__name__}.{attr}", value, value.clear
        elif inspect.isclass(value) and value.__module__ == module.__name__:
            for member in vars(value).values():
                inner = getattr(member, "__func__", member)
                if isinstance(inner, functools._lru_cache_wrapper):
                    yield f"{module.__name__}.{inner.__qualname__}", inner, inner.cache_clear


def every_cache() -> list[tuple[str, Any, Any]]:
    return [found for module in MODULES for found in caches_of(module)]


def containers() -> dict[str, int]:
    """The size of every module-level dict, list and set of the engine that is not a
    registered table."""
    return {
        f"{module.__name__}.{attr}": len(value)
        for module in MODULES
        for attr, value in vars(module).items()
        if isinstance(value, dict | list | set)
        and not isinstance(value, memo.Table)
        and not attr.startswith("__")
    }


def size(cache: Any) -> int:
    return int(cache.cache_info().currsize) if hasattr(cache, "cache_info") else len(cache)


def test_no_engine_module_caches_with_functools_directly() -> None:
    for path in sorted(ENGINE.rglob("*.py")):
        if path.name != "memo.py":
            found = UNREGISTERED.search(path.read_text(encoding="utf-8"))
            assert found is None, f"{path.name}: {found.group(0) if found else ''}"


def test_every_cache_of_the_engine_is_registered_under_its_name() -> None:
    registered = memo.registered()
    found = every_cache()
    assert len(found) >= 30  # every module was searched
    for name, _cache, clear in found:
        assert registered.get(name) == clear, name


def test_the_engine_keeps_nothing_in_a_module_dict_of_its_own() -> None:
    """What the engine keeps between calls lives in registered caches: no module-level
    dict, list or set grows while it answers."""
    before = containers()
    workload()
    after = containers()
    assert {k: (before.get(k), n) for k, n in after.items() if before.get(k) != n} == {}


def test_clear_empties_every_cache_and_the_answers_stay_the_same() -> None:
    first = workload()
    held = {name for name, n in memo.sizes().items() if n}
    assert {
        "memfit.engine.estimate._prepared",
        "memfit.engine.steptime._MEMOS",
        "memfit.engine.timeline._PLANS",
    } <= held
    memo.clear()
    assert set(memo.sizes().values()) == {0}
    assert [name for name, cache, _ in every_cache() if size(cache)] == []
    assert workload() == first


def test_clear_of_names_empties_those_caches_only() -> None:
    workload()
    memo.clear("memfit.engine.batch", "memfit.engine.steptime._MEMOS")
    sizes = memo.sizes()
    assert sizes["memfit.engine.batch.totals"] == sizes["memfit.engine.batch._STRATEGIES"] == 0
    assert sizes["memfit.engine.steptime._MEMOS"] == 0
    assert sizes["memfit.engine.steptime._layer"] > 0
    assert sizes["memfit.engine.estimate._prepared"] > 0
    with pytest.raises(ValueError, match=r"no engine cache is called 'memfit\.engine\.batc'"):
        memo.clear("memfit.engine.batc")


def test_a_table_keeps_the_first_entry_and_starts_afresh_when_full() -> None:
    table: memo.Table[str, list[int]] = memo.Table(None, 2)
    first = table.keep("a", [1])
    assert table.keep("a", [1]) is first  # a thread that computed it too gets the stored one
    table.keep("b", [2])
    table.keep("c", [3])  # full: emptied first
    assert dict(table) == {"c": [3]}
    counts: memo.Table[str, int] = memo.Table(None, 2)
    assert [counts.tally("x"), counts.tally("x"), counts.tally("y")] == [1, 2, 1]
    assert counts.tally("z") == 1 and dict(counts) == {"z": 1}
    table.clear()
    assert not table


def test_threads_sharing_the_caches_get_the_answers_of_one_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """8 threads ask for estimates, step times and sweeps of the scenarios in different
    orders while one of them clears every cache now and then, the hand-kept tables so
    small that they start afresh all the time and the interpreter switching threads as
    often as it can: each answer is the one thread's answer."""
    cases = scenarios()
    memo.clear()
    expected = [(*answers(s), *sweep(s)) for s in cases]
    for module in MODULES:
        for _name, cache, _clear in caches_of(module):
            if isinstance(cache, memo.Table):
                monkeypatch.setattr(cache, "maxsize", 2)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    errors: list[str] = []
    start = threading.Barrier(8)

    def work(me: int) -> None:
        start.wait()
        for round_ in range(12):
            for i in range(len(cases)):
                k = (i * (me + 1) + round_) % len(cases)
                if me == 0 and i % 3 == 0:
                    memo.clear()
                try:
                    got = (*answers(cases[k]), *sweep(cases[k]))
                except Exception as error:  # a corrupted cache may raise anything
                    errors.append(f"thread {me}, round {round_}: scenario {k} raised {error!r}")
                    continue
                if got != expected[k]:
                    errors.append(f"thread {me}, round {round_}: scenario {k} differs")

    try:
        threads = [threading.Thread(target=work, args=(me,)) for me in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    memo.clear()  # no small table outlives the test with what it kept

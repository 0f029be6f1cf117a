"""The examples in the docstrings of the installed packages (``memfit.engine``,
``memfit.gui``) run and say what they show: each module's doctests, as imported under its
installed name (collecting ``engine/`` by path would import a second copy of it under the
folder's name)."""

from __future__ import annotations

import doctest
import importlib
import io
import pkgutil

import pytest

import memfit.engine
import memfit.gui


def _modules() -> list[str]:
    return [
        m.name
        for package in (memfit.engine, memfit.gui)
        for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
        if not m.name.endswith("__main__")  # runs the command line
    ]


def _examples(name: str) -> list[doctest.DocTest]:
    module = importlib.import_module(name)
    return [t for t in doctest.DocTestFinder().find(module, name) if t.examples]


WITH_EXAMPLES = [name for name in _modules() if _examples(name)]


def test_the_modules_with_examples_are_found() -> None:
    # a finder that found nothing would pass every test below
    assert {"memfit.engine.presets", "memfit.engine.locate", "memfit.gui.chart"} <= set(
        WITH_EXAMPLES
    )
    assert len(WITH_EXAMPLES) >= 25


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_the_docstring_examples_hold(name: str) -> None:
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in _examples(name):
        runner.run(test, out=out.write)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0
    assert result.failed == 0, out.getvalue()

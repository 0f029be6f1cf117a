"""Shared test setup: Qt runs offscreen and without OpenGL."""

import os
import tempfile

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# the user's own presets (memfit.engine.locate.user_presets_dir) stay out of the tests: an
# empty folder of their own; a test that wants custom presets points this elsewhere
os.environ["MEMFIT_USER_PRESETS"] = tempfile.mkdtemp(prefix="memfit-no-presets-")
os.environ.setdefault("PYQTGRAPH_QT_LIB", "PySide6")


def pytest_configure(config: object) -> None:
    """Keep tests away from the user's settings and autosave (Qt's test locations)."""
    try:
        from PySide6.QtCore import QStandardPaths
    except ImportError:  # engine tests run without Qt too
        return
    QStandardPaths.setTestModeEnabled(True)


def pytest_sessionstart(session: object) -> None:
    """The tests import the checkout as installed (``memfit.engine`` and the rest, see
    install.sh): a module or data file added since the install is missing from the
    installed tree, and every test would fail far from the cause. Say it once."""
    from pathlib import Path

    import pytest

    import memfit.engine
    import memfit.gui
    import memfit.resources

    root = Path(__file__).resolve().parents[1]
    for package, folder in (
        (memfit.engine, "engine"),
        (memfit.gui, "gui"),
        (memfit.resources, "resources"),
    ):
        installed = Path(str(package.__file__)).parent
        source = root / folder
        missing = sorted(
            p.relative_to(source).as_posix()
            for p in source.rglob("*")
            if p.is_file()
            and p.suffix in (".py", ".json", ".typed")
            and "__pycache__" not in p.parts
            and not (installed / p.relative_to(source)).exists()
        )
        if missing:
            pytest.exit(
                f"{package.__name__} is installed from {installed}, which lacks "
                f"{', '.join(missing[:5])}: run 'bash install.sh' again",
                returncode=4,
            )

"""Shared test setup: Qt runs offscreen and without OpenGL."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("PYQTGRAPH_QT_LIB", "PySide6")


def pytest_configure(config: object) -> None:
    """Keep tests away from the user's settings and autosave (Qt's test locations)."""
    try:
        from PySide6.QtCore import QStandardPaths
    except ImportError:  # engine tests run without Qt too
        return
    QStandardPaths.setTestModeEnabled(True)

"""The MemFit desktop application (PySide6 + pyqtgraph) on top of :mod:`engine`."""

"""The engine imports and estimates with Qt and pyqtgraph made unimportable."""

import pkgutil
import subprocess
import sys

import memfit.engine as engine

BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('PySide6', 'shiboken6', 'pyqtgraph', 'PyQt5', 'PyQt6') or (
            name == 'memfit.gui' or name.startswith('memfit.gui.')
        ):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
import importlib
for name in {modules!r}:
    importlib.import_module(name)
from memfit.engine.cli import main
sys.exit(main(['estimate', '--model', 'gpt2', '--gpu', 'l4', '--json']))
"""


def test_every_engine_module_imports_without_qt() -> None:
    modules = [
        m.name
        for m in pkgutil.walk_packages(engine.__path__, "memfit.engine.")
        if m.name != "memfit.engine.__main__"
    ]
    assert "memfit.engine.estimate" in modules
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK.format(modules=modules)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert '"memfit_estimate": 1' in proc.stdout

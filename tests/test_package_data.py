"""The wheel carries the package data: an installed MemFit (``pip install .``, no source
tree) has its presets, stacks and icons and finds them through importlib.resources.

Built offline: ``pip wheel --no-build-isolation --no-index`` with the environment's own
setuptools (the ``dev`` extra pins one that builds wheels), from a copy of what the build
reads, so that neither the tree's ``build/`` nor its ``*.egg-info`` is read or written.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path

import pytest

from engine.presets import gpu_names, model_names, resources_dir
from engine.specs import STACKS
from engine.stacks import stacks
from gui.assets import icon_path

ROOT = Path(__file__).resolve().parents[1]
#: what the wheel must carry, relative to the repository root (and so to the wheel's root)
DATA = {
    "engine/data/models": "*.json",
    "engine/data/gpus": "*.json",
    "engine/data/stacks": "*.json",
    "gui/icons": "**/*",
}


def data_files() -> set[str]:
    found = set()
    for folder, pattern in DATA.items():
        found |= {
            p.relative_to(ROOT).as_posix() for p in (ROOT / folder).glob(pattern) if p.is_file()
        }
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("engine", "gui"):
        shutil.copytree(ROOT / name, src / name, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    command += ["--no-index", "--disable-pip-version-check", "-q", "-w", str(tmp / "dist")]
    proc = subprocess.run(
        [*command, str(src)], capture_output=True, text=True, timeout=300, cwd=tmp
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (built,) = (tmp / "dist").glob("memfit-*.whl")
    with zipfile.ZipFile(built) as archive:
        yield archive


def test_the_wheel_carries_every_preset_stack_and_icon(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    expected = data_files()
    assert not expected - names, sorted(expected - names)
    assert "gui/icons/memfit.svg" in names
    assert "gui/icons/hicolor/64x64/apps/memfit.png" in names

    def count(folder: str) -> int:
        return sum(n.startswith(folder + "/") and n.endswith(".json") for n in names)

    assert count("engine/data/models") > 40
    assert count("engine/data/gpus") > 10
    assert count("engine/data/stacks") == len(STACKS) == 10
    for name in STACKS:
        assert json.loads(wheel.read(f"engine/data/stacks/{name}.json"))["name"] == name


def test_the_wheel_carries_every_module(wheel: zipfile.ZipFile) -> None:
    """Every module of the packages, subpackages (``engine.plan``, ``engine.timeline``,
    ``engine.train_configs``) included: a package missing from pyproject's list would be
    left out of the wheel."""
    modules = {
        p.relative_to(ROOT).as_posix()
        for name in ("engine", "gui")
        for p in (ROOT / name).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert {"engine/plan/__init__.py", "engine/timeline/walk.py"} <= modules
    missing = modules - set(wheel.namelist())
    assert not missing, sorted(missing)


def test_the_installed_wheel_finds_its_data_without_the_source_tree(
    wheel: zipfile.ZipFile, tmp_path: Path
) -> None:
    """The wheel unpacked (a pure-Python wheel installs as its files) and imported in a
    process that sees neither the source tree nor its editable install: ``-S`` skips the
    ``.pth`` files, and only the dependencies' site-packages come after the wheel."""
    site = tmp_path / "site"
    wheel.extractall(site)
    dependencies = [p for p in sys.path if p.endswith("site-packages")]
    code = f"""
import json, sys
sys.path[:0] = [{str(site)!r}]
sys.path += {dependencies!r}
from importlib.resources import files
import engine.presets as presets
from engine.stacks import stacks
from gui.assets import icon_path
print(json.dumps({{
    "module": presets.__file__,
    "data": str(files("engine") / "data"),
    "models": len(presets.model_names()),
    "gpus": len(presets.gpu_names()),
    "stacks": len(stacks()),
    "llama": presets.load_model("llama-3-8b").name,
    "icon": str(icon_path()),
    "icon_bytes": icon_path().stat().st_size,
}}))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("MEMFIT_RESOURCES", "PYTHONPATH")}
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    for key in ("module", "data", "icon"):
        assert Path(seen[key]).is_relative_to(site), seen
    assert seen["models"] > 40 and seen["gpus"] > 10 and seen["stacks"] == 10, seen
    assert seen["llama"] == "llama-3-8b" and seen["icon_bytes"] > 0


def test_the_presets_are_read_through_importlib_resources(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MEMFIT_RESOURCES", raising=False)
    assert resources_dir() == files("engine") / "data"
    assert len(model_names()) > 40
    assert len(gpu_names()) > 10
    assert len(stacks()) == 10
    assert icon_path() == files("gui") / "icons" / "memfit.svg"
    assert icon_path().is_file()

"""The wheel carries the package data: an installed MemFit (``pip install .``, no source
tree) has its presets, stacks, icons and desktop entry -- the top-level ``resources/``
folder, installed as ``memfit/resources/`` -- and finds them through importlib.resources
(:mod:`memfit.engine.locate`).

Built offline: ``pip wheel --no-build-isolation --no-index`` with the environment's own
setuptools (the ``dev`` extra pins one that builds wheels), from a copy of what the build
reads, so that neither the tree's ``build/`` nor its ``*.egg-info`` is read or written.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest

from memfit.engine.locate import resource_file, resources
from memfit.engine.presets import gpu_names, model_names
from memfit.engine.specs import STACKS
from memfit.engine.stacks import stacks
from memfit.gui.assets import icon_path

ROOT = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
#: each folder of the checkout and the name it installs under (pyproject's package-dir)
INSTALLED = {"engine": "memfit/engine", "gui": "memfit/gui", "resources": "memfit/resources"}


def data_files() -> set[str]:
    """Every data file of ``resources/``, as the wheel names it."""
    return {
        "memfit/resources/" + p.relative_to(ROOT / "resources").as_posix()
        for p in (ROOT / "resources").rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc")
    }


def test_the_data_lives_in_the_top_level_resources_folder() -> None:
    for kind in ("models", "gpus", "stacks", "icons", "desktop"):
        assert (ROOT / "resources" / kind).is_dir(), kind
    assert not (ROOT / "engine" / "data").exists()
    assert not (ROOT / "gui" / "icons").exists()
    # no module but the locator names the folder's package
    named = sorted(
        p.relative_to(ROOT).as_posix()
        for folder in ("engine", "gui")
        for p in (ROOT / folder).rglob("*.py")
        if '"memfit.resources"' in p.read_text(encoding="utf-8")
    )
    assert named == ["engine/locate.py"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in INSTALLED:
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


def run_outside(code: str, cwd: Path) -> dict[str, Any]:
    """The JSON ``code`` prints, run with ``-S`` (no ``.pth`` files: neither the source tree
    nor its editable install) and without the variables that point at the tree."""
    env = {k: v for k, v in os.environ.items() if k not in ("MEMFIT_RESOURCES", "PYTHONPATH")}
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    seen: dict[str, Any] = json.loads(proc.stdout)
    return seen


def test_the_wheel_carries_every_preset_stack_and_icon(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    expected = data_files()
    assert not expected - names, sorted(expected - names)
    assert "memfit/resources/icons/memfit.svg" in names
    assert "memfit/resources/icons/hicolor/64x64/apps/memfit.png" in names
    assert "memfit/resources/desktop/memfit.desktop" in names
    assert {"memfit/engine/py.typed", "memfit/gui/py.typed"} <= names

    def count(folder: str) -> int:
        return sum(n.startswith(folder + "/") and n.endswith(".json") for n in names)

    assert count("memfit/resources/models") > 40
    assert count("memfit/resources/gpus") > 10
    assert count("memfit/resources/stacks") == len(STACKS) == 10
    for name in STACKS:
        assert json.loads(wheel.read(f"memfit/resources/stacks/{name}.json"))["name"] == name
    # the wheel owns no top-level name but its own
    assert {n.split("/")[0] for n in names} == {"memfit", f"memfit-{VERSION}.dist-info"}


def test_the_wheel_carries_every_module(wheel: zipfile.ZipFile) -> None:
    """Every module of the packages, subpackages (``memfit.engine.plan``,
    ``memfit.engine.timeline``, ``memfit.engine.train_configs``) included, under its
    installed name: a package missing from pyproject's list would be left out."""
    modules = {
        INSTALLED[name] + "/" + p.relative_to(ROOT / name).as_posix()
        for name in INSTALLED
        for p in (ROOT / name).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert {"memfit/engine/plan/__init__.py", "memfit/engine/timeline/compiled.py"} <= modules
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
import memfit.engine.presets as presets
from memfit.engine.stacks import stacks
from memfit.gui.assets import icon_path
print(json.dumps({{
    "module": presets.__file__,
    "data": str(files("memfit.resources")),
    "models": len(presets.model_names()),
    "gpus": len(presets.gpu_names()),
    "stacks": len(stacks()),
    "llama": presets.load_model("llama-3-8b").name,
    "icon": str(icon_path()),
    "icon_bytes": icon_path().stat().st_size,
}}))
"""
    seen = run_outside(code, tmp_path)
    for key in ("module", "data", "icon"):
        assert Path(seen[key]).is_relative_to(site), seen
    assert seen["models"] > 40 and seen["gpus"] > 10 and seen["stacks"] == 10, seen
    assert seen["llama"] == "llama-3-8b" and seen["icon_bytes"] > 0


def test_the_presets_are_read_through_importlib_resources(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MEMFIT_RESOURCES", raising=False)
    assert resources() == files("memfit.resources")
    # a checkout's install reads the checkout's files (linked, or as they are)
    llama = Path(str(resources() / "models" / "llama-3-8b.json")).resolve()
    assert llama == ROOT / "resources" / "models" / "llama-3-8b.json"
    assert len(model_names()) > 40
    assert len(gpu_names()) > 10
    assert len(stacks()) == 10
    assert icon_path() == resource_file("icons", "memfit.svg")
    assert icon_path().resolve() == ROOT / "resources" / "icons" / "memfit.svg"


DUMMY_PYPROJECT = """[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "someone-elses-engine"
version = "1.0"

[tool.setuptools]
packages = ["engine", "gui"]
"""


def test_the_installed_names_are_memfits_own(wheel: zipfile.ZipFile, tmp_path: Path) -> None:
    """Installed beside another distribution that owns the top-level ``engine`` and ``gui``
    (both wheels into one site folder, the other one last), each imports as it should:
    ``engine`` and ``gui`` are the other distribution's, ``memfit.engine`` and
    ``memfit.gui`` MemFit's, in one process."""
    src = tmp_path / "dummy"
    for name in ("engine", "gui"):
        (src / name).mkdir(parents=True)
        (src / name / "__init__.py").write_text(f"OWNER = 'someone else\\'s {name}'\n")
    (src / "pyproject.toml").write_text(DUMMY_PYPROJECT)
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    offline = ["--no-deps", "--no-index"]
    proc = subprocess.run(
        [*command, "wheel", *offline, "--no-build-isolation", "-w", str(tmp_path / "dist"), src],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (dummy,) = (tmp_path / "dist").glob("someone_elses_engine-*.whl")
    site = tmp_path / "site"
    for built in (wheel.filename, dummy):  # MemFit first: the other one lands on top of it
        proc = subprocess.run(
            [*command, "install", *offline, "--target", str(site), str(built)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    dependencies = [p for p in sys.path if p.endswith("site-packages")]
    code = f"""
import importlib, io, json, sys
sys.path[:0] = [{str(site)!r}]
sys.path += {dependencies!r}
engine, gui = importlib.import_module("engine"), importlib.import_module("gui")
from memfit.engine.cli import main
from memfit.engine.presets import load_model
from memfit.gui.assets import icon_path
import memfit.engine, memfit.gui
out = io.StringIO()
status = main(["estimate", "--model", "llama-3-8b", "--gpu", "h100-sxm-80gb"], out)
print(json.dumps({{
    "engine": engine.OWNER, "gui": gui.OWNER,
    "engine_after": sys.modules["engine"].OWNER,
    "memfit_engine": memfit.engine.__file__, "memfit_gui": memfit.gui.__file__,
    "status": status, "first": out.getvalue().splitlines()[0],
    "model": load_model("llama-3-8b").label, "icon": icon_path().stat().st_size,
}}))
"""
    seen = run_outside(code, tmp_path)
    assert seen["engine"] == seen["engine_after"] == "someone else's engine"
    assert seen["gui"] == "someone else's gui"
    for key in ("memfit_engine", "memfit_gui"):
        assert Path(seen[key]).is_relative_to(site / "memfit"), seen
    assert seen["status"] == 0
    assert seen["first"] == "MemFit estimate: Llama 3 8B on NVIDIA H100 SXM 80GB (1 GPU)"
    assert seen["model"] == "Llama 3 8B" and seen["icon"] > 0


def test_no_code_imports_the_folders_by_their_checkout_names() -> None:
    """``engine`` and ``gui`` are folders of the checkout, not import names: an import of
    them works only where the checkout's root is on the path, and is someone else's
    package in an install (the test above)."""
    stray = re.compile(r"^\s*(?:from|import)\s+(?:engine|gui)\b", re.MULTILINE)
    found = [
        p.relative_to(ROOT).as_posix()
        for folder in ("engine", "gui", "tests", "benchmarks", "validation", "packaging", "docs")
        for p in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in p.parts and stray.search(p.read_text(encoding="utf-8"))
    ]
    assert found == [], found

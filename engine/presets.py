"""Model and GPU presets: one JSON file per preset, shipped inside the package as
``engine/data/models/NAME.json`` and ``engine/data/gpus/NAME.json`` and read through
:mod:`importlib.resources` (so an installed wheel or a frozen bundle finds them too).

A preset file's name is its ``name`` key; it is parsed into the dataclass strictly, so an
unknown key or a bad value fails loudly with the file and the field named.

>>> load_gpu("h100-sxm-80gb").memory_mib
81559
>>> "llama-3-8b" in model_names()
True
"""

from __future__ import annotations

import dataclasses
import json
import os
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, TypeVar

from engine import memo
from engine.errors import EstimateError, shown
from engine.specs import GpuSpec, ModelSpec

T = TypeVar("T", ModelSpec, GpuSpec)


def resources_dir() -> Traversable:
    """The folder of the presets and stacks (``models/``, ``gpus/``, ``stacks/``):
    ``$MEMFIT_RESOURCES`` when it is set, else the package's own ``engine/data``.

    The package data is found with :func:`importlib.resources.files`: a plain folder for an
    installed package, a source checkout or a frozen bundle, but possibly not one on disk
    (a zip import), so read it with ``/``, ``iterdir()`` and ``read_text()`` only.
    """
    override = os.environ.get("MEMFIT_RESOURCES")
    if override:
        return Path(override)
    return files("engine") / "data"


def build_strict(cls: type[T], data: Any, section: str) -> T:
    """``cls(**data)``, but an unknown or missing key is an :class:`EstimateError` naming it."""
    if not isinstance(data, dict):
        raise EstimateError(section, f"expected a JSON object, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            raise EstimateError(f"{section}.{key}", "unknown key")
    for name, f in fields.items():
        missing = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if missing and name not in data:
            raise EstimateError(f"{section}.{name}", "missing (required)")
    return cls(**data)


def _names(kind: str) -> tuple[str, ...]:
    folder = resources_dir() / kind
    if not folder.is_dir():
        return ()
    return tuple(
        sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))
    )


@memo.cached(maxsize=1)
def model_names() -> tuple[str, ...]:
    """Names of all model presets, sorted."""
    return _names("models")


@memo.cached(maxsize=1)
def gpu_names() -> tuple[str, ...]:
    """Names of all GPU presets, sorted."""
    return _names("gpus")


def _load(kind: str, cls: type[T], name: str, field: str) -> T:
    names = _names(kind)
    if name not in names:
        listed = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
        raise EstimateError(field, f"unknown preset {shown(name)}; choose one of {listed}")
    path = resources_dir() / kind / f"{name}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise EstimateError(field, f"preset file {path.name} cannot be read: {exc}") from exc
    spec = build_strict(cls, data, f"{field}[{name}]")
    if spec.name != name:
        raise EstimateError(f"{field}[{name}].name", f"{spec.name!r} differs from the file name")
    return spec


@memo.cached(maxsize=256)
def load_model(name: str) -> ModelSpec:
    """The model preset called ``name`` (see :func:`model_names`)."""
    return _load("models", ModelSpec, name, "model.preset")


@memo.cached(maxsize=256)
def load_gpu(name: str) -> GpuSpec:
    """The GPU preset called ``name`` (see :func:`gpu_names`)."""
    return _load("gpus", GpuSpec, name, "hardware.gpu")


def preset_name_of(model: ModelSpec) -> str | None:
    """The preset ``model`` is identical to, if any."""
    if model.name in model_names() and load_model(model.name) == model:
        return model.name
    return None

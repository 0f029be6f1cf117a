"""Model and GPU presets: one JSON file per preset, ``models/NAME.json`` and
``gpus/NAME.json``, built in (the top-level ``resources/`` folder) or the user's own (a
folder of the same shape, :func:`memfit.engine.locate.user_presets_dir`); where each is
found is :mod:`memfit.engine.locate`'s business.

A preset file's name is its ``name`` key; it is parsed into the dataclass strictly, so an
unknown key or a bad value fails loudly with the file and the field named. A user's preset
that fails so is left out of the lists, and :func:`preset_problems` says why in one line;
the other presets load as before.

>>> load_gpu("h100-sxm-80gb").memory_mib
81559
>>> "llama-3-8b" in model_names()
True
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, TypeVar

from memfit.engine import memo
from memfit.engine.errors import EstimateError, shown
from memfit.engine.locate import KINDS, loadable, preset_files
from memfit.engine.specs import GpuSpec, ModelSpec
from memfit.engine.stacks import custom_stack_problems

T = TypeVar("T", ModelSpec, GpuSpec)


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


def _read(kind: str, cls: type[T], name: str, field: str) -> T:
    """The preset ``name`` of ``kind`` as ``cls``, checked; an :class:`EstimateError`
    naming the field otherwise."""
    found = preset_files(kind).files
    if name not in found:
        names = sorted(found)
        listed = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
        raise EstimateError(field, f"unknown preset {shown(name)}; choose one of {listed}")
    path = found[name]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EstimateError(field, f"preset file {path.name} cannot be read: {exc}") from exc
    spec = build_strict(cls, data, f"{field}[{name}]")
    if spec.name != name:
        raise EstimateError(f"{field}[{name}].name", f"{spec.name!r} differs from the file name")
    return spec


@memo.cached(maxsize=None)
def _checked(kind: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names of ``kind``'s presets that load, sorted, and one line for each user's
    preset left out (the built-in ones are checked by the tests, not here)."""
    cls, field = _KINDS[kind]
    names, problems = loadable(kind, lambda name: _read(kind, cls, name, field))
    return tuple(sorted(names)), tuple(problems)


_KINDS: dict[str, tuple[type[Any], str]] = {
    "models": (ModelSpec, "model.preset"),
    "gpus": (GpuSpec, "hardware.gpu"),
}


def model_names() -> tuple[str, ...]:
    """Names of all model presets, built-in and the user's that load, sorted."""
    return _checked("models")[0]


def gpu_names() -> tuple[str, ...]:
    """Names of all GPU presets, built-in and the user's that load, sorted."""
    return _checked("gpus")[0]


def custom_names(kind: str) -> frozenset[str]:
    """The names of ``kind``'s presets (``models``, ``gpus``, ``stacks``) that are the
    user's own."""
    return preset_files(kind).custom


def preset_problems(kind: str | None = None) -> tuple[str, ...]:
    """One line for each of the user's preset files of ``kind`` (``models``, ``gpus``,
    ``stacks``; None: every kind) that is left out, naming the file and the field: what
    the CLI and the app show."""
    kinds = KINDS if kind is None else (kind,)
    out: tuple[str, ...] = ()
    for k in kinds:
        out += custom_stack_problems() if k == "stacks" else _checked(k)[1]
    return out


@memo.cached(maxsize=256)
def load_model(name: str) -> ModelSpec:
    """The model preset called ``name`` (see :func:`model_names`)."""
    return _read("models", ModelSpec, name, "model.preset")


@memo.cached(maxsize=256)
def load_gpu(name: str) -> GpuSpec:
    """The GPU preset called ``name`` (see :func:`gpu_names`)."""
    return _read("gpus", GpuSpec, name, "hardware.gpu")


def preset_name_of(model: ModelSpec) -> str | None:
    """The preset ``model`` is identical to, if any."""
    if model.name in model_names() and load_model(model.name) == model:
        return model.name
    return None

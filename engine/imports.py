"""What a user brings, read into a scenario: one entry point for the app and the CLI.

A user has a scenario file, a Hugging Face ``config.json``, a folder with a model's files
(``config.json`` and its safetensors checkpoint), a model in the local Hugging Face cache,
or the training configuration of their run (Axolotl, TRL/transformers, LitGPT, torchtune,
DeepSpeed, accelerate). :func:`import_path` and :func:`import_text` tell which it is from
what it holds and apply it to a base scenario:

* a **scenario** replaces the base;
* a **model** (``config.json``, a model folder, a cached model) replaces the base's model;
  a folder's checkpoint headers give the checkpoint's parameter count beside the engine's
  (:mod:`memfit.engine.checkpoint`), and a mismatch is said;
* a **training configuration** fills the training (and hardware) fields it sets; the rest
  keep the stack's defaults, and the keys MemFit cannot model are listed
  (:mod:`memfit.engine.train_configs`).

Nothing here touches the network. Every problem is an :class:`EstimateError` that names
the file and what is wrong.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memfit.engine.errors import EstimateError, bounded, shown
from memfit.engine.files import NotJson, parse_json, read_text
from memfit.engine.hf_config import model_from_hf_config
from memfit.engine.model_state import lora_targets
from memfit.engine.params import count_parameters
from memfit.engine.scenario_io import scenario_from_dict, scenario_to_dict
from memfit.engine.specs import ModelSpec, Scenario
from memfit.engine.train_configs import ImportedConfig

if TYPE_CHECKING:
    from memfit.engine.checkpoint import Cancelled, Progress


def asks_for_read_as(error: EstimateError) -> bool:
    """Whether ``error`` is a config of a family MemFit does not read, which ``read_as``
    can read as a look-alike (not a family refused with a reason)."""
    return error.field.endswith("model_type") and "read_as" in str(error)


#: what an import was
KINDS = ("scenario", "model-config", "model-folder", "cached-model", "training-config")


@dataclass(frozen=True, slots=True)
class Imported:
    """An import applied: what it was, where from, the scenario it makes, and what the
    user should read (assumptions taken, keys MemFit cannot model, a checkpoint whose
    parameter count differs from the engine's)."""

    kind: str
    source: str
    scenario: Scenario
    messages: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return {
            "scenario": "scenario",
            "model-config": "model config",
            "model-folder": "model folder",
            "cached-model": "cached model",
            "training-config": "training config",
        }[self.kind]


def _with_model(base: Scenario, model: ModelSpec) -> tuple[Scenario, list[str]]:
    """``base`` on ``model``; LoRA targets that name no layer of the new model (``q_proj``
    on DeepSeek-V3's latent attention) become ``all-linear``, and the change is said."""
    training, said = base.training, []
    if training.method in ("lora", "qlora"):
        try:
            lora_targets(model, training.lora.targets)
        except EstimateError:
            lora = dataclasses.replace(training.lora, targets=("all-linear",))
            training = dataclasses.replace(training, lora=lora)
            said.append(
                f"LoRA targets {', '.join(base.training.lora.targets)} name no layer of "
                f"{model.label}: all-linear instead"
            )
    scenario = dataclasses.replace(base, model=model, training=training)
    # the rank check of LoRA against the hidden size lives in Scenario: build it again
    return scenario_from_dict(scenario_to_dict(scenario)), said


def _model_messages(model: ModelSpec) -> list[str]:
    total = count_parameters(model).total
    out = [bounded(f"{model.label}: {total:,} parameters")]  # a name of 2,000 characters
    if model.read_as:
        out.append(f"read as {model.read_as} (a look-alike of {model.family})")
    if model.text_model_of:
        out.append(f"the text model of {model.text_model_of}: its vision tower is not counted")
    return out


def _is_hf_config(data: Any) -> bool:
    return isinstance(data, dict) and (
        "model_type" in data or "text_config" in data or "architectures" in data
    )


def _is_scenario(data: Any) -> bool:
    return isinstance(data, dict) and "memfit_scenario" in data


def _from_data(
    data: Any,
    base: Scenario,
    source: str,
    text: str,
    read_as: str | None = None,
    name: str | None = None,
) -> Imported:
    """``data`` as a scenario, a model config (named by its ``_name_or_path``, else
    ``name``) or a training configuration."""
    if _is_scenario(data):
        return Imported("scenario", source, scenario_from_dict(data))
    if _is_hf_config(data):
        name = data.get("_name_or_path") or name
        model = model_from_hf_config(data, name=name, read_as=read_as)
        scenario, said = _with_model(base, model)
        return Imported("model-config", source, scenario, (*_model_messages(model), *said))
    return _training(base, source, text)


def _training(
    base: Scenario,
    source: str,
    text: str,
    path: Path | None = None,
    allow_outside_paths: bool = False,
) -> Imported:
    from memfit.engine.train_configs import apply, import_training_config

    imported = import_training_config(path=path, text=text, allow_outside_paths=allow_outside_paths)
    scenario = scenario_from_dict(apply(scenario_to_dict(base), imported, replace_model=True))
    messages = [f"{imported.format} configuration: stack {scenario.training.stack}"]
    if imported.model_preset:
        messages.append(f"model: the preset {imported.model_preset} ({imported.model})")
    elif imported.model:
        try:  # a model id the local cache holds
            scenario = import_cached(imported.model, scenario).scenario
            messages.append(f"model: {imported.model} from the local Hugging Face cache")
        except EstimateError:
            messages.append(
                f"the file names the model {shown(imported.model)}, not a preset and not in the "
                "local cache: the model is left as it was"
            )
    messages += config_notes(imported)
    return Imported("training-config", source, scenario, tuple(messages))


def config_notes(imported: ImportedConfig) -> list[str]:
    """What a training configuration's import assumed, then what it cannot model."""
    return [*imported.notes, *(f"not modelled: {item}" for item in imported.ignored)]


def _folder(
    folder: Path,
    base: Scenario,
    kind: str = "model-folder",
    read_as: str | None = None,
    progress: Progress | None = None,
    cancelled: Cancelled | None = None,
) -> Imported:
    from memfit.engine.checkpoint import (
        compare,
        folder_model_name,
        has_weights,
        model_config,
        model_from_folder,
    )

    if not has_weights(folder):  # its config alone (a cache entry without the weights)
        model = model_from_hf_config(
            model_config(folder), name=folder_model_name(folder), read_as=read_as
        )
        scenario, said = _with_model(base, model)
        note = (
            f"{folder.name or folder}: no *.safetensors files; the parameters are counted"
            " from the config alone"
        )
        return Imported(kind, str(folder), scenario, (*_model_messages(model), note, *said))
    model, info = model_from_folder(folder, read_as=read_as, progress=progress, cancelled=cancelled)
    messages = _model_messages(model)
    c = compare(model, info)
    quant = f", {info.quantization.method}" if info.quantization else ""
    shown = (
        f"checkpoint: {c.checkpoint_parameters:,} parameters in {info.tensor_count:,} tensors"
        f"{quant}, {info.total_bytes:,} bytes"
    )
    if c.mismatch:
        shown += (
            f" -- differs from the engine's {c.engine_parameters:,} by {c.difference:+,}"
            f" ({c.relative_difference:+.2%})"
        )
    else:
        shown += ": matches the engine's count"
    messages += [shown, *c.notes, *info.warnings]
    scenario, said = _with_model(base, model)
    return Imported(kind, str(folder), scenario, (*messages, *said))


def import_path(
    path: str | Path,
    base: Scenario,
    read_as: str | None = None,
    *,
    allow_outside_paths: bool = False,
    progress: Progress | None = None,
    cancelled: Cancelled | None = None,
) -> Imported:
    """The file or folder ``path`` applied to ``base`` (see the module docstring);
    ``read_as``: a model config of an unknown family read as this look-alike
    (:func:`memfit.engine.hf_config.model_from_hf_config`); ``allow_outside_paths``: a training
    config may name files outside its own folder
    (:func:`memfit.engine.train_configs.import_training_config`); ``progress`` and
    ``cancelled``: a model folder's reading reports to and polls them
    (:func:`memfit.engine.checkpoint.read_checkpoint`; a cancel raises
    :class:`~memfit.engine.checkpoint.ReadCancelled`)."""
    p = Path(path)
    if p.is_dir():
        if os.path.lexists(p / "config.json"):  # a link is model_from_folder's to judge
            return _folder(p, base, read_as=read_as, progress=progress, cancelled=cancelled)
        raise EstimateError("import", f"{p.name}: a folder without a config.json")
    text = read_text(p, "import")
    if p.suffix.lower() == ".json":
        data = parse_json(text, "import", p.name)
        if _is_scenario(data) or _is_hf_config(data):
            return _from_data(data, base, str(p), text, read_as, _file_model_name(p))
    return _training(base, str(p), text, p, allow_outside_paths)


def _file_model_name(path: Path) -> str:
    """The name of the model whose config is the file ``path``: its folder's (``org/name``
    in the hub cache) for a ``config.json``, else the file's own name."""
    from memfit.engine.checkpoint import folder_model_name

    if path.stem.lower() == "config":
        return folder_model_name(path.parent)
    return path.stem


def import_text(
    text: str, base: Scenario, source: str = "pasted text", read_as: str | None = None
) -> Imported:
    """Pasted text applied to ``base``: a scenario or a ``config.json`` (JSON), or a
    training configuration (JSON or YAML)."""
    stripped = text.strip()
    if not stripped:
        raise EstimateError("import", "the text is empty")
    if stripped.startswith("{"):
        try:
            data = parse_json(stripped, "import", source)
        except NotJson:  # YAML's flow style, perhaps: the training config reader tells
            data = None
        if _is_scenario(data) or _is_hf_config(data):
            return _from_data(data, base, source, stripped, read_as)
    return _training(base, source, stripped)


def import_cached(
    repo_id: str,
    base: Scenario,
    revision: str | None = None,
    read_as: str | None = None,
    *,
    progress: Progress | None = None,
    cancelled: Cancelled | None = None,
) -> Imported:
    """A model of the local Hugging Face cache (``org/name``) applied to ``base``;
    ``progress`` and ``cancelled`` as :func:`import_path` takes them."""
    from memfit.engine.hub_cache import find_model

    snapshot = find_model(repo_id, revision)
    imported = _folder(Path(snapshot.path), base, "cached-model", read_as, progress, cancelled)
    return dataclasses.replace(imported, source=f"{repo_id}@{snapshot.commit[:12]}")

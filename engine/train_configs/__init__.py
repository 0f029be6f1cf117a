"""Import a run's own training configuration into a scenario.

A training run is usually described by the tool that runs it, not by MemFit: an Axolotl
YAML, a transformers ``TrainingArguments`` / TRL ``SFTConfig`` file, a LitGPT or torchtune
recipe config, a DeepSpeed JSON, an accelerate launch config. This module reads such a file
strictly and turns what it says into MemFit's scenario-file keys:

>>> imported = import_training_config(text="base_model: meta-llama/Llama-3.1-8B\\n"
...     "adapter: lora\\nlora_r: 32\\nmicro_batch_size: 2\\nsequence_len: 4096\\n")
>>> imported.format, imported.model_preset
('axolotl', 'llama-3.1-8b')
>>> imported.training["lora"]["rank"], imported.training["stack"]
(32, 'axolotl')

Formats (:data:`FORMATS`) and the stack each implies:

* ``axolotl`` -- an Axolotl config (``base_model``, ``adapter``, ``sequence_len``, ...):
  stack ``axolotl``;
* ``training-arguments`` -- transformers ``TrainingArguments`` as JSON or YAML, with TRL's
  ``SFTConfig`` and ``ModelConfig`` keys where present: stack ``trl-sft`` when the file has
  a key only TRL has (``max_seq_length``, ``max_length``, ``packing``,
  ``dataset_text_field``, ``use_peft``, ...; see :data:`_TRL_KEYS`), else ``hf-trainer``;
* ``litgpt`` -- a LitGPT finetune config (``checkpoint_dir``, ``precision``, ``train:``):
  stack ``lightning``;
* ``torchtune`` -- a torchtune recipe config (``_component_`` sections): stack
  ``torchtune``;
* ``deepspeed`` -- a DeepSpeed config (``zero_optimization``, ...): framework, ZeRO stage
  and offload; a DeepSpeed config names no training loop, so the scenario's stack is kept;
* ``accelerate`` -- an accelerate config (``distributed_type``, ``num_processes``, ...):
  GPUs, nodes, precision and the FSDP / DeepSpeed / Megatron-LM split; no stack either.

The result, :class:`ImportedConfig`, holds only what the file says: a partial
``training`` section, a partial ``hardware`` section, the model it names, the keys present
that MemFit does not model or does not read (``ignored``, each with its reason; keys with
no effect on a step's memory, such as learning rates and paths, pass quietly) and the
assumptions taken (``notes``). :func:`apply` merges it into a scenario-file dict.

Reading is bounded like every other file MemFit reads: a regular file of at most
:data:`MAX_CONFIG_BYTES`, UTF-8. YAML is first walked as the parser's events, counting
its nodes with every alias expanded and its nesting, and refused at the first excess
(a "billion laughs" document never gets built); what passes is read by
``yaml.safe_load`` (no tags that build Python objects). A file the config names (a
DeepSpeed config) is read only from the config's own folder, links followed, unless
``allow_outside_paths``; nothing such a file holds is ever shown. Every problem is an
:class:`~memfit.engine.errors.EstimateError` naming the file's own key (``lora_r``,
``train.micro_batch_size``, ``zero_optimization.stage``) and the values it accepts.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from memfit.engine.errors import EstimateError, shown
from memfit.engine.files import ALLOW_FLAG, PathLike, read_text
from memfit.engine.scenario_io import custom_gpu, scenario_from_dict, training_from_dict
from memfit.engine.specs import HardwareSpec
from memfit.engine.stacks import DEFAULTS as STACK_DEFAULT_FIELDS
from memfit.engine.train_configs.accelerate import _accelerate
from memfit.engine.train_configs.axolotl import _axolotl
from memfit.engine.train_configs.common import _Out, _Reader, preset_for
from memfit.engine.train_configs.deepspeed import _deepspeed_file
from memfit.engine.train_configs.hf import _training_arguments
from memfit.engine.train_configs.litgpt import _litgpt
from memfit.engine.train_configs.parse import (
    _FIELD,
    FORMATS,
    MAX_CONFIG_BYTES,
    MAX_DEPTH,
    MAX_NODES,
    ImportedConfig,
    _detect,
    _parse,
    detect_format,
)
from memfit.engine.train_configs.torchtune import _preset_of_component, _torchtune

_READERS: dict[str, Callable[[_Reader], None]] = {
    "axolotl": _axolotl,
    "training-arguments": _training_arguments,
    "litgpt": _litgpt,
    "torchtune": _torchtune,
    "deepspeed": _deepspeed_file,
    "accelerate": _accelerate,
}


# --------------------------------------------------------------------------------------
# the entry points


def _field_of(exc: EstimateError, origins: Mapping[str, str]) -> EstimateError:
    """An error of a MemFit field the import set, renamed to the file key it came from."""
    name = exc.field.removeprefix("training.")
    key = origins.get(name) or origins.get(exc.field)
    if key is None:
        return exc
    return EstimateError(key, f"{exc.detail} (as {exc.field})")


def import_training_config(
    path: PathLike | None = None,
    text: str | None = None,
    fmt: str | None = None,
    *,
    allow_outside_paths: bool = False,
) -> ImportedConfig:
    """Read the training config at ``path`` (or the config ``text``; with both, ``path``
    names the text) as the format ``fmt`` -- one of :data:`FORMATS`, else detected
    (:func:`detect_format`) -- into an :class:`ImportedConfig`.

    A file the config names (a DeepSpeed config) is looked for relative to the config's
    folder and read only when it resolves inside that folder, symbolic links followed; one
    outside is not read (a note says so) unless ``allow_outside_paths``. Text given as
    such names no files. Errors and notes never show what a named file holds."""
    if path is None and text is None:
        raise EstimateError(_FIELD, "give a file or the text of one")
    if fmt is not None and fmt not in FORMATS:
        raise EstimateError("format", f"got {shown(fmt)}, expected one of {', '.join(FORMATS)}")
    file = Path(path) if path is not None else None
    source = file.name if file is not None else "text"
    shown_name = source if file is not None else "the text"
    if text is None:
        assert file is not None
        text = read_text(file, _FIELD, MAX_CONFIG_BYTES)
    suffix = file.suffix.lower() if file is not None else ""
    data = _parse(text, shown_name, suffix)
    chosen = fmt or _detect(data, shown_name)
    base = file.parent if file is not None else None
    out = _Out(chosen, source, base, allow_outside_paths)
    _READERS[chosen](_Reader(data, "", out))
    preset: str | None = None
    if out.model is not None and chosen == "torchtune":
        preset = _preset_of_component(out.model)
        out.model = preset or out.model
    elif out.model is not None:
        preset = preset_for(out.model)
    origins = dict(out.origins)
    try:
        training_from_dict(copy.deepcopy(out.training))
        HardwareSpec(gpu=custom_gpu(80.0), **out.hardware)
    except EstimateError as exc:
        raise _field_of(exc, origins) from None
    return ImportedConfig(
        format=chosen,
        source=source,
        training=out.training,
        hardware=out.hardware,
        model=out.model,
        model_preset=preset,
        ignored=tuple(out.ignored),
        notes=tuple(out.notes),
        origins=origins,
    )


def apply(
    scenario_data: Mapping[str, Any], imported: ImportedConfig, *, replace_model: bool = False
) -> dict[str, Any]:
    """A copy of the scenario-file dict ``scenario_data`` with ``imported`` merged in.

    * ``training``: every field the file sets replaces the scenario's; the nested
      ``lora``, ``qlora``, ``parallelism``, ``offload`` sections are merged key by key.
      When the file implies a stack, ``training.stack`` is set and the stack's own choices
      of ordinary fields (``loss``, ``optimizer_impl``) replace the scenario's unless the
      file sets them, as choosing a stack does (:func:`memfit.engine.stacks.with_stack`); every
      other field the file does not set keeps the scenario's value;
    * ``hardware``: ``gpus_per_node`` / ``nodes`` where the file says;
    * ``model``: the scenario's, unless ``replace_model`` and the file names a preset
      (``imported.model_preset``), which then replaces it.

    The result is checked with :func:`~memfit.engine.scenario_io.scenario_from_dict`; an error
    in a field the import set names the file's key."""
    if not isinstance(scenario_data, Mapping):
        raise EstimateError(
            "scenario", f"expected a JSON object, got {type(scenario_data).__name__}"
        )
    out = copy.deepcopy(dict(scenario_data))
    training = out.get("training")
    if training is None:
        training = {}
    if not isinstance(training, dict):
        raise EstimateError("training", f"expected an object, got {shown(training)}")
    if "stack" in imported.training:
        for key in STACK_DEFAULT_FIELDS:
            if key not in imported.training:
                training.pop(key, None)
    for key, value in imported.training.items():
        if isinstance(value, dict):
            section = training.get(key)
            merged = dict(section) if isinstance(section, dict) else {}
            merged.update(copy.deepcopy(value))
            training[key] = merged
        else:
            training[key] = copy.deepcopy(value)
    out["training"] = training
    if imported.hardware:
        hardware = out.get("hardware")
        if not isinstance(hardware, dict):
            raise EstimateError("hardware", f"expected an object, got {shown(hardware)}")
        hardware.update(imported.hardware)
    if replace_model and imported.model_preset is not None:
        out["model"] = {"preset": imported.model_preset}
    try:
        scenario_from_dict(out)
    except EstimateError as exc:
        raise _field_of(exc, imported.origins) from None
    return out


__all__ = [
    "ALLOW_FLAG",
    "FORMATS",
    "MAX_CONFIG_BYTES",
    "MAX_DEPTH",
    "MAX_NODES",
    "ImportedConfig",
    "apply",
    "detect_format",
    "import_training_config",
    "preset_for",
]

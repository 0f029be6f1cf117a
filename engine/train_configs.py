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
:class:`~engine.errors.EstimateError` naming the file's own key (``lora_r``,
``train.micro_batch_size``, ``zero_optimization.stage``) and the values it accepts.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from engine import memo
from engine.errors import EstimateError, bounded, check_text, shown
from engine.files import MAX_DEPTH as FILE_DEPTH
from engine.files import PathLike, parse_json, read_text, resolves_inside
from engine.presets import load_model, model_names
from engine.scenario_io import custom_gpu, scenario_from_dict, training_from_dict
from engine.specs import (
    FreezeSpec,
    HardwareSpec,
    LoraSpec,
    OffloadSpec,
    ParallelismSpec,
    QuantSpec,
    TrainingSpec,
)
from engine.stacks import DEFAULTS as STACK_DEFAULT_FIELDS

#: the formats :func:`import_training_config` reads
FORMATS = ("axolotl", "training-arguments", "litgpt", "torchtune", "deepspeed", "accelerate")
#: the largest training config read: real ones are a few KiB
MAX_CONFIG_BYTES = 256 << 10
#: the deepest nesting of mappings and lists a YAML config may have (as a JSON one)
MAX_DEPTH = FILE_DEPTH
#: the most YAML nodes (scalars, lists, mappings) a config may expand to, aliases included
MAX_NODES = 10_000

_YAML_SUFFIXES = (".yaml", ".yml")
_FIELD = "training config"


# --------------------------------------------------------------------------------------
# the result


@dataclass(frozen=True)
class ImportedConfig:
    """What one training config says, in MemFit's scenario-file keys."""

    #: one of :data:`FORMATS`
    format: str
    #: the file's name (``"text"`` when the config was given as text)
    source: str
    #: a partial ``training`` section: only the fields the file sets (``stack`` from the
    #: format); nested ``lora``, ``qlora``, ``parallelism``, ``offload`` sections partial too
    training: dict[str, Any]
    #: a partial ``hardware`` section (``gpus_per_node``, ``nodes``) where the file says
    hardware: dict[str, Any]
    #: the model the file names: as it names it (a Hub id, a path), except torchtune's
    #: builder, given as the preset it builds when there is one (else as the builder)
    model: str | None
    #: the MemFit preset that model is, when that is obvious (see :func:`preset_for`)
    model_preset: str | None
    #: ``"key: reason"`` for every key present that MemFit does not model or does not read
    ignored: tuple[str, ...]
    #: the assumptions taken in reading the file
    notes: tuple[str, ...]
    #: the file key each imported field came from (``"lora.rank": "lora_r"``), for errors
    origins: dict[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------------------
# parsing: bounded YAML and JSON


class _Refused(yaml.YAMLError):  # type: ignore[misc]
    """A YAML document refused for its shape (too deep, too many nodes, a recursive alias)."""

    def __init__(self, what: str, mark: Any) -> None:
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        super().__init__(what + where)


#: the fastest parser PyYAML has (libyaml's, when built with it); only its events are used
_EVENTS_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _check_shape(text: str) -> None:
    """Refuse a YAML document before it is built when it expands to more than
    :data:`MAX_NODES` nodes or nests deeper than :data:`MAX_DEPTH` lists and mappings --
    every alias counted as its whole target -- or when an alias sits inside its own target.
    Reads the parser's events only, and stops at the first excess."""
    #: per open list or mapping: [expanded nodes, deepest nesting below it], its anchor
    open_: list[list[int]] = []
    anchors_open: list[str | None] = []
    shapes: dict[str, tuple[int, int]] = {}
    total = 0

    def add(size: int, depth: int, mark: Any) -> None:
        nonlocal total
        total += size
        if total > MAX_NODES:
            raise _Refused(f"more than {MAX_NODES:,} values with its aliases", mark)
        if len(open_) + depth > MAX_DEPTH:
            raise _Refused(f"nested deeper than {MAX_DEPTH} levels", mark)
        if open_:
            open_[-1][0] += size
            open_[-1][1] = max(open_[-1][1], depth)

    for event in yaml.parse(text, Loader=_EVENTS_LOADER):
        if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
            add(1, 1, event.start_mark)
            open_.append([1, 0])
            anchors_open.append(event.anchor)
        elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
            size, below = open_.pop()
            anchor = anchors_open.pop()
            if anchor is not None:
                shapes[anchor] = (size, below + 1)
            if open_:  # the node itself was counted when it opened: add what it holds
                open_[-1][0] += size - 1
                open_[-1][1] = max(open_[-1][1], below + 1)
        elif isinstance(event, yaml.ScalarEvent):
            add(1, 0, event.start_mark)
            if event.anchor is not None:
                shapes[event.anchor] = (1, 0)
        elif isinstance(event, yaml.AliasEvent):
            if event.anchor in anchors_open:
                raise _Refused(f"a recursive alias (*{event.anchor})", event.start_mark)
            shape = shapes.get(event.anchor)
            if shape is not None:  # an undefined alias is the loader's error to report
                add(shape[0], shape[1], event.start_mark)


class _UniqueKeys(yaml.SafeLoader):  # type: ignore[misc]
    """``yaml.safe_load``'s loader, refusing a key given twice in one mapping: two values
    for one setting, and which one the tool reading the file takes is its own choice. A
    key that overrides one merged in by ``<<: *anchor`` is no duplicate: that is what a
    merge is for."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    repeated = key in seen
                except TypeError:  # a list as a key: the constructor says so
                    continue
                if repeated:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {shown(key)} appears twice", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep)


def _parse_yaml(text: str, name: str) -> Any:
    """The YAML ``text`` built (plain data only, see :class:`_UniqueKeys`) once its shape
    passed :func:`_check_shape`; every failure an :class:`EstimateError`."""
    try:
        _check_shape(text)
        return yaml.load(text, Loader=_UniqueKeys)  # a SafeLoader: plain data only
    except _Refused as exc:
        raise EstimateError(_FIELD, f"{name} is refused: {exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        reason = " ".join(str(exc.problem or exc).split())
        raise EstimateError(_FIELD, f"{name} is not valid YAML ({where}{reason})") from None
    except yaml.YAMLError as exc:  # the reader's: an unprintable character
        reason = " ".join(str(exc).split())
        raise EstimateError(_FIELD, f"{name} is not valid YAML ({reason})") from None
    except RecursionError:
        raise EstimateError(_FIELD, f"{name} is nested too deeply to be a config") from None
    except ValueError as exc:  # an integer of more than 4,300 digits, a bad date
        raise EstimateError(_FIELD, f"{name} is not valid YAML ({exc})") from None


def _parse(text: str, name: str, suffix: str) -> dict[str, Any]:
    """The config's top-level mapping, parsed as JSON or YAML by its extension (JSON first
    for text that starts with a brace and has no YAML extension)."""
    size = len(text) if len(text) > MAX_CONFIG_BYTES else len(text.encode("utf-8", "replace"))
    if size > MAX_CONFIG_BYTES:
        raise EstimateError(
            _FIELD, f"{name} is {size:,} bytes; configs over {MAX_CONFIG_BYTES:,} bytes are refused"
        )
    text = text.removeprefix("\ufeff")
    data: Any
    if suffix == ".json":
        data = parse_json(text, _FIELD, name)
    elif suffix not in _YAML_SUFFIXES and text.lstrip().startswith(("{", "[")):
        try:
            data = parse_json(text, _FIELD, name)
        except EstimateError as json_error:
            try:
                data = _parse_yaml(text, name)
            except EstimateError:
                raise json_error from None
    else:
        data = _parse_yaml(text, name)
    if data is None:
        raise EstimateError(_FIELD, f"{name} is empty")
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else f"a single value ({shown(data)})"
        raise EstimateError(_FIELD, f"{name} holds {kind}; expected a mapping of keys")
    return data


# --------------------------------------------------------------------------------------
# format detection


#: keys that only one format has at its top level
_SIGNATURES: dict[str, frozenset[str]] = {
    "axolotl": frozenset(
        {
            "base_model",
            "base_model_config",
            "sequence_len",
            "micro_batch_size",
            "adapter",
            "lora_target_linear",
            "sample_packing",
            "pad_to_sequence_len",
            "flash_attention",
            "sdp_attention",
            "xformers_attention",
            "num_epochs",
            "dataset_prepared_path",
            "val_set_size",
            "train_on_inputs",
            "special_tokens",
            "wandb_project",
            "evals_per_epoch",
            "saves_per_epoch",
            "lora_model_dir",
        }
    ),
    "training-arguments": frozenset(
        {
            "per_device_train_batch_size",
            "per_device_eval_batch_size",
            "per_gpu_train_batch_size",
            "optim",
            "num_train_epochs",
            "lr_scheduler_type",
            "eval_strategy",
            "evaluation_strategy",
            "save_strategy",
            "logging_strategy",
            "report_to",
            "model_name_or_path",
            "use_peft",
            "max_seq_length",
            "dataset_text_field",
            "packing",
        }
    ),
    "litgpt": frozenset(
        {
            "checkpoint_dir",
            "out_dir",
            "lora_query",
            "lora_key",
            "lora_value",
            "lora_projection",
            "lora_mlp",
            "lora_head",
            "logger_name",
            "quantize",
            "num_nodes",
            "devices",
        }
    ),
    "torchtune": frozenset(
        {
            "enable_activation_checkpointing",
            "enable_activation_offloading",
            "optimizer_in_bwd",
            "max_steps_per_epoch",
            "fsdp_cpu_offload",
            "custom_sharded_layers",
            "log_every_n_steps",
            "checkpointer",
            "metric_logger",
        }
    ),
    "deepspeed": frozenset(
        {
            "zero_optimization",
            "train_micro_batch_size_per_gpu",
            "train_batch_size",
            "steps_per_print",
            "wall_clock_breakdown",
            "zero_allow_untested_optimizer",
            "zero_force_ds_cpu_optimizer",
            "gradient_clipping",
            "activation_checkpointing",
        }
    ),
    "accelerate": frozenset(
        {
            "compute_environment",
            "distributed_type",
            "num_processes",
            "num_machines",
            "machine_rank",
            "main_training_function",
            "mixed_precision",
            "deepspeed_config",
            "megatron_lm_config",
            "downcast_bf16",
            "rdzv_backend",
            "same_network",
            "gpu_ids",
        }
    ),
}


def _scores(data: Mapping[str, Any]) -> dict[str, int]:
    keys = {k for k in data if isinstance(k, str)}
    scores = {fmt: len(keys & sig) for fmt, sig in _SIGNATURES.items()}
    # torchtune's sections name the class that builds them
    components = sum(isinstance(v, dict) and "_component_" in v for v in data.values())
    scores["torchtune"] += 3 * components
    # LitGPT's training arguments are one section; so are its precision names
    train = data.get("train")
    if isinstance(train, dict) and {"global_batch_size", "micro_batch_size"} & set(train):
        scores["litgpt"] += 2
    precision = data.get("precision")
    if isinstance(precision, str) and precision.endswith(("-true", "-mixed")):
        scores["litgpt"] += 1
    return scores


def _detect(data: Mapping[str, Any], name: str) -> str:
    scores = _scores(data)
    best = max(scores.values())
    if best == 0:
        raise EstimateError(
            _FIELD,
            f"{name} is not a training config MemFit recognises; expected one of "
            f"{', '.join(FORMATS)} (give the format if it is one of them)",
        )
    top = [fmt for fmt in FORMATS if scores[fmt] == best]
    if len(top) > 1:
        raise EstimateError(
            _FIELD, f"{name} could be {' or '.join(top)}; give the format to read it as"
        )
    return top[0]


def detect_format(path: str | None, text: str) -> str:
    """The format (one of :data:`FORMATS`) of the config ``text``, read from ``path`` (for
    its name and extension; ``None`` for text from elsewhere), by the keys only one format
    has. Text that fits no format, or two equally, is an :class:`EstimateError`."""
    name = Path(path).name if path else "the text"
    suffix = Path(path).suffix.lower() if path else ""
    return _detect(_parse(text, name, suffix), name)


# --------------------------------------------------------------------------------------
# reading keys


_SECTIONS: dict[str, type[Any]] = {
    "lora": LoraSpec,
    "qlora": QuantSpec,
    "freeze": FreezeSpec,
    "parallelism": ParallelismSpec,
    "offload": OffloadSpec,
}


class _Out:
    """What a config says, collected as it is read."""

    def __init__(
        self, fmt: str, source: str, base: Path | None, allow_outside_paths: bool = False
    ) -> None:
        self.format = fmt
        self.source = source
        #: the config's folder, where files it names (a DeepSpeed config) are looked for
        self.base = base
        #: files it names may be read outside ``base`` too
        self.allow_outside_paths = allow_outside_paths
        self.training: dict[str, Any] = {}
        self.hardware: dict[str, Any] = {}
        self.model: str | None = None
        self.ignored: list[str] = []
        self.notes: list[str] = []
        self.origins: dict[str, str] = {}

    def set(self, name: str, value: Any, key: str) -> None:
        """Set the MemFit field ``name`` (``"micro_batch_size"``, ``"lora.rank"``) from the
        file's ``key``: checked as that field alone, an error naming ``key``."""
        section, _, leaf = name.rpartition(".")
        checked: Any = tuple(value) if isinstance(value, list) else value
        try:
            if section:
                _SECTIONS[section](**{leaf: checked})
            else:
                TrainingSpec(**{leaf: checked})
        except EstimateError as exc:
            raise EstimateError(key, exc.detail) from None
        if section:
            self.training.setdefault(section, {})[leaf] = value
        else:
            self.training[leaf] = value
        self.origins[name] = key

    def set_hardware(self, name: str, value: Any, key: str) -> None:
        try:
            HardwareSpec(gpu=custom_gpu(80.0), **{name: value})
        except EstimateError as exc:
            raise EstimateError(key, exc.detail) from None
        self.hardware[name] = value
        self.origins[f"hardware.{name}"] = key

    def get(self, name: str) -> Any:
        section, _, leaf = name.rpartition(".")
        where = self.training.get(section, {}) if section else self.training
        return where.get(leaf)

    def ignore(self, key: str, reason: str) -> None:
        self.ignored.append(bounded(f"{key}: {reason}"))

    def note(self, text: str) -> None:
        """Say ``text`` once; a value of the file it repeats is cut (:func:`bounded`)."""
        text = bounded(text)
        if text not in self.notes:
            self.notes.append(text)


class _Reader:
    """Typed reads of one mapping of the config; an absent key and ``null`` read as
    ``None``; every error names the key as the file spells it (with its section)."""

    def __init__(self, data: Mapping[Any, Any], prefix: str, out: _Out) -> None:
        self.data = data
        self.prefix = prefix
        self.out = out
        self.seen: set[Any] = set()

    def key(self, key: str) -> str:
        return self.prefix + key

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def raw(self, key: str) -> Any:
        self.seen.add(key)
        return self.data.get(key)

    def integer(self, key: str) -> int | None:
        value = self.raw(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise EstimateError(self.key(key), f"got {shown(value)}, expected an integer")
        return value

    def number(self, key: str) -> float | None:
        value = self.raw(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise EstimateError(self.key(key), f"got {shown(value)}, expected a number")
        return value

    def boolean(self, key: str) -> bool | None:
        value = self.raw(key)
        if value is None or isinstance(value, bool):
            return value
        raise EstimateError(self.key(key), f"got {shown(value)}, expected true or false")

    def text(self, key: str) -> str | None:
        value = self.raw(key)
        if value is None:
            return None
        return check_text(self.key(key), value)

    def choice(self, key: str, choices: Iterable[str], lower: bool = False) -> str | None:
        value = self.text(key)
        if value is None:
            return None
        options = tuple(choices)
        if (value.lower() if lower else value) not in options:
            raise EstimateError(
                self.key(key), f"got {shown(value)}, expected one of {', '.join(options)}"
            )
        return value.lower() if lower else value

    def names(self, key: str) -> list[str] | None:
        """A list of names (a single name is a list of one)."""
        value = self.raw(key)
        if value is None:
            return None
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            raise EstimateError(self.key(key), f"got {shown(value)}, expected a list of names")
        return [check_text(self.key(key), item) for item in items]

    def section(self, key: str) -> _Reader | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise EstimateError(self.key(key), f"got {shown(value)}, expected a mapping of keys")
        return _Reader(value, self.key(key) + ".", self.out)

    def flag(self, key: str, reason: str) -> None:
        """``key`` is ignored with ``reason`` when it is on: any value but null, false, 0
        and an empty text, list or mapping."""
        value = self.raw(key)
        off = value is None or value is False or value in ("", [], {})
        if isinstance(value, int | float) and not isinstance(value, bool):
            off = value == 0
        if not off:
            self.out.ignore(self.key(key), reason)

    def rest(self, known: Iterable[str]) -> None:
        """Every key not read and not in ``known`` (keys with no effect on a step's
        memory) is listed as ignored: MemFit does not read it."""
        known_keys = set(known)
        for key, value in self.data.items():
            if key in self.seen or key in known_keys or value is None:
                continue
            name = key if isinstance(key, str) else shown(key)
            self.out.ignore(self.key(name), "not a setting MemFit reads")


# --------------------------------------------------------------------------------------
# shared vocabularies: precision, optimizers, attention, LoRA targets, model presets


_NOT_MODELLED = "which MemFit does not model"

#: transformers' ``optim`` names (``OptimizerNames``, also Axolotl's ``optimizer``):
#: MemFit optimizer and implementation
_HF_OPTIMIZERS: dict[str, tuple[str, str | None]] = {
    "adamw_torch": ("adamw", "foreach"),
    "adamw_torch_fused": ("adamw", "fused"),
    "adamw_apex_fused": ("adamw", "fused"),
    "adamw_hf": ("adamw", "for-loop"),
    "adafactor": ("adafactor", None),
    "sgd": ("sgd", None),
    "adamw_bnb_8bit": ("adamw-8bit", None),
    "adamw_8bit": ("adamw-8bit", None),
    "adamw_torch_8bit": ("adamw-8bit", None),
    "ao_adamw_8bit": ("adamw-8bit", None),
    "paged_adamw_8bit": ("paged-adamw-8bit", None),
    "paged_adamw_32bit": ("adamw", None),
    "lion_32bit": ("lion", None),
    "paged_lion_32bit": ("lion", None),
}
#: optimizer names the tools accept that MemFit does not model (states of other sizes)
_HF_UNMODELLED = frozenset(
    {
        "adamw_torch_xla",
        "adamw_torch_npu_fused",
        "adamw_anyprecision",
        "adamw_torch_4bit",
        "ao_adamw_4bit",
        "ao_adamw_fp8",
        "optimi_adamw",
        "adopt_adamw",
        "came_pytorch",
        "muon",
        "dion",
        "adagrad",
        "ademamix",
        "ademamix_8bit",
        "paged_ademamix_32bit",
        "paged_ademamix_8bit",
        "lion_8bit",
        "paged_lion_8bit",
        "rmsprop",
        "rmsprop_bnb",
        "rmsprop_bnb_8bit",
        "rmsprop_bnb_32bit",
        "galore_adamw",
        "galore_adamw_8bit",
        "galore_adafactor",
        "galore_adamw_layerwise",
        "galore_adamw_8bit_layerwise",
        "galore_adafactor_layerwise",
        "lomo",
        "adalomo",
        "grokadamw",
        "schedule_free_radam",
        "schedule_free_adamw",
        "schedule_free_sgd",
        "apollo_adamw",
        "apollo_adamw_layerwise",
        "stable_adamw",
    }
)
#: optimizer classes as torchtune's ``_component_`` and LitGPT's ``class_path`` name them
_CLASS_OPTIMIZERS: dict[str, str] = {
    "torch.optim.AdamW": "adamw",
    "torch.optim.Adam": "adamw",
    "torch.optim.SGD": "sgd",
    "bitsandbytes.optim.AdamW8bit": "adamw-8bit",
    "bitsandbytes.optim.Adam8bit": "adamw-8bit",
    "bitsandbytes.optim.PagedAdamW8bit": "paged-adamw-8bit",
    "bitsandbytes.optim.PagedAdam8bit": "paged-adamw-8bit",
    "bitsandbytes.optim.PagedAdamW": "adamw",
    "bitsandbytes.optim.PagedAdamW32bit": "adamw",
    "bitsandbytes.optim.Lion": "lion",
    "lion_pytorch.Lion": "lion",
    "torchao.optim.AdamW8bit": "adamw-8bit",
    "torchao.prototype.low_bit_optim.AdamW8bit": "adamw-8bit",
    "transformers.optimization.Adafactor": "adafactor",
    "transformers.Adafactor": "adafactor",
}
_CLASS_UNMODELLED = frozenset(
    {
        "torch.optim.Adagrad",
        "torch.optim.RMSprop",
        "torch.optim.Adamax",
        "torch.optim.NAdam",
        "torch.optim.RAdam",
        "torch.optim.LBFGS",
        "bitsandbytes.optim.Lion8bit",
        "bitsandbytes.optim.PagedLion8bit",
        "torchao.optim.AdamW4bit",
        "torchao.optim.AdamWFp8",
        "torchao.prototype.low_bit_optim.AdamW4bit",
        "torchao.prototype.low_bit_optim.AdamWFp8",
    }
)
_CPU_OFFLOAD_OPTIMIZERS = (
    "torchao.optim.CPUOffloadOptimizer",
    "torchao.prototype.low_bit_optim.CPUOffloadOptimizer",
)
_PAGED_32 = (
    "paged_adamw_32bit",
    "bitsandbytes.optim.PagedAdamW",
    "bitsandbytes.optim.PagedAdamW32bit",
)


def _hf_optimizer(out: _Out, name: str, key: str) -> None:
    """A transformers / Axolotl optimizer name."""
    name = name.strip()
    if name in _HF_UNMODELLED:
        raise EstimateError(
            key,
            f"got {shown(name)}, {_NOT_MODELLED}; expected one of {', '.join(_HF_OPTIMIZERS)}",
        )
    if name not in _HF_OPTIMIZERS:
        raise EstimateError(key, f"got {shown(name)}, expected one of {', '.join(_HF_OPTIMIZERS)}")
    optimizer, impl = _HF_OPTIMIZERS[name]
    out.set("optimizer", optimizer, key)
    if impl is not None:
        out.set("optimizer_impl", impl, key)
    _optimizer_notes(out, name, key)


def _optimizer_notes(out: _Out, name: str, key: str) -> None:
    if name in _PAGED_32:
        out.note(
            f"{key} {name}: paged 32-bit AdamW holds AdamW's states (paging moves them only under "
            "memory pressure)"
        )
    elif "torchao" in name or name in ("adamw_torch_8bit", "ao_adamw_8bit"):
        out.note(
            f"{key} {name}: torchao's 8-bit AdamW counted as bitsandbytes' (one byte per state)"
        )


def _class_optimizer(out: _Out, key: str, path: str, args: _Reader | None) -> None:
    """An optimizer named by its class (``torch.optim.AdamW``); ``args`` holds its keyword
    arguments (``fused``, ``foreach``, ``momentum``)."""
    if "." not in path:  # LitGPT: a bare name is a class of torch.optim
        path = f"torch.optim.{path}"
    if path in _CLASS_UNMODELLED:
        raise EstimateError(
            key,
            f"got {shown(path)}, {_NOT_MODELLED}; expected one of {', '.join(_CLASS_OPTIMIZERS)}",
        )
    if path not in _CLASS_OPTIMIZERS:
        raise EstimateError(
            key, f"got {shown(path)}, expected one of {', '.join(_CLASS_OPTIMIZERS)}"
        )
    optimizer = _CLASS_OPTIMIZERS[path]
    if args is not None and optimizer == "sgd":
        momentum = args.number("momentum")
        if momentum:
            optimizer = "sgd-momentum"
    out.set("optimizer", optimizer, key)
    if args is not None and path.startswith("torch.optim."):
        fused, foreach = args.boolean("fused"), args.boolean("foreach")
        if fused:
            out.set("optimizer_impl", "fused", args.key("fused"))
        elif foreach is not None:
            out.set("optimizer_impl", "foreach" if foreach else "for-loop", args.key("foreach"))
    _optimizer_notes(out, path, key)


def _component_optimizer(out: _Out, opt: _Reader) -> None:
    """torchtune's ``optimizer:`` section (its keyword arguments beside ``_component_``),
    torchao's ``CPUOffloadOptimizer`` wrapping an ``optimizer_class`` included."""
    component = opt.text("_component_")
    if component is None:
        raise EstimateError(opt.key("_component_"), "missing: the optimizer's class")
    if component in _CPU_OFFLOAD_OPTIMIZERS:
        inner = opt.text("optimizer_class") or "torch.optim.AdamW"
        _class_optimizer(out, opt.key("optimizer_class"), inner, opt)
        out.set("offload.optimizer", "cpu", opt.key("_component_"))
        if opt.boolean("offload_gradients") is False:
            out.note(
                f"{opt.key('_component_')}: CPUOffloadOptimizer without offload_gradients keeps "
                "the gradients on the GPU until the step; MemFit's optimizer offload moves them"
            )
        return
    _class_optimizer(out, opt.key("_component_"), component, opt)


#: attention implementations as transformers, TRL and Axolotl name them
_ATTENTION = {
    "flash_attention_2": "flash",
    "flash_attention_3": "flash",
    "flash": "flash",
    "sdpa": "sdpa",
    "eager": "eager",
    "xformers": "mem-efficient",
}


def _attention(out: _Out, value: str, key: str) -> None:
    if value in ("flex_attention", "flex") or value.startswith("kernels-"):
        out.ignore(key, f"{value} attention is not modelled; the scenario's attention is kept")
        return
    if value not in _ATTENTION:
        raise EstimateError(key, f"got {shown(value)}, expected one of {', '.join(_ATTENTION)}")
    out.set("attention", _ATTENTION[value], key)


def _targets(out: _Out, names: list[str], key: str) -> None:
    """LoRA targets as PEFT names them; ``all-linear`` (any spelling) is every linear."""
    if any(n.replace("_", "-").lower() == "all-linear" for n in names):
        out.set("lora.targets", ["all-linear"], key)
    else:
        out.set("lora.targets", list(dict.fromkeys(names)), key)


def _normalized(name: str) -> str:
    """A model name reduced to what tells architectures apart: lower case, the owner and
    the variant suffixes that keep the architecture (``-Instruct``, ``-hf``, ``-it``...) off."""
    name = name.strip().rstrip("/").replace("\\", "/").split("/")[-1].lower()
    name = name.removeprefix("meta-")
    changed = True
    while changed:
        changed = False
        for suffix in ("-instruct", "-chat", "-hf", "-it", "-pt", "-base", "-fp16", "-bf16"):
            if name.endswith(suffix):
                name, changed = name.removesuffix(suffix), True
    return name


@memo.cached(maxsize=1)
def _preset_index() -> dict[str, str]:
    """Normalized model name -> preset, from each preset's name and the Hub id its
    source names (``config.json of meta-llama/Llama-3.1-8B on the Hugging Face Hub``)."""
    index: dict[str, str] = {}
    for name in model_names():
        index.setdefault(_normalized(name), name)
        match = re.match(
            r"config\.json of (\S+/\S+) on the Hugging Face Hub", load_model(name).source
        )
        if match:
            index.setdefault(_normalized(match.group(1)), name)
    return index


def preset_for(model: str) -> str | None:
    """The MemFit preset the model ``model`` names (a Hub id, a local path, a LitGPT
    checkpoint dir), when its name is a preset's up to the owner and a variant suffix that
    keeps the architecture (``meta-llama/Llama-3.1-8B-Instruct`` is ``llama-3.1-8b``);
    ``None`` otherwise.

    >>> preset_for("checkpoints/meta-llama/Meta-Llama-3.1-8B"), preset_for("my/model")
    ('llama-3.1-8b', None)
    """
    return _preset_index().get(_normalized(model))


#: torchtune model builders (without ``lora_`` / ``qlora_`` and ``_base`` / ``_instruct``)
_TORCHTUNE_MODELS = {
    "llama2_7b": "llama-2-7b",
    "llama2_13b": "llama-2-13b",
    "llama2_70b": "llama-2-70b",
    "llama3_8b": "llama-3-8b",
    "llama3_70b": "llama-3-70b",
    "llama3_1_8b": "llama-3.1-8b",
    "llama3_1_70b": "llama-3.1-70b",
    "llama3_1_405b": "llama-3.1-405b",
    "llama3_2_1b": "llama-3.2-1b",
    "llama3_2_3b": "llama-3.2-3b",
    "mistral_7b": "mistral-7b-v0.1",
    "gemma_2b": "gemma-2b",
    "gemma_7b": "gemma-7b",
    "gemma2_2b": "gemma-2-2b",
    "gemma2_9b": "gemma-2-9b",
    "gemma2_27b": "gemma-2-27b",
    "phi3_mini": "phi-3-mini",
    "qwen2_5_0_5b": "qwen2.5-0.5b",
    "qwen2_5_1_5b": "qwen2.5-1.5b",
    "qwen2_5_3b": "qwen2.5-3b",
    "qwen2_5_7b": "qwen2.5-7b",
    "qwen2_5_14b": "qwen2.5-14b",
    "qwen2_5_32b": "qwen2.5-32b",
    "qwen2_5_72b": "qwen2.5-72b",
    "qwen3_0_6b": "qwen3-0.6b",
    "qwen3_8b": "qwen3-8b",
}


def _name_model(out: _Out, model: str, key: str) -> None:
    out.model = model
    preset = preset_for(model)
    if preset is None:
        out.note(f"{key} {shown(model)} is not a MemFit preset: the scenario's model is kept")


def _sequence(out: _Out, value: int | None, key: str, packed: bool | None) -> None:
    if value is None:
        return
    out.set("sequence_length", value, key)
    if packed:
        out.note(f"{key} {value}: samples are packed into rows of {value} tokens")
    else:
        out.note(
            f"{key} {value} used as the sequence length of every micro-batch "
            "(unpacked batches are padded to their longest sample, at most this)"
        )


# --------------------------------------------------------------------------------------
# parallelism sections shared by several formats: FSDP and DeepSpeed


_FSDP_OPTIONS = (
    "full_shard",
    "shard_grad_op",
    "hybrid_shard",
    "hybrid_shard_zero2",
    "no_shard",
    "offload",
    "auto_wrap",
)
_FSDP_STRATEGIES = {
    "FULL_SHARD": (3, False),
    "SHARD_GRAD_OP": (2, False),
    "NO_SHARD": (0, False),
    "HYBRID_SHARD": (3, True),
    "HYBRID_SHARD_ZERO2": (2, True),
    "_HYBRID_SHARD_ZERO2": (2, True),
}
#: accelerate's numbered strategies (its older configs write 1 for FULL_SHARD)
_FSDP_NUMBERS = {
    1: "FULL_SHARD",
    2: "SHARD_GRAD_OP",
    3: "NO_SHARD",
    4: "HYBRID_SHARD",
    5: "HYBRID_SHARD_ZERO2",
}
#: FSDP settings with no effect MemFit models (wrapping, state dicts, loading)
_FSDP_QUIET = frozenset(
    {
        "auto_wrap_policy",
        "transformer_layer_cls_to_wrap",
        "min_num_params",
        "backward_prefetch",
        "backward_prefetch_policy",
        "forward_prefetch",
        "limit_all_gathers",
        "use_orig_params",
        "sync_module_states",
        "cpu_ram_efficient_loading",
        "state_dict_type",
        "xla",
        "xla_fsdp_settings",
        "xla_fsdp_grad_ckpt",
        "xla_fsdp_v2",
        "version",
        "mixed_precision_policy",
    }
)


def _zero(out: _Out, stage: int, hybrid: bool, key: str) -> None:
    out.set("parallelism.zero_stage", stage, key)
    if hybrid:
        out.set("parallelism.hybrid_shard", True, key)


def _fsdp(out: _Out, options: list[str] | None, config: _Reader | None, key: str) -> None:
    """FSDP as transformers' ``fsdp`` options and ``fsdp_config`` (or accelerate's
    ``fsdp_config``) give it; the config's keys are read with or without their ``fsdp_``
    prefix, as transformers does."""
    out.set("parallelism.framework", "pytorch", key)
    stage, hybrid, offload = 3, False, False
    for option in options or ():
        if option not in _FSDP_OPTIONS:
            raise EstimateError(
                key, f"got {shown(option)}, expected one of {', '.join(_FSDP_OPTIONS)}"
            )
        if option == "offload":
            offload = True
        elif option != "auto_wrap":
            stage, hybrid = _FSDP_STRATEGIES[option.upper()]
    if config is not None:
        names = {k.removeprefix("fsdp_") if isinstance(k, str) else k: k for k in config.data}

        def read(short: str) -> Any:
            return config.raw(names[short]) if short in names else None

        def where(short: str) -> str:
            return config.key(names[short])

        strategy = read("sharding_strategy")
        reshard = read("reshard_after_forward")
        if isinstance(reshard, str):  # accelerate >= 1.6 names FSDP1's strategy so
            strategy, reshard = reshard, None
        if strategy is not None:
            label = (
                where("sharding_strategy")
                if "sharding_strategy" in names
                else where("reshard_after_forward")
            )
            if isinstance(strategy, int) and not isinstance(strategy, bool):
                strategy = _FSDP_NUMBERS.get(strategy, strategy)
            if not isinstance(strategy, str) or strategy.upper() not in _FSDP_STRATEGIES:
                accepted = ", ".join([*list(_FSDP_STRATEGIES)[:5], "1-5"])
                raise EstimateError(label, f"got {shown(strategy)}, expected one of {accepted}")
            stage, hybrid = _FSDP_STRATEGIES[strategy.upper()]
        if reshard is not None:
            if not isinstance(reshard, bool):
                raise EstimateError(
                    where("reshard_after_forward"), f"got {shown(reshard)}, expected true or false"
                )
            if not reshard:  # FSDP2 keeps the gathered parameters from forward to backward
                stage = min(stage, 2)
        for short in ("offload_params", "cpu_offload"):
            value = read(short)
            if value is not None:
                if not isinstance(value, bool):
                    raise EstimateError(where(short), f"got {shown(value)}, expected true or false")
                offload = offload or value
        checkpointing = read("activation_checkpointing")
        if checkpointing is not None:
            if not isinstance(checkpointing, bool):
                raise EstimateError(
                    where("activation_checkpointing"),
                    f"got {shown(checkpointing)}, expected true or false",
                )
            if checkpointing:
                out.set("activation_checkpointing", "full", where("activation_checkpointing"))
        for short, original in names.items():
            if (
                short not in _FSDP_QUIET
                and original not in config.seen
                and config.data[original] is not None
            ):
                config.out.ignore(config.key(str(original)), "not a setting MemFit reads")
        config.seen.update(names.values())
    _zero(out, stage, hybrid, key)
    if offload:
        _fsdp_offload(out, stage, key)


def _fsdp_offload(out: _Out, stage: int, key: str) -> None:
    """FSDP's CPU offload keeps the parameter shards and their gradients on the host and
    steps the optimizer there."""
    out.set("offload.optimizer", "cpu", key)
    if stage == 3:
        out.set("offload.parameters", "cpu", key)
    else:
        out.note(f"{key}: CPU offload without FULL_SHARD read as optimizer (and gradient) offload")


_OFFLOAD_DEVICES = ("none", "cpu", "nvme")
#: DeepSpeed settings whose value MemFit takes as DeepSpeed's default (its buckets)
_DS_BUCKETS = (
    "reduce_bucket_size",
    "allgather_bucket_size",
    "stage3_prefetch_bucket_size",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
    "stage3_param_persistence_threshold",
    "sub_group_size",
)
_DS_QUIET_ZERO = frozenset(
    {
        "overlap_comm",
        "contiguous_gradients",
        "reduce_scatter",
        "allgather_partitions",
        "round_robin_gradients",
        "stage3_gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save",
        "load_from_fp32_weights",
        "elastic_checkpoint",
        "ignore_unused_parameters",
        "cpu_offload",
        "memory_efficient_linear",
        "use_multi_rank_bucket_allreduce",
        "log_trace_cache_warnings",
    }
)
_DS_QUIET = frozenset(
    {
        "scheduler",
        "gradient_clipping",
        "steps_per_print",
        "wall_clock_breakdown",
        "prescale_gradients",
        "gradient_predivide_factor",
        "communication_data_type",
        "zero_allow_untested_optimizer",
        "zero_force_ds_cpu_optimizer",
        "flops_profiler",
        "tensorboard",
        "wandb",
        "csv_monitor",
        "comet",
        "comms_logger",
        "dump_state",
        "checkpoint",
        "elasticity",
        "aio",
        "memory_breakdown",
        "sparse_gradients",
        "seed",
        "dataloader_drop_last",
        "train_batch_size",
    }
)
_DS_OPTIMIZERS = {"Adam": "adamw", "AdamW": "adamw", "Lion": "lion"}


def _auto(value: Any) -> bool:
    return isinstance(value, str) and value == "auto"


def _deepspeed(out: _Out, ds: _Reader, key: str) -> None:
    """A DeepSpeed config (a file of its own, or the dict a Trainer or accelerate holds)."""
    out.set("parallelism.framework", "deepspeed", key)
    zero = ds.section("zero_optimization")
    value = zero.raw("stage") if zero is not None else None
    stage = 0
    if _auto(value):
        out.note(f'{ds.key("zero_optimization.stage")} is "auto": the launcher sets the stage')
    elif value is not None:
        out.set("parallelism.zero_stage", value, ds.key("zero_optimization.stage"))
        stage = value
    else:
        out.set("parallelism.zero_stage", 0, ds.key("zero_optimization.stage"))
        out.note(f"{ds.key('zero_optimization.stage')} not set: DeepSpeed's default, stage 0")
    if zero is not None:
        for section, target in (
            ("offload_optimizer", "offload.optimizer"),
            ("offload_param", "offload.parameters"),
        ):
            sub = zero.section(section)
            if sub is None:
                continue
            device = sub.choice("device", _OFFLOAD_DEVICES)
            if device is None or device == "none":
                continue
            if target == "offload.parameters" and stage < 3:
                out.ignore(
                    sub.key("device"),
                    "parameter offload needs ZeRO stage 3 (DeepSpeed ignores it below)",
                )
                continue
            out.set(target, device, sub.key("device"))
            sub.rest(
                (
                    "pin_memory",
                    "buffer_count",
                    "buffer_size",
                    "nvme_path",
                    "fast_init",
                    "ratio",
                    "pipeline",
                    "pipeline_read",
                    "pipeline_write",
                    "max_in_cpu",
                )
            )
        for bucket in _DS_BUCKETS:
            value = zero.raw(bucket)
            if value is not None and not _auto(value):
                out.ignore(zero.key(bucket), "DeepSpeed's default is modelled, not this value")
        zero.rest(_DS_QUIET_ZERO)
    precision = None
    for name, label in (("bf16", "bf16-mixed"), ("bfloat16", "bf16-mixed"), ("fp16", "fp16-mixed")):
        sub = ds.section(name)
        if sub is None:
            continue
        enabled = sub.raw("enabled")
        if _auto(enabled):
            out.note(f'{sub.key("enabled")} is "auto": the precision comes from the Trainer')
        elif enabled is not None:
            if not isinstance(enabled, bool):
                raise EstimateError(
                    sub.key("enabled"), f'got {shown(enabled)}, expected true, false or "auto"'
                )
            if enabled:
                if precision is not None:
                    raise EstimateError(sub.key("enabled"), "bf16 and fp16 are both enabled")
                precision = label
                out.set("precision", label, sub.key("enabled"))
        sub.seen.update(sub.data)  # loss scaling and the like: no effect on memory
    micro = ds.raw("train_micro_batch_size_per_gpu")
    if _auto(micro):
        where = ds.key("train_micro_batch_size_per_gpu")
        out.note(f'{where} is "auto": the Trainer\'s per-device batch is used')
    elif micro is not None:
        out.set("micro_batch_size", micro, ds.key("train_micro_batch_size_per_gpu"))
    accum = ds.raw("gradient_accumulation_steps")
    if accum is not None and not _auto(accum):
        out.set("gradient_accumulation_steps", accum, ds.key("gradient_accumulation_steps"))
    total = ds.raw("train_batch_size")
    if (
        isinstance(total, int)
        and not isinstance(total, bool)
        and isinstance(micro, int)
        and isinstance(accum, int)
        and micro > 0
        and accum > 0
    ):
        out.note(
            f"train_batch_size {total} = {micro} x {accum} x {total // (micro * accum)} GPUs (the "
            "GPUs are not set from it)"
        )
    opt = ds.section("optimizer")
    if opt is not None:
        kind = opt.text("type")
        if kind is not None:
            if kind not in _DS_OPTIMIZERS:
                raise EstimateError(
                    opt.key("type"),
                    f"got {shown(kind)}, expected one of {', '.join(_DS_OPTIMIZERS)}",
                )
            out.set("optimizer", _DS_OPTIMIZERS[kind], opt.key("type"))
            params = opt.section("params")
            torch_adam = params.boolean("torch_adam") if params is not None else None
            if kind != "Lion":
                out.set("optimizer_impl", "foreach" if torch_adam else "fused", opt.key("type"))
            if params is not None:
                params.seen.update(params.data)
    if ds.has("activation_checkpointing"):
        ds.raw("activation_checkpointing")
        out.ignore(
            ds.key("activation_checkpointing"),
            "configures deepspeed.checkpointing for models that call it; whether the model "
            "checkpoints is the training script's choice",
        )
    for name, reason in (
        ("data_types", "the gradient accumulation dtype is not modelled"),
        ("amp", "apex AMP is not modelled"),
        ("pipeline", "the pipeline split is set in the model code"),
        ("sequence_parallel_size", "DeepSpeed-Ulysses sequence parallelism is not modelled"),
        ("compression_training", "compression training is not modelled"),
        ("zero_quantized_weights", "ZeRO++ quantized weights are not modelled"),
        ("zero_hpz_partition_size", "ZeRO++ hierarchical partitioning is not modelled"),
    ):
        ds.flag(name, reason)
    ds.rest(_DS_QUIET)


_ZERO_NAME = re.compile(r"zero[_-]?([0-3])", re.IGNORECASE)


#: the flag that lets a config name files outside its folder, as the notes name it
ALLOW_FLAG = "--allow-outside-paths"
#: keys a DeepSpeed config has at its top level; a named file with none of them is no
#: DeepSpeed config (a token, a page, someone else's settings) and is not read further
_DS_TOP_KEYS = _SIGNATURES["deepspeed"] | {
    "bf16", "bfloat16", "fp16", "optimizer", "scheduler", "gradient_accumulation_steps",
    "amp", "data_types", "zero_quantized_weights", "zero_hpz_partition_size",
}  # fmt: skip
_WHERE = re.compile(r"line \d+, column \d+")
_UNSHOWN = "what a file named by the config holds is not shown"


def _named_file(out: _Out, key: str, path: str) -> Path | str | None:
    """Where to read the file that the config's ``key`` names as ``path``: relative to the
    config's folder, and only when it resolves inside that folder, links followed (unless
    ``allow_outside_paths``). ``None`` when there is nothing to read (text given as such
    has no folder; no such file); a reason, in words, when the file is not read."""
    if out.base is None:
        return None
    target = Path(path)
    if not target.is_absolute():
        target = out.base / target
    if not out.allow_outside_paths and not resolves_inside(target, out.base):
        return f"was not read, being outside the config's folder (allow it with {ALLOW_FLAG})"
    return target if os.path.exists(target) else None  # a dangling link: not there


def _unshown(exc: EstimateError, key: str, name: str) -> EstimateError:
    """An error met in the file ``name`` that the config's ``key`` names, without anything
    the file holds: its values, its text, its YAML anchors. What is accepted is kept (the
    engine's own words after "expected"), and where, for a file that does not parse."""
    if exc.field.startswith(f"{key}[{name}]"):
        _, sep, accepted = exc.detail.rpartition("expected ")
        tail = f"; expected {accepted}" if sep else ""
        return EstimateError(exc.field, f"the value {name} gives is refused{tail} ({_UNSHOWN})")
    where = _WHERE.search(exc.detail)
    at = f" at {where.group()}" if where else ""
    return EstimateError(
        key,
        f"{name} is not a DeepSpeed config MemFit reads (not a JSON or YAML mapping of "
        f"DeepSpeed keys{at})",
    )


def _deepspeed_reference(out: _Out, value: Any, key: str) -> None:
    """The ``deepspeed`` key of a Trainer or Axolotl config: a DeepSpeed config as a dict,
    or the path of one: read when it is in the config's folder (:func:`_named_file`), else
    its name is read for the ZeRO stage, as Axolotl's shipped
    ``deepspeed_configs/zero3_bf16.json``. Nothing the named file holds is ever shown."""
    if isinstance(value, dict):
        _deepspeed(out, _Reader(value, key + ".", out), key)
        return
    path = check_text(key, value)
    target = _named_file(out, key, path)
    if isinstance(target, Path):
        # a FIFO, a device or a folder is refused here, at once, by read_text
        text = read_text(target, key, MAX_CONFIG_BYTES)
        try:
            data = _parse(text, target.name, target.suffix.lower())
            if not _DS_TOP_KEYS & set(data):
                raise EstimateError(_FIELD, "no DeepSpeed key")
            _deepspeed(out, _Reader(data, f"{key}[{target.name}].", out), key)
        except EstimateError as exc:
            raise _unshown(exc, key, target.name) from None
        return
    why = target or "was not found"
    out.set("parallelism.framework", "deepspeed", key)
    match = _ZERO_NAME.search(Path(path).name)
    if match is None:
        out.note(f"{key} {shown(path)} {why}: DeepSpeed with the scenario's ZeRO stage")
        return
    stage = int(match.group(1))
    out.set("parallelism.zero_stage", stage, key)
    name = Path(path).name.lower()
    if stage == 3 and "cpuoffload_all" in name:
        out.set("offload.optimizer", "cpu", key)
        out.set("offload.parameters", "cpu", key)
    elif stage == 3 and "cpuoffload_params" in name:
        out.set("offload.parameters", "cpu", key)
    out.note(f"{key} {shown(path)} {why}: ZeRO stage {stage} read from its name")


# --------------------------------------------------------------------------------------
# Axolotl


_AXOLOTL_QUIET = frozenset(
    {
        "base_model_config", "model_type", "tokenizer_type", "tokenizer_config",
        "tokenizer_use_fast", "tokenizer_legacy", "trust_remote_code", "is_llama_derived_model",
        "is_mistral_derived_model", "is_falcon_derived_model", "is_qwen_derived_model",
        "revision_of_model", "strict", "chat_template", "chat_template_jinja",
        "default_system_message", "datasets", "test_datasets", "dataset_prepared_path",
        "dataset_processes", "dataset_num_proc", "dataset_exact_deduplication",
        "shuffle_merged_datasets", "val_set_size", "output_dir", "hub_model_id",
        "hub_strategy", "push_dataset_to_hub", "hf_use_auth_token", "wandb_project",
        "wandb_entity", "wandb_watch", "wandb_name", "wandb_run_id", "wandb_log_model",
        "mlflow_tracking_uri", "mlflow_experiment_name", "use_wandb", "use_mlflow",
        "use_tensorboard", "comet_api_key", "comet_project_name", "num_epochs", "max_steps",
        "learning_rate", "lr_scheduler", "lr_scheduler_kwargs", "cosine_min_lr_ratio",
        "cosine_constant_lr_ratio", "lr_quadratic_warmup", "lr_div_factor", "warmup_steps",
        "warmup_ratio", "weight_decay", "adam_beta1", "adam_beta2", "adam_beta3",
        "adam_epsilon", "adam_epsilon2", "max_grad_norm", "optim_args", "loraplus_lr_ratio",
        "loraplus_lr_embedding", "embedding_lr", "embedding_lr_scale", "train_on_inputs",
        "group_by_length", "eval_sample_packing", "pad_to_sequence_len", "sample_packing_eff_est",
        "sample_packing_group_size", "sample_packing_bin_size", "sample_packing_sequentially",
        "multipack_real_batches", "evals_per_epoch", "eval_steps", "eval_strategy",
        "saves_per_epoch", "save_steps", "save_strategy", "save_total_limit",
        "save_safetensors", "save_first_step", "save_only_model", "logging_steps",
        "early_stopping_patience", "resume_from_checkpoint", "auto_resume_from_checkpoints",
        "local_rank", "debug", "seed", "special_tokens", "tokens", "added_tokens_overrides",
        "lora_model_dir", "lora_fan_in_fan_out", "peft_use_rslora", "lora_bias",
        "lora_task_type", "gradient_checkpointing_kwargs", "tf32", "eval_table_size",
        "eval_max_new_tokens", "eval_causal_lm_metrics", "do_causal_lm_eval",
        "dataloader_num_workers", "dataloader_pin_memory", "dataloader_prefetch_factor",
        "dataloader_drop_last", "ddp_timeout", "ddp_find_unused_parameters",
        "ddp_broadcast_buffers", "plugins", "gc_steps", "include_tokens_per_second",
        "fsdp_version", "flash_attn_cross_entropy", "flash_attn_rms_norm",
        "flash_attn_fuse_qkv", "flash_attn_fuse_mlp", "flash_optimum", "pretraining_dataset",
        "streaming", "skip_prepare_dataset", "remove_unused_columns",
        "sequence_len_overflow_handling",
        "excess_length_strategy", "train_on_eos", "roles_to_train", "field_messages",
        "message_property_mappings", "bnb_4bit_quant_storage", "model_config_type",
        "processor_type", "eval_batch_size", "profiler_steps",
        "torch_compile_backend", "torch_compile_mode",
    }
)  # fmt: skip


_LIGER = "Liger's fused kernels are not modelled (the unfused activations are counted)"
_LIGER_KERNELS = (
    "liger_rope",
    "liger_rms_norm",
    "liger_glu_activation",
    "liger_layer_norm",
    "liger_swiglu",
    "liger_cross_entropy",
)


def _axolotl(r: _Reader) -> None:
    out = r.out
    out.set("stack", "axolotl", "(format)")
    model = r.text("base_model")
    if model is not None:
        _name_model(out, model, "base_model")
    _axolotl_method(r)
    _axolotl_precision(r)
    for key, name in (
        ("micro_batch_size", "micro_batch_size"),
        ("gradient_accumulation_steps", "gradient_accumulation_steps"),
    ):
        value = r.integer(key)
        if value is not None:
            out.set(name, value, r.key(key))
    if r.has("batch_size"):
        r.raw("batch_size")
        out.ignore(
            "batch_size", "a global batch needs the GPU count; give gradient_accumulation_steps"
        )
    packed = r.boolean("sample_packing")
    _sequence(out, r.integer("sequence_len"), "sequence_len", packed)
    optimizer = r.text("optimizer")
    if optimizer is not None:
        _hf_optimizer(out, optimizer, "optimizer")
    _axolotl_checkpointing(r)
    _axolotl_attention(r)
    _axolotl_loss(r)
    for key, name in (
        ("tensor_parallel_size", "parallelism.tp"),
        ("context_parallel_size", "parallelism.cp"),
        ("sequence_parallel_degree", "parallelism.cp"),
    ):
        value = r.integer(key)
        if value is not None and value > 1:
            out.set(name, value, key)
    if r.has("deepspeed"):
        _deepspeed_reference(out, r.raw("deepspeed"), "deepspeed")
    fsdp = r.raw("fsdp")
    fsdp_config = r.section("fsdp_config")
    if fsdp or (fsdp_config is not None and r.has("fsdp_version")):
        options = (
            fsdp.split()
            if isinstance(fsdp, str)
            else r.names("fsdp")
            if isinstance(fsdp, list)
            else None
        )
        r.raw("fsdp_version")
        _fsdp(out, options, fsdp_config, "fsdp" if fsdp else "fsdp_config")
    for key, reason in (
        ("torch_compile", "torch.compile fusion is not modelled (eager PyTorch is)"),
        ("neftune_noise_alpha", "no memory effect"),
        ("lora_modules_to_save", "modules trained in full beside the adapters are not modelled"),
        ("peft_use_dora", "DoRA's magnitude vectors and weight norms are not modelled"),
        ("unfrozen_parameters", "training a chosen subset of parameters is not modelled"),
        ("gptq", "a GPTQ-quantized base is not modelled"),
        (
            "rl",
            "preference / RL training (a reference model, paired sequences) is not modelled: read "
            "as SFT",
        ),
        ("reward_model", "reward-model training is not modelled"),
        ("relora_steps", "ReLoRA is not modelled"),
        ("s2_attention", "shifted sparse attention is not modelled"),
        *((name, _LIGER) for name in _LIGER_KERNELS),
        (
            "chunked_cross_entropy",
            "Axolotl's chunked cross-entropy is not modelled; the stack's loss is used",
        ),
        ("gpu_memory_limit", "a memory cap is not modelled"),
        ("lora_on_cpu", "LoRA loading on the CPU has no effect on the step"),
        ("auto_find_batch_size", "the batch size it settles on is not known"),
        ("fp8_enable_fsdp_float8_all_gather", "FP8 all-gathers are not modelled"),
        ("dp_shard_size", "the shard group is derived from the GPUs, not given"),
        ("dp_replicate_size", "the replicate group is derived from the GPUs, not given"),
    ):
        r.flag(key, reason)
    r.rest(_AXOLOTL_QUIET)


def _axolotl_method(r: _Reader) -> None:
    out = r.out
    adapter = r.text("adapter")
    four, eight = r.boolean("load_in_4bit"), r.boolean("load_in_8bit")
    if adapter is None:
        out.set("method", "full", "adapter")
        out.note("no adapter: full fine-tuning, as Axolotl trains every weight without one")
        if four or eight:
            out.ignore(
                "load_in_4bit" if four else "load_in_8bit",
                "a quantized base needs an adapter (Axolotl refuses it)",
            )
        return
    if adapter not in ("lora", "qlora"):
        raise EstimateError(
            "adapter",
            f"got {shown(adapter)}, expected lora or qlora (other adapters are not modelled)",
        )
    qlora = adapter == "qlora" or bool(four)
    out.set("method", "qlora" if qlora else "lora", "adapter")
    if adapter == "qlora" and not four:
        out.note(
            "adapter qlora without load_in_4bit: read as QLoRA (Axolotl requires load_in_4bit)"
        )
    elif adapter == "lora" and four:
        out.note("adapter lora with load_in_4bit: the base is 4-bit, read as QLoRA")
    if eight and not qlora:
        out.ignore(
            "load_in_8bit",
            "an 8-bit (LLM.int8) base is not modelled: read as LoRA on a 16-bit base",
        )
    for key, name in (
        ("lora_r", "lora.rank"),
        ("lora_alpha", "lora.alpha"),
        ("lora_dropout", "lora.dropout"),
    ):
        value = r.number(key) if name != "lora.rank" else r.integer(key)
        if value is not None:
            out.set(name, value, key)
    linear = r.boolean("lora_target_linear")
    modules = r.names("lora_target_modules")
    if linear:
        _targets(out, ["all-linear"], "lora_target_linear")
    elif modules:
        _targets(out, modules, "lora_target_modules")
    if qlora:
        bnb = r.section("bnb_config_kwargs")
        if bnb is not None:
            quant = bnb.choice("bnb_4bit_quant_type", ("nf4", "fp4"))
            if quant is not None:
                out.set("qlora.quant_type", quant, bnb.key("bnb_4bit_quant_type"))
            double = bnb.boolean("bnb_4bit_use_double_quant")
            if double is not None:
                out.set("qlora.double_quant", double, bnb.key("bnb_4bit_use_double_quant"))
            bnb.rest(
                (
                    "llm_int8_has_fp16_weight",
                    "llm_int8_threshold",
                    "bnb_4bit_quant_storage",
                    "bnb_4bit_compute_dtype",
                )
            )


def _axolotl_precision(r: _Reader) -> None:
    out = r.out
    bf16, fp16 = r.raw("bf16"), r.raw("fp16")
    if bf16 is not None and not isinstance(bf16, bool) and bf16 not in ("auto", "full"):
        raise EstimateError("bf16", f"got {shown(bf16)}, expected true, false, auto or full")
    if fp16 is not None and not isinstance(fp16, bool):
        raise EstimateError("fp16", f"got {shown(fp16)}, expected true or false")
    fp8, bfloat16, float16 = r.boolean("fp8"), r.boolean("bfloat16"), r.boolean("float16")
    if float16:
        raise EstimateError(
            "float16",
            "pure fp16 training (no AMP) is not modelled; expected bf16, bfloat16 or fp16 (AMP)",
        )
    if bf16 in (True, "auto", "full") and fp16:
        raise EstimateError("fp16", "bf16 and fp16 are both on")
    precision, key = None, ""
    if fp8:
        precision, key = "fp8-mixed", "fp8"
    elif bfloat16:
        precision, key = "bf16", "bfloat16"
    elif bf16 in (True, "auto", "full"):
        precision, key = "bf16-mixed", "bf16"
        if bf16 == "auto":
            out.note("bf16: auto read as bf16 (Axolotl turns it on where the GPU supports it)")
    elif fp16:
        precision, key = "fp16-mixed", "fp16"
    elif bf16 is False or fp16 is False:
        precision, key = "fp32", "bf16" if bf16 is False else "fp16"
        out.note("bf16 and fp16 off: fp32 training")
    if precision is not None:
        out.set("precision", precision, key)
        if out.get("method") == "qlora" and precision in ("bf16-mixed", "bf16", "fp16-mixed"):
            out.set("qlora.compute_dtype", "fp16" if precision == "fp16-mixed" else "bf16", key)


def _axolotl_checkpointing(r: _Reader) -> None:
    out = r.out
    value = r.raw("gradient_checkpointing")
    if value is None:
        pass
    elif isinstance(value, bool):
        out.set("activation_checkpointing", "full" if value else "none", "gradient_checkpointing")
    elif value in ("unsloth", "offload"):
        out.set("activation_checkpointing", "full", "gradient_checkpointing")
        out.set("offload.activations", "cpu", "gradient_checkpointing")
    else:
        raise EstimateError(
            "gradient_checkpointing",
            f"got {shown(value)}, expected true, false, offload or unsloth",
        )
    offload = r.raw("activation_offloading")
    if offload is not None and offload is not False:
        if out.get("activation_checkpointing") in ("full",):
            out.set("offload.activations", "cpu", "activation_offloading")
        else:
            out.ignore(
                "activation_offloading",
                "offloading every saved activation (without checkpointing) is not modelled",
            )


def _axolotl_attention(r: _Reader) -> None:
    out = r.out
    attention = r.text("attention")
    if attention is not None:
        _attention(out, attention, "attention")
    for key, kernel in (
        ("flash_attention", "flash"),
        ("sdp_attention", "sdpa"),
        ("xformers_attention", "mem-efficient"),
        ("eager_attention", "eager"),
    ):
        if r.boolean(key):
            out.set("attention", kernel, key)
    r.flag("flex_attention", "flex attention is not modelled; the scenario's attention is kept")


def _axolotl_loss(r: _Reader) -> None:
    out = r.out
    for key in ("liger_fused_linear_cross_entropy", "cut_cross_entropy"):
        if r.boolean(key):
            out.set("loss", "chunked", key)


# --------------------------------------------------------------------------------------
# transformers TrainingArguments / TRL SFTConfig


#: keys only TRL's configs have (SFTConfig, ModelConfig, ScriptArguments): the SFT stack
_TRL_KEYS = frozenset(
    {
        "max_seq_length", "max_length", "packing", "packing_strategy", "padding_free",
        "dataset_text_field", "dataset_kwargs", "dataset_num_proc", "dataset_batch_size",
        "completion_only_loss", "assistant_only_loss", "activation_offloading",
        "model_init_kwargs", "eval_packing", "chat_template_path", "use_peft",
        "model_name_or_path", "lora_target_modules", "use_bnb_nested_quant", "dataset_name",
    }
)  # fmt: skip
_HF_QUIET = frozenset(
    {
        "output_dir", "overwrite_output_dir", "do_train", "do_eval", "do_predict",
        "eval_strategy", "evaluation_strategy", "prediction_loss_only",
        "per_device_eval_batch_size", "per_gpu_eval_batch_size", "eval_accumulation_steps",
        "eval_delay", "learning_rate", "weight_decay", "adam_beta1", "adam_beta2",
        "adam_epsilon", "max_grad_norm", "num_train_epochs", "max_steps",
        "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_ratio", "warmup_steps",
        "log_level", "log_level_replica", "log_on_each_node", "logging_dir",
        "logging_strategy", "logging_first_step", "logging_steps", "logging_nan_inf_filter",
        "save_strategy", "save_steps", "save_total_limit", "save_safetensors",
        "save_on_each_node", "save_only_model", "restore_callback_states_from_checkpoint",
        "use_mps_device", "seed", "data_seed", "jit_mode_eval", "use_ipex",
        "fp16_opt_level", "half_precision_backend", "fp16_backend", "bf16_full_eval",
        "fp16_full_eval", "tf32", "local_rank", "ddp_backend", "tpu_num_cores",
        "tpu_metrics_debug", "debug", "dataloader_drop_last", "eval_steps",
        "dataloader_num_workers", "dataloader_prefetch_factor", "past_index", "run_name",
        "disable_tqdm", "remove_unused_columns", "label_names", "load_best_model_at_end",
        "metric_for_best_model", "greater_is_better", "ignore_data_skip",
        "fsdp_min_num_params", "fsdp_transformer_layer_cls_to_wrap", "accelerator_config",
        "label_smoothing_factor", "optim_args", "group_by_length", "length_column_name",
        "report_to", "ddp_find_unused_parameters", "ddp_bucket_cap_mb",
        "ddp_broadcast_buffers", "dataloader_pin_memory", "dataloader_persistent_workers",
        "skip_memory_metrics", "use_legacy_prediction_loop", "push_to_hub",
        "resume_from_checkpoint", "hub_model_id", "hub_strategy", "hub_token",
        "hub_private_repo", "hub_always_push", "hub_revision", "gradient_checkpointing_kwargs",
        "include_inputs_for_metrics", "include_for_metrics", "eval_do_concat_batches",
        "push_to_hub_model_id", "push_to_hub_organization", "push_to_hub_token",
        "mp_parameters", "full_determinism", "ray_scope", "ddp_timeout",
        "torch_compile_backend", "torch_compile_mode", "include_tokens_per_second",
        "include_num_input_tokens_seen", "batch_eval_metrics", "eval_on_start",
        "eval_use_gather_object", "average_tokens_across_devices", "liger_kernel_config",
        "dispatch_batches", "split_batches", "project", "trackio_space_id",
        # TRL
        "dataset_text_field", "dataset_kwargs", "dataset_num_proc", "dataset_batch_size",
        "eos_token", "pad_token", "truncation_mode", "shuffle_dataset", "pad_to_multiple_of",
        "eval_packing", "packing_strategy", "completion_only_loss", "assistant_only_loss",
        "chat_template_path", "dataset_name", "dataset_config", "dataset_train_split",
        "dataset_test_split", "dataset_streaming", "gradient_checkpointing_use_reentrant",
        "ignore_bias_buffers", "model_revision", "trust_remote_code", "lora_task_type",
        "use_rslora", "bnb_4bit_quant_storage", "num_of_sequences", "chars_per_token",
        "dataset_prepare",
    }
)  # fmt: skip
_DTYPES = ("bfloat16", "float16", "float32", "auto", "bf16", "fp16", "fp32")


def _training_arguments(r: _Reader) -> None:
    out = r.out
    for key in ("use_cpu", "no_cuda"):
        if r.boolean(key):
            raise EstimateError(key, "training on the CPU is not modelled")
    trl = any(k in r.data for k in _TRL_KEYS)
    out.set("stack", "trl-sft" if trl else "hf-trainer", "(format)")
    if trl:
        out.note("keys of TRL's SFTConfig or ModelConfig: the trl-sft stack")
    model = r.text("model_name_or_path")
    if model is not None:
        _name_model(out, model, "model_name_or_path")
    init = r.section("model_init_kwargs")
    batch = r.integer("per_device_train_batch_size")
    old = r.integer("per_gpu_train_batch_size")
    if batch is not None:
        out.set("micro_batch_size", batch, "per_device_train_batch_size")
    elif old is not None:
        out.set("micro_batch_size", old, "per_gpu_train_batch_size")
    accum = r.integer("gradient_accumulation_steps")
    if accum is not None:
        out.set("gradient_accumulation_steps", accum, "gradient_accumulation_steps")
    _hf_method(r)
    _hf_precision(r, init)
    optim = r.text("optim")
    if optim is not None:
        _hf_optimizer(out, optim, "optim")
    if r.boolean("adafactor"):
        out.set("optimizer", "adafactor", "adafactor")
    checkpointing = r.boolean("gradient_checkpointing")
    if checkpointing is not None:
        out.set(
            "activation_checkpointing",
            "full" if checkpointing else "none",
            "gradient_checkpointing",
        )
    elif trl:
        out.note(
            "gradient_checkpointing not set: TRL's SFTConfig turns it on by default in recent "
            "versions; the scenario's checkpointing is kept"
        )
    if r.boolean("activation_offloading"):
        if checkpointing:
            out.set("offload.activations", "cpu", "activation_offloading")
        else:
            out.ignore(
                "activation_offloading",
                "offloading every saved activation (without checkpointing) is not modelled",
            )
    attention = r.text("attn_implementation")
    if attention is None and init is not None:
        attention = init.text("attn_implementation")
    if attention is not None:
        _attention(out, attention, "attn_implementation")
    length_key = "max_seq_length" if r.has("max_seq_length") else "max_length"
    packed = r.boolean("packing")
    _sequence(out, r.integer(length_key), length_key, packed)
    if trl and not r.has("max_seq_length") and "max_length" not in r.data:
        out.note(
            "max_length not set: SFTConfig's default is 1024 tokens; the scenario's sequence "
            "length is kept"
        )
    if r.boolean("padding_free"):
        out.note(
            "padding_free: the batch is one row of its tokens; MemFit counts the same tokens as a "
            "padded batch"
        )
    if r.boolean("use_liger_kernel"):
        out.set("loss", "chunked", "use_liger_kernel")
        out.ignore(
            "use_liger_kernel",
            "Liger's other fused kernels are not modelled (its fused linear cross-entropy is)",
        )
    loss_type = r.text("loss_type")
    if loss_type == "nll":
        out.set("loss", "standard", "loss_type")
    elif loss_type is not None:
        out.ignore("loss_type", f"{loss_type} is not modelled; the stack's loss is used")
    tp = r.integer("tp_size")
    if tp is not None and tp > 1:
        out.set("parallelism.tp", tp, "tp_size")
    if r.has("deepspeed"):
        _deepspeed_reference(out, r.raw("deepspeed"), "deepspeed")
    _hf_fsdp(r)
    for key, reason in (
        ("torch_compile", "torch.compile fusion is not modelled (eager PyTorch is)"),
        ("torchdynamo", "torch.compile fusion is not modelled (eager PyTorch is)"),
        ("neftune_noise_alpha", "no memory effect"),
        ("auto_find_batch_size", "the batch size it settles on is not known"),
        (
            "torch_empty_cache_steps",
            "emptying the cache between steps does not change a step's peak",
        ),
        ("optim_target_modules", "GaLore-style low-rank optimizer states are not modelled"),
        ("lora_modules_to_save", "modules trained in full beside the adapters are not modelled"),
        ("lora_target_parameters", "LoRA on parameters (MoE experts) is not modelled"),
        ("use_dora", "DoRA's magnitude vectors and weight norms are not modelled"),
        (
            "beta",
            "preference training (a reference model, paired sequences) is not modelled: read as "
            "SFT",
        ),
        ("max_prompt_length", "preference training is not modelled: read as SFT"),
        ("parallelism_config", "not read: give tp and cp in the scenario"),
    ):
        r.flag(key, reason)
    if init is not None:
        init.rest(
            (
                "torch_dtype",
                "dtype",
                "attn_implementation",
                "trust_remote_code",
                "revision",
                "use_cache",
                "device_map",
            )
        )
    r.rest(_HF_QUIET)


_PEFT_KEYS = (
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
    "bnb_4bit_quant_type",
    "use_bnb_nested_quant",
)


def _hf_method(r: _Reader) -> None:
    """PEFT as TRL's ModelConfig says it (``use_peft``, ``lora_*``, ``load_in_4bit``); a
    plain TrainingArguments file does not say, and the scenario's method is kept."""
    out = r.out
    peft = r.boolean("use_peft")
    four, eight = r.boolean("load_in_4bit"), r.boolean("load_in_8bit")
    if peft is None:
        lora_keys = [k for k in ("lora_r", "lora_alpha", "lora_target_modules") if r.has(k)]
        if lora_keys:
            r.seen.update(_PEFT_KEYS)
            out.ignore(", ".join(lora_keys), "use_peft is not set, so no adapter is trained")
        out.note(
            "the file does not say whether a PEFT adapter is trained: the scenario's method is kept"
        )
        if four or eight:
            out.ignore(
                "load_in_4bit" if four else "load_in_8bit", "a quantized base needs use_peft"
            )
        return
    if not peft:
        out.set("method", "full", "use_peft")
        for key in _PEFT_KEYS:
            r.raw(key)
        return
    out.set("method", "qlora" if four else "lora", "load_in_4bit" if four else "use_peft")
    if eight and not four:
        out.ignore(
            "load_in_8bit",
            "an 8-bit (LLM.int8) base is not modelled: read as LoRA on a 16-bit base",
        )
    for key, name in (
        ("lora_r", "lora.rank"),
        ("lora_alpha", "lora.alpha"),
        ("lora_dropout", "lora.dropout"),
    ):
        value = r.integer(key) if name == "lora.rank" else r.number(key)
        if value is not None:
            out.set(name, value, key)
    targets = r.names("lora_target_modules")
    if targets:
        _targets(out, targets, "lora_target_modules")
    if four:
        quant = r.choice("bnb_4bit_quant_type", ("nf4", "fp4"))
        if quant is not None:
            out.set("qlora.quant_type", quant, "bnb_4bit_quant_type")
        nested = r.boolean("use_bnb_nested_quant")
        if nested is not None:
            out.set("qlora.double_quant", nested, "use_bnb_nested_quant")
        else:
            out.note(
                "use_bnb_nested_quant not set: TRL's default is false; the scenario's "
                "qlora.double_quant is kept"
            )


def _hf_precision(r: _Reader, init: _Reader | None) -> None:
    out = r.out
    bf16, fp16 = r.boolean("bf16"), r.boolean("fp16")
    dtype_key = next((k for k in ("dtype", "torch_dtype") if r.has(k)), None)
    dtype = r.choice(dtype_key, _DTYPES) if dtype_key else None
    if dtype is None and init is not None:
        init_key = next((k for k in ("dtype", "torch_dtype") if init.has(k)), None)
        dtype = init.choice(init_key, _DTYPES) if init_key else None
        dtype_key = init.key(init_key) if init_key else None
    if bf16 and fp16:
        raise EstimateError("fp16", "bf16 and fp16 are both true")
    if bf16:
        out.set("precision", "bf16-mixed", "bf16")
    elif fp16:
        out.set("precision", "fp16-mixed", "fp16")
    elif bf16 is False or fp16 is False:
        if dtype in ("bfloat16", "bf16"):
            out.set("precision", "bf16", dtype_key or "bf16")
            out.note("bf16 and fp16 off with a bf16 model: the weights train in bf16 (no autocast)")
        elif dtype in ("float16", "fp16"):
            raise EstimateError(
                dtype_key or "fp16",
                "pure fp16 training (no AMP) is not modelled; expected bf16 or fp16 AMP",
            )
        else:
            out.set("precision", "fp32", "bf16" if bf16 is False else "fp16")
            out.note("bf16 and fp16 off: fp32 training")
    elif bf16 is None and fp16 is None and r.data.get("model_name_or_path") is not None:
        out.note(
            "bf16 and fp16 not set: TRL turns bf16 on by default in recent versions; the "
            "scenario's precision is kept"
        )
    if out.get("method") == "qlora" and out.get("precision") in (
        "bf16-mixed",
        "bf16",
        "fp16-mixed",
    ):
        compute = "fp16" if out.get("precision") == "fp16-mixed" else "bf16"
        out.set("qlora.compute_dtype", compute, "bf16" if compute == "bf16" else "fp16")


def _hf_fsdp(r: _Reader) -> None:
    out = r.out
    value = r.raw("fsdp")
    config_value = r.raw("fsdp_config")
    options: list[str] | None
    if value is None or value is False or value in ("", []):
        return
    if value is True:
        options = ["full_shard"]
    elif isinstance(value, str):
        options = value.split()
    else:
        options = r.names("fsdp")
    config = None
    if isinstance(config_value, dict):
        config = _Reader(config_value, "fsdp_config.", out)
    elif isinstance(config_value, str):
        out.note(f"fsdp_config {shown(config_value)} is a file: its settings are not read")
    _fsdp(out, options, config, "fsdp")


# --------------------------------------------------------------------------------------
# LitGPT


_LITGPT_PRECISIONS = {
    "bf16-true": "bf16",
    "bf16-mixed": "bf16-mixed",
    "16-mixed": "fp16-mixed",
    "32-true": "fp32",
    "32": "fp32",
    "bf16": "bf16-mixed",
    "16": "fp16-mixed",
}
_LITGPT_QUANTIZE = {
    "bnb.nf4": ("nf4", False),
    "bnb.nf4-dq": ("nf4", True),
    "bnb.fp4": ("fp4", False),
    "bnb.fp4-dq": ("fp4", True),
}
_LITGPT_TARGETS = (
    ("lora_query", ("q_proj",), True),
    ("lora_key", ("k_proj",), False),
    ("lora_value", ("v_proj",), True),
    ("lora_projection", ("o_proj",), False),
    ("lora_mlp", ("gate_proj", "up_proj", "down_proj"), False),
)
_LITGPT_QUIET = frozenset(
    {
        "out_dir",
        "data",
        "eval",
        "logger_name",
        "seed",
        "resume",
        "access_token",
        "tokenizer_dir",
        "initial_checkpoint_dir",
        "log",
        "optimizer_args",
    }
)
_LITGPT_TRAIN_QUIET = frozenset(
    {
        "save_interval",
        "log_interval",
        "lr_warmup_steps",
        "lr_warmup_fraction",
        "epochs",
        "max_tokens",
        "max_steps",
        "max_time",
        "max_norm",
        "min_lr",
        "learning_rate",
        "weight_decay",
        "beta1",
        "beta2",
        "tie_embeddings",
    }
)


def _litgpt(r: _Reader) -> None:
    out = r.out
    out.set("stack", "lightning", "(format)")
    checkpoint = r.text("checkpoint_dir") or r.text("model_name")
    if checkpoint is not None:
        key = "checkpoint_dir" if r.has("checkpoint_dir") else "model_name"
        _name_model(out, checkpoint.removeprefix("checkpoints/"), key)
    precision = r.choice("precision", _LITGPT_PRECISIONS)
    if precision is not None:
        out.set("precision", _LITGPT_PRECISIONS[precision], "precision")
    else:
        out.note(
            "precision not set: LitGPT picks bf16-mixed where the GPU supports bf16; the "
            "scenario's precision is kept"
        )
    devices_value = r.raw("devices")
    devices: int | None = None
    if isinstance(devices_value, int) and not isinstance(devices_value, bool) and devices_value > 0:
        devices = devices_value
        out.set_hardware("gpus_per_node", devices, "devices")
    elif devices_value is not None:
        if devices_value in ("auto", -1):
            out.note("devices: every visible GPU; the scenario's GPU count is kept")
        else:
            raise EstimateError(
                "devices", f"got {shown(devices_value)}, expected a positive integer or auto"
            )
    nodes = r.integer("num_nodes")
    if nodes is not None:
        out.set_hardware("nodes", nodes, "num_nodes")
    world = (devices or 1) * (nodes or 1) if devices is not None else None
    _litgpt_method(r, world)
    if world is not None and world > 1:
        out.set("parallelism.framework", "pytorch", "devices")
        out.set("parallelism.zero_stage", 3, "devices")
        out.set("activation_checkpointing", "full", "devices")
        out.note(
            "more than one device: LitGPT's finetune scripts shard with FSDP (FULL_SHARD) and "
            "checkpoint every block"
        )
    train = r.section("train")
    if train is not None:
        micro = train.integer("micro_batch_size")
        if micro is not None:
            out.set("micro_batch_size", micro, train.key("micro_batch_size"))
        total = train.integer("global_batch_size")
        if total is not None:
            if micro is None or world is None:
                out.note(
                    "train.global_batch_size: gradient accumulation needs micro_batch_size and an "
                    "integer devices; not derived"
                )
            else:
                per_rank = total // world
                if per_rank < 1 or per_rank // micro < 1:
                    raise EstimateError(
                        train.key("global_batch_size"),
                        f"got {shown(total)}, smaller than micro_batch_size {micro} x {world} "
                        "devices",
                    )
                out.set(
                    "gradient_accumulation_steps", per_rank // micro, train.key("global_batch_size")
                )
                out.note(
                    f"gradient accumulation {per_rank // micro} = global_batch_size {total} // "
                    f"{world} device(s) // micro_batch_size {micro}"
                )
        length = train.integer("max_seq_length")
        if length is not None:
            _sequence(out, length, train.key("max_seq_length"), False)
        elif "max_seq_length" in train.data:
            out.note(
                "train.max_seq_length is null: LitGPT trains on the longest sample; the "
                "scenario's sequence length is kept"
            )
        if train.boolean("tie_embeddings"):
            out.ignore(
                train.key("tie_embeddings"),
                "weight tying is not modelled under LitGPT's GPT (it never ties)",
            )
        train.rest(_LITGPT_TRAIN_QUIET)
    _litgpt_optimizer(r)
    r.rest(_LITGPT_QUIET)


def _litgpt_method(r: _Reader, world: int | None) -> None:
    out = r.out
    lora = any(
        k in r.data
        for k in ("lora_r", "lora_alpha", *[t for t, _, _ in _LITGPT_TARGETS], "lora_head")
    )
    quantize = r.text("quantize")
    if quantize is not None and quantize not in _LITGPT_QUANTIZE:
        accepted = ", ".join(_LITGPT_QUANTIZE)
        raise EstimateError(
            "quantize", f"got {shown(quantize)}, expected one of {accepted} (8-bit is not modelled)"
        )
    if quantize is not None and not lora:
        raise EstimateError(
            "quantize",
            "a quantized base without LoRA (LitGPT's adapter finetuning) is not modelled",
        )
    if quantize is not None and world is not None and world > 1:
        raise EstimateError(
            "quantize",
            f"LitGPT does not quantize on more than one device (devices x num_nodes = {world})",
        )
    if not lora:
        out.set("method", "full", "(no lora_* keys)")
        out.note("no lora_* keys: full fine-tuning (litgpt finetune_full)")
        return
    out.set("method", "qlora" if quantize else "lora", "quantize" if quantize else "lora_r")
    for key, name in (
        ("lora_r", "lora.rank"),
        ("lora_alpha", "lora.alpha"),
        ("lora_dropout", "lora.dropout"),
    ):
        value = r.integer(key) if name == "lora.rank" else r.number(key)
        if value is not None:
            out.set(name, value, key)
    if any(r.has(k) for k, _, _ in _LITGPT_TARGETS):
        targets: list[str] = []
        for key, names, default in _LITGPT_TARGETS:
            on = r.boolean(key)
            if on if on is not None else default:
                targets.extend(names)
        out.set("lora.targets", targets, "lora_query")
    if r.boolean("lora_head"):
        out.ignore("lora_head", "LoRA on the LM head is not modelled")
    if quantize is not None:
        quant, double = _LITGPT_QUANTIZE[quantize]
        out.set("qlora.quant_type", quant, "quantize")
        out.set("qlora.double_quant", double, "quantize")
        precision = out.get("precision")
        if precision in ("bf16-mixed", "fp16-mixed"):
            raise EstimateError(
                "quantize",
                f"LitGPT quantizes only with a -true precision (got {r.raw('precision')})",
            )
        if precision == "bf16":
            out.set("qlora.compute_dtype", "bf16", "precision")


def _litgpt_optimizer(r: _Reader) -> None:
    out = r.out
    value = r.raw("optimizer")
    if value is None:
        return
    if isinstance(value, str):
        _class_optimizer(out, "optimizer", value, None)
        return
    opt = r.section("optimizer")
    assert opt is not None
    path = opt.text("class_path")
    if path is None:
        raise EstimateError("optimizer.class_path", "missing: the optimizer's class")
    args = opt.section("init_args")
    _class_optimizer(out, opt.key("class_path"), path, args)
    if args is not None:
        args.seen.update(args.data)


# --------------------------------------------------------------------------------------
# torchtune


_TORCHTUNE_ATTN = {
    "q_proj": "q_proj",
    "k_proj": "k_proj",
    "v_proj": "v_proj",
    "output_proj": "o_proj",
}
_TORCHTUNE_DTYPES = {"bf16": "bf16", "fp32": "fp32"}
_TORCHTUNE_LOSSES = {
    "torchtune.modules.loss.CEWithChunkedOutputLoss": "chunked-output",
    "torchtune.modules.loss.LinearCrossEntropyLoss": "chunked-output",
    "torch.nn.CrossEntropyLoss": "standard",
}
_TORCHTUNE_QUIET = frozenset(
    {
        "output_dir", "tokenizer", "dataset", "seed", "shuffle", "epochs",
        "max_steps_per_epoch", "checkpointer", "resume_from_checkpoint",
        "save_adapter_weights_only", "lr_scheduler", "metric_logger", "log_every_n_steps",
        "log_peak_memory_stats", "log_level", "profiler", "device", "low_cpu_ram",
        "clip_grad_norm", "save_every_n_steps", "run_val_every_n_steps", "dataset_val",
        "custom_sharded_layers", "data_parallel_shard_dim", "cudnn_deterministic_mode",
        "enable_kv_cache", "collate_fn", "cpu_offload_optimizer",
    }
)  # fmt: skip


def _torchtune(r: _Reader) -> None:
    out = r.out
    out.set("stack", "torchtune", "(format)")
    model = r.section("model")
    if model is not None:
        _torchtune_model(model)
    batch = r.integer("batch_size")
    if batch is not None:
        out.set("micro_batch_size", batch, "batch_size")
    accum = r.integer("gradient_accumulation_steps")
    if accum is not None:
        out.set("gradient_accumulation_steps", accum, "gradient_accumulation_steps")
    dtype = r.choice("dtype", _TORCHTUNE_DTYPES)
    if dtype is not None:
        out.set("precision", _TORCHTUNE_DTYPES[dtype], "dtype")
    _torchtune_sequence(r)
    _torchtune_checkpointing(r)
    optimizer = r.section("optimizer")
    if optimizer is not None:
        _component_optimizer(out, optimizer)
    in_backward = r.boolean("optimizer_in_bwd")
    if in_backward is not None:
        out.set("optimizer_in_backward", in_backward, "optimizer_in_bwd")
    loss = r.section("loss")
    if loss is not None:
        component = loss.text("_component_")
        if component in _TORCHTUNE_LOSSES:
            out.set("loss", _TORCHTUNE_LOSSES[component], loss.key("_component_"))
            if component.endswith("LinearCrossEntropyLoss"):
                out.note(
                    "LinearCrossEntropyLoss counted as CEWithChunkedOutputLoss (every chunk's "
                    "logits kept); its skipping of masked positions is not modelled"
                )
            chunks = loss.integer("num_output_chunks")
            if chunks is not None:
                out.set("loss_chunks", chunks, loss.key("num_output_chunks"))
        elif component is not None:
            out.ignore(
                loss.key("_component_"),
                f"{shown(component)} is not modelled; the stack's loss is used",
            )
        loss.seen.update(loss.data)
    _torchtune_distributed(r)
    for key, reason in (
        ("compile", "torch.compile fusion is not modelled (eager PyTorch is)"),
        ("ref_model", "preference training (a reference model) is not modelled"),
        ("teacher_model", "knowledge distillation (a teacher model) is not modelled"),
        ("quantizer", "quantization-aware training is not modelled"),
    ):
        r.flag(key, reason)
    r.rest(_TORCHTUNE_QUIET)


def _torchtune_model(model: _Reader) -> None:
    out = model.out
    component = model.text("_component_")
    if component is None:
        raise EstimateError(model.key("_component_"), "missing: the model builder")
    out.model = component
    builder = component.rsplit(".", 1)[-1]
    method = (
        "qlora"
        if builder.startswith("qlora_")
        else "lora"
        if builder.startswith("lora_")
        else "full"
    )
    base = builder.removeprefix("qlora_").removeprefix("lora_")
    base = base.removesuffix("_base").removesuffix("_instruct")
    if base not in _TORCHTUNE_MODELS:
        out.note(
            f"model._component_ {shown(component)} is not a builder of a MemFit preset: the "
            "scenario's model is kept"
        )
    if model.boolean("quantize_base") and method == "lora":
        method = "qlora"
    out.set("method", method, model.key("_component_"))
    if method == "full":
        model.seen.update(model.data)
        return
    for key, name in (
        ("lora_rank", "lora.rank"),
        ("lora_alpha", "lora.alpha"),
        ("lora_dropout", "lora.dropout"),
    ):
        value = model.integer(key) if name == "lora.rank" else model.number(key)
        if value is not None:
            out.set(name, value, model.key(key))
    modules = model.names("lora_attn_modules")
    mlp = model.boolean("apply_lora_to_mlp")
    if modules is not None or mlp:
        targets: list[str] = []
        for name in modules or ():
            if name not in _TORCHTUNE_ATTN:
                accepted = ", ".join(_TORCHTUNE_ATTN)
                raise EstimateError(
                    model.key("lora_attn_modules"), f"got {shown(name)}, expected one of {accepted}"
                )
            targets.append(_TORCHTUNE_ATTN[name])
        if mlp:
            targets.extend(("gate_proj", "up_proj", "down_proj"))
        out.set("lora.targets", targets, model.key("lora_attn_modules"))
    model.flag("apply_lora_to_output", "LoRA on the output projection (LM head) is not modelled")
    model.flag("use_dora", "DoRA's magnitude vectors and weight norms are not modelled")
    model.rest(())


def _preset_of_component(component: str) -> str | None:
    builder = component.rsplit(".", 1)[-1].removeprefix("qlora_").removeprefix("lora_")
    return _TORCHTUNE_MODELS.get(builder.removesuffix("_base").removesuffix("_instruct"))


def _torchtune_sequence(r: _Reader) -> None:
    out = r.out
    tokenizer = r.data.get("tokenizer")
    dataset = r.data.get("dataset")
    datasets = dataset if isinstance(dataset, list) else [dataset]
    packed = any(isinstance(d, dict) and d.get("packed") is True for d in datasets)
    if isinstance(tokenizer, dict):
        sub = _Reader(tokenizer, "tokenizer.", out)
        length = sub.integer("max_seq_len")
        if length is not None:
            _sequence(out, length, "tokenizer.max_seq_len", packed)
        elif "max_seq_len" in tokenizer:
            out.note(
                "tokenizer.max_seq_len is null: samples keep their own lengths; the scenario's "
                "sequence length is kept"
            )


def _torchtune_checkpointing(r: _Reader) -> None:
    out = r.out
    on = r.boolean("enable_activation_checkpointing")
    mode = r.text("ac_mode")
    option = r.raw("ac_option")
    if on is not None:
        if on and mode == "selective" and isinstance(option, int) and not isinstance(option, bool):
            out.set("activation_checkpointing", "every-k-layers", "ac_mode")
            out.set("checkpoint_every_k", option, "ac_option")
        else:
            out.set(
                "activation_checkpointing",
                "full" if on else "none",
                "enable_activation_checkpointing",
            )
    if r.boolean("enable_activation_offloading"):
        if on:
            out.set("offload.activations", "cpu", "enable_activation_offloading")
        else:
            out.ignore(
                "enable_activation_offloading",
                "offloading every saved activation (without checkpointing) is not modelled",
            )


def _torchtune_distributed(r: _Reader) -> None:
    """The distributed recipes' keys: FSDP2 over every GPU of the run (how many is a
    command-line choice, ``tune run --nproc_per_node``)."""
    out = r.out
    keys = (
        "fsdp_cpu_offload",
        "fsdp_reshard_after_forward",
        "custom_sharded_layers",
        "tensor_parallel_dim",
        "tensor_parallel_plan",
        "data_parallel_shard_dim",
        "data_parallel_replicate_dim",
        "context_parallel_dim",
    )
    present = [k for k in keys if k in r.data]
    if not present:
        return
    out.set("parallelism.framework", "pytorch", present[0])
    reshard = r.boolean("fsdp_reshard_after_forward")
    stage = 2 if reshard is False else 3
    out.set(
        "parallelism.zero_stage",
        stage,
        "fsdp_reshard_after_forward" if reshard is not None else present[0],
    )
    if r.boolean("fsdp_cpu_offload"):
        _fsdp_offload(out, stage, "fsdp_cpu_offload")
    for key, name in (
        ("tensor_parallel_dim", "parallelism.tp"),
        ("context_parallel_dim", "parallelism.cp"),
    ):
        value = r.integer(key)
        if value is not None and value > 1:
            out.set(name, value, key)
    replicate = r.raw("data_parallel_replicate_dim")
    if isinstance(replicate, int) and not isinstance(replicate, bool) and replicate > 1:
        out.ignore(
            "data_parallel_replicate_dim",
            "replicated FSDP groups are derived from the GPUs, not given",
        )
    r.raw("tensor_parallel_plan")
    out.note(
        "a distributed recipe: FSDP2 over the run's GPUs; their number is given to tune run "
        "(--nproc_per_node), so the scenario's GPUs are kept"
    )


# --------------------------------------------------------------------------------------
# DeepSpeed and accelerate files


def _deepspeed_file(r: _Reader) -> None:
    _deepspeed(r.out, r, "zero_optimization")
    r.out.note("a DeepSpeed config names no training loop: the scenario's stack is kept")


_ACCELERATE_PRECISIONS = {
    "no": "fp32",
    "fp16": "fp16-mixed",
    "bf16": "bf16-mixed",
    "fp8": "fp8-mixed",
}
_ACCELERATE_TYPES = ("NO", "MULTI_GPU", "FSDP", "DEEPSPEED", "MEGATRON_LM")
_ACCELERATE_OTHER = (
    "MULTI_CPU",
    "MULTI_XPU",
    "MULTI_NPU",
    "MULTI_MLU",
    "MULTI_SDAA",
    "MULTI_MUSA",
    "MULTI_HPU",
    "XLA",
    "TPU",
)
_ACCELERATE_QUIET = frozenset(
    {
        "compute_environment", "debug", "machine_rank", "main_process_ip", "main_process_port",
        "main_training_function", "rdzv_backend", "same_network", "tpu_env", "tpu_use_cluster",
        "tpu_use_sudo", "tpu_name", "tpu_zone", "gpu_ids", "downcast_bf16",
        "enable_cpu_affinity", "use_cpu", "ipex_config", "mpirun_config", "fsdp_config",
        "deepspeed_config", "megatron_lm_config", "commands", "command_file", "dynamo_backend",
    }
)  # fmt: skip


def _accelerate(r: _Reader) -> None:
    out = r.out
    out.note("an accelerate config names no training loop: the scenario's stack is kept")
    kind_value = r.text("distributed_type")
    kind = kind_value.upper() if kind_value is not None else None
    if kind in _ACCELERATE_OTHER:
        raise EstimateError(
            "distributed_type",
            f"got {shown(kind_value)}: only GPU training is modelled; expected one of "
            f"{', '.join(_ACCELERATE_TYPES)}",
        )
    if kind is not None and kind not in _ACCELERATE_TYPES:
        raise EstimateError(
            "distributed_type",
            f"got {shown(kind_value)}, expected one of {', '.join(_ACCELERATE_TYPES)}",
        )
    if r.boolean("use_cpu"):
        raise EstimateError("use_cpu", "training on the CPU is not modelled")
    processes = r.integer("num_processes")
    machines = r.integer("num_machines")
    if machines is not None:
        out.set_hardware("nodes", machines, "num_machines")
    if processes is not None:
        if processes < 1 or processes % (machines or 1):
            raise EstimateError(
                "num_processes",
                f"got {shown(processes)}, expected a positive multiple of num_machines "
                f"({machines or 1})",
            )
        out.set_hardware("gpus_per_node", processes // (machines or 1), "num_processes")
        per_node = processes // (machines or 1)
        if (machines or 1) > 1:
            out.note(f"num_processes {processes} is every process of the run: {per_node} per node")
    precision = "no" if r.data.get("mixed_precision") is False else None  # YAML's bare no
    if precision is None:
        precision = r.choice("mixed_precision", _ACCELERATE_PRECISIONS, lower=True)
    r.seen.add("mixed_precision")
    if precision is not None:
        out.set("precision", _ACCELERATE_PRECISIONS[precision], "mixed_precision")
    if kind == "FSDP":
        config = r.section("fsdp_config")
        _fsdp(out, None, config, "distributed_type")
    elif kind == "DEEPSPEED":
        _accelerate_deepspeed(r)
    elif kind == "MEGATRON_LM":
        _accelerate_megatron(r)
    elif kind == "MULTI_GPU":
        out.set("parallelism.framework", "pytorch", "distributed_type")
        out.set("parallelism.zero_stage", 0, "distributed_type")
    dynamo = r.raw("dynamo_config")
    backend = dynamo.get("dynamo_backend") if isinstance(dynamo, dict) else r.raw("dynamo_backend")
    if isinstance(backend, str) and backend.upper() != "NO":
        out.ignore(
            "dynamo_config" if dynamo else "dynamo_backend",
            "torch.compile fusion is not modelled (eager PyTorch is)",
        )
    parallel = r.section("parallelism_config")
    if parallel is not None:
        for key, name in (
            ("parallelism_config_tp_size", "parallelism.tp"),
            ("parallelism_config_cp_size", "parallelism.cp"),
        ):
            value = parallel.integer(key)
            if value is not None and value > 1:
                out.set(name, value, parallel.key(key))
        parallel.rest(("parallelism_config_dp_replicate_size", "parallelism_config_dp_shard_size"))
    r.rest(_ACCELERATE_QUIET)


def _accelerate_deepspeed(r: _Reader) -> None:
    out = r.out
    ds = r.section("deepspeed_config")
    if ds is None:
        out.set("parallelism.framework", "deepspeed", "distributed_type")
        return
    file = ds.text("deepspeed_config_file")
    if file is not None:
        _deepspeed_reference(out, file, ds.key("deepspeed_config_file"))
    else:
        out.set("parallelism.framework", "deepspeed", "distributed_type")
    stage = ds.integer("zero_stage")
    if stage is not None:
        out.set("parallelism.zero_stage", stage, ds.key("zero_stage"))
    for key, target in (
        ("offload_optimizer_device", "offload.optimizer"),
        ("offload_param_device", "offload.parameters"),
    ):
        device = ds.choice(key, _OFFLOAD_DEVICES)
        if device is not None and device != "none":
            out.set(target, device, ds.key(key))
    accum = ds.raw("gradient_accumulation_steps")
    if accum is not None and not _auto(accum):
        out.set("gradient_accumulation_steps", accum, ds.key("gradient_accumulation_steps"))
    ds.rest(
        (
            "gradient_clipping",
            "zero3_init_flag",
            "zero3_save_16bit_model",
            "offload_optimizer_nvme_path",
            "offload_param_nvme_path",
            "deepspeed_multinode_launcher",
            "deepspeed_hostfile",
            "deepspeed_exclusion_filter",
            "deepspeed_inclusion_filter",
        )
    )


def _accelerate_megatron(r: _Reader) -> None:
    out = r.out
    out.set("parallelism.framework", "megatron", "distributed_type")
    mg = r.section("megatron_lm_config")
    if mg is None:
        return
    for key, name in (
        ("megatron_lm_tp_degree", "parallelism.tp"),
        ("megatron_lm_pp_degree", "parallelism.pp"),
    ):
        value = mg.integer(key)
        if value is not None:
            out.set(name, value, mg.key(key))
    sp = mg.boolean("megatron_lm_sequence_parallelism")
    if sp is not None:
        out.set("parallelism.sequence_parallel", sp, mg.key("megatron_lm_sequence_parallelism"))
    if mg.boolean("megatron_lm_recompute_activations"):
        out.set(
            "activation_checkpointing", "selective", mg.key("megatron_lm_recompute_activations")
        )
    if mg.boolean("megatron_lm_use_distributed_optimizer"):
        out.set("parallelism.zero_stage", 1, mg.key("megatron_lm_use_distributed_optimizer"))
    mg.rest(("megatron_lm_num_micro_batches", "megatron_lm_gradient_clipping"))


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
      file sets them, as choosing a stack does (:func:`engine.stacks.with_stack`); every
      other field the file does not set keeps the scenario's value;
    * ``hardware``: ``gpus_per_node`` / ``nodes`` where the file says;
    * ``model``: the scenario's, unless ``replace_model`` and the file names a preset
      (``imported.model_preset``), which then replaces it.

    The result is checked with :func:`~engine.scenario_io.scenario_from_dict`; an error
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
    "ImportedConfig",
    "apply",
    "detect_format",
    "import_training_config",
    "preset_for",
]

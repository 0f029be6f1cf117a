"""Reading a training config's text: size, nesting and node limits, YAML with keys given once,
JSON through the one reader of user text, and which format a file is (:func:`detect_format`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from memfit.engine.errors import EstimateError, shown
from memfit.engine.files import MAX_DEPTH as FILE_DEPTH
from memfit.engine.files import parse_json

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

"""Scenario files (``*.memfit.json``): strict load, atomic save, and their dict form.

The file is a versioned JSON object (``"memfit_scenario": 1``) with ``model``,
``hardware`` and ``training`` sections. The ``model`` section takes one of three forms:

* ``{"preset": "llama-3-8b"}`` -- a preset by name;
* ``{"spec": {...}}`` -- MemFit's own :class:`~memfit.engine.specs.ModelSpec` fields, strict
  (what the app writes once a preset's architecture has been edited);
* Hugging Face ``config.json`` keys as they are (``num_hidden_layers``, ...); keys the
  estimate does not need are ignored. Beside them, ``"read_as": "llama"`` reads a family
  without a reader of its own as a look-alike
  (:func:`memfit.engine.hf_config.model_from_hf_config`).

``hardware.gpu_name`` names the device as every view shows it (a custom GPU, or a preset
with its memory overridden): :func:`named_gpu`. It is written only when it is not the
device's own name (:func:`default_gpu_name`), so older files read as before.

Unknown keys in MemFit's own sections are errors naming the key. Reading never evaluates
code. Saving writes a temporary file beside the target and renames it over the target, so
a crash never leaves a half-written scenario.

>>> data = {"memfit_scenario": 1, "model": {"preset": "gpt2"}, "hardware": {"gpu": "l4"}}
>>> scenario_from_dict(data).training.method
'full'
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from memfit.engine.errors import EstimateError, check_choice, check_float, check_text, shown
from memfit.engine.files import read_json, write_text
from memfit.engine.hf_config import model_from_hf_config
from memfit.engine.presets import build_strict, load_gpu, load_model, preset_name_of
from memfit.engine.specs import (
    GPU_NAME_CHARS,
    MEMORY_GIB,
    TDP_W,
    FreezeSpec,
    GpuSpec,
    HardwareSpec,
    LoraSpec,
    ModelSpec,
    OffloadSpec,
    ParallelismSpec,
    QuantSpec,
    Scenario,
    TrainingSpec,
)
from memfit.engine.stacks import apply_defaults
from memfit.engine.steptime import EFFICIENCY

SCENARIO_VERSION = 1
SUFFIX = ".memfit.json"
_TOP_KEYS = ("memfit_scenario", "name", "model", "hardware", "training")
_HARDWARE_KEYS = (
    "gpu",
    "gpus_per_node",
    "nodes",
    "memory_gib",
    "utilization_target",
    "host_memory_gib",
    "network",
    "network_gb_s",
    "price_per_gpu_hour",
    "matmul_efficiency",
    "attention_efficiency",
    "cuda_runtime",
    "power_limit_w",
    "clock_share",
)
GPU_NAME = "hardware.gpu_name"
_SUBSECTIONS: dict[str, type[Any]] = {
    "lora": LoraSpec,
    "qlora": QuantSpec,
    "freeze": FreezeSpec,
    "parallelism": ParallelismSpec,
    "offload": OffloadSpec,
}
_TUPLE_FIELDS = {("lora", "targets"), ("lora", "modules_to_save"), ("freeze", "trainable")}


def _key(key: Any) -> str:
    """An unknown key as an error names it: printable and short."""
    text = shown(key)
    return text[1:-1] if text.startswith("'") and text.endswith("'") else text


#: what a custom GPU may give in the ``hardware`` section beside its memory: its dense
#: peaks (TFLOP/s), memory bandwidth (GB/s), NVLink between the GPUs of a node (GB/s, both
#: directions together, as datasheets and the presets state it; 0: none, they talk over the
#: host link), host link (a name of :data:`GpuSpec.HOST_LINKS`, and GB/s one way), TDP (W)
#: and architecture (a row of :data:`memfit.engine.steptime.EFFICIENCY`)
CUSTOM_GPU_KEYS = (
    "architecture",
    "bf16_tflops",
    "fp16_tflops",
    "fp8_tflops",
    "fp32_tflops",
    "memory_bandwidth_gb_s",
    "interconnect_gb_s",
    "host_link",
    "host_link_gb_s",
    "tdp_w",
)
#: the keys of a file's ``hardware`` section: the spec's fields, the GPU's name and a
#: custom GPU's figures
_HARDWARE_FILE_KEYS = (*_HARDWARE_KEYS, "gpu_name", *CUSTOM_GPU_KEYS)
#: the accepted range of each of a custom GPU's figures
CUSTOM_GPU_RANGES: dict[str, tuple[float, float]] = {
    "bf16_tflops": (0.001, 1e6),
    "fp16_tflops": (0.001, 1e6),
    "fp8_tflops": (0.0, 1e6),
    "fp32_tflops": (0.001, 1e6),
    "memory_bandwidth_gb_s": (1.0, 1e6),
    "interconnect_gb_s": (0.0, 1e5),
    "host_link_gb_s": (1.0, 1e5),
    "tdp_w": TDP_W,
}
#: the device whose figures a custom GPU takes where it gives none: the most common
#: training GPU, so that a step time is shown, labelled as assumed
#: (:func:`memfit.engine.steptime.device_notes`)
REFERENCE_GPU = "h100-sxm-80gb"
#: one-way GB/s of each host link, as the presets give it
HOST_LINK_GB_S = {
    "pcie-gen3": 16.0,
    "pcie-gen4": 32.0,
    "pcie-gen5": 64.0,
    "pcie-gen6": 128.0,
    "nvlink-c2c": 450.0,
}
_VENDOR_OF = {"cdna2": "amd", "cdna3": "amd", "cdna4": "amd", "gaudi3": "intel"}
_PEAKS = ("bf16_tflops", "fp16_tflops", "fp8_tflops", "fp32_tflops")


def _custom_figures(figures: dict[str, Any]) -> dict[str, Any]:
    """The figures a custom GPU gives, each checked against its range (``hardware.<key>``)."""
    out: dict[str, Any] = {}
    for key, value in figures.items():
        if value is None:
            continue
        name = f"hardware.{key}"
        if key == "architecture":
            out[key] = check_choice(name, value, tuple(EFFICIENCY))
        elif key == "host_link":
            out[key] = check_choice(name, value, GpuSpec.HOST_LINKS)
        elif key in CUSTOM_GPU_RANGES:
            out[key] = check_float(name, value, *CUSTOM_GPU_RANGES[key])
        else:
            raise EstimateError(name, f"unknown key; expected {', '.join(CUSTOM_GPU_KEYS)}")
    return out


def custom_gpu(memory_gib: float, **figures: Any) -> GpuSpec:
    """A device with no preset: its memory, and what it gives of :data:`CUSTOM_GPU_KEYS`.

    A figure not given is the :data:`REFERENCE_GPU`'s and is listed in
    :attr:`GpuSpec.assumed`, which the step time's notes name. A 16-bit peak given carries
    to the peaks not given by the reference's ratios (``fp16 = bf16``, FP8 twice, FP32 as
    the reference's share), so one figure describes the compute. No architecture: the
    memory overheads' and the efficiencies' generic rows (``"unknown"``), as before; no
    TDP: no power limit can be given (``hardware.clock_share`` can).

    >>> gpu = custom_gpu(40.0, bf16_tflops=312.0, memory_bandwidth_gb_s=1555.0)
    >>> gpu.fp16_tflops, gpu.assumed
    (312.0, ('fp16_tflops', 'fp8_tflops', 'fp32_tflops', 'interconnect_gb_s', 'host_link'))
    """
    given = _custom_figures(figures)
    ref = load_gpu(REFERENCE_GPU)
    values: dict[str, Any] = {}
    sixteen = given.get("bf16_tflops", given.get("fp16_tflops"))
    scale = sixteen / ref.bf16_tflops if sixteen is not None else 1.0
    for key in _PEAKS:
        values[key] = given.get(key, getattr(ref, key) * scale)
    if "bf16_tflops" in given and "fp16_tflops" not in given:
        values["fp16_tflops"] = given["bf16_tflops"]
    elif "fp16_tflops" in given and "bf16_tflops" not in given:
        values["bf16_tflops"] = given["fp16_tflops"]
    values["memory_bandwidth_gb_s"] = given.get("memory_bandwidth_gb_s", ref.memory_bandwidth_gb_s)
    values["interconnect_gb_s"] = given.get("interconnect_gb_s", ref.interconnect_gb_s)
    values["host_link"] = given.get("host_link", ref.host_link)
    values["host_link_gb_s"] = given.get("host_link_gb_s", HOST_LINK_GB_S[values["host_link"]])
    assumed = tuple(
        k for k in (*_PEAKS, "memory_bandwidth_gb_s", "interconnect_gb_s") if k not in given
    )
    if "host_link" not in given and "host_link_gb_s" not in given:
        assumed += ("host_link",)
    source = "given by the user"
    if assumed:
        scaled = ", its peaks scaled to the 16-bit peak given" if sixteen is not None else ""
        source = f"not given, assumed the {ref.display_name}'s{scaled}: {', '.join(assumed)}"
    architecture = given.get("architecture", "unknown")
    if "interconnect_gb_s" in given:
        interconnect = "custom" if given["interconnect_gb_s"] else ""
    else:
        interconnect = ref.interconnect
    return GpuSpec(
        name="custom",
        display_name=f"Custom GPU ({memory_gib:g} GiB)",
        vendor=_VENDOR_OF.get(architecture, "nvidia"),
        architecture=architecture,
        memory_mib=max(1024, round(memory_gib * 1024)),
        memory_source="given by the user",
        interconnect=interconnect,
        source=source,
        tdp_w=given.get("tdp_w"),
        tdp_source="given by the user" if "tdp_w" in given else "",
        assumed=assumed,
        **values,
    )


def custom_figures(gpu: GpuSpec) -> dict[str, Any]:
    """What a custom GPU gave of :data:`CUSTOM_GPU_KEYS`, as a scenario file writes them:
    ``custom_gpu(gib, **custom_figures(gpu))`` builds ``gpu`` again (but its name)."""
    if gpu.name != "custom":
        return {}
    out: dict[str, Any] = {}
    if gpu.architecture in EFFICIENCY:
        out["architecture"] = gpu.architecture
    for key in (*_PEAKS, "memory_bandwidth_gb_s", "interconnect_gb_s", "host_link"):
        if key not in gpu.assumed:
            out[key] = getattr(gpu, key)
    if "host_link" not in gpu.assumed and gpu.host_link_gb_s != HOST_LINK_GB_S[gpu.host_link]:
        out["host_link_gb_s"] = gpu.host_link_gb_s
    if gpu.tdp_w is not None:
        out["tdp_w"] = gpu.tdp_w
    return out


def resized_custom_gpu(gpu: GpuSpec, memory_gib: float) -> GpuSpec:
    """The custom ``gpu`` with ``memory_gib`` of memory, its other figures kept; a name
    the user gave it kept, its own name (``Custom GPU (N GiB)``) following the memory."""
    resized = custom_gpu(memory_gib, **custom_figures(gpu))
    if gpu.display_name != default_gpu_name(gpu):
        resized = dataclasses.replace(resized, display_name=gpu.display_name)
    return resized


def with_figure(gpu: GpuSpec, key: str, value: Any) -> GpuSpec:
    """The custom ``gpu`` with its figure ``key`` (of :data:`CUSTOM_GPU_KEYS`) set to
    ``value``, or no longer given (``None``: the reference's again); its name kept."""
    figures = custom_figures(gpu)
    if value is None:
        figures.pop(key, None)
    else:
        figures[key] = value
    rebuilt = custom_gpu(gpu.memory_mib / 1024, **figures)
    if gpu.display_name != default_gpu_name(gpu):
        rebuilt = dataclasses.replace(rebuilt, display_name=gpu.display_name)
    return rebuilt


def default_gpu_name(gpu: GpuSpec) -> str:
    """The name ``gpu`` has when none is given: its preset's, or ``Custom GPU (N GiB)``."""
    if gpu.name == "custom":
        return custom_gpu(gpu.memory_mib / 1024).display_name
    try:
        return load_gpu(gpu.name).display_name
    except EstimateError:  # not a preset: the name it has is its own
        return gpu.display_name


def named_gpu(gpu: GpuSpec, name: Any) -> GpuSpec:
    """``gpu`` under the user's ``name`` (``hardware.gpu_name``): text without control
    characters, not empty once trimmed, at most :data:`GPU_NAME_CHARS` characters.

    >>> named_gpu(custom_gpu(40.0), " MIG 3g.40gb ").display_name
    'MIG 3g.40gb'
    """
    text = check_text(GPU_NAME, name, empty=True).strip()
    if not text or len(text) > GPU_NAME_CHARS:
        raise EstimateError(
            GPU_NAME, f"got {len(text):,} characters, expected 1 to {GPU_NAME_CHARS}"
        )
    return dataclasses.replace(gpu, display_name=text)


def model_from_dict(data: Any) -> ModelSpec:
    """The ``model`` section in any of its three forms."""
    if isinstance(data, str):
        return load_model(check_text("model", data))
    if not isinstance(data, dict):
        raise EstimateError("model", f"expected a preset name or an object, got {shown(data)}")
    if "preset" in data:
        extra = sorted(map(str, set(data) - {"preset"}))
        if extra:
            raise EstimateError(f"model.{_key(extra[0])}", "unknown key beside 'preset'")
        return load_model(check_text("model.preset", data["preset"]))
    if "spec" in data:
        extra = sorted(map(str, set(data) - {"spec"}))
        if extra:
            raise EstimateError(f"model.{_key(extra[0])}", "unknown key beside 'spec'")
        return build_strict(ModelSpec, data["spec"], "model.spec")
    name, read_as = data.get("name"), data.get("read_as")
    return model_from_hf_config(
        data,
        name=None if name is None else check_text("model.name", name),
        read_as=None if read_as is None else check_text("model.read_as", read_as),
    )


def hardware_from_dict(data: Any) -> HardwareSpec:
    if not isinstance(data, dict):
        raise EstimateError("hardware", f"expected an object, got {shown(data)}")
    for key in data:
        if key not in _HARDWARE_FILE_KEYS:
            raise EstimateError(
                f"hardware.{_key(key)}",
                f"unknown key; expected {', '.join(_HARDWARE_FILE_KEYS)}",
            )
    memory = data.get("memory_gib")
    gpu_name = check_text("hardware.gpu", data.get("gpu", "custom"))
    if gpu_name == "custom":
        if memory is None:
            raise EstimateError("hardware.gpu", "missing; give a GPU preset or memory_gib")
        figures = {k: data[k] for k in CUSTOM_GPU_KEYS if k in data}
        gpu = custom_gpu(check_float("hardware.memory_gib", memory, *MEMORY_GIB), **figures)
    else:
        for key in CUSTOM_GPU_KEYS:
            if key in data:
                raise EstimateError(
                    f"hardware.{key}",
                    f'only a custom GPU ("gpu": "custom") takes this figure; the preset '
                    f"{gpu_name!r} has its datasheet's",
                )
        gpu = load_gpu(gpu_name)
    if "gpu_name" in data:
        gpu = named_gpu(gpu, data["gpu_name"])
    kwargs = {
        k: v for k, v in data.items() if k not in ("gpu", "gpu_name") and k not in CUSTOM_GPU_KEYS
    }
    return HardwareSpec(gpu=gpu, **kwargs)


def training_from_dict(data: Any) -> TrainingSpec:
    if data is None:
        return TrainingSpec()
    if not isinstance(data, dict):
        raise EstimateError("training", f"expected an object, got {shown(data)}")
    names = {f.name for f in dataclasses.fields(TrainingSpec)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            raise EstimateError(f"training.{_key(key)}", "unknown key")
        if key in _SUBSECTIONS:
            if not isinstance(value, dict):
                raise EstimateError(f"training.{key}", f"expected an object, got {shown(value)}")
            sub = dict(value)
            for section, field in _TUPLE_FIELDS:
                if section == key and field in sub:
                    if not isinstance(sub[field], list | tuple):
                        raise EstimateError(
                            f"training.{key}.{field}", f"got {shown(sub[field])}, expected a list"
                        )
                    sub[field] = tuple(sub[field])
            kwargs[key] = build_strict(_SUBSECTIONS[key], sub, f"training.{key}")
        else:
            kwargs[key] = value
    if "stack" in data:  # a stack chosen in the file brings its loss and optimizer defaults
        kwargs = apply_defaults(kwargs)
    return TrainingSpec(**kwargs)


def scenario_from_dict(data: Any) -> Scenario:
    """Build a :class:`Scenario` from the parsed JSON of a scenario file."""
    if not isinstance(data, dict):
        raise EstimateError("scenario", f"expected a JSON object, got {type(data).__name__}")
    version = data.get("memfit_scenario")
    # strictly the integer 1: ``true == 1`` in Python, but true is not a version
    if type(version) is not int or version != SCENARIO_VERSION:
        raise EstimateError("memfit_scenario", f"got {shown(version)}, expected {SCENARIO_VERSION}")
    for key in data:
        if key not in _TOP_KEYS:
            raise EstimateError(_key(key), f"unknown key; expected {', '.join(_TOP_KEYS)}")
    for key in ("model", "hardware"):
        if key not in data:
            raise EstimateError(key, "missing (required)")
    if "name" in data:
        check_text("name", data["name"])
    return Scenario(
        model=model_from_dict(data["model"]),
        hardware=hardware_from_dict(data["hardware"]),
        training=training_from_dict(data.get("training")),
    )


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return value


def scenario_to_dict(scenario: Scenario) -> dict[str, Any]:
    """The JSON-ready form of ``scenario``; :func:`scenario_from_dict` inverts it."""
    preset = preset_name_of(scenario.model)
    model: dict[str, Any] = (
        {"preset": preset} if preset else {"spec": dataclasses.asdict(scenario.model)}
    )
    hw = scenario.hardware
    hardware: dict[str, Any] = {"gpu": hw.gpu.name}
    if hw.gpu.display_name != default_gpu_name(hw.gpu):
        hardware["gpu_name"] = hw.gpu.display_name
    hardware["gpus_per_node"] = hw.gpus_per_node
    hardware["nodes"] = hw.nodes
    if hw.memory_gib is not None or hw.gpu.name == "custom":
        hardware["memory_gib"] = (
            hw.memory_gib if hw.memory_gib is not None else (hw.gpu.memory_mib / 1024)
        )
    hardware.update(custom_figures(hw.gpu))
    hardware["utilization_target"] = hw.utilization_target
    for key in _HARDWARE_KEYS[5:]:
        if getattr(hw, key) is not None:
            hardware[key] = getattr(hw, key)
    training: dict[str, Any] = {}
    for f in dataclasses.fields(TrainingSpec):
        value = getattr(scenario.training, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            training[f.name] = {k: _plain(v) for k, v in dataclasses.asdict(value).items()}
        else:
            training[f.name] = value
    return {
        "memfit_scenario": SCENARIO_VERSION,
        "model": model,
        "hardware": hardware,
        "training": training,
    }


def load_scenario(path: str | os.PathLike[str]) -> Scenario:
    """Read a scenario file strictly (a regular file of at most 4 MiB, UTF-8 JSON)."""
    return scenario_from_dict(read_json(path))


def save_scenario(scenario: Scenario, path: str | os.PathLike[str]) -> None:
    """Write ``scenario`` as an editor saves: links followed, mode kept, atomic rename
    (:func:`memfit.engine.files.write_text`)."""
    write_text(path, json.dumps(scenario_to_dict(scenario), indent=2, ensure_ascii=False) + "\n")

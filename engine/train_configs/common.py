"""What every reader shares: the scenario sections it fills with the origin of each field
(:class:`_Out`), the reader of a config's keys that reports what it does not model
(:class:`_Reader`), and the rules several formats use -- optimizers by name or class,
attention, LoRA targets, preset names, sequence lengths, FSDP options and offload, and the
files a config names (read inside its folder unless ``--allow-outside-paths``)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from memfit.engine import memo
from memfit.engine.errors import EstimateError, bounded, check_text, shown
from memfit.engine.files import ALLOW_FLAG, resolves_inside
from memfit.engine.presets import load_model, model_names
from memfit.engine.scenario_io import custom_gpu
from memfit.engine.specs import (
    MODULES_TO_SAVE,
    FreezeSpec,
    HardwareSpec,
    LoraSpec,
    OffloadSpec,
    ParallelismSpec,
    QuantSpec,
    TrainingSpec,
)

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


def _reentrant_checkpointing(r: _Reader, checkpointing: bool) -> None:
    """``gradient_checkpointing_kwargs.use_reentrant`` (transformers passes the mapping to
    ``torch.utils.checkpoint``): the convention ``reentrant_checkpointing``, where the file
    checkpoints or leaves it to the scenario; its other keys change nothing of memory."""
    kwargs = r.section("gradient_checkpointing_kwargs")
    if kwargs is None:
        return
    reentrant = kwargs.boolean("use_reentrant")
    if reentrant is not None and checkpointing:
        r.out.set("reentrant_checkpointing", reentrant, kwargs.key("use_reentrant"))


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

    def _on(self, key: str) -> bool:
        """Whether ``key`` is on: any value but null, false, 0 and an empty text, list or
        mapping."""
        value = self.raw(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value != 0
        return not (value is None or value is False or value in ("", [], {}))

    def compiled(self, key: str) -> None:
        """``key`` turns ``torch.compile`` on (:meth:`_on`): ``training.torch_compile``."""
        if self._on(key):
            self.out.set("torch_compile", True, self.key(key))

    def flag(self, key: str, reason: str) -> None:
        """``key`` is ignored with ``reason`` when it is on (:meth:`_on`)."""
        if self._on(key):
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


def _modules_to_save(r: _Reader, key: str) -> None:
    """PEFT's ``modules_to_save`` (``lora.modules_to_save``): names matched, as PEFT
    matches them, by their last part; only the LM head and the token embedding are
    modelled, any other name is reported ignored."""
    names = r.names(key)
    if not names:
        return
    saved: list[str] = []
    for name in names:
        leaf = name.rsplit(".", 1)[-1]
        if leaf in MODULES_TO_SAVE:
            if leaf not in saved:
                saved.append(leaf)
        else:
            r.out.ignore(
                r.key(key),
                f"{shown(name)}: only {' and '.join(MODULES_TO_SAVE)} are modelled as modules "
                "to save",
            )
    if saved:
        r.out.set("lora.modules_to_save", saved, key)


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
    }
)
#: the dtype names accelerate's ``mixed_precision_policy`` takes, as FSDP's policy fields
_POLICY_DTYPES = {
    "bf16": "compute", "bfloat16": "compute", "fp16": "compute", "float16": "compute",
    "fp32": "fp32", "float32": "fp32",
}  # fmt: skip


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
        policy = read("mixed_precision_policy")
        if policy is not None:
            _fsdp_policy(out, policy, where("mixed_precision_policy"))
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


def _fsdp_policy(out: _Out, policy: Any, key: str) -> None:
    """accelerate's ``mixed_precision_policy``: one dtype for every field, or a mapping of
    ``param_dtype`` and ``reduce_dtype`` (``buffer_dtype`` and ``output_dtype`` change no
    memory MemFit models)."""
    accepted = ", ".join(_POLICY_DTYPES)
    if isinstance(policy, str):
        policy = {"param_dtype": policy, "reduce_dtype": policy}
    if not isinstance(policy, dict):
        raise EstimateError(key, f"got {shown(policy)}, expected a dtype ({accepted}) or a mapping")
    for name, field in (("param_dtype", "fsdp_param_dtype"), ("reduce_dtype", "fsdp_reduce_dtype")):
        value = policy.get(name)
        if value is None:
            continue
        dtype = _POLICY_DTYPES.get(str(value).lower().removeprefix("torch."))
        if dtype is None:
            raise EstimateError(f"{key}.{name}", f"got {shown(value)}, expected one of {accepted}")
        out.set(f"parallelism.{field}", dtype, f"{key}.{name}")


def _fsdp_offload(out: _Out, stage: int, key: str) -> None:
    """FSDP's CPU offload keeps the parameter shards and their gradients on the host and
    steps the optimizer there."""
    out.set("offload.optimizer", "cpu", key)
    if stage == 3:
        out.set("offload.parameters", "cpu", key)
    else:
        out.note(f"{key}: CPU offload without FULL_SHARD read as optimizer (and gradient) offload")


_OFFLOAD_DEVICES = ("none", "cpu", "nvme")


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

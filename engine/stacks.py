"""Training stacks: the conventions of the loop that really runs the step.

Two runs of the same model, batch and precision can differ by tens of percent in peak
memory because their training stacks differ in a few conventions that no hyper-parameter
names (each read from the stack's source; the file and version are in its JSON):

* whether the **model output** -- the logits and, in transformers, the KV cache it builds
  in training -- stays referenced through backward (``outputs = model(**batch);
  outputs.loss.backward()``) or is dropped before it (the Trainer's ``compute_loss``
  returns only the loss);
* the **dtype of frozen weights** under mixed precision (Lightning's ``bf16-mixed`` keeps
  every weight in fp32; ``from_pretrained`` loads a 16-bit checkpoint in 16 bits);
* the **dtype of LoRA adapters** (PEFT's ``autocast_adapter_dtype=True`` keeps them fp32);
* what **selective checkpointing** means (Korthikanti's attention core, or torchtitan's
  per-op policy), and the loss and optimizer implementation a stack's recipes use.

A stack is data, ``stacks/NAME.json`` of the built-in ``resources/`` or of the user's own
preset folder (where each is, is :mod:`memfit.engine.locate`'s business)::

    {"memfit_stack": 1, "name": "lightning", "label": "...", "description": "...",
     "source": "file and version the conventions were read from",
     "conventions": {"outputs_held_through_backward": true, "kv_cache_in_outputs": false,
                     "frozen_weights_dtype": {"bf16-mixed": "fp32", "default": "auto"},
                     "lora.adapter_dtype": "auto", "selective_checkpointing": "attention-core"},
     "why": {"outputs_held_through_backward": "..."},
     "defaults": {"loss": "no-upcast"}}

``conventions`` fill the scenario fields left at None (a value, or one per method or
precision, with a ``default``);
``defaults`` are the stack's choices of ordinary fields (loss, optimizer implementation),
applied when a stack is chosen and the field is not given (:func:`apply_defaults`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from memfit.engine import memo
from memfit.engine.abilities import Refusal, refused
from memfit.engine.abilities import parse as parse_abilities
from memfit.engine.errors import EstimateError
from memfit.engine.locate import loadable, preset_files
from memfit.engine.specs import (
    ADAPTER_DTYPES,
    COMPILE_SCOPES,
    DEQUANT_DTYPES,
    FROZEN_DTYPES,
    FSDP_DTYPES,
    LOGITS_UPCASTS,
    LOSSES,
    MODEL_IMPLEMENTATIONS,
    OPTIMIZER_IMPLS,
    STACKS,
    ModelSpec,
    Scenario,
    TrainingSpec,
    stack_names,
)

#: what ``activation_checkpointing="selective"`` means in a stack
SELECTIVE_POLICIES = ("attention-core", "per-op")
#: a stack file must state the convention (:attr:`ConventionField.default`)
REQUIRED = object()


def _auto_frozen(training: TrainingSpec, value: str) -> str:
    return auto_frozen_dtype(training) if value == "auto" else value


def _auto_adapter(training: TrainingSpec, value: str) -> str:
    return auto_adapter_dtype(training) if value == "auto" else value


def _auto_dequant(training: TrainingSpec, value: str) -> str:
    return training.qlora.compute_dtype if value == "auto" else value


def fsdp_mixed(training: TrainingSpec) -> bool:
    """FSDP shards the parameters (FULL_SHARD, SHARD_GRAD_OP, FSDP2) under mixed precision:
    where its mixed-precision policy decides the gathered and the reduced dtypes."""
    par = training.parallelism
    return (
        training.precision.endswith("-mixed") and par.framework == "pytorch" and par.zero_stage >= 2
    )


def _kv_cache(training: TrainingSpec, value: bool) -> bool:
    # transformers turns the cache off under gradient checkpointing
    return value and training.activation_checkpointing == "none"


@dataclass(frozen=True, slots=True)
class ConventionField:
    """One convention of a training step, described once: the stack file's key and the
    scenario field ``training.<key>`` (None there: the stack's value), the values it takes,
    where it applies, how it resolves, and how the app shows it. The stack files, the
    resolution (:func:`conventions`), the app's rows and summary line all read this table;
    a new convention is an entry here, its attribute of :class:`Conventions`, its scenario
    field (:mod:`memfit.engine.specs`) and the mechanism that reads it."""

    key: str
    values: tuple[Any, ...]
    #: the :class:`Conventions` attribute that holds the resolved value ("": none)
    attr: str = ""
    #: the app's row label ("": no row, a stack convention only)
    label: str = ""
    #: what the convention changes, in a user's words (the row's tooltip)
    tip: str = ""
    #: how each value reads in the row's list (default: the value itself)
    choices: Mapping[Any, str] = field(default_factory=dict)
    #: how each value reads in "from stack (...)" (default: the value itself)
    shown: Mapping[Any, str] = field(default_factory=dict)
    #: how the resolved value reads in the one-line summary
    brief: str = "{}"
    brief_words: Mapping[Any, str] = field(default_factory=dict)
    #: the methods it applies to (empty: every method), and why not for the others
    methods: tuple[str, ...] = ()
    unused: str = ""
    #: where it applies beyond its methods (None: wherever they do)
    when: Callable[[TrainingSpec], bool] | None = None
    #: resolved whatever the method (the estimate reads it even where the app greys it)
    always: bool = False
    #: the value taken where it does not apply (before ``resolve``)
    off: Any = "auto"
    #: the value the estimate runs with, from the picked one (``auto``, or a rule)
    resolve: Callable[[TrainingSpec, Any], Any] | None = None
    #: the summary names it only where the scenario sets it or it differs from this
    usual: Callable[[TrainingSpec], Any] | None = None
    #: what a stack file that does not state it gives
    default: Any = REQUIRED

    def applies(self, training: TrainingSpec) -> bool:
        """It changes ``training``'s step (its method is one of :attr:`methods`, and
        :attr:`when` holds)."""
        if self.methods and training.method not in self.methods:
            return False
        return self.when is None or self.when(training)


#: every convention, in the order an estimate reports them and the app lists them
def _qlora_switch(key: str, attr: str, label: str, tip: str, **words: Any) -> ConventionField:
    """A QLoRA convention that is on or off: only QLoRA quantizes the base weights, and
    off is the usual value (``words``: ``choices``, ``shown``, ``brief_words`` and, where
    a stack file may leave it out, ``default``)."""
    return ConventionField(
        key,
        (True, False),
        attr=attr,
        label=label,
        tip=tip,
        methods=("qlora",),
        unused="only QLoRA quantizes the base weights",
        off=False,
        usual=lambda t: False,
        **words,
    )


def _fsdp_policy(
    which: str, label: str, tip: str, verb: str, does: str, usual: str, fp32_choice: str = "fp32"
) -> ConventionField:
    """A dtype of FSDP's mixed-precision policy (``which``: ``param`` or ``reduce``), used
    only where FSDP shards under mixed precision; ``usual`` is the value where a stack does
    not state it and where it does not apply."""
    return ConventionField(
        f"parallelism.fsdp_{which}_dtype",
        FSDP_DTYPES,
        attr=f"fsdp_{which}_dtype",
        label=label,
        tip=tip,
        choices={"compute": "the compute dtype (16-bit)", "fp32": fp32_choice},
        shown={"compute": "16-bit", "fp32": "fp32"},
        brief=f"FSDP {verb} {{}}",
        brief_words={"compute": "16-bit", "fp32": "fp32"},
        unused=f"only FSDP's sharding under mixed precision {does}",
        when=fsdp_mixed,
        off=usual,
        usual=lambda t: usual,
        default=usual,
    )


CONVENTION_FIELDS: tuple[ConventionField, ...] = (
    ConventionField(
        "model_implementation",
        MODEL_IMPLEMENTATIONS,
        attr="implementation",
        label="Modeling code",
        tip="The modeling code that builds the model: transformers' classes (a tied LM head "
        "is the embedding matrix) or LitGPT's GPT, which never ties the LM head to the "
        "embedding (a tied checkpoint gets an LM head of its own).",
        choices={"transformers": "transformers", "litgpt": "LitGPT"},
        shown={"transformers": "transformers", "litgpt": "LitGPT"},
        brief="{} model",
        brief_words={"transformers": "transformers", "litgpt": "LitGPT"},
        usual=lambda t: "transformers",
    ),
    ConventionField(
        "outputs_held_through_backward",
        (True, False),
        attr="outputs_held",
        label="Model output",
        tip="Whether the model output (the logits and, when built, the KV cache) stays "
        "referenced through backward and the optimizer step (outputs = model(...); "
        "outputs.loss.backward()) or is dropped before backward (only the loss kept).",
        choices={True: "held through backward", False: "released before backward"},
        shown={True: "held", False: "released"},
        brief="outputs {}",
        brief_words={True: "held", False: "released"},
    ),
    ConventionField(
        "kv_cache_in_outputs",
        (True, False),
        attr="kv_cache",
        label="KV cache",
        tip="Whether the forward builds a KV cache in training (transformers' use_cache); "
        "it lives as long as the output, and never under gradient checkpointing.",
        choices={True: "built with the output", False: "not built"},
        shown={True: "built", False: "not built"},
        brief_words={True: "KV cache built", False: "no KV cache"},
        resolve=_kv_cache,
    ),
    ConventionField(
        "previous_step_held",
        (True, False),
        attr="previous_held",
        label="Previous step",
        tip="Whether the previous step's autograd graph and model output stay alive into "
        "this step's forward (the loop's variables are rebound only when the next forward "
        "returns) or are gone when the step ends.",
        choices={True: "held into the next forward", False: "released after the step"},
        shown={True: "held", False: "released"},
        brief="previous step {}",
        brief_words={True: "held", False: "released"},
        usual=lambda t: False,
    ),
    ConventionField(
        "gradient_as_bucket_view",
        (True, False),
        attr="gradient_as_bucket_view",
        label="DDP gradients",
        tip="Under DDP (ZeRO stage 0 over more than one GPU): whether each gradient is a view "
        "of DDP's all-reduce bucket (gradient_as_bucket_view=True) or a tensor of its own "
        "that backward copies into a second, persistent set of buckets (PyTorch's default): "
        "a second copy of the gradients. FSDP's NO_SHARD keeps no second copy.",
        choices={True: "views of the buckets", False: "copied into buckets"},
        shown={True: "bucket views", False: "copied"},
        brief="DDP gradients {}",
        brief_words={True: "as bucket views", False: "copied into buckets"},
        usual=lambda t: False,
        unused="only DDP (ZeRO stage 0, PyTorch) keeps gradient buckets",
        when=lambda t: t.parallelism.zero_stage == 0 and t.parallelism.framework == "pytorch",
        off=False,
        # torch.nn.parallel.DistributedDataParallel, accelerate's DistributedDataParallelKwargs
        # and Lightning's DDPStrategy all default to False; a stack may state otherwise
        default=False,
    ),
    ConventionField(
        "frozen_weights_dtype",
        FROZEN_DTYPES,
        attr="frozen_dtype",
        label="Frozen weights",
        tip="Storage dtype of the frozen, non-quantized weights (LoRA's base, frozen parts); "
        "auto is the compute dtype of the precision (fp32 under fp32).",
        brief="frozen {}",
        methods=("freeze", "lora", "qlora"),
        unused="full fine-tuning freezes no weight",
        always=True,
        resolve=_auto_frozen,
    ),
    ConventionField(
        "lora.adapter_dtype",
        ADAPTER_DTYPES,
        attr="adapter_dtype",
        label="LoRA adapters",
        tip="Dtype of the LoRA adapters, and so of their gradients and optimizer states; auto "
        "is fp32, bf16 under pure bf16.",
        brief="adapters {}",
        methods=("lora", "qlora"),
        unused="only LoRA and QLoRA train adapters",
        resolve=_auto_adapter,
    ),
    _qlora_switch(
        "qlora.quantize_lm_head",
        "quantize_head",
        "QLoRA LM head",
        "Whether QLoRA quantizes the LM head to 4 bits with the other linear layers "
        "(Lightning's bitsandbytes plugin) or keeps it unquantized (transformers).",
        choices={True: "quantized to 4 bits", False: "not quantized"},
        shown={True: "quantized", False: "not quantized"},
        brief_words={True: "4-bit LM head", False: "LM head unquantized"},
    ),
    ConventionField(
        "qlora.dequant_dtype",
        DEQUANT_DTYPES,
        attr="dequant_dtype",
        label="QLoRA dequant",
        tip="The dtype QLoRA's dequantization returns; auto is the compute dtype. Any other "
        "dtype costs a second copy of each weight, cast to the compute dtype at every "
        "matmul.",
        brief="dequant {}",
        methods=("qlora",),
        unused="only QLoRA quantizes the base weights",
        resolve=_auto_dequant,
        usual=lambda t: t.qlora.compute_dtype,
    ),
    _qlora_switch(
        "qlora.prepare_kbit",
        "prepare_kbit",
        "k-bit preparation",
        "Whether PEFT's prepare_model_for_kbit_training runs on the 4-bit model: it "
        "upcasts every weight left unquantized (norms, embeddings, the LM head) to fp32, so "
        "under autocast the residual stream, the norms' outputs and every 4-bit linear fed "
        "by them (bitsandbytes casts its output back to its input's dtype) are fp32.",
        choices={True: "fp32 norms, embeddings, head", False: "not run"},
        shown={True: "fp32 islands", False: "not run"},
        brief_words={True: "k-bit prepared", False: "not k-bit prepared"},
        default=False,
    ),
    _qlora_switch(
        "qlora.matmul_keeps_input",
        "matmul_keeps_input",
        "4-bit matmul input",
        "Whether bitsandbytes' 4-bit matmul keeps its input for backward with the 4-bit "
        "weight (ctx.tensors = (A, B), bitsandbytes before 0.43.2) or the weight alone "
        "(0.43.2 and later: the input's gradient needs only the weight). Kept, it also "
        "outlives non-reentrant checkpointing, which cannot drop what a custom function "
        "holds.",
        choices={True: "kept (bitsandbytes < 0.43.2)", False: "not kept (0.43.2 and later)"},
        shown={True: "kept", False: "not kept"},
        brief_words={True: "4-bit matmul keeps its input", False: "4-bit matmul input freed"},
        default=False,
    ),
    ConventionField(
        "reentrant_checkpointing",
        (True, False),
        attr="reentrant",
        label="Checkpointing",
        tip="Whether activation checkpointing runs through torch's reentrant implementation "
        "(use_reentrant=True: the layer's forward runs without autograd and again, with "
        "it, in backward) or the non-reentrant one (saved-tensor hooks). It matters where a "
        "custom autograd function keeps a tensor on its ctx (bitsandbytes' 4-bit matmul "
        "before 0.43.2): non-reentrant checkpointing cannot drop it, so every layer keeps "
        "it until its backward; reentrant checkpointing keeps nothing of the forward.",
        choices={True: "reentrant (use_reentrant=True)", False: "non-reentrant"},
        shown={True: "reentrant", False: "non-reentrant"},
        brief_words={True: "reentrant checkpointing", False: "non-reentrant checkpointing"},
        usual=lambda t: False,
        # torch.utils.checkpoint's recommended mode; transformers' default since 5.0
        default=False,
    ),
    ConventionField(
        "torch_compile_scope",
        COMPILE_SCOPES,
        attr="compile_scope",
        label="Compiled",
        tip="What torch.compile compiles, where it is on: the whole model with its loss "
        "(torch.compile(model) on a model that computes its loss, transformers' Trainer), "
        "each decoder layer alone, or each layer and the loss function on their own "
        "(torchtune; torchtitan since April 2025). The final norm and the LM head run eager "
        "unless the whole model is compiled; a compiled loss keeps the logits and their "
        "log-sum-exp instead of fp32 copies.",
        choices={
            "model": "the whole model and loss",
            "layers": "each layer",
            "layers+loss": "each layer, and the loss",
        },
        shown={"model": "whole model", "layers": "layers", "layers+loss": "layers and loss"},
        brief="compiled: {}",
        brief_words={"model": "whole model", "layers": "layers", "layers+loss": "layers, loss"},
        usual=lambda t: "model",
        unused="torch.compile is off",
        when=lambda t: t.torch_compile,
        off="model",
        # torch.compile(model): what a loop that compiles does unless its stack says
        default="model",
    ),
    _fsdp_policy(
        "param",
        "FSDP parameters",
        "The dtype FSDP gathers the parameters in under mixed precision: the compute "
        "dtype (MixedPrecisionPolicy(param_dtype=bf16): the layers compute in 16 bits on "
        "16-bit copies) or fp32 (Lightning's bf16-mixed: fp32 gathered, autocast casting "
        "each weight for its matmul).",
        "gathers",
        "gathers parameters",
        usual="compute",
        fp32_choice="fp32, autocast",
    ),
    _fsdp_policy(
        "reduce",
        "FSDP reduce",
        "The dtype FSDP reduce-scatters the gradients in under mixed precision: fp32 "
        "(torchtitan's MixedPrecisionPolicy(bf16, reduce_dtype=fp32): each layer's "
        "gradients copied to an fp32 buffer, twice the bytes on the wire) or the compute "
        "dtype (accelerate's policy, Lightning's, and PyTorch's when only param_dtype is "
        "given).",
        "reduces in",
        "reduce-scatters gradients",
        usual="fp32",
    ),
    ConventionField(
        "logits_upcast",
        LOGITS_UPCASTS,
        attr="logits_upcast",
        label="Logits upcast",
        tip="Where the full loss's fp32 copy of the logits is made: by the loss function "
        "(transformers' ForCausalLMLoss, torchtitan's loss), or by the model, which returns "
        "it (torchtune's decoder: self.output(h).float()). The model's output is that copy, "
        "and a loss compiled on its own receives it and keeps it for backward.",
        choices={"loss": "by the loss", "model": "by the model (its output)"},
        shown={"loss": "loss", "model": "model"},
        brief="logits upcast by the {}",
        unused="only the full, unchunked loss upcasts the whole logits",
        usual=lambda t: "loss",
        when=lambda t: t.loss == "standard",
        off="loss",
        default="loss",
    ),
    ConventionField("selective_checkpointing", SELECTIVE_POLICIES),
)
#: the convention keys of a stack file and the accepted values of each
CONVENTIONS: dict[str, tuple[Any, ...]] = {f.key: f.values for f in CONVENTION_FIELDS}
CONVENTION_FIELD = {f.key: f for f in CONVENTION_FIELDS}
#: the ordinary training fields a stack may choose, and their accepted values
DEFAULTS: dict[str, tuple[Any, ...]] = {"loss": LOSSES, "optimizer_impl": OPTIMIZER_IMPLS}


@dataclass(frozen=True, slots=True)
class Stack:
    name: str
    label: str
    description: str
    source: str
    #: convention key -> a value, or {precision or "default": value}
    conventions: dict[str, Any]
    why: dict[str, str]
    defaults: dict[str, Any]
    #: what it can run (:mod:`memfit.engine.abilities`): ability -> false or the values
    #: it runs; an ability left out limits nothing
    abilities: dict[str, Any] = field(default_factory=dict)
    abilities_why: dict[str, str] = field(default_factory=dict)

    def convention(self, key: str, precision: str, method: str = "full") -> Any:
        """The stack's value of ``key``: one for all, or by method, else by precision,
        else its ``default``."""
        value = self.conventions.get(key, CONVENTION_FIELD[key].default)
        if isinstance(value, dict):
            return value.get(method, value.get(precision, value["default"]))
        return value


def _check_value(where: str, value: Any, accepted: tuple[Any, ...]) -> None:
    # bools compare equal to 0 and 1: check the type as well as the value
    if not any(type(value) is type(a) and value == a for a in accepted):
        shown = ", ".join(json.dumps(a) for a in accepted)
        raise EstimateError(where, f"got {json.dumps(value)}, expected one of {shown}")


def _parse(name: str, data: Any) -> Stack:
    where = f"stacks/{name}.json"
    if not isinstance(data, dict) or data.get("memfit_stack") != 1:
        raise EstimateError(where, 'expected a JSON object with "memfit_stack": 1')
    if data.get("name") != name:
        raise EstimateError(f"{where}: name", f"got {data.get('name')!r}, expected {name!r}")
    for key in ("label", "description", "source"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise EstimateError(f"{where}: {key}", "expected a non-empty string")
    conventions = data.get("conventions")
    required = {f.key for f in CONVENTION_FIELDS if f.default is REQUIRED}
    if (
        not isinstance(conventions, dict)
        or not required <= set(conventions)
        or not set(conventions) <= set(CONVENTIONS)
    ):
        raise EstimateError(f"{where}: conventions", f"expected the keys {', '.join(CONVENTIONS)}")
    for key, value in conventions.items():
        values = value.values() if isinstance(value, dict) else [value]
        if isinstance(value, dict) and "default" not in value:
            raise EstimateError(
                f"{where}: conventions.{key}", 'a per-precision value needs "default"'
            )
        for v in values:
            _check_value(f"{where}: conventions.{key}", v, CONVENTIONS[key])
    defaults = data.get("defaults", {})
    for key, value in defaults.items():
        if key not in DEFAULTS:
            raise EstimateError(f"{where}: defaults.{key}", "unknown key")
        _check_value(f"{where}: defaults.{key}", value, DEFAULTS[key])
    why = data.get("why", {})
    abilities, abilities_why = parse_abilities(
        where, data.get("abilities"), data.get("abilities_why")
    )
    return Stack(
        name,
        data["label"],
        data["description"],
        data["source"],
        conventions,
        why,
        defaults,
        abilities,
        abilities_why,
    )


@memo.cached(maxsize=None)
def load_stack(name: str) -> Stack:
    """The stack ``name`` (one of :func:`memfit.engine.specs.stack_names`), read from its
    JSON file and checked."""
    files = preset_files("stacks").files
    if name not in files:
        raise EstimateError(
            "training.stack", f"got {name!r}, expected one of {', '.join(stack_names())}"
        )
    path = files[name]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EstimateError(f"stacks/{name}.json", f"cannot be read: {exc}") from exc
    return _parse(name, data)


@memo.cached(maxsize=1)
def _custom_checked() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The user's own stacks that load, by name, and one line for each left out."""
    names, problems = loadable("stacks", load_stack)
    return tuple(sorted(set(names) - set(STACKS))), tuple(problems)


def loadable_stack_names() -> tuple[str, ...]:
    """:data:`memfit.engine.specs.STACKS`, then the user's own stacks whose files load."""
    return STACKS + _custom_checked()[0]


def custom_stack_problems() -> tuple[str, ...]:
    """One line for each of the user's stack files left out, naming the file and field."""
    return _custom_checked()[1]


def stacks() -> tuple[Stack, ...]:
    """Every stack that loads: the built-in ones, then the user's own."""
    return tuple(load_stack(n) for n in loadable_stack_names())


@dataclass(frozen=True, slots=True)
class Convention:
    """One convention an estimate used: the field, its value, and where it came from."""

    field: str
    value: Any
    #: "scenario" (set explicitly) or "stack" (the stack's default)
    origin: str
    #: what the value means for the step, from the stack file when it came from there
    why: str = ""


@dataclass(frozen=True, slots=True)
class Conventions:
    """The conventions of one step, resolved: the scenario's values, else its stack's."""

    stack: str
    outputs_held: bool
    #: the KV cache is built (and held with the outputs): never under checkpointing
    kv_cache: bool
    #: storage dtype of frozen, non-quantized weights: "fp32", "bf16" or "fp16"
    frozen_dtype: str
    #: dtype of LoRA adapters: "fp32" or "bf16"
    adapter_dtype: str
    #: the checkpointing policy run: ``activation_checkpointing`` with "selective" read
    #: as the stack's selective policy
    checkpointing: str
    used: tuple[Convention, ...]
    #: the modeling code: "transformers" or "litgpt"
    implementation: str = "transformers"
    #: the previous step's graph and model output live on into this step until the loop
    #: rebinds its variables
    previous_held: bool = False
    #: QLoRA quantizes the LM head as well
    quantize_head: bool = False
    #: the dtype QLoRA's dequantization returns: "fp16", "bf16" or "fp32"
    dequant_dtype: str = "bf16"
    #: DDP's gradients are views of its all-reduce buckets (no second copy)
    gradient_as_bucket_view: bool = False
    #: QLoRA: PEFT's ``prepare_model_for_kbit_training`` ran (the unquantized weights fp32)
    prepare_kbit: bool = False
    #: QLoRA: bitsandbytes' 4-bit matmul keeps its input (before 0.43.2)
    matmul_keeps_input: bool = False
    #: activation checkpointing is torch's reentrant implementation (``use_reentrant=True``)
    reentrant: bool = False
    #: what torch.compile compiles, where it is on (:data:`memfit.engine.specs.COMPILE_SCOPES`)
    compile_scope: str = "model"
    #: FSDP's mixed-precision policy: the gathered and the reduced dtype
    #: (:data:`memfit.engine.specs.FSDP_DTYPES`)
    fsdp_param_dtype: str = "compute"
    fsdp_reduce_dtype: str = "fp32"
    #: where the standard loss's fp32 copy of the logits is made (``LOGITS_UPCASTS``)
    logits_upcast: str = "loss"


def auto_frozen_dtype(training: TrainingSpec) -> str:
    """``auto``: QLoRA's compute dtype; else the precision's compute dtype (fp32 under
    fp32, fp16 under fp16-mixed, bf16 otherwise)."""
    if training.method == "qlora":
        return training.qlora.compute_dtype
    return {"fp32": "fp32", "fp16-mixed": "fp16"}.get(training.precision, "bf16")


def auto_adapter_dtype(training: TrainingSpec) -> str:
    """``auto``: the trainable weights' dtype (bf16 under pure bf16, else fp32)."""
    return "bf16" if training.precision == "bf16" else "fp32"


@memo.cached(maxsize=4096)
def conventions(training: TrainingSpec) -> Conventions:
    """The conventions ``training`` runs with (its fields, else its stack's)."""
    stack = load_stack(training.stack)
    precision = training.precision
    used: list[Convention] = []

    def pick(key: str, explicit: Any) -> Any:
        if explicit is not None:
            used.append(Convention(key, explicit, "scenario", stack.why.get(key, "")))
            return explicit
        value = stack.convention(key, precision, training.method)
        used.append(Convention(key, value, "stack", stack.why.get(key, "")))
        return value

    values: dict[str, Any] = {}
    for f in CONVENTION_FIELDS:
        if not f.attr:
            continue
        explicit = _scenario_value(training, f.key)
        value = pick(f.key, explicit) if f.always or f.applies(training) else f.off
        values[f.attr] = f.resolve(training, value) if f.resolve else value
    if values.get("prepare_kbit"):
        _kbit_frozen(training, values)
    policy = stack.convention("selective_checkpointing", precision, training.method)
    checkpointing = training.activation_checkpointing
    if checkpointing == "selective":
        used.append(
            Convention(
                "selective_checkpointing",
                policy,
                "stack",
                stack.why.get("selective_checkpointing", ""),
            )
        )
        if policy == "per-op":
            checkpointing = "per-op"
    return Conventions(stack=stack.name, checkpointing=checkpointing, used=tuple(used), **values)


def _kbit_frozen(training: TrainingSpec, values: dict[str, Any]) -> None:
    """PEFT's ``prepare_model_for_kbit_training`` (peft 0.21.2 ``utils/other.py``) casts
    every fp16 or bf16 parameter that is not a ``Params4bit`` to fp32: the weights QLoRA
    leaves unquantized are fp32 whatever they were loaded in. A 16-bit
    ``frozen_weights_dtype`` set beside it contradicts it."""
    explicit = training.frozen_weights_dtype
    if explicit is not None and explicit not in ("auto", "fp32"):
        raise EstimateError(
            "training.frozen_weights_dtype",
            f"got {explicit!r}, but training.qlora.prepare_kbit upcasts the unquantized "
            'weights to fp32: expected "fp32", "auto" or none',
        )
    values["frozen_dtype"] = "fp32"


def _scenario_value(training: TrainingSpec, key: str) -> Any:
    """The scenario's field of the convention ``key`` (``lora.adapter_dtype`` is
    ``training.lora.adapter_dtype``); None: the stack's value."""
    value: Any = training
    for part in key.split("."):
        value = getattr(value, part)
    return value


#: activations transformers writes in Python ops that LitGPT's model runs fused
_LITGPT_ACTIVATION = {"gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh"}


def as_built(model: ModelSpec, training: TrainingSpec) -> ModelSpec:
    """``model`` as its modeling code builds it. LitGPT's ``GPT`` never ties the LM head
    to the embedding (its converter copies a tied checkpoint's embedding into
    ``lm_head.weight``, a parameter of its own), always fuses q, k and v into one linear,
    keeps an MLP's gate and up projections apart (Phi-3's fused one is split on
    conversion), repeats grouped keys and values for the kernel, so no SDPA math
    fallback, and runs its GELU as one op (``F.gelu(x, approximate=config.gelu_approximate)``:
    a transformers config's Python-op ``gelu_new`` or ``gelu_fast``, Phi-1.5's and Phi-2's,
    is LitGPT's fused tanh GELU)."""
    if conventions(training).implementation != "litgpt" or model.is_mla:
        return model
    activation = _LITGPT_ACTIVATION.get(model.activation, model.activation)
    litgpt = dataclasses.replace(
        model, tie_word_embeddings=False, fused_qkv=True, fused_gate_up=False, sdpa_math=False,
        activation=activation,
    )  # fmt: skip
    return model if litgpt == model else litgpt


def built(scenario: Scenario) -> Scenario:
    """``scenario`` with its model as its stack builds it (:func:`as_built`)."""
    model = as_built(scenario.model, scenario.training)
    if model is scenario.model:
        return scenario
    return dataclasses.replace(scenario, model=model)


def apply_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """A scenario file's ``training`` section with its stack's :attr:`Stack.defaults`
    filled in where the section does not give them (a copy; the stack's name must be
    valid, else it is left for :class:`TrainingSpec` to refuse)."""
    name = data.get("stack", "hf-trainer")
    if not isinstance(name, str) or name not in loadable_stack_names():
        return data
    stack = load_stack(name)
    out = dict(data)
    for key, value in stack.defaults.items():
        out.setdefault(key, value)
    return out


def with_stack(training: TrainingSpec, name: str) -> TrainingSpec:
    """``training`` run on stack ``name``: the stack's defaults of ordinary fields, and
    every convention left to the stack (explicit convention values are kept)."""
    stack = load_stack(name)
    return dataclasses.replace(training, stack=name, **stack.defaults)


def refusals(scenario: Scenario) -> tuple[Refusal, ...]:
    """What of ``scenario``'s training its own stack cannot run (:mod:`memfit.engine.
    abilities`); nothing for a stack whose file does not load (its conventions say so
    where they are read).

    >>> from memfit.engine.presets import load_gpu, load_model
    >>> from memfit.engine.specs import HardwareSpec, ParallelismSpec
    >>> hw = HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=4)
    >>> s = Scenario(load_model("gpt2"), hw, TrainingSpec(parallelism=ParallelismSpec(pp=2)))
    >>> refusals(s)[0].words
    'pipeline parallelism (pp 2)'
    >>> stacks_that_can(s)
    ('torchtitan', 'custom')
    """
    return _refusals(scenario.training.stack, scenario.training)


@memo.cached(maxsize=4096)
def _refusals(name: str, training: TrainingSpec) -> tuple[Refusal, ...]:
    try:
        stack = load_stack(name)
    except EstimateError:
        return ()
    return refused(stack.abilities, stack.abilities_why, training)


def refusal_text(scenario: Scenario) -> str | None:
    """The first thing ``scenario``'s stack cannot run, as a sentence; ``None`` where it
    can run all of it."""
    found = refusals(scenario)
    if not found:
        return None
    return found[0].sentence(load_stack(scenario.training.stack).label)


def new_refusal(before: Scenario, after: Scenario) -> str | None:
    """What ``after`` asks of its stack that the stack cannot run and ``before`` did not
    ask already, as a sentence: a change must not lead out of the stack's abilities (what
    the user set up already is theirs to keep)."""
    same = before.training.stack == after.training.stack
    had = {r.ability for r in refusals(before)} if same else set()
    fresh = [r for r in refusals(after) if r.ability not in had]
    if not fresh:
        return None
    return fresh[0].sentence(load_stack(after.training.stack).label)


def stacks_that_can(scenario: Scenario) -> tuple[str, ...]:
    """The stacks (by name) that can run all of ``scenario``'s training: where a plan
    leaves the stack's abilities, the ones to switch to."""
    return tuple(name for name in loadable_stack_names() if not _refusals(name, scenario.training))

"""The changes a user can make to a scenario's training, in one registry.

Each change is one frozen :class:`Change`: a stable id, a label, one rule for when it
applies (:meth:`Change.why_not` gives the reason it does not, :meth:`Change.applies` the
yes or no), one way to make it (:meth:`Change.apply`), what it does to the step in words,
and whether it alters the training's numerics (:attr:`Change.numerics`). The what-if
toggles (:mod:`memfit.engine.whatif`), make-it-fit (:mod:`memfit.engine.solve`), the remedies of
:mod:`memfit.engine.explain` and the sweep's axes (:mod:`memfit.engine.sweep`) each pick the
changes they
offer from :data:`CHANGES`; none keeps a rule of its own.

The rules follow the mechanism. A ZeRO stage applies where it shards something
(:func:`nothing_to_shard`: not on one GPU, nor on a data-parallel shard
group of one); an optimizer offload needs ZeRO's partitions to run on, so it raises the
stage to 1, and applies on one GPU too (ZeRO-Offload's own case). Flash attention applies
where the kernel that runs is not flash already -- SDPA runs flash for 16-bit inputs,
except where the model's call falls back to the math kernel -- and never to fp32 compute,
for which there is no flash kernel. A change whose changed training the specs reject does
not apply either, and says so.

>>> from memfit.engine.presets import load_gpu, load_model
>>> from memfit.engine.specs import HardwareSpec, Scenario
>>> s = Scenario(load_model("gpt2"), HardwareSpec(load_gpu("l4")))
>>> BY_ID["8bit-optimizer"].apply(s).training.optimizer
'adamw-8bit'
>>> BY_ID["zero3"].why_not(s)
'one GPU: there is nothing to shard'
>>> [c.id for c in CHANGES if c.alters_numerics]
['qlora', 'lora', 'pure-bf16', 'chunked-loss', '8bit-optimizer', 'half-sequence']

Changes that set the same thing (:attr:`Change.setting`: the training method, the
precision, the checkpointing, the micro-batch, the ZeRO stage) replace one another: a
combination holds at most one of each (:func:`compatible`). Several changes are made in the
order of :data:`CHANGES` (:func:`in_order`): what is trained, then the number formats, the
attention kernel, the loss and the loop's habits, the optimizer, the activations, the
micro-batch, the sharding and offload that place the optimizer's state and the parameters,
and last the layout: a model-parallel axis twice as wide on the same GPUs (one change per
axis of :data:`memfit.engine.specs.PARALLEL_AXES` that splits the model), twice the GPUs,
half the sequence. A change whose mesh does not hold (an axis that does not divide the
GPUs, the heads or the experts) does not apply, and says why; nor does one the scenario's
training stack cannot run (pipeline parallelism under the Hugging Face Trainer: the
stack's abilities, :mod:`memfit.engine.abilities`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from memfit.engine.errors import EstimateError
from memfit.engine.layers import attention_kernel, attention_run
from memfit.engine.plan import resolve
from memfit.engine.sharding import not_ddp
from memfit.engine.specs import PARALLEL_AXES, Scenario
from memfit.engine.stacks import as_built, conventions, new_refusal

#: A change's rule: why it does not apply to a scenario, or ``None`` where it does.
Rule = Callable[[Scenario], str | None]
#: A change made: the scenario with it (called only where the rule lets it apply).
Make = Callable[[Scenario], Scenario]


def nothing_to_shard(scenario: Scenario, stage: int) -> str | None:
    """Why ZeRO stage ``stage`` would shard nothing for ``scenario`` -- one GPU, or a
    data-parallel shard group of one GPU -- or ``None`` where it shards. A stage that
    shards nothing only adds what its gathering and buckets keep (the what-if toggles and
    make-it-fit both ask this one rule)."""
    if scenario.hardware.world_size == 1:
        return "one GPU: there is nothing to shard"
    par = scenario.training.parallelism
    if par.zero_stage != stage:
        training = dataclasses.replace(
            scenario.training, parallelism=dataclasses.replace(par, zero_stage=stage)
        )
        scenario = dataclasses.replace(scenario, training=training)
    try:
        mesh = resolve(scenario).mesh
    except EstimateError as exc:
        return f"the parallel layout is invalid: {exc}"
    if mesh.shard == 1:
        return (
            "the data-parallel shard group is one GPU (tensor, pipeline and context "
            "parallelism take them all): there is nothing to shard"
        )
    return None


class NotApplicable(ValueError):
    """A change was asked of a scenario it does not apply to; the message says why."""

    def __init__(self, change: str, reason: str) -> None:
        super().__init__(f"{change}: {reason}")
        self.change = change
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Change:
    """One change to a scenario: its rule, how it is made and what it does."""

    #: stable: what settings, tests and exports name it by
    id: str
    label: str
    #: what the change does to the step, in words (the what-if note after the percentage)
    compute_reason: str
    rule: Rule
    make: Make
    #: how the training computes something else with it, in words; ``""`` where the
    #: numbers it trains with are the scenario's (sharding, offload, recomputation,
    #: kernels and loop habits that compute the same thing)
    numerics: str = ""
    #: what it sets, in words, where other changes set it too: those replace each other
    setting: str = ""
    #: the training fields it sets to fixed values, as (field, value); empty where what it
    #: sets depends on the scenario
    sets: tuple[tuple[str, object], ...] = ()

    @property
    def key(self) -> str:
        """The id, by the name the what-if results and exports use."""
        return self.id

    @property
    def alters_numerics(self) -> bool:
        return bool(self.numerics)

    def value(self, field: str) -> object:
        """The value this change sets the training field ``field`` to (``KeyError`` where
        it sets no fixed value there)."""
        return dict(self.sets)[field]

    def attempt(self, scenario: Scenario) -> Scenario | str:
        """The scenario with this change made, or the reason it does not apply: its rule's,
        that the specs reject the changed training, or that the scenario's training stack
        cannot run it (:func:`memfit.engine.stacks.new_refusal`: a plan stays inside what
        the user's stack can run)."""
        reason = self.rule(scenario)
        if reason is not None:
            return reason
        try:
            made = self.make(scenario)
        except EstimateError as exc:
            return f"the changed scenario is invalid: {exc}"
        return new_refusal(scenario, made) or made

    def why_not(self, scenario: Scenario) -> str | None:
        """Why this change does not apply to ``scenario``; ``None`` where it applies."""
        made = self.attempt(scenario)
        return made if isinstance(made, str) else None

    def applies(self, scenario: Scenario) -> bool:
        return self.why_not(scenario) is None

    def apply(self, scenario: Scenario) -> Scenario:
        """The scenario with this change made; :class:`NotApplicable` where it does not
        apply."""
        made = self.attempt(scenario)
        if isinstance(made, str):
            raise NotApplicable(self.id, made)
        return made


def with_training(scenario: Scenario, **fields: object) -> Scenario:
    """``scenario`` with the training fields ``fields`` replaced."""
    training = dataclasses.replace(scenario.training, **fields)  # type: ignore[arg-type]
    return dataclasses.replace(scenario, training=training)


@dataclass(frozen=True, slots=True)
class _Sets:
    """The making of a change that sets training fields to fixed values."""

    fields: tuple[tuple[str, object], ...]

    def __call__(self, s: Scenario) -> Scenario:
        return with_training(s, **dict(self.fields))


@dataclass(frozen=True, slots=True)
class _UnlessSet:
    """The rule of a change that sets fields and needs nothing else: ``reason`` where the
    scenario has those values already."""

    reason: str
    fields: tuple[tuple[str, object], ...]

    def __call__(self, s: Scenario) -> str | None:
        t = s.training
        return self.reason if all(getattr(t, k) == v for k, v in self.fields) else None


def _setter(
    id: str,
    label: str,
    compute_reason: str,
    rule: Rule | str,
    *,
    numerics: str = "",
    setting: str = "",
    **fields: object,
) -> Change:
    """A change that sets the training ``fields``; ``rule`` is its rule, or the reason it
    does not apply where the fields have those values already (and nothing else stops it)."""
    sets = tuple(fields.items())
    check = _UnlessSet(rule, sets) if isinstance(rule, str) else rule
    return Change(id, label, compute_reason, check, _Sets(sets), numerics, setting, sets)


# --- the rules that are more than "already set", and the changes that set more ----------


def _mixed_rule(s: Scenario) -> str | None:
    t = s.training
    if t.precision != "fp32":
        return f"the scenario already computes in 16 bits or fewer ({t.precision})"
    return None


def _flash_rule(s: Scenario) -> str | None:
    t = s.training
    fp32 = t.precision == "fp32"
    # the kernel the step runs: a model (as its stack builds it) whose SDPA call has no
    # fused kernel runs the math fallback
    model = as_built(s.model, t)
    if model.attention_sinks:
        return "no flash kernel has a backward with attention sinks: they train in eager attention"
    attention = attention_run(model, t.attention)  # SDPA cannot soft-cap the scores
    if attention_kernel(attention, fp32=fp32, sdpa_math=model.sdpa_math) == "flash":
        if t.attention == "flash":
            return "the scenario already uses flash attention"
        return "SDPA already runs the flash kernel for 16-bit compute"
    if fp32:
        # FlashAttention has fp16/bf16 kernels only (Dao et al. 2022; PyTorch's SDPA
        # flash backend likewise): offering it on fp32 would promise a kernel that cannot run
        return "flash attention needs 16-bit compute; this scenario computes in fp32"
    return None


def _eight_bit_rule(s: Scenario) -> str | None:
    t = s.training
    return None if t.optimizer == "adamw" else f"needs AdamW; the optimizer is {t.optimizer}"


def _release_outputs_rule(s: Scenario) -> str | None:
    t = s.training
    if not conventions(t).outputs_held:
        return f"the {t.stack} loop already releases the model output before backward"
    return None


def _release_previous_rule(s: Scenario) -> str | None:
    t = s.training
    if not conventions(t).previous_held:
        return f"the {t.stack} loop already frees each step before the next"
    return None


def _bucket_view_rule(s: Scenario) -> str | None:
    if conventions(s.training).gradient_as_bucket_view:
        return "the gradients are already views of DDP's buckets"
    try:
        mesh = resolve(s).mesh
    except EstimateError as exc:
        return f"the parallel layout is invalid: {exc}"
    return not_ddp(s.training, mesh)


def _no_cache_rule(s: Scenario) -> str | None:
    return None if conventions(s.training).kv_cache else "the model output keeps no KV cache"


def _offload_inputs_rule(s: Scenario) -> str | None:
    t = s.training
    if t.offload.activations == "cpu":
        return "the checkpointed inputs already wait in host memory"
    if t.activation_checkpointing in ("none", "selective"):
        how = "no layer" if t.activation_checkpointing == "none" else "selectively"
        return f"it offloads the inputs of checkpointed layers; the scenario checkpoints {how}"
    return None


def _offload_inputs(s: Scenario) -> Scenario:
    t = s.training
    return with_training(s, offload=dataclasses.replace(t.offload, activations="cpu"))


def _half_micro_rule(s: Scenario) -> str | None:
    b = s.training.micro_batch_size
    return None if b >= 2 and b % 2 == 0 else f"the micro-batch ({b}) does not halve"


def _half_micro(s: Scenario) -> Scenario:
    """Half the micro-batch, twice the accumulation: the same global batch."""
    t = s.training
    return with_training(
        s,
        micro_batch_size=t.micro_batch_size // 2,
        gradient_accumulation_steps=t.gradient_accumulation_steps * 2,
    )


def _micro_one_rule(s: Scenario) -> str | None:
    b = s.training.micro_batch_size
    # under 4, micro-batch 1 is the half micro-batch (2) or no change at all (1)
    return None if b >= 4 else f"the micro-batch ({b}) is under 4"


def _micro_one(s: Scenario) -> Scenario:
    """Micro-batch 1, the global batch kept by accumulation."""
    t = s.training
    return with_training(
        s,
        micro_batch_size=1,
        gradient_accumulation_steps=t.gradient_accumulation_steps * t.micro_batch_size,
    )


#: how a ZeRO stage is named where a scenario already uses it
ZERO_NAMES = {1: "ZeRO-1", 2: "ZeRO-2 / FSDP SHARD_GRAD_OP", 3: "ZeRO-3 / FSDP FULL_SHARD"}


@dataclass(frozen=True, slots=True)
class _ZeroRule:
    """A ZeRO stage applies above the scenario's stage, where it shards something."""

    stage: int

    def __call__(self, s: Scenario) -> str | None:
        current = s.training.parallelism.zero_stage
        if current >= self.stage:
            return f"the scenario already uses {ZERO_NAMES[current]}"
        return nothing_to_shard(s, self.stage)


@dataclass(frozen=True, slots=True)
class _Zero:
    stage: int

    def __call__(self, s: Scenario) -> Scenario:
        par = dataclasses.replace(s.training.parallelism, zero_stage=self.stage)
        return with_training(s, parallelism=par)


def _cpu_offload_rule(s: Scenario) -> str | None:
    t = s.training
    if t.offload.optimizer != "none":
        return f"the optimizer is already offloaded ({t.offload.optimizer})"
    return None


def _cpu_offload(s: Scenario) -> Scenario:
    """The optimizer step on the CPU, on ZeRO's partitions (stage 1 at least)."""
    t = s.training
    par = dataclasses.replace(t.parallelism, zero_stage=max(1, t.parallelism.zero_stage))
    offload = dataclasses.replace(t.offload, optimizer="cpu")
    return with_training(s, parallelism=par, offload=offload)


def _laid_out(s: Scenario) -> Scenario:
    """``s`` where its mesh holds (the mesh's :class:`EstimateError` otherwise: the change
    that made it then does not apply, and says why)."""
    resolve(s)
    return s


def _offload_parameters_rule(s: Scenario) -> str | None:
    offload = s.training.offload
    if offload.parameters != "none":
        return f"the parameters are already offloaded ({offload.parameters})"
    return None


def _offload_parameters(s: Scenario) -> Scenario:
    """The parameters in host memory, gathered to the GPU layer by layer: ZeRO-3's (or
    FSDP's) parameter offload, on stage 3."""
    t = s.training
    par = dataclasses.replace(t.parallelism, zero_stage=3)
    offload = dataclasses.replace(t.offload, parameters="cpu")
    return _laid_out(with_training(s, parallelism=par, offload=offload))


@dataclass(frozen=True, slots=True)
class _Wider:
    """Twice the size of a model-parallel axis on the same GPUs: the data-parallel size
    (the experts' data-parallel split, for expert parallelism) halves."""

    axis: str

    def rule(self, s: Scenario) -> str | None:
        if s.hardware.world_size < 2:
            return "one GPU: there is nothing to split it over"
        return None

    def __call__(self, s: Scenario) -> Scenario:
        par = s.training.parallelism
        wider = dataclasses.replace(par, **{self.axis: getattr(par, self.axis) * 2})
        return _laid_out(with_training(s, parallelism=wider))


def _more_gpus(s: Scenario) -> Scenario:
    """Twice the GPUs -- twice the node's count up to 8 a node, then twice the nodes --
    with the data-parallel size doubled; the global batch kept where the accumulation
    halves."""
    hw, t = s.hardware, s.training
    if hw.gpus_per_node < 8:
        hw = dataclasses.replace(hw, gpus_per_node=min(8, hw.gpus_per_node * 2))
    else:
        hw = dataclasses.replace(hw, nodes=hw.nodes * 2)
    doubled = hw.world_size // s.hardware.world_size == 2
    k = t.gradient_accumulation_steps
    if doubled and k % 2 == 0:
        t = dataclasses.replace(t, gradient_accumulation_steps=k // 2)
    return _laid_out(dataclasses.replace(s, hardware=hw, training=t))


def _half_sequence_rule(s: Scenario) -> str | None:
    n = s.training.sequence_length
    return None if n >= 2 and n % 2 == 0 else f"the sequence length ({n}) does not halve"


def _half_sequence(s: Scenario) -> Scenario:
    return _laid_out(with_training(s, sequence_length=s.training.sequence_length // 2))


def zero_refusal(scenario: Scenario) -> str | None:
    """Why ``scenario``'s ZeRO stage and optimizer offload are not a layout the changes
    here make: an optimizer offload below ZeRO-1, or a stage that shards nothing
    (:func:`nothing_to_shard`) other than the ZeRO-1 an optimizer offload
    runs on. ``None`` for ZeRO-0 without offload and for every layout the changes reach."""
    par, offload = scenario.training.parallelism, scenario.training.offload
    if offload.optimizer != "none" and par.zero_stage == 0:
        return "the optimizer offload runs on ZeRO's partitions: it needs ZeRO-1 or more"
    carrier = 1 if offload.optimizer != "none" else 0
    if par.zero_stage > carrier:
        return nothing_to_shard(scenario, par.zero_stage)
    return None


# --- the registry ------------------------------------------------------------------------

METHOD = "the training method"
PRECISION = "the precision"
CHECKPOINTING = "the activation checkpointing"
MICRO_BATCH = "the micro-batch"
ZERO = "the ZeRO stage"

#: every change, in the order several are made in (see the module's doc)
CHANGES: tuple[Change, ...] = (
    _setter(
        "qlora",
        "QLoRA (4-bit base)",
        "no weight gradients for the frozen base, but the 4-bit weights are dequantized "
        "for every matmul",
        "the scenario already trains QLoRA adapters",
        numerics="low-rank adapters on a 4-bit quantized base are trained, not the weights",
        setting=METHOD,
        method="qlora",
    ),
    _setter(
        "lora",
        "LoRA (r=16)",
        "no weight gradients for the frozen base",
        "the scenario already trains LoRA adapters",
        numerics="low-rank adapters are trained, not the weights",
        setting=METHOD,
        method="lora",
    ),
    # autocast keeps fp32 master weights and optimizer states: the recipe that trains to
    # fp32's accuracy (Micikevicius et al. 2018), so not counted as altering the numerics
    _setter(
        "mixed-precision",
        "Mixed precision (bf16)",
        "matmuls on the tensor cores at the 16-bit rate",
        _mixed_rule,
        setting=PRECISION,
        precision="bf16-mixed",
    ),
    _setter(
        "pure-bf16",
        "Pure bf16 (weights and states)",
        "matmuls at the 16-bit rate, and no fp32 master copy to cast from",
        "the weights and optimizer states are already bf16",
        numerics="bf16 weights and optimizer states: no fp32 master copy, small updates round off",
        setting=PRECISION,
        precision="bf16",
    ),
    _setter(
        "flash-attention",
        "Flash attention",
        "the attention core in one kernel; no s x s scores kept",
        _flash_rule,
        attention="flash",
    ),
    _setter(
        "torch-compile",
        "torch.compile",
        "element-wise ops fused into kernels that write only what leaves them; the backward "
        "recomputes them from what the partitioner kept",
        "the model is compiled already",
        torch_compile=True,
    ),
    _setter(
        "chunked-loss",
        "Chunked loss (fused linear cross-entropy)",
        "the LM head and the loss run a chunk of rows at a time",
        "the loss is already chunked",
        numerics="another loss implementation: the LM head and the cross-entropy fused, by chunks",
        loss="chunked",
    ),
    _setter(
        "release-outputs",
        "Release outputs before backward",
        "no compute change: the loop keeps only the loss (loss = out.loss; del out)",
        _release_outputs_rule,
        outputs_held_through_backward=False,
    ),
    _setter(
        "no-kv-cache",
        "No KV cache in the output (use_cache=False)",
        "no compute change: the keys and values are not returned",
        _no_cache_rule,
        kv_cache_in_outputs=False,
    ),
    _setter(
        "release-previous-step",
        "Free the previous step",
        "no compute change: the loop deletes its loss and outputs after each step "
        "(del loss, logits), so the next forward does not carry them",
        _release_previous_rule,
        previous_step_held=False,
    ),
    _setter(
        "gradient-bucket-view",
        "DDP gradients as bucket views",
        "less memory traffic: DDP(..., gradient_as_bucket_view=True) all-reduces the "
        "gradients in place instead of copying them into its buckets and back",
        _bucket_view_rule,
        gradient_as_bucket_view=True,
    ),
    _setter(
        "fused-optimizer",
        "Fused optimizer",
        "one kernel per step for the optimizer update, no temporaries",
        "the optimizer is already fused",
        optimizer_impl="fused",
    ),
    _setter(
        "8bit-optimizer",
        "8-bit AdamW",
        "fewer optimizer bytes to update",
        _eight_bit_rule,
        numerics="AdamW's moments quantized to 8 bits, block by block",
        optimizer="adamw-8bit",
    ),
    _setter(
        "selective-checkpointing",
        "Selective checkpointing",
        "the attention core runs again in backward (Korthikanti et al. 2022)",
        "the scenario already checkpoints selectively",
        setting=CHECKPOINTING,
        activation_checkpointing="selective",
    ),
    _setter(
        "checkpointing",
        "Gradient checkpointing",
        "the forward runs again in backward (Chen et al. 2016)",
        "the scenario already checkpoints every layer",
        setting=CHECKPOINTING,
        activation_checkpointing="full",
    ),
    Change(
        "offload-activations",
        "Checkpointed inputs to host memory",
        "each checkpointed input crosses the host link twice",
        _offload_inputs_rule,
        _offload_inputs,
    ),
    Change(
        "half-micro-batch",
        "Half the micro-batch, twice the accumulation",
        "twice the micro-steps, each on half the rows",
        _half_micro_rule,
        _half_micro,
        setting=MICRO_BATCH,
    ),
    Change(
        "micro-batch-1",
        "Micro-batch 1, the rest by accumulation",
        "one sequence per micro-step, as many micro-steps as the micro-batch held",
        _micro_one_rule,
        _micro_one,
        setting=MICRO_BATCH,
    ),
    Change(
        "zero1",
        "ZeRO-1 (optimizer states sharded)",
        "optimizer states sharded: the traffic of plain data parallelism (ZeRO, sec. 7)",
        _ZeroRule(1),
        _Zero(1),
        setting=ZERO,
    ),
    Change(
        "zero2",
        "ZeRO-2 (and gradients)",
        "gradients reduce-scattered: the traffic of plain data parallelism (ZeRO, sec. 7)",
        _ZeroRule(2),
        _Zero(2),
        setting=ZERO,
    ),
    Change(
        "zero3",
        "ZeRO-3 / FSDP",
        "parameters gathered layer by layer: 1.5x the data-parallel traffic (ZeRO, sec. 7)",
        _ZeroRule(3),
        _Zero(3),
        setting=ZERO,
    ),
    Change(
        "cpu-offload",
        "CPU offload",
        "optimizer step on the CPU; gradients and weights cross the host link every step",
        _cpu_offload_rule,
        _cpu_offload,
    ),
    Change(
        "offload-parameters",
        "Parameters to host memory (ZeRO-3)",
        "every layer's parameters cross the host link in forward and again in backward",
        _offload_parameters_rule,
        _offload_parameters,
    ),
    *(
        Change(
            f"{axis.key}-x2",
            f"Twice the {axis.label.lower()} size",
            f"split over twice the GPUs: more {axis.group} traffic, half the data-parallel ranks",
            _Wider(axis.key).rule,
            _Wider(axis.key),
            setting=f"the {axis.label.lower()} size",
        )
        for axis in PARALLEL_AXES
        if axis.section == "model"
    ),
    Change(
        "more-gpus",
        "Twice the GPUs",
        "twice the data-parallel ranks: each step's gradients reduced over twice the GPUs",
        lambda s: None,
        _more_gpus,
    ),
    Change(
        "half-sequence",
        "Half the sequence length",
        "half the rows per sequence; attention's quadratic work a quarter",
        _half_sequence_rule,
        _half_sequence,
        numerics="trains on sequences half as long",
    ),
)
BY_ID: dict[str, Change] = {c.id: c for c in CHANGES}
assert len(BY_ID) == len(CHANGES), "change ids must be unique"


def pick(ids: Iterable[str]) -> tuple[Change, ...]:
    """The changes ``ids``, in that order; an unknown id is a ``KeyError``."""
    return tuple(BY_ID[i] for i in ids)


def in_order(ids: Iterable[str]) -> tuple[str, ...]:
    """``ids`` in the order of :data:`CHANGES`, each once."""
    asked = set(ids)
    return tuple(c.id for c in CHANGES if c.id in asked)


def clash(made: Iterable[str], id: str) -> str | None:
    """The first of ``made`` that sets what the change ``id`` sets (one would replace the
    other), or ``None``."""
    setting = BY_ID[id].setting
    if not setting:
        return None
    return next((m for m in made if m != id and BY_ID[m].setting == setting), None)


def compatible(ids: Iterable[str]) -> bool:
    """No two of ``ids`` set the same thing."""
    settings = [BY_ID[i].setting for i in ids if BY_ID[i].setting]
    return len(settings) == len(set(settings))


def made_in_turn(scenario: Scenario, ids: Iterable[str]) -> Scenario | tuple[str, str]:
    """``scenario`` with the changes ``ids`` made one after another, each on what the ones
    before it left; ``(id, reason)`` for the first that does not apply there."""
    s = scenario
    for i in ids:
        made = BY_ID[i].attempt(s)
        if isinstance(made, str):
            return i, made
        s = made
    return s


@dataclass(frozen=True, slots=True)
class _InTurnRule:
    """The rule of changes made in turn; equal for equal ids, so two results of the same
    combination compare equal."""

    ids: tuple[str, ...]

    def __call__(self, s: Scenario) -> str | None:
        made = made_in_turn(s, self.ids)
        return None if isinstance(made, Scenario) else f"{BY_ID[made[0]].label}: {made[1]}"


@dataclass(frozen=True, slots=True)
class _InTurn:
    ids: tuple[str, ...]

    def __call__(self, s: Scenario) -> Scenario:
        made = made_in_turn(s, self.ids)
        if isinstance(made, Scenario):
            return made
        raise NotApplicable(*made)


def in_turn(id: str, label: str, ids: Iterable[str]) -> Change:
    """One change that makes the changes ``ids`` in turn, in the order given: it applies
    where each applies to what the ones before it left."""
    ids = tuple(ids)
    parts = pick(ids)
    return Change(
        id,
        label,
        "; ".join(c.compute_reason for c in parts),
        _InTurnRule(ids),
        _InTurn(ids),
        "; ".join(c.numerics for c in parts if c.numerics),
    )

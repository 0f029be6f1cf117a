"""The device mesh, data-parallel sharding (ZeRO / FSDP) and offload of the model state.

* :func:`make_mesh` splits the GPUs into tensor (``tp``), pipeline (``pp``) and context
  (``cp``) parallel groups, derives the data-parallel size ``dp = GPUs / (tp pp cp)``, the
  group that shares the ZeRO shards (``dp``, or the ranks of one node under
  ``hybrid_shard``) and the expert data-parallel size ``dp / ep``, and reports every
  inconsistency as an :class:`~memfit.engine.errors.EstimateError`;
* :func:`framework_items` lays the model state out as the framework does under mixed
  precision: PyTorch AMP / FSDP keep fp32 weights and gradients; DeepSpeed keeps 16-bit
  weights and gradients in the module and an fp32 master copy and gradient partition in
  its optimizer (``stage_1_and_2.py``, ``stage3.py``); Megatron-LM keeps 16-bit weights,
  an fp32 ``main_grad`` buffer and, in its distributed optimizer, fp32 master weights
  (``docs/source/api-guide/dist_optimizer.md``: ``6 + 12/d`` bytes per parameter);
* :func:`shard` divides the model state over ``dp`` ranks as ZeRO does (Rajbhandari et al.
  2020, section 5, figure 1): stage 1 partitions the optimizer states, stage 2 also the
  gradients, stage 3 also the parameters, which are all-gathered one unit (a layer) at a
  time for its forward and backward, with the next unit prefetched. PyTorch FSDP's
  ``SHARD_GRAD_OP`` is stage 2 and ``FULL_SHARD`` (FSDP2 ``fully_shard`` per block) stage 3;
* offload (ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity, Rajbhandari et al. 2021) moves the
  optimizer states -- and, since the step then runs on the CPU, the gradient shards -- to
  host memory, and with stage 3 the parameter shards too; the GPU keeps the gathered units.

>>> from memfit.engine.presets import load_gpu, load_model
>>> from memfit.engine.specs import HardwareSpec, Scenario
>>> s = Scenario(load_model("gpt2"), HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8))
>>> from memfit.engine.plan import make_mesh
>>> make_mesh(s).dp
8
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

from memfit.engine import memo
from memfit.engine.model_state import (
    BUFFERS,
    MemoryItem,
    ModelState,
    TensorSplit,
    fused_experts,
    nf4_bytes,
    split_tensors,
    storage_bytes,
    stored_tensors,
    weights_label,
)
from memfit.engine.overhead import MIB
from memfit.engine.params import TensorGroup, model_tensors
from memfit.engine.plan.mesh import Mesh
from memfit.engine.plan.precision import precision_of
from memfit.engine.specs import ModelSpec, QuantSpec, Scenario, TrainingSpec
from memfit.engine.stacks import conventions
from memfit.engine.timeline import Gather

#: DeepSpeed's default ``reduce_bucket_size`` (elements): ZeRO-2/3 reduce the 16-bit
#: gradients through a contiguous bucket of this size instead of keeping them all
DS_REDUCE_BUCKET = 500_000_000
MIXED = ("bf16-mixed", "fp16-mixed", "fp8-mixed")


def tensor_parallel_shard(model: ModelSpec, tp: int, ep: int = 1) -> ModelSpec:
    """What one tensor- (and expert-) parallel rank holds and computes (Megatron-LM,
    Shoeybi et al. 2019).

    Attention is split by heads (column-parallel q/k/v, row-parallel output), the MLP by its
    intermediate size, the embedding and LM head by vocabulary (vocab-parallel, so each rank
    holds ``b s V / tp`` logits); norms stay whole. Without sequence parallelism the
    hidden-size activations (residual stream, norm inputs and outputs) are replicated on
    every rank, exactly as the layer simulation of this narrower model keeps them
    (Korthikanti et al. 2022, table 2, "tensor parallel" row). Key/value heads fewer than
    ``tp`` are replicated, one per rank. Under expert parallelism each rank holds
    ``num_experts / ep`` of the routed experts.
    """
    if tp == 1 and ep == 1:
        return model
    parts = ([f"1/{tp} tensor-parallel"] if tp > 1 else []) + (
        [f"1/{ep} expert-parallel"] if ep > 1 else []
    )
    return replace(
        model,
        name=f"{model.name} ({', '.join(parts)} rank)",
        num_attention_heads=model.num_attention_heads // tp,
        num_key_value_heads=max(1, model.num_key_value_heads // tp),
        intermediate_size=_ceil_div(model.intermediate_size, tp),
        moe_intermediate_size=_ceil_div(model.moe_intermediate_size, tp),
        shared_expert_intermediate_size=_ceil_div(model.shared_expert_intermediate_size, tp),
        vocab_size=_ceil_div(model.vocab_size, tp),
        expert_shards=ep,
    )


#: optimizers whose states bitsandbytes allocates in CUDA unified memory
#: (``cudaMallocManaged``, ``F.get_paged``): outside PyTorch's caching allocator, resident
#: on the GPU while memory is free and evicted to the host by the driver under pressure;
#: each step prefetches one parameter's states before updating it (``prefetch_state``)
PAGED_OPTIMIZERS = frozenset({"paged-adamw-8bit"})
PAGED = " (paged: unified memory, evicted to the host under pressure)"


@dataclass(frozen=True, slots=True)
class Sharded:
    """One rank's share of the model state and what it leaves elsewhere."""

    state: ModelState
    #: the share of gradients that stays on this GPU as backward produces them
    grad_share: Fraction
    #: the share of the optimizer's temporaries allocated on this GPU
    optimizer_share: Fraction
    #: all-gathered parameter units and communication buffers (ZeRO-3 / FSDP)
    gather: Gather
    host: tuple[MemoryItem, ...]
    nvme: tuple[MemoryItem, ...]
    #: gradient buffers that live through the whole step (Megatron's ``main_grad``,
    #: DeepSpeed's fp32 partition and reduce bucket), included in ``state``'s gradients
    grad_buffer: int = 0


def _ceil_div(n: int, d: int) -> int:
    return -(-n // d)


@dataclass(frozen=True, slots=True)
class _Part:
    """A model-state item and how the framework treats it."""

    item: MemoryItem
    #: the lowest ZeRO stage that shards it over the data-parallel ranks
    shard_from: int
    #: it lives through the whole step (a buffer), not only from backward to the step
    persistent: bool = False
    #: a communication buffer: offload leaves it on the GPU
    pinned_to_gpu: bool = False


def params_sharded_from(framework: str) -> int:
    """The lowest ZeRO stage that shards the parameters at rest: FSDP's SHARD_GRAD_OP
    shards them too (they are gathered from the forward to the backward); DeepSpeed's
    ZeRO-2 keeps them whole."""
    return 2 if framework == "pytorch" else 3


def sixteen_bit_module(training: TrainingSpec) -> bool:
    """Whether the framework keeps a 16-bit copy of the trained weights as the module's
    parameters and their fp32 master in the optimizer (DeepSpeed and Megatron under mixed
    precision; PyTorch AMP keeps the fp32 weights as the parameters)."""
    return training.precision in MIXED and training.parallelism.framework != "pytorch"


def framework_items(state: ModelState, training: TrainingSpec) -> list[_Part]:
    """The model state as the chosen framework lays it out (see the module docstring)."""
    framework = training.parallelism.framework
    params_from = params_sharded_from(framework)
    stage_of = {"parameters": params_from, "gradients": 2, "optimizer_states": 1, "overhead": 99}
    mixed = sixteen_bit_module(training)
    parts: list[_Part] = []
    n = state.trainable_params
    for item in state.items:
        if mixed and item.role == "saved-copies":
            continue  # PEFT's modules_to_save copies: in the framework's items below (n)
        # under mixed precision the trainable weights are fp32 (model_state.trainable_dtype)
        if mixed and item.role == "trainable-weights":
            label = weights_label(training.method)
            parts.append(
                _Part(
                    MemoryItem(
                        f"{label} (16-bit)",
                        "parameters",
                        2 * n,
                        f"{n:,} x 2 B",
                        _SRC[framework],
                        role="trainable-weights",
                    ),
                    3,
                )
            )
            parts.append(
                _Part(
                    MemoryItem(
                        "fp32 master weights",
                        "optimizer_states",
                        4 * n,
                        f"{n:,} x 4 B",
                        _SRC[framework],
                    ),
                    1,
                )
            )
        elif mixed and item.category == "gradients":
            if framework == "deepspeed":
                parts += _deepspeed_gradients(n, training)
            else:
                main = MemoryItem(
                    "main_grad buffer (fp32)", "gradients", 4 * n, f"{n:,} x 4 B", _SRC[framework]
                )
                # with the optimizer offloaded (HybridDeviceOptimizer) the buffer stays:
                # gradients are copied to the host for the step
                parts.append(_Part(main, 2, persistent=True, pinned_to_gpu=True))
        else:
            parts.append(_Part(item, stage_of[item.category]))
    return parts


def _deepspeed_gradients(n: int, training: TrainingSpec) -> list[_Part]:
    """DeepSpeed's gradient memory for ``n`` trainable parameters (``stage_1_and_2.py``,
    ``stage3.py``): without ZeRO-2 the module's 16-bit gradients stay whole; ZeRO-2/3
    reduce them through a contiguous bucket (``reduce_bucket_size`` elements) as backward
    makes them, ZeRO-2 into a 16-bit partition (``grads_in_partition``); the optimizer
    keeps an fp32 gradient partition. With the optimizer offloaded the reduced gradients
    go straight to the host's fp32 buffer."""
    stage = training.parallelism.zero_stage
    offloaded = training.offload.optimizer != "none"
    src = _SRC["deepspeed"]
    parts: list[_Part] = []
    if stage <= 1:
        parts.append(_Part(MemoryItem("gradients (16-bit)", "gradients", 2 * n, f"{n:,} x 2 B"), 2))
    else:
        bucket = min(DS_REDUCE_BUCKET, n)
        item = MemoryItem(
            "gradient reduce bucket (16-bit)",
            "gradients",
            2 * bucket,
            f"min(reduce_bucket_size {DS_REDUCE_BUCKET:,}, {n:,}) x 2 B",
            "DeepSpeed ZeRO contiguous_gradients (ipg buffer)",
            role="reduce-bucket",
        )
        parts.append(_Part(item, 99, persistent=True, pinned_to_gpu=True))
        if stage == 2 and not offloaded:
            part = MemoryItem("16-bit gradient partition", "gradients", 2 * n, f"{n:,} x 2 B", src)
            parts.append(_Part(part, 2, persistent=True))
    fp32 = MemoryItem("fp32 gradient partition", "gradients", 4 * n, f"{n:,} x 4 B", src)
    parts.append(_Part(fp32, 1, persistent=True))
    return parts


def not_ddp(training: TrainingSpec, mesh: Mesh) -> str | None:
    """Why the step runs no DDP all-reduce buckets (:func:`_ddp_buckets`), or None where
    it does: PyTorch's framework at ZeRO stage 0 with more than one replica, the optimizer
    on the GPU and stepped after backward."""
    parallelism = training.parallelism
    if parallelism.framework != "pytorch":
        return f"{parallelism.framework} reduces the gradients through its own buffers"
    if parallelism.zero_stage != 0:
        return f"ZeRO-{parallelism.zero_stage} (FSDP) reduce-scatters the gradients"
    if mesh.dp * mesh.cp == 1:
        return "one replica: nothing to all-reduce"
    if training.offload.optimizer != "none":
        return "the optimizer runs on the host"
    if training.optimizer_in_backward:
        return "each gradient is stepped and freed in backward"
    return None


def _ddp_buckets(state: ModelState, training: TrainingSpec, mesh: Mesh) -> list[_Part]:
    """PyTorch DDP's gradient buckets, under ZeRO stage 0 of the PyTorch framework with more
    than one replica. DDP's reducer (``torch/csrc/distributed/c10d/reducer.cpp``,
    ``initialize_buckets``) allocates one flat tensor per bucket of ``bucket_cap_mb``
    (25 MiB), in the parameters' dtype, for every parameter that needs a gradient; they
    live as long as the DDP module. Backward's hook copies each gradient into its bucket,
    all-reduces the bucket and copies the result back, so the gradients exist twice --
    unless ``gradient_as_bucket_view=True`` (``DistributedDataParallel``'s argument, False
    by default in PyTorch, accelerate's ``DistributedDataParallelKwargs`` and Lightning's
    ``DDPStrategy``), which makes each ``.grad`` a view of its bucket."""
    if not_ddp(training, mesh) or conventions(training).gradient_as_bucket_view:
        return []
    n = sum(item.bytes for item in state.items if item.category == "gradients")
    if not n:
        return []
    item = MemoryItem(
        "DDP gradient buckets",
        "gradients",
        n,
        f"a second copy of the gradients, {n:,} B (gradient_as_bucket_view=False)",
        "torch DistributedDataParallel: reducer.cpp initialize_buckets",
        role="gradient-buffer",
    )
    return [_Part(item, 99, persistent=True, pinned_to_gpu=True)]


_SRC = {
    "deepspeed": "DeepSpeed ZeRO (stage_1_and_2.py / stage3.py): 16-bit module, fp32 partition",
    "megatron": "Megatron-LM distributed optimizer (dist_optimizer.md): 6 + 12/d B",
    "pytorch": "PyTorch AMP",
}


def _expert_share(model: ModelSpec, training: TrainingSpec) -> Fraction:
    """The share of the trainable parameters that are routed experts."""
    if not model.is_moe or training.method not in ("full", "freeze"):
        return Fraction(0)
    tensors = model_tensors(model)
    total = sum(g.total for g in tensors)
    experts = sum(g.total for g in tensors if g.component == "experts")
    return Fraction(experts, total) if total else Fraction(0)


def _expert_group(mesh: Mesh) -> int:
    """The ranks a routed expert's sharded state is divided over (ZeRO / FSDP)."""
    return max(1, mesh.expert_dp if mesh.shard == mesh.dp * mesh.cp else mesh.shard // mesh.ep)


def shard(
    state: ModelState,
    scenario: Scenario,
    mesh: Mesh,
    model: ModelSpec | None = None,
    part: str = "all",
) -> Sharded:
    """Divide ``state`` over the data-parallel ranks and move what offload moves.

    ``model`` is this rank's model (tensor/expert shard) and ``part`` the pipeline stage's
    share of it (:func:`memfit.engine.model_state.model_state`); the routed experts' share of
    each sharded item is divided over the expert data-parallel group (``dp / ep``), the
    rest over the shard group."""
    training = scenario.training
    framework = training.parallelism.framework
    stage = training.parallelism.zero_stage
    offload = training.offload
    experts = _expert_share(model or scenario.model, training) if mesh.ep > 1 else Fraction(0)
    expert_group = _expert_group(mesh)
    items: list[MemoryItem] = []
    host: list[MemoryItem] = []
    nvme: list[MemoryItem] = []
    buffer = 0

    def place(item: MemoryItem, target: str) -> None:
        if target == "cpu":
            host.append(replace(item, name=item.name + " (offloaded to CPU)"))
        elif target == "paged":
            host.append(replace(item, name=item.name + PAGED))
        elif target == "nvme":
            nvme.append(replace(item, name=item.name + " (offloaded to NVMe)"))
        else:
            items.append(item)

    # FSDP under pipeline parallelism (torch.distributed.pipelining, torchtitan) keeps each
    # stage gathered for the whole step (reshard_after_forward=False) and its gradients
    # unsharded until the last micro-batch's backward (no gradient sync before it)
    pipelined_fsdp = framework == "pytorch" and stage >= 2 and mesh.pp > 1
    for laid in framework_items(state, training) + _ddp_buckets(state, training, mesh):
        item = laid.item
        if pipelined_fsdp and item.category == "gradients":
            item = replace(item, name=item.name + ", unsharded until the last micro-batch")
            laid = _Part(item, 99, persistent=True)
        if stage >= laid.shard_from and mesh.shard > 1:
            expert_bytes = int(item.bytes * experts)
            dense = item.bytes - expert_bytes
            size = _ceil_div(dense, mesh.shard) + _ceil_div(expert_bytes, expert_group)
            group = f"dp {mesh.shard}" + (f", experts over {expert_group}" if experts else "")
            item = replace(item, bytes=size, formula=f"{item.formula} / {group} (ZeRO-{stage})")
        target = "none"
        if laid.pinned_to_gpu:
            pass
        elif item.category == "optimizer_states":
            target = offload.optimizer
            if target == "none" and training.optimizer in PAGED_OPTIMIZERS:
                target = "paged"
        elif item.category == "gradients" and offload.optimizer != "none":
            target = "cpu"  # the optimizer step runs on the host: gradients go there
        elif item.category == "parameters":
            target = offload.parameters
        if item.category == "gradients" and training.optimizer_in_backward:
            continue  # each gradient is freed by its own step, inside backward
        if item.category == "gradients" and target == "none" and laid.persistent:
            buffer += item.bytes
            item = replace(item, role=item.role if item.role in BUFFERS else "gradient-buffer")
        place(item, target)

    if training.optimizer_in_backward:
        grad_share = Fraction(0)  # stepped and freed parameter by parameter in backward
    elif pipelined_fsdp or (framework == "megatron" and training.precision in MIXED):
        grad_share = Fraction(0)  # the gradients are a buffer that lives through the step
    elif offload.optimizer != "none":
        grad_share = Fraction(0)  # nothing of the backward's gradients stays as .grad
    elif framework == "deepspeed" and stage >= 2:
        grad_share = Fraction(0)  # reduced through the bucket
    else:
        grad_share = Fraction(1, mesh.shard) if stage >= 2 else Fraction(1)
    optimizer_share = Fraction(1, mesh.shard) if stage >= 1 else Fraction(1)
    if offload.optimizer != "none" or framework != "pytorch" or training.optimizer_in_backward:
        optimizer_share = Fraction(0)  # on the host, a fused kernel, or one tensor at a time
    gather = gather_buffers(training, model or scenario.model, part, mesh.pp)
    new_state = replace(state, items=tuple(items))
    return Sharded(new_state, grad_share, optimizer_share, gather, tuple(host), tuple(nvme), buffer)


@memo.cached(maxsize=4096)
def resident_blocks(model: ModelSpec, training: TrainingSpec, mesh: Mesh, part: str) -> int:
    """The parameter tensors over 1 MiB that this rank keeps on its GPU between steps:
    the caching allocator serves each from its large pool, rounded up to 2 MiB
    (:mod:`memfit.engine.overhead`). Each tensor counts as the rank stores it: trained weights
    in their storage dtype (DeepSpeed's and Megatron's 16-bit module copy under mixed
    precision), frozen ones in theirs, QLoRA's base as packed 4-bit codes and block
    constants; a ZeRO-3 / FSDP shard of it where the parameters are sharded at rest
    (FSDP2 and DeepSpeed shard each parameter on its own; routed experts over their own
    group, as :func:`shard` divides them); none when the parameters are offloaded.
    ``model`` is the rank's (tensor/expert) shard, ``part`` its pipeline stage's share."""
    if training.offload.parameters != "none":
        return 0
    at_rest = params_sharded_from(training.parallelism.framework)
    sharded = training.parallelism.zero_stage >= at_rest and mesh.shard > 1
    dense = mesh.shard if sharded else 1
    experts = dense
    if sharded and mesh.ep > 1 and _expert_share(model, training):
        experts = _expert_group(mesh)
    trained, frozen = storage_bytes(training)
    if sixteen_bit_module(training):
        trained = 2  # the module's 16-bit copy; the fp32 master is the optimizer's
    split = split_tensors(model, training, part)
    fused = fused_experts(training)
    return _blocks(model, split, fused, trained, frozen, training.qlora, dense, experts)


@memo.cached(maxsize=4096)
def _blocks(
    model: ModelSpec,
    split: TensorSplit,
    fused: bool,
    trained: int,
    frozen: int,
    q: QuantSpec,
    dense: int,
    experts: int,
) -> int:
    """:func:`resident_blocks` of the tensors ``split``: trained ones stored in
    ``trained`` bytes per element, frozen ones in ``frozen``, a 4-bit base as ``q`` packs
    it; each divided over ``dense`` ranks, routed experts over ``experts``."""
    blocks = 0
    for groups, size in (
        (split.trainable, lambda numel: trained * numel),
        (split.frozen, lambda numel: frozen * numel),
        (split.quantized, lambda numel: nf4_bytes(numel, q.block_size, q.double_quant)),
    ):
        for g in groups:
            share = experts if g.component == "experts" else dense
            count, numel = stored_tensors(g, model, fused)
            if _ceil_div(size(numel), share) > MIB:
                blocks += count
    return blocks


@dataclass(frozen=True, slots=True)
class Units:
    """What ZeRO-3 / FSDP gathers, in bytes as gathered: the root unit (everything
    outside the blocks), the largest block and all blocks; and the trainable elements of
    the largest block, whose gradients pass through the reduce-scatter."""

    root: int
    largest: int
    layers: int
    trainable: int


def gathered_units(model: ModelSpec, training: TrainingSpec, part: str, dtype: int | None) -> Units:
    """The units of :func:`gather_buffers`, tensor by tensor in the dtype they are gathered
    in: floating-point weights (trained or frozen, adapters with their layer) in the
    gathering ``dtype`` (FSDP's ``param_dtype``; ``None``: each in its storage dtype),
    QLoRA's 4-bit base as stored -- FSDP all-gathers the packed codes and block constants
    as they are (``bnb_4bit_quant_storage``), it never widens them to 16 bits."""
    trained_bytes, frozen_bytes = storage_bytes(training)
    split = split_tensors(model, training, part)
    return _units(split, training.qlora, dtype or trained_bytes, dtype or frozen_bytes)


@memo.cached(maxsize=4096)
def _units(split: TensorSplit, q: QuantSpec, trained_bytes: int, frozen_bytes: int) -> Units:
    """:func:`gathered_units` of the tensors ``split``, trained ones gathered in
    ``trained_bytes`` per element, frozen ones in ``frozen_bytes``, a 4-bit base as stored."""
    root = 0
    per_layer: dict[int, int] = {}
    trainable: dict[int, int] = {}

    def add(g: TensorGroup, nbytes: int, trained: bool) -> None:
        nonlocal root
        if g.layers is None:
            root += nbytes
            return
        span = g.layers[1] - g.layers[0]
        each, elements = nbytes // span, g.total // span
        for layer in range(*g.layers):
            per_layer[layer] = per_layer.get(layer, 0) + each
            if trained:
                trainable[layer] = trainable.get(layer, 0) + elements

    for g in split.trainable:
        add(g, trained_bytes * g.total, True)
    for g in split.frozen:
        add(g, frozen_bytes * g.total, False)
    for g in split.quantized:
        add(g, nf4_bytes(g.numel, q.block_size, q.double_quant) * g.count, False)
    return Units(
        root,
        max(per_layer.values(), default=0),
        sum(per_layer.values()),
        max(trainable.values(), default=0),
    )


def gather_buffers(
    training: TrainingSpec, model: ModelSpec, part: str = "all", pp: int = 1
) -> Gather:
    """What the parameter gathering of ZeRO-3 / FSDP keeps on the GPU beyond the shards.

    * **DeepSpeed ZeRO-3** (and its estimator's ``4 x largest layer``): the current and
      the prefetched unit in 16 bits.
    * **FSDP2** ``fully_shard`` per block and on the root, as a step traced with a fake
      process group shows it (``tests/validation/dataset_multi.json``): the root unit
      (embedding, final norm, LM head) stays gathered from its forward to the end of the
      backward. In the forward the current layer's parameters, its flat all-gather output
      (kept until the next layer waits for its own) and the next layer's all-gather in
      flight are live. In the backward the current layer and the next one's all-gather
      output are live; the layer's unsharded gradients are copied into a flat
      reduce-scatter input in the reduce dtype (fp32 under ``MixedPrecisionPolicy(bf16,
      fp32)``), kept until the next reduce-scatter -- only the gradients of the tensors
      that train (a LoRA layer reduces its adapters alone). With
      ``reshard_after_forward=False`` (SHARD_GRAD_OP) every layer stays gathered from its
      forward to its backward, beside its shard. Under pipeline parallelism the whole stage
      stays gathered through the step.

    The gathered units hold each tensor as :func:`gathered_units` says: 16-bit under
    mixed precision (FSDP's ``param_dtype``), else in its own storage dtype, and a 4-bit
    base as stored.
    """
    par = training.parallelism
    stage = par.zero_stage
    sharded_units = stage == 3 or (stage == 2 and par.framework == "pytorch")
    if not sharded_units or par.framework == "megatron":
        return Gather()
    if par.framework == "deepspeed":
        unit = gathered_units(model, training, part, 2).largest
        return Gather(forward=2 * unit, backward=2 * unit)
    mixed = training.precision in MIXED
    prec = precision_of(training)
    gathered = prec.gather if mixed and training.method != "qlora" else 2 if mixed else None
    units = gathered_units(model, training, part, gathered)
    root, unit = units.root, units.largest
    if pp > 1:  # pipelined: the whole stage stays gathered (see shard)
        return Gather(root + units.layers, root + units.layers)
    # the unsharded gradients come in the gathered dtype, the reduce-scatter in the
    # policy's reduce dtype (fp32, but under pure bf16 and a 16-bit reduce_dtype)
    grad_bytes = gathered or storage_bytes(training)[0]
    reduce_bytes = prec.reduce
    grads, reduce = grad_bytes * units.trainable, reduce_bytes * units.trainable
    if stage == 3:
        return Gather(root + 3 * unit, root + 2 * unit, grads, reduce)
    return Gather(root + 2 * unit, root, grads, reduce, unit=unit)

"""One precision value per scenario: what each class of tensor is stored, computed,
communicated and accumulated in.

The training field ``precision`` names a recipe (``fp32``, ``bf16``, ``bf16-mixed``,
``fp16-mixed``, ``fp8-mixed``); the bytes each tensor takes under it also depend on the
method, the sharding framework and the stack's conventions. :func:`precision_of` decides
them once, and memory (:mod:`memfit.engine.timeline`, :mod:`memfit.engine.sharding`) and time
(:mod:`memfit.engine.steptime`) read the result instead of testing the recipe's name.

>>> from memfit.engine.specs import TrainingSpec
>>> p = precision_of(TrainingSpec(precision="bf16-mixed"))
>>> (p.mode, p.compute, p.master, p.gather, p.reduce)
('amp', 2, 4, 2, 4)
>>> precision_of(TrainingSpec(precision="bf16")).master
2
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.engine import memo
from memfit.engine.model_state import storage_bytes
from memfit.engine.specs import TrainingSpec
from memfit.engine.stacks import conventions, fsdp_mixed


@dataclass(frozen=True, slots=True)
class Precision:
    """Bytes per element of each class of tensor under one scenario's recipe."""

    #: the recipe's name (``TrainingSpec.precision``)
    name: str
    #: how the step computes: ``fp32``; pure 16-bit (``half``: also DeepSpeed, Megatron and
    #: FSDP full sharding of mixed precision, whose modules hold 16-bit weights); or
    #: autocast over fp32 weights (``amp``)
    mode: str
    #: activations and the dtype kernels compute in: 4 under fp32, else 2
    compute: int
    #: a trained parameter of the model and its gradient as stored: 2 under pure bf16,
    #: else 4 (fp32 master weights)
    master: int
    #: the trainable and the frozen (not quantized) weights as stored, under the stack's
    #: conventions (:func:`memfit.engine.model_state.storage_bytes`)
    trained: int
    frozen: int
    #: a parameter gathered for compute (ZeRO-3 / FSDP): 4 under fp32 and where FSDP's
    #: policy gathers fp32 (``fsdp_param_dtype``), else 2; QLoRA's 4-bit base is gathered
    #: as stored (1)
    gather: int
    #: a gradient reduced across data-parallel ranks: 2 under pure bf16 and where FSDP's
    #: policy reduces in the compute dtype (``fsdp_reduce_dtype``), else 4
    reduce: int
    #: a gradient the data-parallel collective sends: 4 under fp32, 2 under pure bf16 and
    #: DeepSpeed's mixed precision (it reduces the 16-bit gradients, then copies them to
    #: fp32), else 4 (fp32 ``.grad`` under autocast, Megatron's fp32 ``main_grad``, FSDP's
    #: fp32 ``reduce_dtype``)
    grad_comm: int = 4


def compute_mode(training: TrainingSpec) -> str:
    """fp32, pure 16-bit ("half") or autocast over fp32 weights ("amp"). DeepSpeed and
    Megatron-LM run mixed precision on 16-bit module weights (the fp32 master copy lives in
    the optimizer), and FSDP FULL_SHARD / FSDP2 on 16-bit gathered units (the fp32 shards
    are the master copy), so their steps compute like pure 16-bit ones -- unless FSDP's
    policy gathers fp32 (``fsdp_param_dtype``), which leaves autocast to compute."""
    precision = training.precision
    par = training.parallelism
    full_shard = par.zero_stage == 3 and training.method in ("full", "freeze")
    if full_shard and gathers_fp32(training):
        return "amp"
    if precision.endswith("-mixed") and (par.framework != "pytorch" or full_shard):
        # FSDP's MixedPrecision(param_dtype=bf16) gathers each unit in 16 bits and runs
        # the forward on it: no autocast cache, a 16-bit residual stream (adapters of a
        # 16-bit base keep PEFT's fp32 copies and autocast)
        return "half"
    return {"fp32": "fp32", "bf16": "half"}.get(precision, "amp")


@memo.cached(maxsize=4096)
def precision_of(training: TrainingSpec) -> Precision:
    """The bytes of each class of tensor under ``training``."""
    name = training.precision
    compute = 4 if name == "fp32" else 2
    master = 2 if name == "bf16" else 4
    trained, frozen = storage_bytes(training)
    gather = 1 if training.method == "qlora" else 4 if gathers_fp32(training) else compute
    reduce = 2 if reduces_16_bit(training) else master
    return Precision(
        name=name,
        mode=compute_mode(training),
        compute=compute,
        master=master,
        trained=trained,
        frozen=frozen,
        gather=gather,
        reduce=reduce,
        grad_comm=_grad_comm(training),
    )


def gathers_fp32(training: TrainingSpec) -> bool:
    """FSDP's mixed-precision policy gathers the parameters in fp32 (Lightning's
    ``bf16-mixed``: ``param_dtype=torch.float32``, autocast computing)."""
    return fsdp_mixed(training) and conventions(training).fsdp_param_dtype == "fp32"


def reduces_16_bit(training: TrainingSpec) -> bool:
    """FSDP's mixed-precision policy reduce-scatters the gradients in the compute dtype
    (accelerate's and Lightning's policies: ``reduce_dtype`` is the 16-bit dtype)."""
    return fsdp_mixed(training) and conventions(training).fsdp_reduce_dtype == "compute"


def _grad_comm(training: TrainingSpec) -> int:
    if training.precision == "fp32":
        return 4
    if training.precision == "bf16" or training.parallelism.framework == "deepspeed":
        return 2
    return 2 if reduces_16_bit(training) else 4

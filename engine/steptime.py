"""Step time: what one optimizer step costs in seconds, what bounds it, and what a run costs.

The memory model says whether a step fits; this model says how long it takes, so that a
memory saving can be weighed against its price in time. It plays the same step as
:mod:`memfit.engine.timeline` -- forward through every layer, the loss, backward, the optimizer --
and each layer's work is the ops of the very block the memory walk plays for it
(:func:`memfit.engine.timeline.layer_block`, built for the rank's share of the model), and the
head's and the loss's the ops of the block it plays last
(:func:`memfit.engine.timeline.head_block`), so an op that reaches memory reaches time. Each
piece of work is priced by what limits it:

* **matmuls** (the block's ops that carry a GEMM shape: every ``nn.Linear``, the grouped
  experts, the LoRA adapters; the LM head) by a roofline per GEMM: ``max(FLOPs / (peak x
  e_mm), bytes / (bandwidth x e_mem))``, so large GEMMs are compute-bound and a rank-16
  adapter or a router is bandwidth-bound (Williams et al. 2009, "Roofline"); rows run in
  whole 128-row tiles (:data:`GEMM_TILE_ROWS`); FP8 GEMMs by their recipe
  (:data:`FP8_RECIPE_COSTS`), the LM head in 16 bits; backward runs the input's gradient
  where the op's input needs one and the weight's where it trains;
* the **attention core** (``softmax(QK^T) V``) by the kernel in use: flash/SDPA at the
  attention kernel's efficiency, with causal masking halving the work (Dao 2023,
  FlashAttention-2, section 3.1) -- on Hopper each kernel's rate by the keys a query reads
  (:data:`HOPPER_ATTENTION`, measured on an H200); eager attention and SDPA's math
  fallback as two batched matmuls plus the bytes the core's own ops of the block move
  (scaling, mask, softmax, casts of the ``s x s`` scores);
* every other op of the block -- norms, activations as the model writes them, residual
  adds, RoPE, dropout, casts, routing -- by the bytes it moves at the device's bandwidth:
  forward each input read and each output written; backward its outputs' gradients and
  what it saved read, its inputs' gradients written (a fused loss's chunk of rows as many
  times as the rows need); autocast's weight casts, QLoRA's dequantization, the embedding
  lookup and the optimizer step likewise (the optimizer at its launches where they take
  longer, :func:`_optimizer_launches`); under ``torch.compile`` the element-wise ops in
  fused groups (:func:`_fused`);
* **communication** by ring-collective volumes (Patarasuk and Yuan 2009: an all-reduce of
  ``S`` bytes over ``n`` ranks moves ``2 (n-1)/n S`` per rank, all-gather and
  reduce-scatter ``(n-1)/n S``) over NVLink inside a node and over the node's network
  share across nodes, plus a latency per collective; an all-to-all across nodes through
  each rank's own NIC;
* **host transfers** (offload) over the host link, and the CPU optimizer step at the host's
  memory bandwidth;
* the **pipeline bubble**: ``(pp - 1) / vpp`` micro-batch times of the slowest stage for
  1F1B, GPipe and interleaved 1F1B (Narayanan et al. 2021, section 2.2), a third of it for
  zero-bubble schedules (Qi et al. 2023, ZB-H1).

Every kernel costs at least :data:`KERNEL_S`: the GPU cannot run kernels faster than the
host issues them, which is what bounds small models.

What overlaps what (:data:`OVERLAP`): tensor-parallel, expert-parallel and pipeline
sends are on the critical path in all frameworks, the tensor-parallel collectives hidden
behind the layers' GEMMs where ``tp_comm_overlap`` says so. Data-parallel gradient reduction
overlaps the last micro-batch's backward in PyTorch DDP/FSDP and Megatron-LM
(``overlap_grad_reduce``), and in DeepSpeed only under ZeRO-3 (``overlap_comm`` defaults to
false below stage 3). ZeRO-3 / FSDP prefetch the next unit's all-gather during the current
unit's compute; Megatron's distributed optimizer overlaps its parameter all-gather with the
next forward (``overlap_param_gather``). Context-parallel ring exchanges overlap the
attention core of the same layer. Overlapped communication costs only what exceeds the
compute it hides behind.

The step's **bound** is the kind of work with the largest share of the step time.
**MFU** counts the model FLOPs of the step -- forward and backward of every matmul and of
the attention core as the causal mask needs it, no recomputation (Chowdhery et al. 2022,
appendix B) -- over the step time and the dtype's dense peak of every GPU.

>>> from memfit.engine.presets import load_gpu, load_model
>>> from memfit.engine.specs import HardwareSpec, Scenario, TrainingSpec
>>> s = Scenario(load_model("llama-3-8b"), HardwareSpec(load_gpu("h100-sxm-80gb")),
...              TrainingSpec(sequence_length=4096))
>>> t = step_time(s)
>>> t.bound, 0.3 < t.mfu < 0.7
('compute', True)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import NamedTuple

from memfit.engine import memo
from memfit.engine.graph import COLLECTIVES, Block, Size, concrete, connected
from memfit.engine.layers import Ctx, attention_kernel, dequant_traffic
from memfit.engine.model_state import fused_experts, model_state, split_tensors, stored_tensors
from memfit.engine.params import model_tensors
from memfit.engine.plan.mesh import Mesh
from memfit.engine.plan.precision import precision_of
from memfit.engine.plan.resolve import resolve
from memfit.engine.sharding import not_ddp
from memfit.engine.specs import (
    NETWORKS,
    FreezeSpec,
    GpuSpec,
    LoraSpec,
    ModelSpec,
    Scenario,
    TrainingSpec,
    full_attention_layers,
    window_masks,
)
from memfit.engine.timeline import head_block, layer_block, make_ctx, recomputed_layers

#: the kinds of work a step's time is made of; the step's ``bound`` is one of them
BOUNDS = ("compute", "memory_bandwidth", "communication", "host_transfer", "pipeline_bubble")

#: (matmul, attention kernel) achievable shares of the dense 16-bit peak, by architecture.
#: Matmul: large cuBLAS/hipBLASLt GEMMs at transformer sizes; attention: the FlashAttention-2
#: kernel PyTorch's SDPA runs (Dao 2023: 50-73 % of peak on A100 forward and backward;
#: Shah et al. 2024, FlashAttention-3: FA2 reaches about 35 % on H100); AMD CDNA figures
#: from public hipBLASLt GEMM measurements (about half of peak). Editable per GPU preset
#: and per scenario (``matmul_efficiency``, ``attention_efficiency``).
EFFICIENCY: dict[str, tuple[float, float]] = {
    "volta": (0.75, 0.35),
    "turing": (0.55, 0.35),
    "ampere": (0.78, 0.55),
    "ada": (0.70, 0.50),
    "hopper": (0.62, 0.30),
    "blackwell": (0.70, 0.45),
    "cdna2": (0.55, 0.35),
    "cdna3": (0.48, 0.35),
    # CDNA 4 (MI355X): no public GEMM measurement yet; CDNA 3's shares until there is
    "cdna4": (0.48, 0.35),
    "gaudi3": (0.60, 0.40),
}
#: the attention kernels on Hopper, by the sequence: a kernel does work per query row
#: that does not grow with the keys it reads (loading the row's queries, the softmax's
#: rescaling and statistics, writing the output; in backward the ``rowsum(dO * O)`` pass
#: and the fp32 accumulation and conversion of dq), so its rate is
#: ``R * keys / (keys + k0)`` with ``keys`` the mean keys a query reads (half the sequence,
#: causal). Fitted on an H200 (``validation/gpu/h200_kernels.jsonl``: causal, 512 to 65,536
#: tokens, 65,536 tokens a call; rms error 1-5 %), per head dimension: ``(R_forward,
#: k0_forward, R_backward, k0_backward)``, R as a share of the dense 16-bit peak. SDPA
#: runs cuDNN's kernel on Hopper; ``flash`` is FlashAttention-2 (which does not use
#: Hopper's asynchronous tensor cores); ``mem-efficient`` is SDPA's memory-efficient kernel.
#: Other architectures keep their flat share (:data:`EFFICIENCY`), as does a scenario or a
#: preset that gives its own ``attention_efficiency``
HOPPER_ATTENTION: dict[str, dict[int, tuple[float, float, float, float]]] = {
    "sdpa": {64: (0.465, 190, 0.435, 530), 128: (0.615, 170, 0.545, 580)},
    "flash": {64: (0.325, 260, 0.29, 530), 128: (0.35, 220, 0.33, 540)},
    "mem-efficient": {64: (0.185, 140, 0.14, 270), 128: (0.185, 140, 0.14, 270)},
}


def attention_curve(attention: str, head_dim: int) -> tuple[float, float, float, float]:
    """The Hopper curve (:data:`HOPPER_ATTENTION`) of a kernel at ``head_dim``: linear
    between the measured 64 and 128, the nearest outside them."""
    by_dim = HOPPER_ATTENTION[attention]
    d = min(128.0, max(64.0, float(head_dim)))
    w = (d - 64) / 64
    lo, hi = by_dim[64], by_dim[128]
    a, b, c, e = (x + w * (y - x) for x, y in zip(lo, hi, strict=True))
    return (a, b, c, e)


#: share of the memory bandwidth that streaming kernels reach (STREAM-like copies on HBM)
MEMORY_EFFICIENCY = 0.8
#: share of a link's one-way bandwidth that NCCL's ring collectives reach (bus bandwidth)
COMM_EFFICIENCY = 0.8
#: the alpha-beta model of a ring collective (Thakur et al. 2005): a fixed cost per
#: collective, plus one step latency per hop of the ring, inside a node (NVLink) and
#: across nodes (the NIC), so that a ring over thousands of ranks pays thousands of hops
COLLECTIVE_S = 10e-6
HOP_INTRA_S = 2e-6
HOP_INTER_S = 5e-6
#: while NCCL runs beside compute its channels hold a share of the SMs and of the memory
#: bandwidth (16-32 thread blocks of 108-132 SMs by default): overlapped communication
#: still slows the compute it hides behind by this share of its own time
OVERLAP_SLOWDOWN = 0.15
#: GEMMs reach their efficiency only when large: the achievable share of peak falls as
#: ``d / (d + GEMM_HALF_DIM)`` with ``d`` the smaller dimension of the weight (of the
#: rank's shard under tensor parallelism): narrow GEMMs fill fewer tiles per wave (tile
#: and wave quantization, NVIDIA's "Matrix Multiplication Background" user's guide)
GEMM_HALF_DIM = 384
#: the rows of one output tile of the large-GEMM kernels (cuBLAS and CUTLASS on Ampere and
#: Hopper: 128 x 128 or 128 x 256 tiles): a GEMM of ``m`` rows runs ``ceil(m / 128)`` row
#: tiles, so rows short of a whole tile cost as if it were full (tile quantization, NVIDIA's
#: "Matrix Multiplication Background" user's guide). Dense layers' rows are the tokens,
#: nearly always whole tiles; an expert's are its share of the routed tokens, often a
#: fraction of one (16 rows per expert ran at 4-5 % of peak on an H200, 1,024 at 58-74 %:
#: ``validation/gpu/h200_kernels.jsonl``)
GEMM_TILE_ROWS = 128
#: FP8 GEMMs (Transformer Engine) first cast each input to FP8: read 16 bits, write 8,
#: for the activations and the weights of every linear layer, and the output gradients
FP8_CAST_BYTES = 3
#: FP8 GEMMs reach a smaller share of their (doubled) peak than 16-bit ones: cuBLASLt
#: FP8 GEMMs on H100 run at about 1,200-1,300 of 1,979 TFLOP/s where BF16 ones reach
#: about 700-750 of 989 (per-tensor scaling, narrower tiles)
FP8_EFFICIENCY = 0.85
#: each FP8 recipe (``training.fp8_recipe``): its GEMM's rate as a share of a
#: per-tensor-scaled FP8 GEMM's, and the bytes per element that its own quantization
#: kernels move for the input, the weight and the output gradient of each linear layer,
#: every orientation a step uses together (forward row-scaled, backward column-scaled).
#: Per-tensor scaling (Transformer Engine) casts inside the kernels that produce the
#: inputs, the 3 bytes per element of :data:`FP8_CAST_BYTES` within the GEMM's own
#: traffic. A row's or a 1x128 block's scale does not survive a transpose, so the other
#: recipes quantize each operand twice, each time a kernel of its own: rowwise, an amax
#: pass (read 2 bytes) and a scale-and-convert (read 2, write 1), 5 bytes, twice; blockwise
#: and MXFP8 find each block's amax in registers, 3 bytes, twice (a 128x128 weight block
#: transposes: its second orientation moves 2). The rates: rowwise ``_scaled_mm`` on an
#: H200 ran at 0.87-1.01 of tensorwise, median 0.94 (``validation/gpu/h200_kernels.jsonl``);
#: blockwise is taken as rowwise (scales applied in the main loop alike, unmeasured);
#: MXFP8's scaling is in Blackwell's tensor cores
FP8_RECIPE_COSTS: dict[str, tuple[float, tuple[float, float, float]]] = {
    "tensorwise": (1.0, (0.0, 0.0, 0.0)),
    "rowwise": (0.94, (10.0, 10.0, 10.0)),
    "blockwise": (0.94, (6.0, 5.0, 6.0)),
    "mxfp8": (1.0, (6.0, 6.0, 6.0)),
}
#: the shortest time a kernel takes: the host's launch rate through PyTorch's dispatcher
KERNEL_S = 5e-6
#: the optimizer step's kernels: per parameter tensor for the per-tensor loop (PyTorch's
#: ``_single_tensor_adamw``: weight decay, ``lerp_``, ``mul_`` and ``addcmul_`` for the
#: second moment, ``sqrt``, ``div_``, ``add_``, ``addcdiv_``; bitsandbytes' 8-bit
#: optimizers one fused kernel a tensor), and per ``_foreach`` op for the foreach one
OPTIMIZER_KERNELS: dict[str, tuple[int, int]] = {
    "adamw": (8, 8),
    "adamw-8bit": (1, 1),
    "paged-adamw-8bit": (1, 1),
    "sgd": (2, 2),
    "sgd-momentum": (3, 3),
    "adafactor": (12, 12),
    "lion": (5, 5),
}
#: a ``_foreach`` or fused kernel takes at most this many tensors, and this many
#: elements, a launch (``multi_tensor_apply``: 36 tensors at the depth of AdamW's lists,
#: 320 blocks of 65,536 elements)
MULTI_TENSOR_TENSORS = 36
MULTI_TENSOR_ELEMS = 320 * 65536
#: host memory bandwidth one node's CPU optimizer step reaches, GB/s (DeepSpeed CPU-Adam
#: is bandwidth-bound; Ren et al. 2021, ZeRO-Offload, section 5)
HOST_OPTIMIZER_GB_S = 100.0
#: one node's NVMe read/write bandwidth for ZeRO-Infinity offload, GB/s
NVME_GB_S = 6.0
#: the usual fabric of each GPU generation's servers: one NIC per GPU of the generation's
#: InfiniBand (DGX A100: HDR 200 Gb/s; DGX H100/H200/B200: NDR 400 Gb/s)
DEFAULT_NETWORK = {
    "volta": "infiniband-edr-4x100",
    "turing": "ethernet-100g",
    "ampere": "infiniband-hdr-8x200",
    "ada": "ethernet-100g",
    "hopper": "infiniband-ndr-8x400",
    "blackwell": "infiniband-ndr-8x400",
    "cdna2": "infiniband-hdr-8x200",
    "cdna3": "infiniband-ndr-8x400",
    "cdna4": "infiniband-ndr-8x400",
    "gaudi3": "roce-8x400",
}

#: what each framework overlaps with compute (see the module docstring)
OVERLAP = {
    "pytorch": {"grad_reduce": True, "param_gather": False},
    "megatron": {"grad_reduce": True, "param_gather": True},
    "deepspeed": {"grad_reduce": False, "param_gather": False},
}


class Term(NamedTuple):
    """One piece of the step time: ``seconds`` on the critical path (after overlap),
    ``busy_s`` the time the work itself takes."""

    name: str
    kind: str  # one of BOUNDS
    seconds: float
    busy_s: float
    formula: str


class StepTime(NamedTuple):
    """The time of one optimizer step of a scenario and what follows from it (a named
    tuple: a sweep makes thousands)."""

    step_time_s: float
    tokens_per_step: int
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    bound: str
    #: model FLOPs of one step (all GPUs), and what the GPUs execute with recomputation
    model_flops: float
    hardware_flops: float
    terms: tuple[Term, ...]
    gpus: int
    #: for ``training.token_budget``: wall time, GPU-hours and cost (None: not asked or
    #: no price known)
    run_time_s: float | None = None
    gpu_hours: float | None = None
    cost: float | None = None
    price_per_gpu_hour: float | None = None
    #: what the figures assume that the scenario did not say
    assumptions: tuple[str, ...] = ()

    def by_kind(self) -> dict[str, float]:
        """Seconds on the critical path by kind of work."""
        out = dict.fromkeys(BOUNDS, 0.0)
        for t in self.terms:
            out[t.kind] += t.seconds
        return out

    def as_dict(self) -> dict[str, object]:
        """The estimate JSON's ``"time"`` object."""
        d: dict[str, object] = {
            "step_time_s": self.step_time_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "bound": self.bound,
            "tokens_per_step": self.tokens_per_step,
            "model_flops_per_step": self.model_flops,
            "hardware_flops_per_step": self.hardware_flops,
            "seconds_by_kind": self.by_kind(),
            "terms": [
                {"name": t.name, "kind": t.kind, "seconds": t.seconds, "busy_s": t.busy_s}
                for t in self.terms
            ],
            "assumptions": list(self.assumptions),
        }
        if self.run_time_s is not None:
            d["token_budget"] = {
                "run_time_s": self.run_time_s,
                "gpu_hours": self.gpu_hours,
                "cost": self.cost,
                "price_per_gpu_hour": self.price_per_gpu_hour,
            }
        return d


@dataclass(frozen=True, slots=True)
class Device:
    """What one GPU of the scenario computes and moves per second."""

    peak_flops: float  # the compute dtype's dense peak, FLOP/s
    matmul_flops: float  # achievable on large matmuls
    attention_flops: float  # achievable by the attention kernel
    bandwidth: float  # achievable bytes/s of device memory
    intra: float  # one-way bytes/s per GPU inside a node, at NCCL's efficiency
    inter: float  # one-way bytes/s of one GPU's NIC (its share of the node's fabric)
    host: float  # one-way bytes/s of the host link
    network: str
    fp8: bool = False  # the linear layers' GEMMs run in FP8
    fp32_flops: float = 0.0  # achievable on fp32 matmuls (SDPA's math fallback upcasts)
    #: the 16-bit matmul rate: the LM head's under FP8, which no FP8 stack converts
    matmul16_flops: float = 0.0
    #: bytes per element of input, weight and output gradient that the FP8 recipe's own
    #: quantization kernels move (:data:`FP8_RECIPE_COSTS`); zeros: fused or no FP8
    fp8_cast: tuple[float, float, float] = (0.0, 0.0, 0.0)
    #: the fused attention kernel's rate by the keys a query reads, forward and backward:
    #: ``(FLOP/s, k0, FLOP/s, k0)`` (:data:`HOPPER_ATTENTION`); empty: ``attention_flops``
    attention_curve: tuple[float, ...] = ()

    def sixteen_bit(self) -> Device:
        """This device running its matmuls in 16 bits (the LM head under FP8: Megatron's
        output layer is not a Transformer Engine module, torchtitan's Float8 converter
        leaves ``output`` out, llm-foundry converts the blocks' linears only)."""
        if not self.fp8:
            return self
        return dataclasses.replace(
            self, fp8=False, matmul_flops=self.matmul16_flops, fp8_cast=(0.0, 0.0, 0.0)
        )


def network_gb_s(scenario: Scenario) -> tuple[float, str]:
    """GB/s one way of one node's fabric, and where the figure comes from."""
    hw = scenario.hardware
    if hw.network_gb_s is not None:
        return hw.network_gb_s, f"{hw.network_gb_s:g} GB/s per node (hardware.network_gb_s)"
    name = hw.network or DEFAULT_NETWORK.get(hw.gpu.architecture, "ethernet-100g")
    note = "" if hw.network else " (assumed: the usual fabric of this GPU generation)"
    return NETWORKS[name], f"{name}, {NETWORKS[name]:g} GB/s per node{note}"


def _peak_tflops(gpu: GpuSpec, precision: str) -> float:
    if precision == "fp32":
        return gpu.fp32_tflops
    if precision == "fp16-mixed":
        return gpu.fp16_tflops
    return gpu.bf16_tflops


#: the efficiencies of an architecture :data:`EFFICIENCY` has no row for
GENERIC_EFFICIENCY = (0.6, 0.4)


#: the share of a board's power at its TDP that does not follow the SM clock: HBM and
#: its interface, leakage, the board's regulators and fans (an idle H200 draws 80 W of
#: its 700, ``validation/gpu/h200_kernels.jsonl``; HBM and leakage add to it under load).
#: 0.3 leaves an H100 SXM capped at 500 W 84 % of its stock clock: compute-bound work
#: takes 19 % longer, about the 20 % reported for H100s capped at 500 W
SM_FIXED_POWER_SHARE = 0.3


def sustained_clock(scenario: Scenario) -> float:
    """The SM clock a power limit leaves, as a share of the stock board's sustained clock
    (1.0 when neither ``hardware.power_limit_w`` nor ``hardware.clock_share`` is given; the
    latter is taken as it is).

    A board holds its power cap by lowering the SM clock (the firmware's power management;
    ``nvidia-smi -pl``). Its power is ``P = P_fixed + P_dyn``, where the dynamic power of
    CMOS logic is ``P_dyn = a C V^2 f`` (Rabaey, *Digital Integrated Circuits*, 1996), and
    along the voltage-frequency curve the voltage rises about in step with the clock
    (``V ~ f``), so ``P_dyn ~ f^3``. With ``P_fixed`` = :data:`SM_FIXED_POWER_SHARE` of
    the TDP, a cap ``P_cap`` leaves::

        f / f_stock = ((P_cap - P_fixed) / (TDP - P_fixed)) ** (1/3)

    The efficiencies of :data:`EFFICIENCY` are measured on stock boards, so the stock
    board is 1.0 and a cap at the TDP changes nothing. What the clock scales
    (:func:`device`): the matmul, attention and FP32 rates. Memory-bound work does not
    follow it: HBM runs on its own clock (3,201 MHz in every record of
    ``validation/gpu/h200_kernels.jsonl`` while the SM clock went from 345 to 1,980 MHz);
    on capped H100s and H200s the SM clock and the DGEMM rate follow the cap and a
    bandwidth-bound kernel far less (Ujeniya et al. 2026, arXiv:2604.11391), so the
    bandwidth is kept whole (under deep caps it may fall a little too). Communication and
    the host link are not on the SM clock either. Matmuls are power-bound at stock (He 2024,
    "Strangely, matrix multiplications on GPUs run faster when given predictable data"),
    which is why the cap reaches compute-bound steps first.
    """
    hw = scenario.hardware
    if hw.clock_share is not None:
        return hw.clock_share
    tdp = hw.gpu.tdp_w
    if hw.power_limit_w is None or tdp is None or hw.power_limit_w >= tdp:
        return 1.0
    fixed = SM_FIXED_POWER_SHARE * tdp
    return float(((hw.power_limit_w - fixed) / (tdp - fixed)) ** (1 / 3))


def device_notes(scenario: Scenario) -> tuple[str, ...]:
    """What :func:`device` assumed of the GPU that the scenario did not say (a custom GPU's
    figures not given), and the SM clock a power limit or clock share leaves."""
    hw, gpu = scenario.hardware, scenario.hardware.gpu
    notes = []
    if gpu.assumed:
        notes.append(f"{gpu.display_name}: step time of an assumed device -- {gpu.source}")
    if gpu.name == "custom" and gpu.architecture not in EFFICIENCY:
        mm, attn = GENERIC_EFFICIENCY
        notes.append(
            f"{gpu.display_name}: no architecture given (hardware.architecture): generic "
            f"efficiencies, {100 * mm:g} % of peak on matmuls, {100 * attn:g} % on attention"
        )
    if hw.clock_share is not None:
        notes.append(
            f"SM clock {100 * hw.clock_share:.1f} % of the stock board's (hardware.clock_share): "
            "compute rates scaled by it, memory bandwidth and links not"
        )
    elif hw.power_limit_w is not None and gpu.tdp_w is not None:
        fixed = SM_FIXED_POWER_SHARE
        notes.append(
            f"SM clock {100 * sustained_clock(scenario):.1f} % of the stock board's: power "
            f"limit {hw.power_limit_w:g} W of the {gpu.tdp_w:g} W TDP, "
            f"f ~ ((P - {fixed:g} TDP) / ({1 - fixed:g} TDP))^(1/3); "
            "compute rates scaled by it, memory bandwidth and links not"
        )
    return tuple(notes)


def device(scenario: Scenario) -> Device:
    hw, gpu, precision = scenario.hardware, scenario.hardware.gpu, scenario.training.precision
    mm, attn = EFFICIENCY.get(gpu.architecture, GENERIC_EFFICIENCY)
    mm = hw.matmul_efficiency or gpu.matmul_efficiency or mm
    attn = hw.attention_efficiency or gpu.attention_efficiency or attn
    peak = _peak_tflops(gpu, precision) * 1e12
    # FP8 runs the linear layers' GEMMs at the FP8 rate (Transformer Engine); attention,
    # norms and the rest stay in 16 bits
    fp8 = precision == "fp8-mixed" and gpu.fp8_tflops > 0
    recipe_share, cast = FP8_RECIPE_COSTS[scenario.training.fp8_recipe] if fp8 else (1.0, None)
    mm_peak = gpu.fp8_tflops * 1e12 * FP8_EFFICIENCY * recipe_share if fp8 else peak
    # NVLink figures are both directions together; PCIe cards talk over the host link
    one_way = gpu.interconnect_gb_s / 2 if gpu.interconnect_gb_s else gpu.host_link_gb_s
    net, net_note = network_gb_s(scenario)
    # a power limit slows what runs on the SM clock, not memory or links (sustained_clock)
    clock = sustained_clock(scenario)
    curve: tuple[float, ...] = ()
    attention = scenario.training.attention
    given = hw.attention_efficiency or gpu.attention_efficiency
    # measured in 16 bits: fp32 attention (SDPA's memory-efficient kernel on the CUDA
    # cores) keeps the flat share
    sixteen = precision != "fp32"
    if gpu.architecture == "hopper" and sixteen and not given and attention in HOPPER_ATTENTION:
        m = scenario.model
        d = m.qk_nope_head_dim + m.qk_rope_head_dim if m.kv_lora_rank else m.head_dim
        r_f, k_f, r_b, k_b = attention_curve(attention, d)
        curve = (peak * r_f * clock, k_f, peak * r_b * clock, k_b)
    return Device(
        peak_flops=peak,
        matmul_flops=mm_peak * mm * clock,
        attention_flops=peak * attn * clock,
        bandwidth=gpu.memory_bandwidth_gb_s * 1e9 * MEMORY_EFFICIENCY,
        intra=one_way * 1e9 * COMM_EFFICIENCY,
        inter=net / hw.gpus_per_node * 1e9 * COMM_EFFICIENCY,
        host=gpu.host_link_gb_s * 1e9 * COMM_EFFICIENCY,
        network=net_note,
        fp8=fp8,
        fp32_flops=gpu.fp32_tflops * 1e12 * mm * clock,
        matmul16_flops=peak * mm * clock,
        fp8_cast=cast or (0.0, 0.0, 0.0),
        attention_curve=curve,
    )


def _kernel(flops: float, nbytes: float, rate: float, bandwidth: float) -> float:
    """One kernel's time by the roofline, never under the launch floor."""
    return max(flops / rate, nbytes / bandwidth, KERNEL_S)


@dataclass(frozen=True, slots=True)
class _Layer:
    """One transformer layer's work on one GPU for one micro-batch, in seconds."""

    matmul_fwd: float
    matmul_bwd: float  # input gradients and, where trainable, weight gradients
    attn_fwd: float
    attn_bwd: float
    elementwise_fwd: float
    elementwise_bwd: float
    dequant: float  # QLoRA: one dequantization of the layer's 4-bit base weights
    cast_elems: float  # frozen fp32 weights autocast casts to 16 bits in one forward
    flops_fwd: float  # model FLOPs, forward (matmuls and attention core)
    flops_bwd: float
    attn_flops_fwd: float  # the attention core's share of flops_fwd
    tp_bytes: float  # one tensor-parallel all-reduce's payload (b s h in the compute dtype)
    ep_bytes: float  # one expert-parallel all-to-all's payload
    cp_bytes: float  # the K and V block one context-parallel ring step passes on


def _act_bytes(training: TrainingSpec) -> int:
    return precision_of(training).compute


def _gemm(m: float, k: float, n: float, dt: int, dev: Device, count: float = 1) -> float:
    """``count`` GEMMs of an (m x k) by (k x n) product."""
    if count <= 0 or m <= 0:
        return 0.0
    d = min(k, n)
    rate = dev.matmul_flops * d / (d + GEMM_HALF_DIM)
    tiles = math.ceil(m / GEMM_TILE_ROWS)
    rate *= m / (tiles * GEMM_TILE_ROWS)
    nbytes = (m * k + k * n + m * n) * dt
    if dev.fp8 and not dev.fp8_cast[0]:  # per-tensor scaling: cast where produced
        nbytes += (m * k + k * n) * FP8_CAST_BYTES
    return count * _kernel(2 * m * k * n, nbytes, rate, dev.bandwidth)


@dataclass(frozen=True, slots=True)
class _Work:
    """What one layer's work depends on, beyond the model and the device."""

    #: the rank's share of the model (tensor and expert parallel) and the memory walk's
    #: context without the shape (whether the sequence is masked is set): what the
    #: layer's block is built from
    rank_model: ModelSpec
    ctx: Ctx
    batch: int
    seq: int
    tp: int
    cp: int
    ep: int
    compute: int  # bytes of the compute dtype (engine.plan.precision)
    #: QLoRA: bytes one weight's dequantization moves (engine.layers.dequant_traffic)
    dequant_bytes: float = 2.5
    #: torch.compile fuses the element-wise ops (:func:`_fused`)
    compiled: bool = False


def _work(stages: _Stages, b: int, s: int, full: bool = False) -> _Work:
    """What one layer's work depends on, at micro-batch ``b`` and sequence length ``s``
    (``full``: a global layer among sliding-window ones, attending over the sequence)."""
    mesh, rank = stages.mesh, stages.rank_model
    # the walk's context without the shape, but with whether this sequence is masked
    window = window_masks(rank, s) and not full
    masked = window or (rank.sdpa_math and stages.attention == "sdpa")
    ctx = stages.ctx
    if ctx.masked != masked:
        ctx = dataclasses.replace(ctx, masked=masked)
    return _Work(
        rank, ctx, b, s, mesh.tp, mesh.cp, mesh.ep, stages.compute,
        stages.dequant_bytes, stages.compiled,
    )  # fmt: skip


#: ops of the memory walk's blocks that the step time prices otherwise than by the bytes
#: they move: the attention core (by its kernel), collectives (by the rings), autocast's
#: weight casts (over the rank's weights) and QLoRA's dequantization (by its traffic); and
#: the release of the logits, which is no kernel
_NOT_ELEMENTWISE = COLLECTIVES | {
    "matmul_qk", "matmul_pv", "cast_weight", "dequantize", "dequantize_backward",
    "release_logits",
}  # fmt: skip


class _Priced(NamedTuple):
    """What one layer's ops cost, as sizes (bytes, rows) of the shape: concrete, or linear
    forms (:class:`memfit.engine.graph.Lin`) of a block built once for every shape."""

    #: (rows, in, out, weights, backward passes, once per chunk of rows) of each GEMM, in
    #: the block's order
    gemms: tuple[tuple[Size, int, int, int, int, bool], ...]
    #: the element-wise ops: bytes forward and backward, kernels forward and backward
    e_f: Size
    e_b: Size
    k_f: int
    k_b: int
    #: the attention core's own ops (eager attention, SDPA's math fallback)
    c_f: Size
    c_b: Size
    c_k: int
    #: bytes QLoRA's dequantizations write; bytes of the frozen weights autocast casts
    dequant: Size
    cast: Size
    #: the element-wise ops that run once per chunk of rows (``Block.repeated``)
    r_f: Size = 0
    r_b: Size = 0
    r_k: int = 0


def _fused(block: Block, members: list[int]) -> tuple[Size, Size, int, int]:
    """The element-wise ops ``members`` of ``block`` (indices, in order) as ``torch.compile``
    (inductor) runs them: ops joined by a tensor one makes and the next reads fuse into one
    kernel, which reads what comes from outside its group once and writes only what leaves
    it -- read by an op outside the group, saved for backward, or the block's output.
    Backward, each group is one kernel again: it reads the gradients of what left it and
    what it took in (saved, or recomputed from), and writes the gradients of its inputs
    that need one. Bytes forward and backward, and kernels forward and backward."""
    ops = block.ops
    made: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    saved: set[str] = set()
    for i, op in enumerate(ops):
        for t in op.inputs:
            readers.setdefault(t, []).append(i)
        saved.update(op.saves)
        for t, _ in op.outputs:
            made[t] = i
    groups = connected(ops, members)
    fwd: Size = 0
    bwd: Size = 0
    k_b = 0
    for group in groups:
        mine = set(group)
        ins: dict[str, Size] = {}
        grads: set[str] = set()
        out: Size = 0
        out_grad: Size = 0
        recorded = False
        for i in group:
            op = ops[i]
            recorded = recorded or bool(op.out_grad)
            for t in op.inputs:
                if made.get(t) not in mine:
                    ins[t] = block.sizes[t]
            grads.update(t for t in op.grads if made.get(t) not in mine)
            for t, size in op.outputs:
                leaves = t in saved or any(r not in mine for r in readers.get(t, [i]))
                if leaves or not readers.get(t):
                    out += size
                    if op.out_grad:
                        out_grad += size
        read: Size = sum(ins.values(), 0)
        fwd += read + out
        if recorded:
            bwd += out_grad + read + sum((ins[t] for t in grads), 0)
            k_b += 1
    return fwd, bwd, len(groups), k_b


def _price(block: Block, kernel: str, fused: bool = False) -> _Priced:
    """The ops of ``block`` sorted by how they are priced: matrix products as GEMMs; the
    attention core by its kernel, with its own ops where they are separate kernels; every
    other op by the bytes it moves (:meth:`memfit.engine.graph.Block.moved`) -- or, with
    ``fused`` (``torch.compile``), the element-wise ops outside the attention core and the
    chunked loss in fused groups (:func:`_fused`)."""
    gemms = []
    e_f: Size = 0
    e_b: Size = 0
    c_f: Size = 0
    c_b: Size = 0
    k_f = k_b = c_k = 0
    dequant: Size = 0
    cast: Size = 0
    r_f: Size = 0
    r_b: Size = 0
    r_k = 0
    core = range(*block.core) if kernel in ("eager", "math") else range(0)
    repeated = range(*block.repeated)
    pointwise: list[int] = []
    for i, op in enumerate(block.ops):
        if op.outputs and all(t in block.views for t, _ in op.outputs):
            # a view: no kernel forward; backward its gradient is copied into its slice of
            # its base's (split's backward concatenates them)
            if op.out_grad and not fused:
                e_b, k_b = e_b + 2 * op.out_grad, k_b + 1
            continue
        if op.gemm is not None:
            # backward: the input's gradient where it needs one, the weight's where it trains
            gemms.append((*op.gemm, bool(op.grads) + op.trains, i in repeated))
        elif op.name == "dequantize":
            dequant += op.outputs[0][1]
        elif op.name == "cast_weight":
            if not op.trains:  # the trainable ones: over the rank's weights (_new_block)
                cast += op.outputs[0][1]
        elif op.name == "to" and op.inputs[0].startswith("deq"):
            continue  # the dequantization's cast, in its traffic (dequant_traffic)
        elif op.name.startswith("sdpa_") or op.name in _NOT_ELEMENTWISE:
            continue
        else:
            f, g = block.moved(op)
            if i in core:
                c_f, c_b, c_k = c_f + f, c_b + g, c_k + 1
            elif i in repeated:
                r_f, r_b, r_k = r_f + f, r_b + g, r_k + 1
            elif fused:
                pointwise.append(i)
            else:
                e_f, e_b, k_f, k_b = e_f + f, e_b + g, k_f + 1, k_b + bool(op.out_grad)
    if pointwise:
        e_f, e_b, k_f, k_b = _fused(block, pointwise)
    return _Priced(tuple(gemms), e_f, e_b, k_f, k_b, c_f, c_b, c_k, dequant, cast, r_f, r_b, r_k)


def _at(size: Size, terms: tuple[int, ...]) -> int:
    return size if isinstance(size, int) else size.evaluate(terms)


def _priced_at(priced: _Priced, terms: tuple[int, ...]) -> _Priced:
    """``priced`` at the shape whose terms are ``terms``: every size a number of bytes."""
    gemms = tuple((_at(r, terms), k, n, c, p, o) for r, k, n, c, p, o in priced.gemms)
    p = priced
    f, b, cf, cb, dq, cast, rf, rb = (
        _at(x, terms) for x in (p.e_f, p.e_b, p.c_f, p.c_b, p.dequant, p.cast, p.r_f, p.r_b)
    )
    return _Priced(gemms, f, b, p.k_f, p.k_b, cf, cb, p.c_k, dq, cast, rf, rb, p.r_k)


#: (batch, sequence length / sp) at which a layer priced once for every shape is checked
#: against the layer built at that shape (odd sizes, as the memory walk's profiles are)
_HELD_OUT = (3, 37)


def _block_of(model: ModelSpec, ctx: Ctx, kind: str) -> Block:
    """The block the memory walk plays for ``kind``: "layer", "moe" or "head"."""
    return head_block(model, ctx) if kind == "head" else layer_block(model, ctx, kind == "moe")


@memo.cached(maxsize=4096)
def _priced_forms(model: ModelSpec, ctx: Ctx, kind: str, fused: bool = False) -> _Priced | None:
    """A block's ops priced for every shape (``kind`` as :func:`_block_of`): built once with
    symbolic sizes, checked against the block built at :data:`_HELD_OUT`. None where its
    sizes are not linear forms of the shape (the eager experts loop, a chunked output):
    each shape is then built."""
    kernel = _kernel_of(ctx.attention, model.sdpa_math)
    b, s = _HELD_OUT
    held = dataclasses.replace(ctx, batch=b, seq=s * ctx.sp)
    try:
        symbolic = _block_of(model, dataclasses.replace(ctx, symbolic=True), kind)
        forms = _price(symbolic, kernel, fused)
        direct = _price(_block_of(model, held, kind), kernel, fused)
        if _priced_at(forms, held.terms()) == direct:
            return forms
    except (TypeError, ValueError):  # a size that no linear form of the terms holds
        pass
    return None


@memo.cached(maxsize=16384)
def _priced_block(
    model: ModelSpec, ctx: Ctx, kind: str, b: int, seq: int, fused: bool = False
) -> _Priced:
    """A block's ops priced at micro-batch ``b`` and sequence length ``seq`` (the rank's
    chunk): from the forms priced once where they hold, else from the block built at this
    shape; the two agree to the byte (:func:`_priced_forms`)."""
    forms = _priced_forms(model, ctx, kind, fused)
    if forms is not None:
        try:
            return _priced_at(forms, ctx.terms_at(b, seq))
        except ValueError:  # not a whole number of bytes here
            pass
    shaped = dataclasses.replace(ctx, batch=b, seq=seq)
    kernel = _kernel_of(ctx.attention, model.sdpa_math)
    return _price(_block_of(model, shaped, kind), kernel, fused)


class _Gemms(NamedTuple):
    """A block's GEMMs at a shape: seconds forward and backward, FLOPs forward and
    backward."""

    fwd: float
    bwd: float
    flops_f: float
    flops_b: float


def _gemms(ops: _Priced, share: float, dt: int, dev: Device) -> _Gemms:
    """The GEMMs of ``ops`` (concrete); those run once per chunk of rows count ``share``
    times (the rows in all over the rows of one chunk)."""
    mm_f = mm_b = fl_f = fl_b = 0.0
    cx, cw, cdy = dev.fp8_cast
    for rows, k, n, count, passes, per_chunk in ops.gemms:
        m_rows = concrete(rows) / count
        times = count * (share if per_chunk else 1)
        fwd = _gemm(m_rows, k, n, dt, dev, times)
        flops = 2 * m_rows * k * n * times
        mm_f += fwd
        mm_b += fwd * passes
        fl_f += flops
        fl_b += flops * passes
        if cx:  # the recipe's own quantization kernels: half of each operand's forward
            x, w, dy = m_rows * k * times, k * n * times, m_rows * n * times
            mm_f += (cx * x + cw * w) / 2 / dev.bandwidth
            if passes:  # the input gradient needs w and dy; the weight gradient x and dy
                wgrad = passes > 1
                back = cw * w / 2 + cdy * dy * passes / 2 + (cx * x / 2 if wgrad else 0.0)
                mm_b += back / dev.bandwidth
    return _Gemms(mm_f, mm_b, fl_f, fl_b)


@memo.cached(maxsize=8192)
def _layer(model: ModelSpec, work: _Work, dev: Device, moe: bool, full: bool = False) -> _Layer:
    """The work of one layer of ``model`` (dense or MoE) on one GPU, one micro-batch: the
    ops of the block the memory walk plays for it (:func:`memfit.engine.timeline.layer_block`,
    built for the rank's share of the model), each priced -- matrix products as GEMMs, the
    attention core by its kernel, every other op by the bytes it moves -- so that an op
    that reaches memory reaches time."""
    tp, cp = work.tp, work.cp
    b, s = work.batch, work.seq
    tokens = b * s / cp  # the rank's tokens (context parallelism splits the sequence)
    dt = work.compute
    h = model.hidden_size
    kernel = _kernel_of(work.ctx.attention, model.sdpa_math)
    kind = "moe" if moe else "layer"
    ops = _priced_block(work.rank_model, work.ctx, kind, b, s // cp, work.compiled)
    mm_f, mm_b, fl_f, fl_b = _gemms(ops, 1.0, dt, dev)
    c_f, c_b, c_k = float(concrete(ops.c_f)), float(concrete(ops.c_b)), ops.c_k
    e_f, e_b = float(concrete(ops.e_f)), float(concrete(ops.e_b))
    dequant_elems = concrete(ops.dequant) / (work.ctx.dequant_other or 2)
    cast_elems = concrete(ops.cast) / 2  # frozen fp32 weights autocast casts
    k_f, k_b = ops.k_f, ops.k_b
    # the attention core: per query, keys up to the causal limit or the window
    heads = model.num_attention_heads / tp
    d_qk = model.qk_nope_head_dim + model.qk_rope_head_dim if model.kv_lora_rank else model.head_dim
    d_v = model.v_head_dim if model.kv_lora_rank else model.head_dim
    causal = model.architecture == "decoder"
    window = model.sliding_window if 0 < model.sliding_window < s and not full else s
    if kernel in ("eager", "math"):
        keys = float(s)  # every score is computed and masked afterwards
    elif causal:
        keys = window - window * window / (2 * s) if window < s else (s + 1) / 2
    else:
        keys = float(s)
    model_keys = (
        ((s + 1) / 2 if window >= s else window - window * window / (2 * s)) if causal else s
    )
    attn_flops = 2 * b * (s / cp) * keys * heads * (d_qk + d_v)
    model_attn = 2 * b * (s / cp) * model_keys * heads * (d_qk + d_v)
    # eager attention and SDPA's math fallback: the two products by the matmul rate (the
    # fallback's at the fp32 rate), twice each in backward, and the bytes the core's other
    # ops move (the scores' scaling, mask, softmax and casts: ops of the block)
    if kernel in ("eager", "math"):
        rate = dev.matmul_flops if kernel == "eager" else dev.fp32_flops or dev.matmul_flops
        attn_f = attn_flops / rate + max(c_f / dev.bandwidth, c_k * KERNEL_S)
        attn_b = 2 * attn_flops / rate + max(c_b / dev.bandwidth, 2 * c_k * KERNEL_S)
    elif dev.attention_curve:  # the kernel's rate by the keys each query reads
        r_f, k0_f, r_b, k0_b = dev.attention_curve
        attn_f = max(attn_flops / (r_f * keys / (keys + k0_f)), KERNEL_S)
        attn_b = max(2.5 * attn_flops / (r_b * keys / (keys + k0_b)), KERNEL_S)
    else:
        attn_f = max(attn_flops / dev.attention_flops, KERNEL_S)
        # FlashAttention's backward recomputes the scores: 2.5x the forward's FLOPs
        attn_b = max(2.5 * attn_flops / dev.attention_flops, KERNEL_S)
    ew_f = max(e_f / dev.bandwidth, k_f * KERNEL_S)
    ew_b = max(e_b / dev.bandwidth, k_b * KERNEL_S)
    dequant = dequant_elems * work.dequant_bytes / dev.bandwidth
    kv_heads = max(1, model.num_key_value_heads // tp)
    ep_bytes = tokens * model.num_experts_per_tok * h * dt if moe and work.ep > 1 else 0.0
    cp_bytes = 2 * b * (s / cp) * kv_heads * model.head_dim * dt if cp > 1 else 0.0
    return _Layer(
        matmul_fwd=mm_f,
        matmul_bwd=mm_b,
        attn_fwd=attn_f,
        attn_bwd=attn_b,
        elementwise_fwd=ew_f,
        elementwise_bwd=ew_b,
        dequant=dequant,
        cast_elems=cast_elems,
        flops_fwd=fl_f + model_attn,
        flops_bwd=fl_b + 2 * model_attn,
        attn_flops_fwd=attn_flops,
        tp_bytes=tokens * h * dt if tp > 1 else 0.0,
        ep_bytes=ep_bytes,
        cp_bytes=cp_bytes,
    )


def _kernel_of(attention: str, sdpa_math: bool = False) -> str:
    """The attention core's cost model, for the kernel the memory walk runs
    (:func:`memfit.engine.layers.attention_kernel`): eager attention and SDPA's math fallback
    materialise the scores (the fallback in fp32); the flash and memory-efficient kernels
    run the core in one fused kernel."""
    kernel = attention_kernel(attention, fp32=False, sdpa_math=sdpa_math)
    return kernel if kernel in ("eager", "math") else "flash"


@dataclass(frozen=True, slots=True)
class _Ring:
    """Time of collectives in one process group."""

    n: int
    bandwidth: float
    latency: float  # per hop of the ring
    #: the members of the group on one node, one rank's NVLink and its own share of the
    #: node's fabric (its NIC): what an all-to-all, which sends each peer its own piece,
    #: goes through
    local: int = 0
    intra: float = 0.0
    nic: float = 0.0

    def all_reduce(self, nbytes: float) -> float:
        if self.n <= 1 or nbytes <= 0:
            return 0.0
        steps = 2 * (self.n - 1)
        return steps / self.n * nbytes / self.bandwidth + COLLECTIVE_S + steps * self.latency

    def gather(self, nbytes: float) -> float:
        """An all-gather or reduce-scatter of a tensor of ``nbytes`` in all."""
        if self.n <= 1 or nbytes <= 0:
            return 0.0
        steps = self.n - 1
        return steps / self.n * nbytes / self.bandwidth + COLLECTIVE_S + steps * self.latency

    def all_to_all(self, nbytes: float) -> float:
        """Each rank sends ``nbytes / n`` to every other rank. Inside a node the pieces
        cross NVLink; a piece for a peer on another node leaves through the rank's own NIC
        -- no ring spreads it over the node's other NICs, as an all-gather's rails do -- so
        a group spanning nodes is bound by ``(n - local) / n`` of the bytes over one NIC,
        while the pieces for the node's own peers cross NVLink at the same time."""
        if self.local >= self.n or self.nic <= 0:
            return self.gather(nbytes)
        steps = self.n - 1
        inside = (self.local - 1) / self.n * nbytes / self.intra
        across = (self.n - self.local) / self.n * nbytes / self.nic
        return max(inside, across) + COLLECTIVE_S + steps * self.latency

    def send(self, nbytes: float) -> float:
        if self.n <= 1 or nbytes <= 0:
            return 0.0
        return nbytes / self.bandwidth + COLLECTIVE_S + self.latency


def _ring(n: int, stride: int, scenario: Scenario, dev: Device) -> _Ring:
    """A group of ``n`` ranks ``stride`` apart (Megatron's order: tp, cp, dp, pp).

    Inside a node the group talks over NVLink. Across nodes NCCL runs one ring per NIC
    (rail), each carrying its share of the data, so the members of the group on one node
    together have their NICs' share of the node's fabric: all of it when the group holds
    every GPU of the node, one NIC's worth when it holds one GPU per node."""
    per_node = scenario.hardware.gpus_per_node
    if n * stride <= per_node:
        return _Ring(n, dev.intra, HOP_INTRA_S)
    members = max(1, min(n, per_node // stride))
    ring = min(dev.intra, dev.inter * members)
    return _Ring(n, ring, HOP_INTER_S, members, dev.intra, min(dev.intra, dev.inter))


def _overlapped(comm: float, compute: float) -> float:
    """What ``comm`` seconds of communication overlapped with ``compute`` add to the
    step: the part the compute cannot hide, and the slowdown of the part it hides."""
    hidden = min(comm, compute)
    return comm - hidden + OVERLAP_SLOWDOWN * hidden


def step_time(scenario: Scenario) -> StepTime:
    """The time of one optimizer step of ``scenario``; see the module docstring."""
    t = scenario.training
    return _evaluate(
        _plan(*_strategy(scenario)),
        t.micro_batch_size,
        t.sequence_length,
        t.gradient_accumulation_steps,
        t.token_budget,
    )


def step_times(scenario: Scenario, shapes: Sequence[tuple[int, int, int]]) -> list[StepTime]:
    """The step time of ``scenario`` at each (micro-batch size, sequence length, gradient
    accumulation steps) of ``shapes``, the strategy planned once: equal to
    :func:`step_time` of each changed scenario."""
    plan = _plan(*_strategy(scenario))
    budget = scenario.training.token_budget
    return [_evaluate(plan, b, s, m, budget) for b, s, m in shapes]


def per_op_recompute_share(model: ModelSpec) -> float:
    """The share of a layer's matmul FLOPs that torchtitan's per-op checkpointing runs
    again in backward: it keeps the outputs of every odd-numbered ``mm`` of the layer (in
    the order the layer calls them) and recomputes the even ones; routed experts run as
    grouped GEMMs, which it does not keep, and are recomputed whole."""
    h, q, kv = model.hidden_size, model.num_attention_heads * model.head_dim, 0
    kv = model.num_key_value_heads * model.head_dim
    attention = [h * (q + 2 * kv), q * h] if model.fused_qkv else [h * q, h * kv, h * kv, q * h]
    inter = model.intermediate_size
    if model.mlp == "gated":
        mlp = [2 * h * inter, inter * h] if model.fused_gate_up else [h * inter] * 3
    else:
        mlp = [h * inter, inter * h]
    experts = 0
    if model.is_moe:
        mlp = [h * model.num_experts]  # the router
        experts = 3 * h * model.moe_intermediate_size * model.num_experts_per_tok
    sizes = attention + mlp
    again = sum(sizes[1::2]) + experts
    return again / (sum(sizes) + experts)


#: the fields of a training spec that give a step its shape: the plan is made without
#: them and each evaluation passes them (:func:`_evaluate`)
SHAPE_FIELDS = frozenset(
    ("micro_batch_size", "sequence_length", "gradient_accumulation_steps", "token_budget")
)
#: every other field keys the plan: a field added to the spec keys it without an edit here
_PLAN_FIELDS = tuple(f.name for f in fields(TrainingSpec) if f.name not in SHAPE_FIELDS)


def _strategy(scenario: Scenario) -> tuple[Scenario, tuple[object, ...]]:
    """``scenario`` and the cache key of its plan within its model and hardware: every
    training field but the shape (:data:`SHAPE_FIELDS`). The model is the one the stack
    builds (:func:`memfit.engine.stacks.built`)."""
    scenario = resolve(scenario).scenario
    return scenario, plan_key(scenario.training)


def plan_key(training: TrainingSpec) -> tuple[object, ...]:
    """What a step's plan is keyed by within its model and hardware: every training field
    but the shape."""
    return tuple(getattr(training, name) for name in _PLAN_FIELDS)


@dataclass(frozen=True, slots=True)
class _Stages:
    """Everything :func:`_new_block` reads but the shape: a stage block is cached by the
    whole of it (with the micro-batch and sequence length), so that plans alike in all of
    it share their blocks (ZeRO stages, optimizers, offload) and plans that differ in any
    of it never do. Its hash is computed once. The blocks are kept per model and hardware
    (:class:`_Memo`), so the model, and the device and rings, which follow from the
    hardware, the precision and the mesh, are read but not compared."""

    model: ModelSpec = field(compare=False)
    #: the rank's share of the model (follows from the model and the mesh)
    rank_model: ModelSpec = field(compare=False)
    mesh: Mesh
    dev: Device = field(compare=False)
    method: str
    lora: LoraSpec
    freeze: FreezeSpec
    precision: str
    #: the device follows from it too (its GEMM rate and cast kernels)
    fp8_recipe: str
    #: torch.compile fuses the element-wise ops
    compiled: bool
    attention: str
    loss: str
    sequence_parallel: bool
    #: the tensor-parallel collectives hide behind the layers' GEMMs (tp_comm_overlap, with
    #: sequence parallelism and tp above 1)
    tp_overlap: bool
    #: the expert capacity factor
    capacity: float
    #: bytes of the compute dtype (engine.plan.precision)
    compute: int
    #: the compute mode (engine.plan.precision)
    mode: str
    #: QLoRA: bytes one weight's dequantization moves (the memory walk's context:
    #: engine.timeline.make_ctx)
    dequant_bytes: float
    #: the memory walk's context for the rank's blocks, without the shape: the ops of
    #: each layer are priced from the block it builds (:func:`_layer`), and the head's and
    #: the loss's from theirs (:func:`_head`)
    ctx: Ctx
    head_ctx: Ctx
    per_rank: tuple[int, ...]
    recompute_share: float
    #: torchtitan's per-op checkpointing: the attention kernel is not recomputed
    per_op: bool
    selective: bool
    amp: bool
    trainable_rank: float
    moe_share: float
    #: the share of the layers that attend over the whole sequence where the others slide
    #: a window (:func:`memfit.engine.specs.full_attention_layers`)
    full_share: float
    tp_ring: _Ring = field(compare=False)
    cp_ring: _Ring = field(compare=False)
    ep_ring: _Ring = field(compare=False)
    pp_ring: _Ring = field(compare=False)
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(_stage_values(self)))

    def __hash__(self) -> int:
        return self._hash


#: the fields of :class:`_Stages` its equality compares, as one tuple
_stage_values = attrgetter(*(f.name for f in fields(_Stages) if f.compare))


@dataclass(frozen=True, slots=True)
class _Plan:
    """What a step's time depends on apart from its shape (micro-batch, sequence length,
    accumulation): the mesh, the device, the rings, the rank's parameters, and what its
    stage blocks read (:class:`_Stages`)."""

    scenario: Scenario
    mesh: Mesh
    dev: Device
    recompute_share: float
    stages: _Stages
    dp_ring: _Ring
    shard_ring: _Ring
    rep_ring: _Ring | None
    trainable_rank: float
    params_rank: float
    g_bytes: int
    gather_bytes: int
    #: the optimizer step's bytes per trainable element (0: nothing to update)
    opt_bytes: float
    #: the trainable parameter tensors one rank steps (its pipeline stage's)
    opt_tensors: float
    #: DDP copies the gradients into its all-reduce buckets and back
    #: (engine.sharding.not_ddp; not where they are the buckets' views)
    ddp_copies: bool
    assumptions: tuple[str, ...]
    #: the stage blocks of the plan's model and hardware (:func:`_stage_block`)
    blocks: memo.Table[tuple[_Stages, int, int], _Block]
    #: those this plan met, by shape (dropped with the plan)
    seen: dict[tuple[int, int], _Block] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Memo:
    """The plans and stage blocks of one model on one hardware (a sweep shares them
    across its configurations)."""

    plans: memo.Table[tuple[object, ...], _Plan]
    blocks: memo.Table[tuple[_Stages, int, int], _Block]


#: plans or stage blocks one memo keeps before it starts afresh
_ENTRIES_MAX = 8192
#: memos by model and hardware, at most :data:`_MEMOS_MAX` of them; and the same by the
#: identity of the two objects, which saves hashing them (each entry keeps its objects,
#: so that an identity is never reused while the entry exists)
_MEMOS_MAX = 256
_MEMOS: memo.Table[tuple[ModelSpec, object], _Memo] = memo.Table(f"{__name__}._MEMOS", _MEMOS_MAX)
_BY_ID: memo.Table[tuple[int, int], tuple[ModelSpec, object, _Memo]] = memo.Table(
    f"{__name__}._BY_ID", 4 * _MEMOS_MAX
)


def _memo(scenario: Scenario) -> _Memo:
    model, hw = scenario.model, scenario.hardware
    ident = (id(model), id(hw))
    held = _BY_ID.get(ident)
    if held is not None and held[0] is model and held[1] is hw:
        return held[2]
    kept = _MEMOS.get((model, hw))
    if kept is None:
        if len(_MEMOS) >= _MEMOS_MAX:
            _BY_ID.clear()  # its entries point into the memos about to be dropped
        fresh = _Memo(memo.Table(None, _ENTRIES_MAX), memo.Table(None, _ENTRIES_MAX))
        kept = _MEMOS.keep((model, hw), fresh)
    _BY_ID.keep(ident, (model, hw, kept))
    return kept


def _plan(scenario: Scenario, key: tuple[object, ...]) -> _Plan:
    kept = _memo(scenario)
    plan = kept.plans.get(key)
    if plan is None:
        plan = kept.plans.keep(key, _make_plan(scenario, kept.blocks))
    return plan


def _make_plan(scenario: Scenario, blocks: memo.Table[tuple[_Stages, int, int], _Block]) -> _Plan:
    model, training, hw = scenario.model, scenario.training, scenario.hardware
    resolved = resolve(scenario)
    mesh, prec = resolved.mesh, resolved.precision
    dev = device(scenario)
    par = training.parallelism
    assumptions = list(device_notes(scenario))
    if hw.nodes > 1 and hw.network is None and hw.network_gb_s is None:
        assumptions.append("network: " + dev.network)
    n_moe = model.num_layers - model.first_dense_layers if model.is_moe else 0
    # which layers recompute their forward in backward: those the memory walk plays as
    # checkpointed (engine.timeline.step_layers) -- not a layer autograd does not record
    mode = resolved.conventions.checkpointing
    # what the memory walk's blocks are built with (the rank's share of the model); the
    # layers are keyed by what their ops read (Ctx.for_layers)
    rank = resolved.rank_model()
    # eager blocks: torch.compile's fusion is priced on them (_fused)
    whole_ctx = make_ctx(rank, training).replaced(compiled="")
    ctx = whole_ctx.for_layers()
    kept = recomputed_layers(model, training)
    recompute_share = sum(kept) / model.num_layers if model.num_layers else 0.0
    if mode == "per-op":  # of each such layer, the matmuls the policy does not keep
        recompute_share = per_op_recompute_share(model) * recompute_share
    # per stage: the layers it holds (the first holds the embedding, the last the head)
    per_rank = tuple(slot.model.num_layers for slot in resolved.ranks())
    dp_ring = _ring(mesh.dp, mesh.tp * mesh.cp, scenario, dev)
    if (par.hybrid_shard or par.dp_replicate > 1) and mesh.shard < mesh.dp:
        shard_ring = _ring(mesh.shard, mesh.tp * mesh.cp, scenario, dev)
        rep_ring: _Ring | None = _ring(
            mesh.dp // mesh.shard, mesh.tp * mesh.cp * mesh.shard, scenario, dev
        )
    else:
        shard_ring, rep_ring = dp_ring, None
    # parameters and gradients of one rank (tensor and pipeline shards)
    whole = model_state(model, training)
    trainable_rank = whole.trainable_params / (mesh.tp * mesh.pp)
    params_rank = whole.total_params / (mesh.tp * mesh.pp)
    if model.is_moe and mesh.ep > 1:
        experts = sum(g.total for g in model_tensors(model) if g.component == "experts")
        share = experts / whole.total_params if whole.total_params else 0.0
        params_rank *= 1 - share + share / mesh.ep
        trainable_rank *= 1 - share + share / mesh.ep
    # a QLoRA base is gathered as stored, 4-bit (with its constants)
    gather_bytes = prec.gather
    # the optimizer step: bytes of parameters, gradients and states per trainable element
    opt_bytes = 0.0
    if whole.trainable_params:
        state_b = whole.category_bytes("optimizer_states") / whole.trainable_params
        grad_b = whole.category_bytes("gradients") / whole.trainable_params
        param_b = prec.master
        temp_b = 8 if training.optimizer_impl == "foreach" and training.optimizer == "adamw" else 0
        opt_bytes = 2 * param_b + grad_b + 2 * state_b + temp_b
    fused = fused_experts(training)
    opt_tensors = (
        sum(stored_tensors(g, model, fused)[0] for g in split_tensors(model, training).trainable)
        / mesh.pp
    )
    stages = _Stages(
        model=model,
        rank_model=rank,
        mesh=mesh,
        dev=dev,
        method=training.method,
        lora=training.lora,
        freeze=training.freeze,
        precision=training.precision,
        fp8_recipe=training.fp8_recipe,
        compiled=training.torch_compile,
        attention=training.attention,
        loss=training.loss,
        sequence_parallel=par.sequence_parallel,
        tp_overlap=par.tp_comm_overlap and par.sequence_parallel and mesh.tp > 1,
        capacity=par.expert_capacity_factor,
        compute=prec.compute,
        mode=prec.mode,
        dequant_bytes=dequant_traffic(ctx.dequant_other),
        ctx=ctx,
        head_ctx=whole_ctx.for_head(),
        per_rank=per_rank,
        recompute_share=recompute_share,
        per_op=mode == "per-op",
        # the attention that runs (a soft-capped Gemma-2 runs eager under sdpa)
        selective=mode == "selective" and _kernel_of(ctx.attention) == "eager",
        amp=prec.mode == "amp",
        trainable_rank=trainable_rank,
        moe_share=n_moe / model.num_layers if model.num_layers else 0.0,
        full_share=full_attention_layers(model) / max(model.num_layers, 1),
        tp_ring=_ring(mesh.tp, 1, scenario, dev),
        cp_ring=_ring(mesh.cp, mesh.tp, scenario, dev),
        ep_ring=_ring(mesh.ep, mesh.tp * mesh.cp, scenario, dev),
        pp_ring=_ring(2, mesh.tp * mesh.cp * mesh.dp, scenario, dev),
    )
    return _Plan(
        scenario=scenario,
        mesh=mesh,
        dev=dev,
        recompute_share=recompute_share,
        stages=stages,
        dp_ring=dp_ring,
        shard_ring=shard_ring,
        rep_ring=rep_ring,
        trainable_rank=trainable_rank,
        params_rank=params_rank,
        g_bytes=prec.grad_comm,
        gather_bytes=gather_bytes,
        opt_bytes=opt_bytes,
        opt_tensors=opt_tensors,
        ddp_copies=not_ddp(training, mesh) is None
        and not resolved.conventions.gradient_as_bucket_view,
        assumptions=tuple(assumptions),
        blocks=blocks,
    )


_FIELDS = (
    "matmul_fwd", "matmul_bwd", "attn_fwd", "attn_bwd", "elementwise_fwd",
    "elementwise_bwd", "dequant", "cast_elems", "flops_fwd", "flops_bwd", "attn_flops_fwd",
    "cp_bytes",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Block:
    """One micro-batch on the busiest pipeline stage, and the FLOPs of all stages."""

    busiest: dict[str, float]
    mb_compute: float
    mb_time: float
    flops_mb: float
    hw_mb: float
    tokens: float


class _Head(NamedTuple):
    """The final norm, the LM head and the loss of one micro-batch, on the last stage."""

    fwd: float  # the head's GEMMs, forward
    bwd: float
    flops_f: float
    flops_b: float
    #: every other op of the block (the final norm, the loss's casts, log-softmax and
    #: nll), forward and backward
    elementwise: float
    #: QLoRA: a quantized head's dequantization, forward and again in backward
    dequant: float
    #: elements of a frozen fp32 head autocast casts in the forward
    cast_elems: float


def _head(stages: _Stages, b: int, s: int) -> _Head:
    """The head and the loss at micro-batch ``b`` and sequence length ``s`` (see
    :func:`_head_at`)."""
    # the LM head stays in 16 bits under FP8 (Device.sixteen_bit)
    return _head_at(
        stages.rank_model, stages.head_ctx, stages.dev.sixteen_bit(), stages.compute,
        stages.dequant_bytes, b, s // stages.mesh.cp, stages.compiled,
    )  # fmt: skip


@memo.cached(maxsize=16384)
def _head_at(
    model: ModelSpec,
    ctx: Ctx,
    dev: Device,
    dt: int,
    dequant_bytes: float,
    b: int,
    seq: int,
    compiled: bool = False,
) -> _Head:
    """The head and the loss of ``model`` (the rank's share) at micro-batch ``b`` and the
    rank's ``seq`` positions: the ops of the block the memory walk plays last
    (:func:`memfit.engine.timeline.head_block`), priced as the layers' are; a fused loss's
    chunk of rows runs ``ceil(tokens / chunk)`` times."""
    ops = _priced_block(model, ctx, "head", b, seq, compiled)
    # a fused loss runs its chunk's ops over every row: tokens / chunk times the work, in
    # ceil(tokens / chunk) launches
    terms = ctx.terms_at(b, seq)
    tokens, chunk = terms[0], terms[4]
    share, chunks = (tokens / chunk, -(-tokens // chunk)) if ops.r_k and chunk else (1.0, 1)
    mm = _gemms(ops, share, dt, dev)
    bw = dev.bandwidth
    ew = max(concrete(ops.e_f) / bw, ops.k_f * KERNEL_S)
    ew += max(concrete(ops.e_b) / bw, ops.k_b * KERNEL_S)
    if ops.r_k:
        ew += max(share * concrete(ops.r_f) / bw, chunks * ops.r_k * KERNEL_S)
        ew += max(share * concrete(ops.r_b) / bw, chunks * ops.r_k * KERNEL_S)
    deq = concrete(ops.dequant) / (ctx.dequant_other or 2)
    return _Head(
        mm.fwd, mm.bwd, mm.flops_f, mm.flops_b, ew,
        2 * deq * dequant_bytes / bw, concrete(ops.cast) / 2,
    )  # fmt: skip


def _stage_block(plan: _Plan, b: int, s: int) -> _Block:
    """One micro-batch of ``plan`` at micro-batch ``b`` and sequence length ``s`` on its
    busiest stage, kept by :attr:`_Plan.stages` and the shape (:func:`_new_block`)."""
    shape = (b, s)
    found = plan.seen.get(shape)  # this plan's own blocks: no hash of its stages
    if found is not None:
        return found
    key = (plan.stages, b, s)
    found = plan.blocks.get(key)
    if found is None:
        found = plan.blocks.keep(key, _new_block(plan.stages, b, s))
    if len(plan.seen) >= _ENTRIES_MAX:
        plan.seen.clear()
    plan.seen[shape] = found
    return found


def _new_block(stages: _Stages, b: int, s: int) -> _Block:
    """One micro-batch on the busiest stage, from ``stages`` and the shape alone."""
    model, mesh, dev = stages.model, stages.mesh, stages.dev
    dt = stages.compute
    h = model.hidden_size
    recompute_share, selective = stages.recompute_share, stages.selective
    tp_ring, cp_ring = stages.tp_ring, stages.cp_ring
    ep_ring, pp_ring = stages.ep_ring, stages.pp_ring
    trainable_rank = stages.trainable_rank
    work = _work(stages, b, s)
    dense = _layer(model, work, dev, False)
    moe = _layer(model, work, dev, True) if model.is_moe else None
    moe_share = stages.moe_share
    parts = [(dense, 1 - moe_share)] + ([(moe, moe_share)] if moe else [])
    if window_masks(stages.rank_model, s) and stages.full_share:
        # the global layers among sliding-window ones run their attention over the whole
        # sequence, unmasked (their share of every kind alike)
        g = stages.full_share
        full = _work(stages, b, s, full=True)
        parts = [(layer, share * (1 - g)) for layer, share in parts] + [
            (_layer(model, full, dev, kind is moe, full=True), share * g) for kind, share in parts
        ]

    # the embedding (on the first stage), the LM head and the loss (on the last)
    tokens = b * s / mesh.cp
    head = _head(stages, b, s)
    embed_t = max(4 * tokens * h * dt / dev.bandwidth, 2 * KERNEL_S)

    per_layer = {
        name: sum(getattr(layer, name) * share for layer, share in parts) for name in _FIELDS
    }

    def layers_time(n: float) -> dict[str, float]:
        return {name: v * n for name, v in per_layer.items()}

    # one micro-batch on the busiest stage
    stage_terms: list[dict[str, float]] = []
    alike: dict[tuple[int, bool, bool], dict[str, float]] = {}
    for r, n in enumerate(stages.per_rank):
        first, last = r == 0, r == mesh.pp - 1
        if (n, first, last) in alike:
            stage_terms.append(alike[(n, first, last)])
            continue
        lt = layers_time(n)
        fwd = lt["matmul_fwd"] + lt["attn_fwd"]
        bwd = lt["matmul_bwd"] + lt["attn_bwd"]
        ew = lt["elementwise_fwd"] + lt["elementwise_bwd"]
        # per-op checkpointing keeps the attention kernel's outputs: it is not run again
        attn_again = 0.0 if stages.per_op else lt["attn_fwd"]
        rec = recompute_share * (lt["matmul_fwd"] + attn_again + lt["elementwise_fwd"])
        if selective:
            rec += lt["attn_fwd"]
        deq = lt["dequant"] * (2 + recompute_share)
        if last:
            fwd += head.fwd
            bwd += head.bwd
            ew += head.elementwise + 6 * head.cast_elems / dev.bandwidth
            deq += head.dequant
        if first:
            ew += embed_t
        # autocast re-casts the fp32 weights to 16 bits in every forward (and recompute)
        if stages.amp:
            ew += 6 * trainable_rank / dev.bandwidth * (1 + recompute_share)
        # and the frozen ones it finds stored in fp32 (the LM head with them, when frozen)
        cast = lt["cast_elems"]
        if cast:
            ew += 6 * cast / dev.bandwidth * (1 + recompute_share)
        # tensor parallel: 2 all-reduces (or all-gather + reduce-scatter) forward, 2 backward
        tp_t = tp_busy = 0.0
        if mesh.tp > 1:
            one = tp_ring.all_reduce(tokens * h * dt)
            layers_tp = (4 + 2 * recompute_share) * n * one
            ends = 2 * one if first or last else 0.0  # the embedding's and the head's
            tp_busy = layers_tp + ends
            if stages.tp_overlap:
                # chunked against the GEMM each collective feeds or drains: the layers'
                # GEMMs (forward, recomputed, backward) hide them, less their slowdown
                gemms = lt["matmul_fwd"] * (1 + recompute_share) + lt["matmul_bwd"]
                layers_tp = _overlapped(layers_tp, gemms)
            tp_t = layers_tp + ends
        ep_t = 0.0
        if moe is not None and mesh.ep > 1:
            ep_t = (4 + 2 * recompute_share) * n * moe_share * ep_ring.all_to_all(moe.ep_bytes)
        cp_t = 0.0
        if mesh.cp > 1:
            per_layer_kv = lt["cp_bytes"] / max(n, 1)
            ring_f = (mesh.cp - 1) * cp_ring.send(per_layer_kv)
            core_f = lt["attn_fwd"] / max(n, 1)
            cp_t = n * (
                _overlapped(ring_f, core_f) * (1 + recompute_share)
                + _overlapped(2 * ring_f, lt["attn_bwd"] / max(n, 1))
            )
        pp_t = 0.0
        if mesh.pp > 1:
            send = pp_ring.send(tokens * h * dt / (mesh.tp if stages.sequence_parallel else 1))
            pp_t = 2 * mesh.vpp * send
        stage_terms.append(
            {
                "forward": fwd,
                "backward": bwd,
                "recompute": rec,
                "elementwise": ew + deq,
                "tp": tp_t,
                "tp_busy": tp_busy,
                "ep": ep_t,
                "cp": cp_t,
                "pp": pp_t,
                "flops_f": lt["flops_fwd"] + (head.flops_f if last else 0),
                "flops_b": lt["flops_bwd"] + (head.flops_b if last else 0),
                "attn_flops": lt["attn_flops_fwd"],
                "layers_f": lt["flops_fwd"],
                "n": n,
            }
        )
        alike[(n, first, last)] = stage_terms[-1]
    busiest = max(
        stage_terms,
        key=lambda t: sum(
            v
            for k_, v in t.items()
            if k_ not in ("flops_f", "flops_b", "attn_flops", "layers_f", "n", "tp_busy")
        ),
    )
    mb_compute = busiest["forward"] + busiest["backward"] + busiest["recompute"]
    mb_time = (
        mb_compute
        + busiest["elementwise"]
        + busiest["tp"]
        + busiest["ep"]
        + busiest["cp"]
        + busiest["pp"]
    )

    flops_mb = sum(t["flops_f"] + t["flops_b"] for t in stage_terms) * mesh.tp * mesh.cp
    hw_mb = (
        sum(
            t["flops_f"]
            + recompute_share * t["layers_f"]
            + t["flops_b"]
            + (t["attn_flops"] if selective else 0)
            for t in stage_terms
        )
        * mesh.tp
        * mesh.cp
    )
    return _Block(busiest, mb_compute, mb_time, flops_mb, hw_mb, tokens)


#: the terms every micro-batch pays on the busiest stage: (name, bound, the stage block's
#: key, how it is computed); ``{mode}`` is the checkpointing mode
_PER_MICRO_BATCH = (
    ("forward matmuls and attention", "compute", "forward", "per-GEMM roofline x micro-batches"),
    (
        "backward matmuls and attention",
        "compute",
        "backward",
        "input and weight gradients, FlashAttention backward 2.5x",
    ),
    ("recomputation", "compute", "recompute", "{mode} checkpointing re-runs the forward"),
    (
        "elementwise ops (norms, activations, loss)",
        "memory_bandwidth",
        "elementwise",
        "bytes moved / bandwidth",
    ),
    (
        "tensor-parallel all-reduces",
        "communication",
        "tp",
        "4 per layer per micro-batch, 2 (n-1)/n b s h",
    ),
    ("expert-parallel all-to-all", "communication", "ep", "4 per MoE layer per micro-batch"),
    (
        "context-parallel ring (exposed)",
        "communication",
        "cp",
        "K/V ring beyond the attention it hides behind",
    ),
    (
        "pipeline sends",
        "communication",
        "pp",
        "activation and gradient per micro-batch per boundary",
    ),
)


#: the tensor-parallel term's formula when its collectives hide behind the GEMMs
_TP_OVERLAPPED = (
    "4 per layer per micro-batch, 2 (n-1)/n b s h, hidden behind the layers' GEMMs "
    "(tp_comm_overlap): the part they cannot hide, and 15 % of the part they do"
)


@memo.cached(maxsize=16)
def _per_micro_batch(mode: str, tp_overlap: bool) -> tuple[tuple[str, str, str, str, str], ...]:
    """:data:`_PER_MICRO_BATCH` with the checkpointing ``mode`` written into its formulas,
    and the key of each term's busy time (the tensor-parallel collectives', when hidden)."""
    out = []
    for n, k, key, f in _PER_MICRO_BATCH:
        busy = key
        if key == "tp" and tp_overlap:
            n, f, busy = "tensor-parallel collectives (exposed)", _TP_OVERLAPPED, "tp_busy"
        out.append((n, k, key, f.format(mode=mode), busy))
    return tuple(out)


class _Terms:
    """The step's terms in the order they are added, and the seconds of each bound."""

    def __init__(self) -> None:
        self.terms: list[Term] = []
        self.kinds = dict.fromkeys(BOUNDS, 0.0)

    def add(self, name: str, kind: str, seconds: float, busy: float, formula: str) -> None:
        if busy > 0 or seconds > 0:
            self.terms.append(Term(name, kind, seconds, busy, formula))
            self.kinds[kind] += seconds


def _evaluate(plan: _Plan, b: int, s: int, micro: int, token_budget: int | None) -> StepTime:
    """The step of ``plan`` at micro-batch ``b``, sequence length ``s`` and ``micro``
    micro-batches per step."""
    scenario, mesh = plan.scenario, plan.mesh
    training = scenario.training
    blk = _stage_block(plan, b, s)
    busiest = blk.busiest
    out = _Terms()
    terms, kinds = out.terms, out.kinds
    per_mb = _per_micro_batch(training.activation_checkpointing, plan.stages.tp_overlap)
    for name, kind, key, formula, busy_key in per_mb:
        seconds = micro * busiest[key]
        busy = seconds if busy_key == key else micro * busiest[busy_key]
        if busy > 0:  # out.add, inline: every evaluation of a sweep runs these
            terms.append(Term(name, kind, seconds, busy, formula))
            kinds[kind] += seconds
    # the pipeline bubble: (pp - 1) / vpp micro-batch times of the slowest stage
    if mesh.pp > 1:
        factor = {"zero-bubble": 1 / 3}.get(training.parallelism.pp_schedule, 1.0)
        bubble = factor * (mesh.pp - 1) / mesh.vpp * blk.mb_time
        out.add(
            "pipeline bubble",
            "pipeline_bubble",
            bubble,
            bubble,
            f"(pp - 1) / vpp = {(mesh.pp - 1) / mesh.vpp:g} micro-batch times",
        )
    waiting = _data_parallel(plan, busiest, micro, out)
    _optimizer(plan, busiest, out)
    _accumulation(plan, micro, out)
    _host_transfers(plan, blk, micro, waiting, out)
    return _summary(plan, blk, out, b * s * micro * mesh.dp, micro, token_budget)


def _data_parallel(plan: _Plan, busiest: dict[str, float], micro: int, out: _Terms) -> float:
    """Gradients reduced and parameters gathered across data-parallel ranks; returns the
    exposed ZeRO-3 gathers of one micro-batch (the step waits on them)."""
    mesh, par = plan.mesh, plan.scenario.training.parallelism
    shard_ring, rep_ring = plan.shard_ring, plan.rep_ring
    trainable_rank = plan.trainable_rank
    overlap = OVERLAP[par.framework]
    grad_bytes = trainable_rank * plan.g_bytes
    last_bwd = busiest["backward"] + busiest["recompute"]
    zero = par.zero_stage
    waiting = 0.0  # per micro-batch: the exposed gathers, when the step waits on them
    if mesh.dp <= 1 or not trainable_rank:
        return waiting
    if zero == 3:
        # every micro-batch gathers the parameters twice and reduce-scatters gradients
        # FSDP's unit is a layer: one collective per layer and pass
        n_units = max(1.0, busiest["n"])
        ag = n_units * shard_ring.gather(plan.params_rank * plan.gather_bytes / n_units)
        rs = n_units * shard_ring.gather(grad_bytes / n_units)
        fwd_c = busiest["forward"] + busiest["elementwise"] / 2
        bwd_c = busiest["backward"] + busiest["recompute"] + busiest["elementwise"] / 2
        exposed = _overlapped(ag, fwd_c) + _overlapped(ag + rs, bwd_c) + (ag + rs) / n_units
        waiting = exposed
        out.add(
            "ZeRO-3 / FSDP gathers and reduce-scatters",
            "communication",
            micro * exposed,
            micro * (2 * ag + rs),
            "all-gather forward and backward, reduce-scatter, prefetched",
        )
    else:
        per_mb = zero == 2  # ZeRO-2 reduce-scatters every micro-batch
        reduce = shard_ring.gather(grad_bytes) if zero >= 1 else plan.dp_ring.all_reduce(grad_bytes)
        hide = last_bwd if overlap["grad_reduce"] else 0.0
        times = micro if per_mb else 1
        exposed = times * _overlapped(reduce, hide)
        out.add(
            "gradient reduction",
            "communication",
            exposed,
            times * reduce,
            "all-reduce (ZeRO-0) or reduce-scatter (ZeRO-1/2) of the gradients",
        )
        if plan.ddp_copies:
            # DDP's autograd hook copies each gradient into its bucket, and the reducer
            # copies the reduced bucket back (reducer.cpp: mark_variable_ready_dense,
            # copy_bucket_to_grad): a read and a write of the gradients each way, on the
            # compute stream
            copies = 4 * grad_bytes / plan.dev.bandwidth
            out.add(
                "DDP gradient bucket copies",
                "memory_bandwidth",
                copies,
                copies,
                "gradients into the buckets and back (gradient_as_bucket_view=False)",
            )
        if zero >= 1:
            gather = shard_ring.gather(trainable_rank * plan.gather_bytes)
            hide = busiest["forward"] if overlap["param_gather"] else 0.0
            out.add(
                "parameter all-gather after the step",
                "communication",
                _overlapped(gather, hide),
                gather,
                "(n-1)/n of the updated 16-bit parameters",
            )
    if rep_ring is not None:
        rep = rep_ring.all_reduce(grad_bytes / mesh.shard)
        out.add(
            "gradient all-reduce across nodes (hybrid shard)",
            "communication",
            _overlapped(rep, last_bwd),
            rep,
            "replicas of each shard",
        )
    return waiting


def _optimizer(plan: _Plan, busiest: dict[str, float], out: _Terms) -> None:
    """The optimizer step: bytes of parameters, gradients and states per trainable
    element, on the GPU or on the host."""
    mesh, dev = plan.mesh, plan.dev
    training, hw = plan.scenario.training, plan.scenario.hardware
    opt_share = mesh.shard if training.parallelism.zero_stage >= 1 else 1
    opt_params = plan.trainable_rank / opt_share
    if not (opt_params and plan.opt_bytes):
        return
    per = plan.opt_bytes
    if training.offload.optimizer == "none":
        opt_t = max(opt_params * per / dev.bandwidth, _optimizer_launches(plan) * KERNEL_S)
        out.add(
            "optimizer step",
            "memory_bandwidth",
            opt_t,
            opt_t,
            f"{per:g} bytes per trainable element / bandwidth",
        )
        return
    last_bwd = busiest["backward"] + busiest["recompute"]
    host_bw = (HOST_OPTIMIZER_GB_S if training.offload.optimizer == "cpu" else NVME_GB_S) * 1e9
    cpu = opt_params * hw.gpus_per_node * per / host_bw
    d2h = plan.trainable_rank / opt_share * 2 / dev.host
    h2d = plan.trainable_rank / opt_share * 2 / dev.host
    out.add(
        "optimizer step on the host",
        "host_transfer",
        cpu,
        cpu,
        "bytes per element / host memory bandwidth, all GPUs of a node",
    )
    out.add(
        "gradients to the host",
        "host_transfer",
        max(0.0, d2h - last_bwd),
        d2h,
        "16-bit gradients over the host link, during backward",
    )
    out.add(
        "parameters back to the GPU",
        "host_transfer",
        h2d,
        h2d,
        "16-bit parameters over the host link",
    )


def _optimizer_launches(plan: _Plan) -> float:
    """The kernels of one optimizer step on a rank: per tensor and per kernel of the
    update for the per-tensor loop; for ``foreach`` per op and per launch of
    ``multi_tensor_apply`` (so many tensors, so many elements a launch), one op for
    ``fused``. A model of many small tensors steps at the launch rate, not the bandwidth's."""
    training = plan.scenario.training
    per_tensor, ops = OPTIMIZER_KERNELS[training.optimizer]
    tensors = plan.opt_tensors
    if training.optimizer_impl == "for-loop" or per_tensor == 1:
        return tensors * per_tensor
    share = plan.mesh.shard if training.parallelism.zero_stage >= 1 else 1
    elems = plan.trainable_rank / share
    launches = max(-(-tensors // MULTI_TENSOR_TENSORS), -(-elems // MULTI_TENSOR_ELEMS), 1)
    return launches * (1 if training.optimizer_impl == "fused" else ops)


def _accumulation(plan: _Plan, micro: int, out: _Terms) -> None:
    """Autograd adds each micro-batch's gradients into ``.grad`` (into the shard under
    ZeRO-2/3, which reduce-scatter every micro-batch); Megatron's fused weight gradient
    GEMM accumulates into ``main_grad`` itself."""
    par = plan.scenario.training.parallelism
    if micro > 1 and plan.trainable_rank and par.framework != "megatron":
        held = plan.trainable_rank / (plan.mesh.shard if par.zero_stage >= 2 else 1)
        acc = (micro - 1) * 3 * held * plan.g_bytes / plan.dev.bandwidth
        out.add(
            "gradient accumulation",
            "memory_bandwidth",
            acc,
            acc,
            "read, add and write the gradients per extra micro-batch",
        )


def _host_transfers(plan: _Plan, blk: _Block, micro: int, waiting: float, out: _Terms) -> None:
    """Offloaded parameters fetched from the host, checkpointed inputs sent there and back."""
    training, hw, dev = plan.scenario.training, plan.scenario.hardware, plan.dev
    busiest = blk.busiest
    if training.offload.parameters != "none":
        bw = (
            dev.host if training.offload.parameters == "cpu" else NVME_GB_S * 1e9 / hw.gpus_per_node
        )
        fetch = 2 * plan.params_rank / plan.mesh.shard * plan.gather_bytes / bw
        # each layer's shard comes over the host link, then is gathered, then computed: a
        # pipeline whose copies hide behind the compute and behind the waits for the
        # gathers, once -- not behind the compute a second time
        hide = busiest["forward"] + busiest["backward"] + waiting
        out.add(
            "parameters from the host",
            "host_transfer",
            micro * max(0.0, fetch - hide),
            micro * fetch,
            "the rank's shard, forward and backward",
        )
    if training.offload.activations == "cpu" and plan.recompute_share:
        h, dt = plan.scenario.model.hidden_size, _act_bytes(training)
        moved = 2 * busiest["n"] * plan.recompute_share * blk.tokens * h * dt / dev.host
        out.add(
            "checkpointed inputs to and from the host",
            "host_transfer",
            micro * max(0.0, moved - blk.mb_compute),
            micro * moved,
            "b s h per checkpointed layer, out and back",
        )


def _summary(
    plan: _Plan, blk: _Block, out: _Terms, tokens_step: int, micro: int, token_budget: int | None
) -> StepTime:
    """The step's time, rates and cost from its terms."""
    mesh, dev, hw = plan.mesh, plan.dev, plan.scenario.hardware
    terms, kinds = out.terms, out.kinds
    step = sum(t.seconds for t in terms)
    world = mesh.world
    model_flops = blk.flops_mb * micro * mesh.dp
    hardware_flops = blk.hw_mb * micro * mesh.dp
    bound = max(BOUNDS, key=lambda k_: kinds[k_])
    tps = tokens_step / step if step else 0.0
    mfu = model_flops / (step * world * dev.peak_flops) if step else 0.0
    price = (
        hw.price_per_gpu_hour if hw.price_per_gpu_hour is not None else hw.gpu.price_per_gpu_hour
    )
    run = hours = cost = None
    if token_budget is not None and tps:
        run = token_budget / tps
        hours = run * world / 3600
        cost = hours * price if price is not None else None
    return StepTime(
        step_time_s=step,
        tokens_per_step=tokens_step,
        tokens_per_s=tps,
        tokens_per_s_per_gpu=tps / world,
        mfu=mfu,
        bound=bound,
        model_flops=model_flops,
        hardware_flops=hardware_flops,
        terms=tuple(terms),
        gpus=world,
        run_time_s=run,
        gpu_hours=hours,
        cost=cost,
        price_per_gpu_hour=price,
        assumptions=plan.assumptions,
    )

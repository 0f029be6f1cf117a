"""The device mesh, data-parallel sharding (ZeRO / FSDP) and offload of the model state.

* :func:`make_mesh` splits the GPUs into tensor (``tp``), pipeline (``pp``) and context
  (``cp``) parallel groups, derives the data-parallel size ``dp = GPUs / (tp pp cp)`` and
  reports every inconsistency as an :class:`~engine.errors.EstimateError`;
* :func:`shard` divides the model state over ``dp`` ranks as ZeRO does (Rajbhandari et al.
  2020, section 5, figure 1): stage 1 partitions the optimizer states, stage 2 also the
  gradients, stage 3 also the parameters, which are all-gathered one unit (a layer) at a
  time for its forward and backward, with the next unit prefetched. PyTorch FSDP's
  ``SHARD_GRAD_OP`` is stage 2 and ``FULL_SHARD`` (FSDP2 ``fully_shard`` per block) stage 3;
* offload (ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity, Rajbhandari et al. 2021) moves the
  optimizer states -- and, since the step then runs on the CPU, the gradient shards -- to
  host memory, and with stage 3 the parameter shards too; the GPU keeps the gathered units.

>>> from engine.presets import load_gpu, load_model
>>> from engine.specs import HardwareSpec, Scenario
>>> s = Scenario(load_model("gpt2"), HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8))
>>> make_mesh(s).dp
8
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

from engine.errors import EstimateError
from engine.model_state import MemoryItem, ModelState
from engine.params import model_tensors
from engine.specs import ModelSpec, Scenario

P = "training.parallelism"


@dataclass(frozen=True, slots=True)
class Mesh:
    world: int
    tp: int
    pp: int
    cp: int
    ep: int
    dp: int


def make_mesh(scenario: Scenario) -> Mesh:
    """The parallel group sizes of ``scenario``; inconsistent sizes are errors."""
    p, m = scenario.training.parallelism, scenario.model
    world = scenario.hardware.world_size
    model_parallel = p.tp * p.pp * p.cp
    if world % model_parallel:
        raise EstimateError(
            P,
            f"tp x pp x cp = {model_parallel} must divide the {world} GPUs (gpus_per_node x nodes)",
        )
    dp = world // model_parallel
    if m.num_attention_heads % p.tp:
        raise EstimateError(
            f"{P}.tp",
            f"got {p.tp}, expected a divisor of the {m.num_attention_heads} attention heads",
        )
    kv = m.num_key_value_heads
    if kv % p.tp and p.tp % kv:
        raise EstimateError(
            f"{P}.tp", f"got {p.tp}, expected a divisor or multiple of the {kv} key/value heads"
        )
    if m.num_layers % p.pp:
        raise EstimateError(
            f"{P}.pp", f"got {p.pp}, expected a divisor of the {m.num_layers} layers"
        )
    if p.ep > 1:
        if not m.is_moe or m.num_experts % p.ep:
            raise EstimateError(
                f"{P}.ep",
                f"got {p.ep}, expected a divisor of the {m.num_experts} experts (MoE models only)",
            )
        if dp % p.ep:
            raise EstimateError(
                f"{P}.ep", f"got {p.ep}, expected a divisor of the data-parallel size {dp}"
            )
    if p.cp > 1 and scenario.training.sequence_length % (2 * p.cp):
        raise EstimateError(
            f"{P}.cp",
            f"got {p.cp}: the sequence length must divide into "
            f"2 x cp chunks (load-balanced ring attention)",
        )
    offload = scenario.training.offload
    if offload.parameters != "none" and p.zero_stage < 3:
        raise EstimateError(
            "training.offload.parameters", f"got {offload.parameters!r}, which needs zero_stage 3"
        )
    if offload.optimizer != "none" and p.zero_stage < 1 and dp > 1:
        raise EstimateError(
            "training.offload.optimizer", f"got {offload.optimizer!r}, which needs zero_stage >= 1"
        )
    return Mesh(world, p.tp, p.pp, p.cp, p.ep, dp)


def tensor_parallel_shard(model: ModelSpec, tp: int) -> ModelSpec:
    """What one tensor-parallel rank holds and computes (Megatron-LM, Shoeybi et al. 2019).

    Attention is split by heads (column-parallel q/k/v, row-parallel output), the MLP by its
    intermediate size, the embedding and LM head by vocabulary (vocab-parallel, so each rank
    holds ``b s V / tp`` logits); norms stay whole. Without sequence parallelism the
    hidden-size activations (residual stream, norm inputs and outputs) are replicated on
    every rank, exactly as the layer simulation of this narrower model keeps them
    (Korthikanti et al. 2022, table 2, "tensor parallel" row). Key/value heads fewer than
    ``tp`` are replicated, one per rank.
    """
    if tp == 1:
        return model
    return replace(
        model,
        name=f"{model.name} (1/{tp} tensor-parallel rank)",
        num_attention_heads=model.num_attention_heads // tp,
        num_key_value_heads=max(1, model.num_key_value_heads // tp),
        intermediate_size=_ceil_div(model.intermediate_size, tp),
        moe_intermediate_size=_ceil_div(model.moe_intermediate_size, tp),
        shared_expert_intermediate_size=_ceil_div(model.shared_expert_intermediate_size, tp),
        vocab_size=_ceil_div(model.vocab_size, tp),
    )


@dataclass(frozen=True, slots=True)
class Sharded:
    """One rank's share of the model state and what it leaves elsewhere."""

    state: ModelState
    #: the share of gradients that stays on this GPU as backward produces them
    grad_share: Fraction
    #: the share of the optimizer's temporaries allocated on this GPU
    optimizer_share: Fraction
    #: bytes of all-gathered parameter units live during forward and backward (stage 3)
    gathered: int
    host: tuple[MemoryItem, ...]
    nvme: tuple[MemoryItem, ...]


def _ceil_div(n: int, d: int) -> int:
    return -(-n // d)


def shard(state: ModelState, scenario: Scenario, mesh: Mesh) -> Sharded:
    """Divide ``state`` over the data-parallel ranks and move what offload moves."""
    training = scenario.training
    stage, dp = training.parallelism.zero_stage, mesh.dp
    offload = training.offload
    items: list[MemoryItem] = []
    host: list[MemoryItem] = []
    nvme: list[MemoryItem] = []

    def place(item: MemoryItem, target: str) -> None:
        if target == "cpu":
            host.append(replace(item, name=item.name + " (offloaded to CPU)"))
        elif target == "nvme":
            nvme.append(replace(item, name=item.name + " (offloaded to NVMe)"))
        else:
            items.append(item)

    for item in state.items:
        sharded = {
            "optimizer_states": stage >= 1,
            "gradients": stage >= 2,
            "parameters": stage >= 3,
        }.get(item.category, False)
        if sharded and dp > 1:
            item = replace(
                item,
                bytes=_ceil_div(item.bytes, dp),
                formula=f"{item.formula} / dp {dp} (ZeRO-{stage})",
            )
        target = "none"
        if item.category == "optimizer_states":
            target = offload.optimizer
        elif item.category == "gradients" and offload.optimizer != "none":
            target = "cpu"  # the optimizer step runs on the host: gradients go there
        elif item.category == "parameters":
            target = offload.parameters
        place(item, target)

    grad_share = Fraction(1, dp) if stage >= 2 else Fraction(1)
    if offload.optimizer != "none":
        grad_share = Fraction(0)
    optimizer_share = Fraction(1, dp) if stage >= 1 else Fraction(1)
    if offload.optimizer != "none":
        optimizer_share = Fraction(0)
    gathered = 0
    if stage >= 3 and (dp > 1 or offload.parameters != "none"):
        # the current layer all-gathered in the compute dtype, and the next one prefetched
        per_layer: dict[tuple[int, int], int] = {}
        for g in model_tensors(scenario.model):
            if g.layers:
                span = g.layers[1] - g.layers[0]
                per_layer[g.layers] = per_layer.get(g.layers, 0) + g.total // span
        gathered = 2 * 2 * max(per_layer.values(), default=0)
    new_state = replace(state, items=tuple(items))
    return Sharded(new_state, grad_share, optimizer_share, gathered, tuple(host), tuple(nvme))

"""The device mesh of a scenario: how its GPUs split into tensor, pipeline, context, expert
and data parallel groups (:class:`Mesh`), refused where the sizes do not divide
(:func:`make_mesh`), and the layers of each pipeline stage (:func:`stage_layers`)."""

from __future__ import annotations

from dataclasses import dataclass

from memfit.engine.errors import EstimateError
from memfit.engine.overhead import Communicator
from memfit.engine.specs import PARALLEL_AXES, WORLD_AXES, Scenario

P = "training.parallelism"


#: each axis's place in :attr:`Mesh.sizes`
_INDEX = {axis.key: i for i, axis in enumerate(PARALLEL_AXES)}


@dataclass(frozen=True, slots=True)
class Mesh:
    """The parallel groups of a scenario: the size of each parallel axis
    (:data:`memfit.engine.specs.PARALLEL_AXES`), the data-parallel size left over, the
    ranks that share one set of ZeRO shards and the virtual pipeline stages."""

    world: int
    #: the size of each axis of :data:`memfit.engine.specs.PARALLEL_AXES`, in its order
    sizes: tuple[int, ...]
    dp: int
    #: ranks that share one set of ZeRO shards (dp, or the ranks of a node: HYBRID_SHARD)
    shard: int = 1
    vpp: int = 1

    def size(self, key: str) -> int:
        """The size of the parallel axis ``key``."""
        return self.sizes[_INDEX[key]]

    @property
    def tp(self) -> int:
        return self.sizes[_INDEX["tp"]]

    @property
    def pp(self) -> int:
        return self.sizes[_INDEX["pp"]]

    @property
    def cp(self) -> int:
        return self.sizes[_INDEX["cp"]]

    @property
    def ep(self) -> int:
        return self.sizes[_INDEX["ep"]]

    @property
    def expert_dp(self) -> int:
        """The data-parallel size of the routed experts: each is replicated
        dp x cp / ep times."""
        return self.dp * self.cp // self.ep

    def as_dict(self) -> dict[str, int]:
        """The JSON form: ``world``, each axis's size by its key, ``dp``, ``shard``,
        ``vpp``."""
        axes = {axis.key: n for axis, n in zip(PARALLEL_AXES, self.sizes, strict=True)}
        return {"world": self.world, **axes, "dp": self.dp, "shard": self.shard, "vpp": self.vpp}

    def communicators(self) -> tuple[Communicator, ...]:
        """The NCCL communicators one rank belongs to: one per process group of more than
        one rank, and a send and a receive pair for an axis that talks point to point
        (the pipeline)."""
        groups = {"data parallel": self.dp}
        pairs = []
        for axis, n in zip(PARALLEL_AXES, self.sizes, strict=True):
            if axis.point_to_point:
                pairs += [axis.group] if n > 1 else []
            else:
                groups[axis.group] = n
        if self.shard not in (1, self.dp, self.dp * self.cp):
            groups["shard (within a node)"] = self.shard
        out = [Communicator(name, n) for name, n in groups.items() if n > 1]
        for group in pairs:  # PyTorch makes one communicator per send/receive pair
            out += [
                Communicator(f"{group} {d}", 2, point_to_point=True) for d in ("send", "receive")
            ]
        return tuple(out)


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def make_mesh(scenario: Scenario) -> Mesh:
    """The parallel group sizes of ``scenario``; inconsistent sizes are errors."""
    p, m, training = scenario.training.parallelism, scenario.model, scenario.training
    hw = scenario.hardware
    world = hw.world_size
    model_parallel = p.model_parallel
    if world % model_parallel:
        raise EstimateError(
            P,
            f"{' x '.join(WORLD_AXES)} = {model_parallel} must divide the {world} GPUs "
            "(gpus_per_node x nodes)",
        )
    dp = world // model_parallel
    for axis in PARALLEL_AXES:
        wrong = axis.check(scenario, p.size(axis.key)) if axis.check else None
        if wrong:
            raise EstimateError(f"{P}.{axis.key}", wrong)
    if p.ep > 1 and training.moe_implementation == "eager":
        raise EstimateError(
            "training.moe_implementation",
            f'got "eager", but transformers\' eager experts loop runs every expert on each rank: '
            f'expected "grouped" under expert parallelism (ep {p.ep}), or ep 1',
        )
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
    if p.pp_split == "even" and m.num_layers % (p.pp * p.vpp):
        raise EstimateError(
            f"{P}.pp" if p.vpp == 1 else f"{P}.vpp",
            f"pp x vpp = {p.pp * p.vpp} must divide the {m.num_layers} layers "
            f"(or choose pp_split balanced)",
        )
    if p.pp * p.vpp > 1 and min(stage_layers(m.num_layers, p.pp * p.vpp, p.pp_split)) < 1:
        raise EstimateError(
            f"{P}.pp" if p.vpp == 1 else f"{P}.vpp",
            f"pp x vpp = {p.pp * p.vpp} stages leave a stage without a layer "
            f"({m.num_layers} layers)",
        )
    if p.vpp > 1 and p.pp == 1:
        raise EstimateError(f"{P}.vpp", f"got {p.vpp}, expected 1 without pipeline parallelism")
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
    seq = training.sequence_length
    if p.cp > 1:
        if seq % (2 * p.cp):
            raise EstimateError(
                f"{P}.cp",
                f"got {p.cp}: the sequence length must divide into "
                f"2 x cp chunks (load-balanced ring attention)",
            )
        if training.attention == "eager":
            raise EstimateError(
                f"{P}.cp", f"got {p.cp}: context parallelism needs a fused attention kernel"
            )
        if m.attention_sinks:  # they train in eager attention only (layers.attention_run)
            raise EstimateError(
                f"{P}.cp",
                f"got {p.cp}: context parallelism needs a fused attention kernel, and "
                f"{m.label}'s attention sinks train in eager attention only",
            )
    if p.sequence_parallel and p.tp > 1 and (seq // p.cp) % p.tp:
        raise EstimateError(
            f"{P}.sequence_parallel",
            f"the sequence length per context rank ({seq // p.cp}) must divide by tp = {p.tp}",
        )
    if p.framework == "deepspeed" and p.pp > 1 and p.zero_stage >= 2:
        raise EstimateError(
            f"{P}.zero_stage",
            f"got {p.zero_stage}, expected 0 or 1: DeepSpeed's pipeline engine "
            "supports ZeRO stages 0 and 1 only",
        )
    # context-parallel ranks hold the same weights (only the sequence is split), so the
    # ZeRO/FSDP shards and the gradient reduction span dp x cp (Megatron's
    # data-parallel-with-context group; torchtitan's dp_shard x cp mesh)
    shard = dp * p.cp
    if p.hybrid_shard:
        if p.zero_stage == 0:
            raise EstimateError(f"{P}.hybrid_shard", "needs zero_stage >= 1 (there is no shard)")
        if hw.gpus_per_node % p.tp:
            raise EstimateError(
                f"{P}.hybrid_shard",
                f"tp = {p.tp} must divide the {hw.gpus_per_node} GPUs of a node",
            )
        shard = _gcd(dp * p.cp, hw.gpus_per_node // p.tp)
    elif p.dp_replicate > 1:  # HSDP: each replica group holds one whole set of shards
        shard = dp * p.cp // p.dp_replicate
    offload = training.offload
    if offload.parameters != "none" and p.zero_stage < 3:
        raise EstimateError(
            "training.offload.parameters", f"got {offload.parameters!r}, which needs zero_stage 3"
        )
    if offload.optimizer != "none" and p.zero_stage < 1 and dp > 1:
        raise EstimateError(
            "training.offload.optimizer", f"got {offload.optimizer!r}, which needs zero_stage >= 1"
        )
    if offload.activations != "none" and training.activation_checkpointing in ("none", "selective"):
        raise EstimateError(
            "training.offload.activations",
            "offloads the inputs of checkpointed layers: needs activation_checkpointing "
            "full or every-k-layers",
        )
    return Mesh(world, tuple(p.size(a.key) for a in PARALLEL_AXES), dp, shard, p.vpp)


def stage_layers(layers: int, stages: int, split: str = "even") -> list[int]:
    """Transformer layers of each (virtual) pipeline stage, in order.

    ``even`` gives every stage ``layers / stages``. ``balanced`` counts the embedding and
    the LM head as one layer each, gives every stage ``(layers + 2) // stages`` of these
    units and the remainder one each to the first stages; the first stage then holds one
    layer less (the embedding) and the last one less (the head). This is how torchtitan
    splits a model by default (``generate_llm_fqn_per_model_part``).
    """
    if stages == 1:
        return [layers]
    if split == "even":
        return [layers // stages] * stages
    base, extra = divmod(layers + 2, stages)
    units = [base + (k < extra) for k in range(stages)]
    units[0] -= 1
    units[-1] -= 1
    out, left = [], layers
    for u in units:
        take = max(0, min(u, left))
        out.append(take)
        left -= take
    return out

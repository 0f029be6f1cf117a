"""The distinct groups of ranks of a plan: what one rank holds and which stage it plays.

A rank holds its tensor- and expert-parallel shard of the model (:func:`rank_model`); under
pipeline parallelism each stage holds its layers, the first the embedding and the last the
head (:func:`layout`, split as :func:`memfit.engine.plan.mesh.stage_layers` splits them). Stages
of the same shape share one :class:`RankSlot` key, so memory plays each shape once; the
step time reads the layers each stage holds from the same slots.

>>> from memfit.engine.plan import resolve
>>> from memfit.engine.presets import load_gpu, load_model
>>> from memfit.engine.specs import HardwareSpec, ParallelismSpec, Scenario, TrainingSpec
>>> four = HardwareSpec(load_gpu("h100-sxm-80gb"), 4)
>>> pp = TrainingSpec(parallelism=ParallelismSpec(pp=4))
>>> plan = resolve(Scenario(load_model("llama-3-8b"), four, pp))
>>> [(s.model.num_layers, s.part) for s in plan.ranks()]
[(8, 'first'), (8, 'middle'), (8, 'middle'), (8, 'last')]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from memfit.engine import memo
from memfit.engine.plan.mesh import Mesh, stage_layers
from memfit.engine.sharding import tensor_parallel_shard
from memfit.engine.specs import ModelSpec
from memfit.engine.timeline import Stage


@dataclass(frozen=True, slots=True)
class RankSlot:
    """One pipeline stage, whatever the shape: its name, the key of its shape (layers,
    dense layers, layers of its largest virtual stage, part), what it holds and plays."""

    name: str
    key: tuple[int, int, int, str]
    stage: Stage
    model: ModelSpec
    #: interleaved pipeline: the largest virtual stage, whose activations are played
    chunk: ModelSpec | None

    @property
    def part(self) -> str:
        """``all``, or the stage's part of the model: ``first``, ``middle``, ``last``."""
        return self.key[3]


@memo.cached(maxsize=512)
def rank_model(model: ModelSpec, tp: int, ep: int) -> ModelSpec:
    """What one tensor- and expert-parallel rank holds
    (:func:`memfit.engine.sharding.tensor_parallel_shard`)."""
    return tensor_parallel_shard(model, tp, ep)


@memo.cached(maxsize=256)
def layout(model: ModelSpec, mesh: Mesh, split: str) -> tuple[RankSlot, ...]:
    """Every pipeline stage of ``model`` (a rank's shard) in order; one when pp = 1."""
    tp = "any tp rank" if mesh.tp > 1 else ""
    if mesh.ep > 1:
        tp = "any tp/ep rank" if mesh.tp > 1 else "any ep rank"
    if mesh.pp == 1:
        name = "all ranks" + (f" ({tp})" if tp else "")
        return (RankSlot(name, (model.num_layers, 0, 0, "all"), Stage(), model, None),)
    counts = stage_layers(model.num_layers, mesh.pp * mesh.vpp, split)
    starts = [sum(counts[:c]) for c in range(len(counts))]
    models: dict[tuple[int, int, int, str], tuple[ModelSpec, ModelSpec | None]] = {}
    out = []
    for s in range(mesh.pp):
        # rank s runs virtual stages s, s + pp, s + 2 pp, ... (the interleaved layout)
        chunks = [s + k * mesh.pp for k in range(mesh.vpp)]
        sizes = [counts[c] for c in chunks]
        dense = sum(min(counts[c], max(0, model.first_dense_layers - starts[c])) for c in chunks)
        part = "first" if s == 0 else "last" if s == mesh.pp - 1 else "middle"
        key = (sum(sizes), dense, max(sizes) if mesh.vpp > 1 else 0, part)
        if key not in models:
            stage_model = dataclasses.replace(model, num_layers=key[0], first_dense_layers=dense)
            chunk = None
            if mesh.vpp > 1:
                chunk = dataclasses.replace(
                    stage_model, num_layers=key[2], first_dense_layers=min(dense, key[2])
                )
            models[key] = (stage_model, chunk)
        name = f"pp stage {s}" + (f", {tp}" if tp else "")
        one = Stage(first=s == 0, last=s == mesh.pp - 1, inflight=1)
        out.append(RankSlot(name, key, one, *models[key]))
    return tuple(out)

"""Resolve a scenario once: ``resolve(scenario) -> Plan``, what every answer starts from.

A scenario says what the user asked for; the plan says what runs: the model as the
training stack builds it (:func:`memfit.engine.stacks.built`), the stack's conventions resolved
against the fields (:func:`memfit.engine.stacks.conventions`), one precision value
(:func:`memfit.engine.plan.precision.precision_of`) and the device mesh
(:func:`memfit.engine.plan.mesh.make_mesh`, which refuses sizes that do not divide). Memory
(:mod:`memfit.engine.estimate`, :mod:`memfit.engine.batch`), time (:mod:`memfit.engine.steptime`),
the changes
(:mod:`memfit.engine.changes`) and the app read these from the plan instead of deriving them again.

A plan compares by identity: :func:`resolve` returns the same object for equal scenarios
while it holds it, so caches below it key on the plan without hashing a scenario again.

>>> from memfit.engine.presets import load_gpu, load_model
>>> from memfit.engine.specs import HardwareSpec, Scenario
>>> two = HardwareSpec(load_gpu("rtx-4090"), gpus_per_node=2)
>>> plan = resolve(Scenario(load_model("gpt2"), two))
>>> (plan.mesh.dp, plan.precision.mode, plan.conventions.outputs_held)
(2, 'amp', False)
>>> plan is resolve(plan.given)
True
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.engine import memo
from memfit.engine.errors import EstimateError, shown
from memfit.engine.plan.mesh import Mesh, make_mesh
from memfit.engine.plan.precision import Precision, precision_of
from memfit.engine.plan.ranks import RankSlot, layout, rank_model
from memfit.engine.specs import ModelSpec, Scenario
from memfit.engine.stacks import Conventions, built, conventions


@dataclass(frozen=True, slots=True, eq=False)
class Plan:
    """One scenario resolved: see the module docstring."""

    #: the scenario as given
    given: Scenario
    #: the scenario with its model as the stack builds it
    scenario: Scenario
    conventions: Conventions
    precision: Precision
    mesh: Mesh

    def rank_model(self) -> ModelSpec:
        """What one tensor- and expert-parallel rank holds of the model as built."""
        return rank_model(self.scenario.model, self.mesh.tp, self.mesh.ep)

    def ranks(self) -> tuple[RankSlot, ...]:
        """The distinct groups of ranks: each pipeline stage with what it holds and plays
        (:func:`memfit.engine.plan.ranks.layout`); raises the model's error where the tensor or
        expert split does not hold."""
        split = self.scenario.training.parallelism.pp_split
        return layout(self.rank_model(), self.mesh, split)


@memo.cached(maxsize=4096)
def resolve(scenario: Scenario) -> Plan:
    """The plan of ``scenario`` (raises the :class:`~memfit.engine.errors.EstimateError` of a mesh
    that does not divide)."""
    run = built(scenario)
    training = run.training
    arch = scenario.hardware.gpu.architecture
    if training.precision == "fp8-mixed" and training.fp8_recipe == "mxfp8" and arch != "blackwell":
        raise EstimateError(
            "training.fp8_recipe",
            f"mxfp8 needs Blackwell's block-scaled tensor cores; {shown(arch)} has none: "
            "expected tensorwise, rowwise or blockwise",
        )
    return Plan(scenario, run, conventions(training), precision_of(training), make_mesh(run))

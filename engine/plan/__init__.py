"""The plan of a scenario, resolved once: :func:`resolve` gives the frozen :class:`Plan`
(the model as the stack builds it, the conventions, one :class:`Precision`, the
:class:`Mesh`); :mod:`memfit.engine.plan.precision` decides the bytes of each tensor class,
:mod:`memfit.engine.plan.mesh` the parallel groups, :mod:`memfit.engine.plan.ranks` the distinct
groups
of ranks (each pipeline stage and what a rank holds). Memory, time and the app start from
it."""

from memfit.engine.plan.mesh import Mesh, make_mesh, stage_layers
from memfit.engine.plan.precision import Precision, compute_mode, precision_of
from memfit.engine.plan.ranks import RankSlot
from memfit.engine.plan.resolve import Plan, resolve

__all__ = [
    "Mesh",
    "Plan",
    "Precision",
    "RankSlot",
    "compute_mode",
    "make_mesh",
    "precision_of",
    "resolve",
    "stage_layers",
]

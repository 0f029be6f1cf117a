"""The step's timeline: its points (:class:`Point`, bytes per category at a moment of the
step) and :class:`Timeline`, which holds the highest and, when asked, every point."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from memfit.engine.timeline.sources import Source, _in_flight_source

CATS = ("parameters", "gradients", "optimizer_states", "activations", "overhead")


@dataclass(frozen=True, slots=True)
class Point:
    """The live bytes by category at one moment of the step."""

    phase: str  # before | forward | backward | optimizer
    layer: int | None
    label: str
    parameters: int
    gradients: int
    optimizer_states: int
    activations: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_states + self.activations


def _total(point: Point) -> int:
    return point.total


def _raised(point: Point, extra: int) -> Point:
    """``point`` with ``extra`` more activations."""
    return Point(
        point.phase,
        point.layer,
        point.label,
        point.parameters,
        point.gradients,
        point.optimizer_states,
        point.activations + extra,
    )


def _shifted(timeline: Timeline, extra: int) -> tuple[Point, ...]:
    """The points of ``timeline``, every forward and backward one ``extra`` higher."""
    return tuple(
        _raised(p, extra) if p.phase in ("forward", "backward") else p for p in timeline.points
    )


@dataclass(frozen=True, slots=True, eq=False)
class Timeline:
    """A played step: its peak, the parts of the breakdown named at the peak, and every
    point of the step, played when first asked for (:attr:`points`)."""

    #: the highest point of the step
    peak: Point
    #: named parts of the breakdown at the peak beyond the model state
    autocast_copies: int
    logits: int
    optimizer_temp: int
    #: the model-state parameters, the optimizer's temporaries, and what each further
    #: micro-batch in flight (a pipeline stage's earlier ones) adds to every forward and
    #: backward point: what one micro-batch keeps at the end of its forward
    params: int
    temp: int
    per_microbatch: int
    #: the candidates for the peak however many micro-batches are in flight: the point
    #: before the step, the highest of forward and backward, the optimizer step and the
    #: point after ``zero_grad``
    moments: tuple[Point, Point, Point, Point]
    #: plays every point of the step (:func:`_layer_by_layer`)
    replay: Callable[[], tuple[Point, ...]] = field(repr=False)
    _played: list[tuple[Point, ...]] = field(default_factory=list, repr=False)
    #: tells every point's activations apart by source (:func:`step_sources`)
    explain: Callable[[], tuple[tuple[Source, ...], ...]] | None = field(default=None, repr=False)
    _explained: list[tuple[tuple[Source, ...], ...]] = field(default_factory=list, repr=False)

    def sources(self) -> tuple[tuple[Source, ...], ...]:
        """Each point's activations by source, in the order of :attr:`points`: played on
        the first call, then kept."""
        if self.explain is None:
            raise ValueError("this timeline was played without its sources")
        if not self._explained:
            self._explained.append(self.explain())
        return self._explained[0]

    @property
    def peak_index(self) -> int:
        """Where the peak is among :attr:`points`: the first of equal highest points."""
        return self.points.index(self.peak)

    def peak_sources(self) -> tuple[Source, ...]:
        """The activations at the peak by source: they add up to ``peak.activations``."""
        return self.sources()[self.peak_index]

    @property
    def points(self) -> tuple[Point, ...]:
        """Every moment of the step, in order: played on the first call, then kept."""
        if not self._played:
            self._played.append(self.replay())
        return self._played[0]

    def _key(self) -> tuple[object, ...]:
        return (
            self.peak,
            self.autocast_copies,
            self.logits,
            self.optimizer_temp,
            self.params,
            self.temp,
            self.per_microbatch,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Timeline):
            return NotImplemented
        return self._key() == other._key() and self.points == other.points

    def __hash__(self) -> int:
        return hash(self._key())

    def in_flight(self, extra: int) -> Timeline:
        """The same step with ``extra`` more micro-batches in flight: a pipeline stage's
        timeline for every schedule position from one play of it."""
        if extra == 0:
            return self
        add = extra * self.per_microbatch
        before, top, step, after = self.moments
        moments = (before, _raised(top, add), step, after)
        peak = max(moments, key=_total)
        return Timeline(
            peak,
            peak.parameters - self.params,
            self.logits,
            self.temp if peak.phase == "optimizer" else 0,
            self.params,
            self.temp,
            self.per_microbatch,
            moments,
            partial(_shifted, self, add),
            explain=partial(_shifted_sources, self, add),
        )


def _shifted_sources(timeline: Timeline, extra: int) -> tuple[tuple[Source, ...], ...]:
    """The sources of :meth:`Timeline.in_flight`'s points."""
    return tuple(
        (*parts, _in_flight_source(extra)) if p.phase in ("forward", "backward") else parts
        for p, parts in zip(timeline.points, timeline.sources(), strict=True)
    )

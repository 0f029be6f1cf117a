"""The published throughput measurements (``throughput.json``) recomputed by the
step-time model: shared by the validation test and ``benchmarks/throughput.py``."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from memfit.engine.scenario_io import scenario_from_dict
from memfit.engine.specs import Scenario
from memfit.engine.steptime import step_time

DATA = Path(__file__).resolve().parent / "throughput.json"
#: pairs whose measured throughputs differ by less than this are within the run-to-run
#: noise of the published tables (repeated rows of one table differ by up to 2-3 %):
#: their order is not a measurement
ORDER_NOISE = 0.03
#: the families of runs the accuracy tables break out, each with its test on a scenario
FAMILIES = (
    ("MoE", lambda s: s.model.is_moe),
    ("FP8", lambda s: s.training.precision == "fp8-mixed"),
    ("long sequence (>= 8k)", lambda s: s.training.sequence_length >= 8192),
    ("TP >= 4", lambda s: s.training.parallelism.tp >= 4),
    ("multi-node", lambda s: s.hardware.nodes > 1),
)


def families(scenario: Scenario) -> tuple[str, ...]:
    """The names of the :data:`FAMILIES` ``scenario`` belongs to."""
    return tuple(name for name, test in FAMILIES if test(scenario))


@dataclass(frozen=True)
class Case:
    id: str
    source: str
    measured: float  # tokens/s per GPU
    estimated: float
    bound: str
    gpus: int
    families: tuple[str, ...] = ()

    @property
    def error(self) -> float:
        return (self.estimated - self.measured) / self.measured


def load() -> list[dict]:
    return json.loads(DATA.read_text(encoding="utf-8"))["cases"]


def cases() -> list[Case]:
    out = []
    for c in load():
        s = scenario_from_dict(c["scenario"])
        t = step_time(s)
        out.append(
            Case(c["id"], c["source"], c["tokens_per_s_per_gpu"], t.tokens_per_s_per_gpu,
                 t.bound, s.hardware.world_size, families(s))
        )  # fmt: skip
    return out


def pairs(results: list[Case]) -> list[tuple[Case, Case, str, bool]]:
    """Every recorded pair once: (a, b, what differs, ordered as measured), leaving out
    the pairs within :data:`ORDER_NOISE` of each other."""
    by_id = {c.id: c for c in results}
    out = []
    for c in load():
        for other, what in c.get("differs_in", {}).items():
            if c["id"] >= other:
                continue
            a, b = by_id[c["id"]], by_id[other]
            if abs(a.measured - b.measured) / max(a.measured, b.measured) < ORDER_NOISE:
                continue
            ordered = (a.estimated - b.estimated) * (a.measured - b.measured) > 0
            out.append((a, b, what, ordered))
    return out


def median_error(results: list[Case]) -> float:
    return statistics.median(abs(c.error) for c in results)

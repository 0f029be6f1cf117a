"""Two or more scenarios side by side: the settings that differ, memory per category, the
totals, the step time, tokens/s and the cost.

A design doc weighs a handful of runs at once -- the run as planned, the pinned baseline,
a saved alternative. :func:`compare` estimates each and lines them up; :func:`table` gives
the rows (a section, an item and one cell per scenario) that the CSV, the Markdown table
and the app's Compare window all show, so that each says the same thing.

>>> from memfit.engine.presets import load_gpu, load_model
>>> from memfit.engine.specs import HardwareSpec, Scenario, TrainingSpec
>>> a = Scenario(load_model("gpt2"), HardwareSpec(load_gpu("l4")), TrainingSpec())
>>> b = Scenario(load_model("gpt2"), HardwareSpec(load_gpu("l4")),
...              TrainingSpec(activation_checkpointing="full"))
>>> c = compare([("plain", a), ("checkpointed", b)])
>>> c.differing
(('training.activation_checkpointing', ('none', 'full')),)
>>> c.estimates[1].device_bytes < c.estimates[0].device_bytes
True
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memfit.engine.estimate import GIB, Estimate, estimate
from memfit.engine.model_state import CATEGORIES
from memfit.engine.scenario_io import scenario_to_dict
from memfit.engine.specs import Scenario

#: a scenario's settings that say only where it was read from, not what it runs
_NOT_SETTINGS = ("memfit_scenario",)


def settings(scenario: Scenario) -> dict[str, Any]:
    """The scenario's settings as dotted paths (``training.parallelism.zero_stage``) to
    values, as its file writes them (:func:`memfit.engine.scenario_io.scenario_to_dict`)."""

    def flatten(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
        if isinstance(value, Mapping):
            for key, inner in value.items():
                yield from flatten(f"{prefix}.{key}" if prefix else str(key), inner)
        else:
            yield prefix, value

    data = {k: v for k, v in scenario_to_dict(scenario).items() if k not in _NOT_SETTINGS}
    return dict(flatten("", data))


@dataclass(frozen=True, slots=True)
class Compared:
    """Scenarios by name, their estimates, and each setting that differs among them with
    its value in each (``None`` where a scenario does not state it)."""

    names: tuple[str, ...]
    estimates: tuple[Estimate, ...]
    differing: tuple[tuple[str, tuple[Any, ...]], ...]


def compare(named: Sequence[tuple[str, Scenario]]) -> Compared:
    """Estimate each of ``named`` (name, scenario) and find the settings that differ; an
    :class:`memfit.engine.errors.EstimateError` names the first scenario the engine rejects."""
    if len(named) < 2:
        raise ValueError("compare needs two scenarios or more")
    estimates = tuple(estimate(s) for _, s in named)
    each = [settings(s) for _, s in named]
    keys = list(dict.fromkeys(k for s in each for k in s))
    differing = tuple(
        (k, tuple(s.get(k) for s in each)) for k in keys if len({repr(s.get(k)) for s in each}) > 1
    )
    return Compared(tuple(name for name, _ in named), estimates, differing)


def _gib(n: int | None) -> str:
    return "" if n is None else f"{n / GIB:.3f}"


def _value(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, list | tuple):
        return ", ".join(str(x) for x in v)
    return str(v)


#: one row of :func:`table`: a section, an item, one cell per scenario
Row = tuple[str, str, tuple[str, ...]]


def table(c: Compared) -> list[Row]:
    """The comparison's rows: the settings that differ; memory per GPU by category and the
    allocated, reserved and device totals (GiB, 2^30 bytes), the budget and the verdict;
    the step time, tokens/s (all GPUs and per GPU) and MFU; the run's time, GPU-hours
    and cost where a token budget (and a price) are known."""
    rows: list[Row] = [
        ("setting", k, tuple(_value(v) for v in values)) for k, values in c.differing
    ]
    ests = c.estimates
    rows += [
        ("memory (GiB per GPU)", cat.replace("_", " "), tuple(_gib(e.breakdown[cat]) for e in ests))
        for cat in CATEGORIES
    ]
    for name in ("allocated", "reserved", "device", "budget"):
        rows.append(
            ("total (GiB per GPU)", name, tuple(_gib(getattr(e, f"{name}_bytes")) for e in ests))
        )
    rows.append(("total (GiB per GPU)", "verdict", tuple(e.verdict for e in ests)))
    rows += [
        ("time", "step time (s)", tuple(f"{e.time.step_time_s:.4g}" for e in ests)),
        ("time", "tokens/s", tuple(f"{e.time.tokens_per_s:.0f}" for e in ests)),
        ("time", "tokens/s per GPU", tuple(f"{e.time.tokens_per_s_per_gpu:.0f}" for e in ests)),
        ("time", "MFU (%)", tuple(f"{e.time.mfu * 100:.1f}" for e in ests)),
        ("time", "bound", tuple(e.time.bound for e in ests)),
    ]
    if any(e.time.run_time_s is not None for e in ests):

        def opt(v: float | None, fmt: str) -> str:
            return "" if v is None else format(v, fmt)

        rows += [
            (
                "run",
                "run time (h)",
                tuple(opt(e.time.run_time_s and e.time.run_time_s / 3600, ".1f") for e in ests),
            ),
            ("run", "GPU-hours", tuple(opt(e.time.gpu_hours, ".0f") for e in ests)),
            ("run", "cost", tuple(opt(e.time.cost, ".0f") for e in ests)),
        ]
    return rows


def to_csv(c: Compared) -> str:
    """:func:`table` as CSV: ``section,item`` and a column per scenario."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["section", "item", *c.names])
    for section, item, cells in table(c):
        writer.writerow([section, item, *cells])
    return buffer.getvalue()


def to_markdown(c: Compared) -> str:
    """:func:`table` as a Markdown table, for a design doc."""
    names = [n.replace("|", "\\|") for n in c.names]
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    section = ""
    for sec, item, cells in table(c):
        if sec != section:
            lines.append(f"| **{sec}** |" + " |" * len(names))
            section = sec
        lines.append(f"| {item} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\nGiB = 2^30 bytes.\n"

"""The golden set: the engine's answers to a fixed set of scenarios, recorded once so that
a change meant to keep every answer can be shown to keep them to the byte.

``benchmarks/golden.py record`` writes the set, ``benchmarks/golden.py compare`` checks
all of it and ``tests/engine/test_golden.py`` an evenly spread part on every run. Inside:

* :func:`preset_scenarios` -- every model preset on one H100 with the default training,
  with LoRA, and with ZeRO-3 on 8 GPUs;
* :func:`draw` -- one random scenario dict over every preset, GPU and training setting
  (the pools of ``tests/engine/invariants.py``), from a :class:`random.Random`: the same
  seed draws the same scenarios;
* :func:`answers` -- what the engine answers for one scenario dict: every item and total
  of ``estimate()``, every rank group, the timeline's highest point, the step time with
  every term and, when asked, the batched totals and step times at a few shapes -- or the
  field and message of the :class:`~memfit.engine.errors.EstimateError` that refuses it;
* :func:`record`, :func:`dump` and :func:`load` -- the set as deterministic gzip-compressed
  JSON (sorted keys, no time stamp): the same code records the same bytes;
* :func:`compare` -- every difference between the recorded answers and today's, and
  :func:`report` -- those differences in words, grouped by field.

Each scenario is kept as its scenario dict (:func:`memfit.engine.scenario_io.scenario_to_dict`),
so the set does not depend on the drawer staying the same. Floats are kept as their
``repr``, which reads back to the same float (``-0.0`` and ``nan`` included).

>>> data = preset_scenarios()[0][1]
>>> answers(data)["estimate"]["peak_phase"]
'backward'
>>> compare({"scenarios": [{"kind": "preset", "scenario": data,
...                         "answer": answers(data)}]})
[]
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import random
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from memfit.engine import specs
from memfit.engine.batch import Totals, totals_over
from memfit.engine.errors import EstimateError
from memfit.engine.estimate import Estimate, estimate
from memfit.engine.presets import gpu_names, model_names
from memfit.engine.scenario_io import scenario_from_dict, scenario_to_dict
from memfit.engine.specs import Scenario
from memfit.engine.steptime import StepTime, step_time, step_times

FORMAT = 1
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "golden.json.gz"
#: every how many-th estimated random scenario also records its batched answers
BATCH_EVERY = 10

#: the value pools of ``tests/engine/invariants.py``'s ``scenarios`` (repeats weight a value)
TP, PP, CP, EP = (1, 1, 2, 4, 8), (1, 1, 2, 4), (1, 1, 2), (1, 1, 2, 8)
SCHEDULES = tuple((s, 2 if s.startswith("interleaved") else 1) for s in specs.PP_SCHEDULES)
GPUS_PER_NODE, NODES = (1, 1, 2, 8), (1, 1, 2)
SEQUENCES = (1, 7, 64, 512, 1000, 2048, 8192)
CHECKPOINTING = ("none", "selective", "full", "every-k-layers", "first-k-layers", "per-op")
LORA_RANKS = (1, 8, 64)
LORA_TARGETS = (("q_proj", "v_proj"), ("all-linear",))
TRAINABLE = (("lm_head",), ("norms", "mlp"))


def draw(rng: random.Random) -> dict[str, Any]:
    """One scenario dict drawn with ``rng``: a preset, a GPU, every training setting and,
    half the time, a parallel layout."""
    parallelism: dict[str, Any] = {}
    if rng.random() < 0.5:
        schedule, vpp = rng.choice(SCHEDULES)
        parallelism = {
            "tp": rng.choice(TP),
            "pp": rng.choice(PP),
            "cp": rng.choice(CP),
            "ep": rng.choice(EP),
            "zero_stage": rng.randint(0, 3),
            "framework": rng.choice(specs.FRAMEWORKS),
            "pp_schedule": schedule,
            "vpp": vpp,
            "sequence_parallel": rng.random() < 0.5,
            "expert_capacity_factor": rng.choice((1.0, 1.25)),
            "pp_split": rng.choice(("even", "balanced")),
        }
    return {
        "memfit_scenario": 1,
        "model": {"preset": rng.choice(model_names())},
        "hardware": {
            "gpu": rng.choice(gpu_names()),
            "gpus_per_node": rng.choice(GPUS_PER_NODE),
            "nodes": rng.choice(NODES),
        },
        "training": {
            "method": rng.choice(specs.METHODS),
            "precision": rng.choice(specs.PRECISIONS),
            "optimizer": rng.choice(specs.OPTIMIZERS),
            "optimizer_impl": rng.choice(specs.OPTIMIZER_IMPLS),
            "micro_batch_size": rng.randint(1, 8),
            "sequence_length": rng.choice(SEQUENCES),
            "gradient_accumulation_steps": rng.randint(1, 8),
            "activation_checkpointing": rng.choice(CHECKPOINTING),
            "checkpoint_every_k": rng.randint(1, 4),
            "attention": rng.choice(specs.ATTENTION_KERNELS),
            "loss": rng.choice(specs.LOSSES),
            "stack": rng.choice(specs.STACKS),
            "frozen_weights_dtype": rng.choice(specs.FROZEN_DTYPES),
            "lora": {
                "rank": rng.choice(LORA_RANKS),
                "targets": list(rng.choice(LORA_TARGETS)),
                "dropout": rng.choice((0.0, 0.05)),
            },
            "freeze": {"trainable": list(rng.choice(TRAINABLE))},
            "parallelism": parallelism,
        },
    }


def preset_scenarios() -> list[tuple[str, dict[str, Any]]]:
    """(kind, scenario dict) for every model preset: the default training on one H100,
    LoRA on one H100, and ZeRO-3 with DeepSpeed on 8 H100s."""
    out: list[tuple[str, dict[str, Any]]] = []
    for name in model_names():
        base = {"memfit_scenario": 1, "model": {"preset": name}}
        one = {"gpu": "h100-sxm-80gb"}
        eight = {"gpu": "h100-sxm-80gb", "gpus_per_node": 8}
        zero3 = {"parallelism": {"zero_stage": 3, "framework": "deepspeed"}}
        out.append(("preset", {**base, "hardware": one}))
        out.append(("preset-lora", {**base, "hardware": one, "training": {"method": "lora"}}))
        out.append(("preset-zero3", {**base, "hardware": eight, "training": zero3}))
    return out


def _plain(value: Any) -> Any:
    """``value`` as JSON keeps it exactly: floats as their ``repr``, tuples as lists."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _refusal(error: EstimateError) -> dict[str, str]:
    return {"field": error.field, "message": str(error)}


def _items(items: Iterable[Any]) -> list[dict[str, Any]]:
    return [{"name": i.name, "category": i.category, "bytes": i.bytes} for i in items]


def _estimate(est: Estimate) -> dict[str, Any]:
    return {
        "items": _items(est.items),
        "allocated_bytes": est.allocated_bytes,
        "reserved_bytes": est.reserved_bytes,
        "device_bytes": est.device_bytes,
        "capacity_bytes": est.capacity_bytes,
        "budget_bytes": est.budget_bytes,
        "verdict": est.verdict,
        "peak_phase": est.peak_phase,
        "peak_layer": est.peak_layer,
        "total_params": est.total_params,
        "trainable_params": est.trainable_params,
        "host_bytes": est.host_bytes,
        "nvme_bytes": est.nvme_bytes,
        "host_items": _items(est.host_items),
        "host_node_bytes": est.host_node_bytes,
        "worst_group": est.worst_group,
    }


def _rank_groups(est: Estimate) -> list[dict[str, Any]]:
    """Every rank group's totals; its items only where they are not the headline's."""
    return [
        {
            "group": g.group,
            "allocated_bytes": g.allocated_bytes,
            "reserved_bytes": g.reserved_bytes,
            "device_bytes": g.device_bytes,
            "peak_phase": g.peak_phase,
            "peak_layer": g.peak_layer,
            "host_bytes": g.host_bytes,
            "nvme_bytes": g.nvme_bytes,
            "items": "headline" if g.items == est.items else _items(g.items),
        }
        for g in est.rank_groups
    ]


def _timeline_peak(est: Estimate) -> dict[str, Any] | None:
    """The timeline's highest point (the first of equal ones), where it is and how many
    points the step has."""
    points = est.timeline
    if not points:
        return None
    index = max(range(len(points)), key=lambda i: (points[i].total, -i))
    p = points[index]
    return {
        "index": index,
        "points": len(points),
        "phase": p.phase,
        "layer": p.layer,
        "label": p.label,
        "parameters": p.parameters,
        "gradients": p.gradients,
        "optimizer_states": p.optimizer_states,
        "activations": p.activations,
        "total": p.total,
    }


def _time(t: StepTime) -> dict[str, Any]:
    out = t._asdict()
    out["terms"] = [term._asdict() for term in t.terms]
    return out


def shapes_of(scenario: Scenario) -> list[tuple[int, int, int]]:
    """The shapes the batched answers are recorded at: micro-batch 1, 2, 4 and 8 at the
    scenario's length and accumulation, twice its length, one more accumulation step."""
    t = scenario.training
    b, s, a = t.micro_batch_size, t.sequence_length, t.gradient_accumulation_steps
    return [(1, s, a), (2, s, a), (4, s, a), (8, s, a), (b, 2 * s, a), (b, s, a + 1)]


def _totals_of(t: Totals) -> dict[str, Any]:
    return {f.name: getattr(t, f.name) for f in dataclasses.fields(t)}


def _batch(scenario: Scenario) -> dict[str, Any]:
    shapes = shapes_of(scenario)
    found = totals_over(scenario, shapes)
    totals = [_refusal(t) if isinstance(t, EstimateError) else _totals_of(t) for t in found]
    try:
        times: Any = [_time(t) for t in step_times(scenario, shapes)]
    except EstimateError as error:
        times = _refusal(error)
    return {"shapes": [list(s) for s in shapes], "totals": totals, "step_times": times}


def answers(data: dict[str, Any], batch: bool = False) -> dict[str, Any]:
    """The engine's answers for the scenario dict ``data`` (JSON-ready, floats as their
    ``repr``): ``{"refused": {field, message}}``, or the estimate, the rank groups, the
    timeline's peak, the step time (or its refusal) and, with ``batch``, the batched
    totals and step times at :func:`shapes_of`."""
    try:
        scenario = scenario_from_dict(data)
        est = estimate(scenario)
    except EstimateError as error:
        return {"refused": _refusal(error)}
    out: dict[str, Any] = {
        "estimate": _estimate(est),
        "rank_groups": _rank_groups(est),
        "timeline_peak": _timeline_peak(est),
    }
    try:
        out["time"] = _time(step_time(scenario))
    except EstimateError as error:
        out["time"] = {"refused": _refusal(error)}
    if batch:
        out["batch"] = _batch(scenario)
    plain: dict[str, Any] = _plain(out)
    return plain


def stored(data: dict[str, Any]) -> dict[str, Any]:
    """The scenario dict the set keeps for ``data``, as JSON reads it back: its
    :func:`scenario_to_dict` form when it reads, else ``data`` as drawn."""
    try:
        kept = scenario_to_dict(scenario_from_dict(data))
    except EstimateError:
        kept = data
    read_back: dict[str, Any] = json.loads(json.dumps(kept))
    return read_back


class Recorded(NamedTuple):
    """A recorded set, how many random scenarios were drawn for it and how many of those
    the engine refused."""

    golden: dict[str, Any]
    drawn: int
    refused: int


def record(random_count: int, seed: int) -> Recorded:
    """Every preset scenario and ``random_count`` random ones that estimate (drawn from
    ``seed``; the refused draws on the way are kept too), with their answers."""
    entries: list[dict[str, Any]] = []
    for kind, data in preset_scenarios():
        entries.append(_entry(kind, data, batch=False))
    rng = random.Random(seed)
    estimated = drawn = refused = 0
    while estimated < random_count:
        drawn += 1
        entry = _entry("random", draw(rng), batch=estimated % BATCH_EVERY == 0)
        if "refused" in entry["answer"]:
            refused += 1
        else:
            estimated += 1
        entries.append(entry)
    golden = {"format": FORMAT, "seed": seed, "random": random_count, "scenarios": entries}
    return Recorded(golden, drawn, refused)


def _entry(kind: str, data: dict[str, Any], batch: bool) -> dict[str, Any]:
    scenario = stored(data)
    return {"kind": kind, "scenario": scenario, "answer": answers(scenario, batch)}


def dump(golden: dict[str, Any]) -> bytes:
    """``golden`` as gzip-compressed JSON, the same bytes for the same answers."""
    text = json.dumps(golden, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return gzip.compress(text.encode(), compresslevel=9, mtime=0)


def load(path: Path = GOLDEN) -> dict[str, Any]:
    """The set :func:`dump` wrote to ``path``."""
    data: dict[str, Any] = json.loads(gzip.decompress(path.read_bytes()))
    if data.get("format") != FORMAT:
        raise ValueError(f"{path}: format {data.get('format')!r}, expected {FORMAT}")
    return data


class _Absent:
    """What a field that one side lacks compares as: equal to nothing else."""

    def __repr__(self) -> str:
        return "(absent)"


ABSENT: Any = _Absent()


class Difference(NamedTuple):
    """One answer that changed: which scenario (its index in the set), the field (its
    path, list indices included) and the old and new values (:data:`ABSENT` where a side
    lacks the field)."""

    scenario: int
    field: str
    old: Any
    new: Any

    @property
    def kind(self) -> str:
        """The field without list indices, to group differences by."""
        out, depth = [], 0
        for ch in self.field:
            depth += ch == "["
            if depth == 0 or ch in "[]":
                out.append(ch)
            depth -= ch == "]"
        return "".join(out)


def _flat(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for k in sorted(value):
            yield from _flat(value[k], f"{path}.{k}" if path else k)
    elif isinstance(value, list):
        yield f"{path}#", len(value)
        for i, v in enumerate(value):
            yield from _flat(v, f"{path}[{i}]")
    else:
        yield path, value


def differences(index: int, old: dict[str, Any], new: dict[str, Any]) -> list[Difference]:
    """Every leaf of ``old`` and ``new`` that differs (``name#`` is a list's length)."""
    if old == new:
        return []
    a, b = dict(_flat(old)), dict(_flat(new))
    return [
        Difference(index, key, a.get(key, ABSENT), b.get(key, ABSENT))
        for key in sorted(a.keys() | b.keys())
        if a.get(key, ABSENT) != b.get(key, ABSENT)
    ]


def compare(golden: dict[str, Any], indices: Sequence[int] | None = None) -> list[Difference]:
    """Every difference between the recorded answers of ``golden`` (those at ``indices``,
    or all) and the engine's answers now."""
    entries = golden["scenarios"]
    chosen = range(len(entries)) if indices is None else indices
    found: list[Difference] = []
    for i in chosen:
        entry = entries[i]
        new = answers(entry["scenario"], batch="batch" in entry["answer"])
        found += differences(i, entry["answer"], new)
    return found


def _value(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def report(golden: dict[str, Any], found: Sequence[Difference], shown: int = 5) -> list[str]:
    """``found`` in words, grouped by field (list indices left out), most first: the count
    and the first ``shown``, each with its scenario (:func:`short`) and old -> new value."""
    entries = golden["scenarios"]
    by_kind: dict[str, list[Difference]] = defaultdict(list)
    for d in found:
        by_kind[d.kind].append(d)
    lines = []
    for kind, diffs in sorted(by_kind.items(), key=lambda kd: (-len(kd[1]), kd[0])):
        scenarios = len({d.scenario for d in diffs})
        lines.append(f"{kind}: {len(diffs):,} differences in {scenarios:,} scenarios")
        for d in diffs[:shown]:
            lines.append(f"  #{d.scenario} {short(entries[d.scenario]['scenario'])}")
            lines.append(f"    {d.field}: {_value(d.old)} -> {_value(d.new)}")
    return lines


def short(data: dict[str, Any]) -> str:
    """A scenario dict in one line: model, GPUs, the training fields that say most."""
    model = data.get("model", {})
    hw = data.get("hardware", {})
    t = data.get("training", {})
    name = model.get("preset", "custom") if isinstance(model, dict) else model
    gpus = f"{hw.get('gpus_per_node', 1)}x{hw.get('nodes', 1)} {hw.get('gpu')}"
    par = t.get("parallelism") or {}
    layout = [f"{k}{par[k]}" for k in ("tp", "pp", "cp", "ep") if par.get(k, 1) != 1]
    if par.get("zero_stage"):
        layout.append(f"zero{par['zero_stage']}")
    shape = "b{}s{}a{}".format(
        t.get("micro_batch_size", "?"),
        t.get("sequence_length", "?"),
        t.get("gradient_accumulation_steps", "?"),
    )
    parts = [name, gpus, t.get("method", "full"), t.get("precision", ""), shape, *layout]
    if t.get("activation_checkpointing", "none") != "none":
        parts.append("ckpt=" + str(t["activation_checkpointing"]))
    return " ".join(str(p) for p in parts if p)

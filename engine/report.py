"""The breakdown of an estimate as data: CSV, JSON and a Markdown table.

All three carry the same rows -- every named item with its category, bytes (an exact
integer), GiB (2^30 bytes) and formula -- and the totals. Runs on more than one GPU also get
one row per distinct rank group (category ``rank``: what each pipeline stage holds), and
runs that offload to host memory, or that give the host RAM per node, get the ``host`` rows
(host RAM per node and its verdict); the ``convention`` rows name the training stack and
each convention the step was estimated with. Only the five breakdown categories sum to the
device total; :func:`breakdown_rows` returns just those.

The what-ifs the app shows beside the current bar (:class:`memfit.engine.whatif.WhatIfResult`)
can be given to all three (``whatifs=``): they come after the current scenario's rows --
category ``whatif`` in the CSV (:func:`whatif_rows`), a ``whatifs`` list in the JSON
(:func:`whatif_dict`), a table of their own in the Markdown -- each with its totals, its
bytes per category, its saving against the current scenario and its compute cost.

>>> from memfit.engine.presets import load_gpu, load_model
>>> from memfit.engine.specs import HardwareSpec, Scenario
>>> from memfit.engine.estimate import estimate
>>> est = estimate(Scenario(load_model("gpt2"), HardwareSpec(load_gpu("l4"))))
>>> to_csv(est).splitlines()[0]
'category,item,bytes,gib,formula,source'
>>> shows_ranks(est), shows_host(est)
(False, False)
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any

from memfit.engine.estimate import GIB, Estimate, RankGroup
from memfit.engine.model_state import CATEGORIES
from memfit.engine.specs import PARALLEL_AXES, ModelSpec
from memfit.engine.whatif import WhatIfResult

COLUMNS = ("category", "item", "bytes", "gib", "formula", "source")
Row = dict[str, str | int]

#: the host verdict in words, for tables and the app
HOST_VERDICT_WORDS = {"fits": "fits", "oom": "does not fit", "unknown": "unknown"}
#: the device verdict in words
VERDICT_WORDS = {"fits": "fits", "tight": "tight", "oom": "does not fit"}


def shows_ranks(est: Estimate) -> bool:
    """Whether reports list the rank groups: more than one group, or more than one GPU."""
    return len(est.rank_groups) > 1 or est.scenario.hardware.world_size > 1


def shows_host(est: Estimate) -> bool:
    """Whether reports give the host RAM per node: offload is on, or the RAM is given."""
    return (
        est.host_node_bytes > 0
        or est.host_capacity_bytes is not None
        or not est.scenario.training.offload.is_trivial
    )


def peak_phase(group: RankGroup) -> str:
    """The phase of a group's peak; the start of the step holds what the optimizer left."""
    return "optimizer" if group.peak_phase == "before" else group.peak_phase


def host_need(est: Estimate) -> str:
    """``412.30 GiB per node (8 GPUs x 51.54 GiB)``: the host RAM offload takes."""
    n = est.scenario.hardware.gpus_per_node
    per_gpu = est.host_node_bytes // n
    return (
        f"{est.host_node_bytes / GIB:,.2f} GiB per node "
        f"({n} GPU{'s' if n > 1 else ''} x {per_gpu / GIB:,.2f} GiB)"
    )


def host_summary(est: Estimate) -> str:
    """``412.30 GiB per node (8 GPUs x 51.54 GiB) of 512.00 GiB: fits`` (GiB = 2^30 B)."""
    if est.host_capacity_bytes is None:
        return host_need(est) + ": host RAM per node not given"
    return (
        f"{host_need(est)} of {est.host_capacity_bytes / GIB:,.2f} GiB: "
        f"{HOST_VERDICT_WORDS[est.host_verdict]}"
    )


def _row(category: str, item: str, n_bytes: int, formula: str = "", source: str = "") -> Row:
    return {
        "category": category,
        "item": item,
        "bytes": n_bytes,
        "gib": f"{n_bytes / GIB:.4f}",
        "formula": formula,
        "source": source,
    }


def breakdown_rows(est: Estimate) -> list[Row]:
    """One row per item at the peak; they sum to the device total."""
    return [_row(i.category, i.name, i.bytes, i.formula, i.source) for i in est.items]


def total_rows(est: Estimate) -> list[Row]:
    """allocated, reserved, device, capacity and budget (category ``total``)."""
    return [
        _row("total", name, getattr(est, f"{name}_bytes"))
        for name in ("allocated", "reserved", "device", "capacity", "budget")
    ]


def rank_rows(est: Estimate) -> list[Row]:
    """Per rank group: allocated, reserved, device and host bytes of one of its GPUs."""
    if not shows_ranks(est):
        return []
    out: list[Row] = []
    for g in est.rank_groups:
        worst = "worst group: sets the verdict; " if g.group == est.worst_group else ""
        out += [
            _row("rank", f"{g.group}: allocated", g.allocated_bytes),
            _row("rank", f"{g.group}: reserved", g.reserved_bytes),
            _row("rank", f"{g.group}: device", g.device_bytes, f"{worst}peak at {peak_phase(g)}"),
            _row("rank", f"{g.group}: host per GPU", g.host_bytes, "offloaded to host memory"),
        ]
    return out


def host_rows(est: Estimate) -> list[Row]:
    """Host RAM per node, and the user's host RAM per node when given."""
    if not shows_host(est):
        return []
    out = [_row("host", "host RAM per node", est.host_node_bytes, host_summary(est))]
    if est.host_capacity_bytes is not None:
        out.append(_row("host", "host RAM capacity per node", est.host_capacity_bytes))
    return out


def model_reading(model: ModelSpec) -> str:
    """How the model's config was read, where not plainly as its own family: the
    look-alike family it was read as, the multimodal model it is the text model of. Empty
    for every other model."""
    parts = []
    if model.read_as:
        of = "a config without model_type" if model.family == "unnamed" else model.family
        parts.append(f"read as {model.read_as} (look-alike of {of})")
    if model.text_model_of:
        parts.append(f"the text model of {model.text_model_of} (its vision tower is not counted)")
    return "; ".join(parts)


def conventions_text(est: Estimate) -> str:
    """The training stack and every convention the estimate used, on one line; "(set)"
    marks the ones the scenario sets itself, the rest are the stack's."""
    conv = est.conventions
    used = ", ".join(
        f"{c.field}={json.dumps(c.value)}" + (" (set)" if c.origin == "scenario" else "")
        for c in conv.used
    )
    return f"{conv.stack}: {used}"


def convention_rows(est: Estimate) -> list[Row]:
    """The stack, then one row per convention: its value (formula) and where it came from
    with what it means (source); no bytes."""
    conv = est.conventions
    out = [_row("convention", "training.stack", 0, conv.stack, "scenario")]
    for c in conv.used:
        out.append(_row("convention", c.field, 0, json.dumps(c.value), f"{c.origin}: {c.why}"))
    return out


def saved_bytes(est: Estimate, whatif: WhatIfResult) -> int:
    """Device bytes the what-if saves against ``est`` (negative: it takes more)."""
    return est.device_bytes - whatif.estimate.device_bytes


def whatif_rows(est: Estimate, whatifs: Sequence[WhatIfResult]) -> list[Row]:
    """Per what-if (category ``whatif``, items named ``<label>: ...``): allocated, reserved
    and device bytes (its verdict as the formula), its bytes per breakdown category at its
    peak, then its saving against ``est`` with the compute cost as the source."""
    out: list[Row] = []
    for w in whatifs:
        label, ghost = w.whatif.label, w.estimate
        out += [
            _row("whatif", f"{label}: allocated", ghost.allocated_bytes),
            _row("whatif", f"{label}: reserved", ghost.reserved_bytes),
            _row("whatif", f"{label}: device", ghost.device_bytes, VERDICT_WORDS[ghost.verdict]),
        ]
        out += [_row("whatif", f"{label}: {c}", ghost.breakdown[c]) for c in CATEGORIES]
        out.append(
            _row(
                "whatif",
                f"{label}: saving vs current",
                saved_bytes(est, w),
                "current device - what-if device (negative: it takes more)",
                f"compute cost: {w.compute_note}" if w.compute_note else "",
            )
        )
    return out


def baseline_rows(est: Estimate, baseline: Estimate | None) -> list[Row]:
    """A pinned baseline (category ``baseline``): its scenario in words, allocated, reserved
    and device bytes, bytes per breakdown category, and the current scenario's difference."""
    if baseline is None:
        return []
    words = scenario_line(baseline).replace("**", "")
    return [
        _row("baseline", "baseline: allocated", baseline.allocated_bytes, words),
        _row("baseline", "baseline: reserved", baseline.reserved_bytes),
        _row(
            "baseline", "baseline: device", baseline.device_bytes, VERDICT_WORDS[baseline.verdict]
        ),
        *(_row("baseline", f"baseline: {c}", baseline.breakdown[c]) for c in CATEGORIES),
        _row(
            "baseline",
            "baseline: current minus baseline",
            est.device_bytes - baseline.device_bytes,
            "current device - baseline device",
        ),
    ]


def rows(
    est: Estimate, whatifs: Sequence[WhatIfResult] = (), baseline: Estimate | None = None
) -> list[Row]:
    """Items, totals, the rank groups and host rows where they apply, the conventions,
    then the rows of each what-if given and of a pinned baseline."""
    return (
        breakdown_rows(est) + total_rows(est) + rank_rows(est) + host_rows(est)
        + convention_rows(est) + whatif_rows(est, whatifs) + baseline_rows(est, baseline)
    )  # fmt: skip


def to_csv(
    est: Estimate, *, whatifs: Sequence[WhatIfResult] = (), baseline: Estimate | None = None
) -> str:
    """:func:`rows` as CSV, one header line of :data:`COLUMNS`, then the scenario in words
    (category ``scenario``: a file read alone says what it measured)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerow({"category": "scenario", "item": scenario_line(est).replace("**", "")})
    writer.writerows(rows(est, whatifs, baseline))
    return buffer.getvalue()


def whatif_dict(est: Estimate, whatif: WhatIfResult) -> dict[str, Any]:
    """One what-if for the JSON export: its key and label, totals, verdict, bytes per
    breakdown category, saving against ``est`` and step-time factor with its note."""
    ghost = whatif.estimate
    return {
        "key": whatif.whatif.key,
        "label": whatif.whatif.label,
        "allocated_bytes": ghost.allocated_bytes,
        "reserved_bytes": ghost.reserved_bytes,
        "device_bytes": ghost.device_bytes,
        "verdict": ghost.verdict,
        "breakdown": dict(ghost.breakdown),
        "saved_bytes": saved_bytes(est, whatif),
        "step_time_factor": whatif.compute_factor,
        "compute_note": whatif.compute_note,
    }


def to_json(
    est: Estimate, *, whatifs: Sequence[WhatIfResult] = (), baseline: Estimate | None = None
) -> str:
    """The ``--json`` shape (:meth:`Estimate.to_dict`); with what-ifs, a ``whatifs`` list
    of :func:`whatif_dict` beside it; with a pinned baseline, a ``baseline`` object (its
    whole estimate, and the current scenario's difference in device bytes)."""
    data = est.to_dict()
    if whatifs:
        data["whatifs"] = [whatif_dict(est, w) for w in whatifs]
    if baseline is not None:
        data["baseline"] = {
            **baseline.to_dict(),
            "current_minus_baseline_bytes": est.device_bytes - baseline.device_bytes,
        }
    return json.dumps(data, indent=2) + "\n"


def mesh_text(est: Estimate) -> str:
    """``world 16 = tp 8 x pp 2 x cp 1 x dp 1 | vpp 1 | ZeRO shard group 1`` (and
    ``| ep 4`` before the shard group, where experts are split)."""
    m = est.mesh
    if m is None:
        return ""
    par = est.scenario.training.parallelism
    schedule = f" ({par.pp_schedule})" if m.pp > 1 else ""
    world = " x ".join(f"{a.key} {m.size(a.key)}" for a in PARALLEL_AXES if a.in_world)
    # the axes that split the data-parallel ranks, where they do
    inner = "".join(
        f" | {a.key} {m.size(a.key)}" for a in PARALLEL_AXES if not a.in_world and m.size(a.key) > 1
    )
    return (
        f"world {m.world} = {world} x dp {m.dp} | vpp {m.vpp}{schedule}{inner} | "
        f"ZeRO shard group {m.shard}" + (" (within a node)" if par.hybrid_shard else "")
    )


def scenario_line(est: Estimate) -> str:
    """The scenario in one Markdown line: model, GPUs (how many, which, the nodes), method,
    precision, optimizer, micro-batch x sequence, activation checkpointing (where on) and
    the framework."""
    s = est.scenario
    t, hw = s.training, s.hardware
    nodes = f" ({hw.nodes} nodes x {hw.gpus_per_node})" if hw.nodes > 1 else ""
    checkpointing = (
        f", checkpointing {t.activation_checkpointing}"
        if t.activation_checkpointing != "none"
        else ""
    )
    return (
        f"**{s.model.label}** on **{hw.world_size} x {hw.gpu.display_name}**{nodes} -"
        f" {t.method}, {t.precision}, {t.optimizer}, micro-batch {t.micro_batch_size:,}"
        f" x {t.sequence_length:,} tokens{checkpointing}, framework {t.parallelism.framework}"
    )


def totals_line(est: Estimate) -> str:
    """``Verdict: **fits**: device 45.10 GiB of 80.00 GiB per GPU (budget 68.00 GiB);
    allocated ..., reserved ... GiB. GiB = 2^30 bytes.``"""
    return (
        f"Verdict: **{est.verdict}**: device {est.device_bytes / GIB:,.2f} GiB of"
        f" {est.capacity_bytes / GIB:,.2f} GiB per GPU (budget {est.budget_bytes / GIB:,.2f}"
        f" GiB); allocated {est.allocated_bytes / GIB:,.2f} GiB, reserved"
        f" {est.reserved_bytes / GIB:,.2f} GiB. GiB = 2^30 bytes."
    )


def whatif_table(est: Estimate, whatifs: Sequence[WhatIfResult]) -> list[str]:
    """The what-ifs as Markdown lines (a heading line, then the table); none for none."""
    if not whatifs:
        return []
    lines = [
        "What-ifs, each alone against the current scenario:",
        "",
        "| what-if | device GiB | saving GiB | verdict | compute cost |",
        "|---|---:|---:|---|---|",
    ]
    for w in whatifs:
        lines.append(
            f"| {w.whatif.label} | {w.estimate.device_bytes / GIB:.2f} |"
            f" {saved_bytes(est, w) / GIB:+.2f} | {VERDICT_WORDS[w.estimate.verdict]} |"
            f" {w.compute_note or '-'} |"
        )
    return lines


def to_markdown(
    est: Estimate, *, whatifs: Sequence[WhatIfResult] = (), baseline: Estimate | None = None
) -> str:
    """A summary to paste into an issue or a chat: the scenario, the breakdown table with
    the totals, the verdict, then the what-ifs given (:func:`whatif_table`) and a pinned
    baseline."""
    s = est.scenario
    lines = [
        scenario_line(est),
        "",
        "| category | item | GiB | formula |",
        "|---|---|---:|---|",
    ]
    for r in breakdown_rows(est):
        lines.append(f"| {r['category']} | {r['item']} | {r['gib']} | {r['formula']} |")
    for r in total_rows(est):
        lines.append(f"| **{r['item']}** | | **{r['gib']}** | |")
    lines += ["", totals_line(est), ""]  # the verdict a paragraph of its own
    if model_reading(s.model):
        lines.append(f"Model {model_reading(s.model)}.")
    lines.append(f"Training stack {conventions_text(est)}.")
    if est.not_modelled:
        lines.append("Not yet modelled: " + "; ".join(est.not_modelled) + ".")
    if shows_ranks(est):
        lines += [
            "",
            f"Mesh: {mesh_text(est)}.",
            "",
            "| rank group | allocated GiB | reserved GiB | device GiB | peak | host GiB per GPU |",
            "|---|---:|---:|---:|---|---:|",
        ]
        for g in est.rank_groups:
            name = f"**{g.group} (worst)**" if g.group == est.worst_group else g.group
            lines.append(
                f"| {name} | {g.allocated_bytes / GIB:.4f} | {g.reserved_bytes / GIB:.4f} | "
                f"{g.device_bytes / GIB:.4f} | {peak_phase(g)} | {g.host_bytes / GIB:.4f} |"
            )
    if shows_host(est):
        lines += ["", f"Host RAM: {host_summary(est)}."]
    if whatifs:
        lines += ["", *whatif_table(est, whatifs)]
    if baseline is not None:
        diff = (est.device_bytes - baseline.device_bytes) / GIB
        lines += [
            "",
            f"Pinned baseline: {scenario_line(baseline)}: device"
            f" {baseline.device_bytes / GIB:,.2f} GiB per GPU"
            f" ({VERDICT_WORDS[baseline.verdict]}); the current scenario {diff:+,.2f} GiB.",
        ]
    return "\n".join(lines) + "\n"

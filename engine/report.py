"""The breakdown of an estimate as data: CSV, JSON and a Markdown table.

All three carry the same rows -- every named item with its category, bytes (an exact
integer), GiB (2^30 bytes) and formula -- and the totals.

>>> from engine.presets import load_gpu, load_model
>>> from engine.specs import HardwareSpec, Scenario
>>> from engine.estimate import estimate
>>> est = estimate(Scenario(load_model("gpt2"), HardwareSpec(load_gpu("l4"))))
>>> to_csv(est).splitlines()[0]
'category,item,bytes,gib,formula,source'
"""

from __future__ import annotations

import csv
import io
import json

from engine.estimate import GIB, Estimate

COLUMNS = ("category", "item", "bytes", "gib", "formula", "source")


def rows(est: Estimate) -> list[dict[str, str | int]]:
    """One row per item, then the totals (category ``total``)."""
    out: list[dict[str, str | int]] = [
        {
            "category": i.category,
            "item": i.name,
            "bytes": i.bytes,
            "gib": f"{i.bytes / GIB:.4f}",
            "formula": i.formula,
            "source": i.source,
        }
        for i in est.items
    ]
    for name in ("allocated", "reserved", "device", "capacity", "budget"):
        value = getattr(est, f"{name}_bytes")
        out.append(
            {
                "category": "total",
                "item": name,
                "bytes": value,
                "gib": f"{value / GIB:.4f}",
                "formula": "",
                "source": "",
            }
        )
    return out


def to_csv(est: Estimate) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows(est))
    return buffer.getvalue()


def to_json(est: Estimate) -> str:
    return json.dumps(est.to_dict(), indent=2) + "\n"


def to_markdown(est: Estimate) -> str:
    """A table to paste into an issue or a document."""
    s = est.scenario
    t = s.training
    lines = [
        f"**{s.model.label}** on **{s.hardware.gpu.display_name}** - {t.method}, {t.precision},"
        f" {t.optimizer}, micro-batch {t.micro_batch_size} x {t.sequence_length} tokens",
        "",
        "| category | item | GiB | formula |",
        "|---|---|---:|---|",
    ]
    for r in rows(est):
        if r["category"] == "total":
            lines.append(f"| **{r['item']}** | | **{r['gib']}** | |")
        else:
            lines.append(f"| {r['category']} | {r['item']} | {r['gib']} | {r['formula']} |")
    lines += ["", f"Verdict: **{est.verdict}**. GiB = 2^30 bytes."]
    if est.not_modelled:
        lines.append("Not yet modelled: " + "; ".join(est.not_modelled) + ".")
    return "\n".join(lines) + "\n"

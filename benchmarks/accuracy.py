"""How close is MemFit to measurements? Prints two error tables.

1. The traced dataset (``tests/validation/dataset.json``): one real PyTorch training step
   per case, measured without a GPU (see ``validation/README.md``); compared on the
   **allocated** peak. Target: 3 % median, 8 % worst.
2. Published measurements (``tests/validation/published.json``): each compared with the
   total of the same kind (allocated, reserved or nvidia-smi = device; "unknown" is
   compared with device). Not tuned per case; each case is tagged with what it uses
   (several GPUs, torch.compile -- ``training.torch_compile`` --, offload, packing).
   Every published case records the training stack that produced it (``stack``: its loop's
   conventions, see ``engine.stacks``); the errors are also grouped by stack, and the
   single-GPU cases are summed up as one group, "single GPU, stack recorded".

Run: ``python benchmarks/accuracy.py [--cases] [--markdown]`` (``--cases`` lists every
traced case; ``--markdown`` prints the published tables as the README shows them, the
per-stack table among them). A case the engine cannot estimate (an ``EstimateError``: a
field it does not accept yet) is listed as "cannot estimate" and counted per stack.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from memfit.engine.errors import EstimateError
from memfit.engine.estimate import GIB, Estimate, estimate
from memfit.engine.scenario_io import scenario_from_dict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.validation.throughput import FAMILIES, families
from tests.validation.traced import as_traced

DATA = Path(__file__).resolve().parent.parent / "tests" / "validation"
KIND = {"allocated": "allocated_bytes", "reserved": "reserved_bytes",
        "nvidia-smi": "device_bytes", "unknown": "device_bytes"}  # fmt: skip


def rel(est: int, measured: float) -> float:
    return (est - measured) / measured


def summary(errs: list[float]) -> tuple[int, float, float, float]:
    """n, median, p90 and max of the absolute relative errors (``errs`` non-empty)."""
    a = sorted(abs(e) for e in errs)
    p90 = a[min(len(a) - 1, int(0.9 * len(a)))]
    return len(a), statistics.median(a), p90, a[-1]


def table(title: str, rows: list[tuple[str, list[float]]]) -> None:
    print(title)
    print(f"  {'group':<34}{'n':>4}{'median':>9}{'p90':>9}{'max':>9}   (|relative error|)")
    for name, errs in rows:
        if not errs:
            continue
        n, median, p90, worst = summary(errs)
        print(f"  {name:<34}{n:>4}{median:>9.1%}{p90:>9.1%}{worst:>9.1%}")


def markdown_table(first: str, rows: list[tuple[str, list[float]]]) -> None:
    """Median, p90 and max of the absolute errors, and the signed median (+: MemFit above
    the measurement); a group without cases shows as such rather than disappearing."""
    print(f"\n| {first} | n | median | signed median | p90 | max |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, errs in rows:
        if errs:
            n, median, p90, worst = summary(errs)
            signed = statistics.median(errs)
            print(f"| {name} | {n} | {median:.1%} | {signed:+.1%} | {p90:.1%} | {worst:.1%} |")
        else:
            print(f"| {name} | 0 | -- | -- | -- | -- |")


def traced(show_cases: bool) -> list[float]:
    path = DATA / "dataset.json"
    if not path.exists():
        print("traced dataset: not present\n")
        return []
    cases = json.loads(path.read_text())
    groups: dict[str, list[float]] = defaultdict(list)
    errors = []
    for case in cases:
        # the step as traced: the model output held through backward (the harness's
        # conventions, tests/validation/traced.py); benchmarks/conventions.py adds the
        # traced step that releases it
        est = estimate(scenario_from_dict(as_traced(case["scenario"])))
        measured = case["measured"]["peak_allocated_bytes"]
        e = rel(est.allocated_bytes, measured)
        errors.append(e)
        t = case["scenario"]["training"]
        for key in (
            f"family={case['family']}",
            f"precision={t.get('precision')}",
            f"method={t.get('method')}",
            f"optimizer={t.get('optimizer')}/{t.get('optimizer_impl', 'foreach')}",
            f"checkpointing={t.get('activation_checkpointing', 'none')}",
            f"attention={t.get('attention', 'sdpa')}",
        ):
            groups[key].append(e)
        if show_cases:
            print(
                f"  {case['id']:<48} measured {measured / GIB:8.3f} GiB  MemFit "
                f"{est.allocated_bytes / GIB:8.3f} GiB  {e:+7.1%}  "
                f"peak {case['measured']['peak_phase']}/{est.peak_phase}"
            )
    table(
        f"Traced dataset: {len(cases)} cases, allocated peak",
        [("all", errors), *sorted(groups.items())],
    )
    print()
    return errors


def traced_multi() -> list[float]:
    """FSDP2 and tensor-parallel steps traced with a fake process group."""
    cases = json.loads((DATA / "dataset_multi.json").read_text())
    groups: dict[str, list[float]] = defaultdict(list)
    errors = []
    for case in cases:
        if case["setup"].get("tp_plan") == "layers":
            continue  # embedding and LM head whole on every rank: not Megatron's TP
        est = estimate(scenario_from_dict(as_traced(case["scenario"])))
        e = rel(est.allocated_bytes, case["measured"]["peak_allocated_bytes"])
        errors.append(e)
        par = case["scenario"]["training"]["parallelism"]
        kind = f"FSDP2 ZeRO-{par['zero_stage']}" if par["zero_stage"] else f"tp {par['tp']}"
        groups[kind].append(e)
        groups[f"precision={case['scenario']['training']['precision']}"].append(e)
        if "fsdp_param_dtype" in par:  # a policy other than (bf16, fp32)
            groups[f"policy {par['fsdp_param_dtype']}/{par['fsdp_reduce_dtype']}"].append(e)
    table(
        f"Traced multi-GPU steps: {len(errors)} cases, allocated peak of rank 0",
        [("all", errors), *sorted(groups.items())],
    )
    return errors


#: the group of every single-GPU case that records its training stack
SINGLE_STACKED = "single GPU, stack recorded"


def published(markdown: bool = False) -> list[float]:
    cases = json.loads((DATA / "published.json").read_text())
    groups: dict[str, list[float]] = defaultdict(list)
    by_stack: dict[str, list[float]] = defaultdict(list)
    by_family: dict[str, list[float]] = {name: [] for name, _ in FAMILIES}
    unestimated: dict[str, int] = defaultdict(int)
    errors = []
    rows: list[str] = []
    print(f"Published measurements: {len(cases)} cases")
    for case in cases:
        stack = case.get("stack")
        try:
            scenario = scenario_from_dict(case["scenario"])
            est: Estimate = estimate(scenario)
        except EstimateError as exc:
            print(f"  {case['id']}: cannot estimate: {exc}")
            unestimated[stack or "(none)"] += 1
            rows.append(f"| {case['id']} | {case['measure']} | {case['measured_gib']:.2f} | "
                        f"cannot estimate: {exc} | |")  # fmt: skip
            continue
        measured = case["measured_gib"] * GIB
        e = rel(getattr(est, KIND[case["measure"]]), measured)
        compiled = scenario.training.torch_compile
        flags = ["compile"] if compiled else []
        flags += [w for w in ("offload", "packed") if w in json.dumps(case).lower()]
        multi = case.get("num_gpus", 1) > 1
        errors.append(e)
        for name in families(scenario):
            by_family[name].append(e)
        groups[f"measure={case['measure']}"].append(e)
        kind = "multi-GPU" if multi else "single GPU"
        groups[f"{kind}, torch.compile" if compiled else f"{kind}, eager"].append(e)
        if stack:
            by_stack[f"stack={stack}"].append(e)
            if not multi:
                by_stack[SINGLE_STACKED].append(e)
        # every published case is listed: the README quotes the table
        tags = ([f"{case['num_gpus']} GPUs"] if multi else []) + flags
        note = "  [" + ", ".join(tags) + "]" if tags else ""
        ours = getattr(est, KIND[case["measure"]]) / GIB
        print(
            f"  {case['id']:<52} {case['measure']:<10} measured {case['measured_gib']:7.2f}"
            f"  MemFit {ours:7.2f} GiB  {e:+7.1%}{note}"
        )
        rows.append(f"| {case['id']}{note} | {case['measure']} | {case['measured_gib']:.2f} | "
                    f"{ours:.2f} | {e:+.1%} |")  # fmt: skip
    table("Published measurements, error by group", [("all", errors), *sorted(groups.items())])
    stack_rows = sorted((k, v) for k, v in by_stack.items() if k != SINGLE_STACKED)
    stack_rows.append((SINGLE_STACKED, by_stack[SINGLE_STACKED]))
    table("Published measurements, error by training stack", stack_rows)
    table("Published measurements, error by family of runs", list(by_family.items()))
    for name, errs in by_family.items():
        if errs:
            print(f"  {name:<34} signed median {statistics.median(errs):+.1%}")
    if unestimated:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(unestimated.items()))
        print(f"  cannot estimate: {sum(unestimated.values())} cases ({counts})")
    if markdown:
        markdown_table("group", [("all", errors), *sorted(groups.items())])
        markdown_table("stack", [(k.removeprefix("stack="), v) for k, v in stack_rows])
        markdown_table("family of runs", list(by_family.items()))
        print("\n| case | measure | measured GiB | MemFit GiB | error |\n|---|---|---:|---:|---:|")
        print("\n".join(rows))
    return errors


def real_gpu() -> None:
    """The traced cases and whole models run as real steps on a GPU
    (``validation/gpu/``, :mod:`validation.compare_gpu`)."""
    from validation import compare_gpu

    if not compare_gpu.DEFAULT.exists():
        print("real GPU steps: not present\n")
        return
    result = compare_gpu.compare()
    names = {"tracer": "traced peak vs allocated", "allocated": "MemFit allocated",
             "reserved": "MemFit reserved", "device": "MemFit device (nvidia-smi)",
             "step_time": "MemFit step time"}  # fmt: skip
    rows = [
        (
            f"{part}: {names[figure]}",
            [r[figure] for r in result["rows"] if r["part"] == part and figure in r],
        )
        for part in ("traced", "whole")
        for figure in names
        if any(r["part"] == part and figure in r for r in result["rows"])
    ]
    table("Real GPU steps (validation/gpu/h200_steps.jsonl, one NVIDIA H200)", rows)
    for a in result["accumulation"]:
        measured, ours = a["measured"], a["estimated"]
        print(f"  accumulation {a['id'][:60]}: measured {measured:+.1%}, MemFit {ours:+.1%}")
    print()


def main() -> None:
    show = "--cases" in sys.argv
    traced(show)
    traced_multi()
    real_gpu()
    published("--markdown" in sys.argv)


if __name__ == "__main__":
    main()

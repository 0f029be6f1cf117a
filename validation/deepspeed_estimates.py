"""DeepSpeed's own ZeRO model-state memory estimates, recorded as a fixture.

DeepSpeed ships closed-form estimators of the memory that parameters, gradients and optimizer
states need under ZeRO-2 and ZeRO-3 (``estimate_zero2_model_states_mem_needs`` in
``deepspeed.runtime.zero.stage_1_and_2`` and ``estimate_zero3_model_states_mem_needs`` in
``deepspeed.runtime.zero.stage3``). This script calls those functions (the ones that return
numbers) over a grid of models, GPU layouts and offload options, and writes every input and
output to ``tests/validation/deepspeed_estimates.json``, so that MemFit's engine can be
cross-checked against DeepSpeed without DeepSpeed installed.

    VENV/bin/python -m validation.deepspeed_estimates            # writes the fixture
    VENV/bin/python -m validation.deepspeed_estimates --out FILE

``VENV`` is the harness environment (see ``validation/README.md``) with ``deepspeed`` from
``validation/requirements.txt``. No GPU is needed: DeepSpeed is imported with its CPU
accelerator.

The models' parameter counts are constants below (they were computed with MemFit's engine,
so this script does not import it): ``total_params`` is the model's parameter count (tied
weights once) and ``largest_layer_params`` that of its largest transformer block. Note that
DeepSpeed's ``*_all_live`` helpers define the largest layer differently: the largest single
module's own parameters (for these models the embedding or output matrix).

As a self-check, the ``*_all_cold`` printers (which print GiB with two decimals for the same
option grid) are run too and their figures compared with the recorded bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "tests" / "validation" / "deepspeed_estimates.json"
DEEPSPEED_VERSION = "0.19.8"

# (MemFit model preset, total parameters, parameters of the largest transformer block)
MODELS: tuple[tuple[str, int, int], ...] = (
    ("gpt2", 124_439_808, 7_087_872),
    ("llama-3.2-1b", 1_235_814_400, 60_821_504),
    ("llama-3-8b", 8_030_261_248, 218_112_000),
    ("mistral-7b-v0.1", 7_241_732_096, 218_112_000),
    ("llama-2-13b", 13_015_864_320, 317_204_480),
    ("llama-3.1-70b", 70_553_706_496, 855_654_400),
)

# (num_nodes, num_gpus_per_node)
LAYOUTS: tuple[tuple[int, int], ...] = ((1, 1), (1, 8), (2, 8), (4, 8))

ZERO2_OPTIONS: tuple[bool, ...] = (False, True)  # cpu_offload
# (cpu_offload, cpu_offload_params, zero_init)
ZERO3_OPTIONS: tuple[tuple[bool, bool, bool], ...] = tuple(
    (offload, params, init)
    for offload, params in ((False, False), (True, False), (True, True))
    for init in (True, False)
)

_PRINTED_ROW = re.compile(r"^\s*([0-9.]+)GB \|\s*([0-9.]+)GB \| (.*)$")


def _default_buffer_factor(fn: Any) -> float:
    """The default of ``additional_buffer_factor`` in ``fn``'s signature."""
    return float(inspect.signature(fn).parameters["additional_buffer_factor"].default)


def _record(stage: int, model: str, total: int, largest: int, layout: tuple[int, int],
            options: dict[str, Any], result: tuple[Any, ...]) -> dict[str, Any]:  # fmt: skip
    """One fixture record: the estimator's inputs and what it returned."""
    nodes, gpus = layout
    cpu, gpu, *layer = result
    return {
        "stage": stage,
        "model": model,
        "total_params": total,
        "largest_layer_params": largest,
        "num_gpus_per_node": gpus,
        "num_nodes": nodes,
        "cpu_offload": options["cpu_offload"],
        "cpu_offload_params": options.get("cpu_offload_params"),
        "zero_init": options.get("zero_init"),
        "additional_buffer_factor": options["additional_buffer_factor"],
        "gpu_bytes": int(gpu),
        "cpu_bytes": int(cpu),
        "largest_layer_memory": int(layer[0]) if layer else None,
    }


def zero2_records(estimate: Any, factor: float) -> list[dict[str, Any]]:
    """One record per model, layout and ``cpu_offload`` from the ZeRO-2 estimator."""
    out = []
    for model, total, largest in MODELS:
        for nodes, gpus in LAYOUTS:
            for offload in ZERO2_OPTIONS:
                options = {"cpu_offload": offload, "additional_buffer_factor": factor}
                result = estimate(
                    total_params=total, num_gpus_per_node=gpus, num_nodes=nodes, **options
                )
                out.append(_record(2, model, total, largest, (nodes, gpus), options, result))
    return out


def zero3_records(estimate: Any, factor: float) -> list[dict[str, Any]]:
    """One record per model, layout and option triple from the ZeRO-3 estimator."""
    out = []
    for model, total, largest in MODELS:
        for nodes, gpus in LAYOUTS:
            for offload, offload_params, zero_init in ZERO3_OPTIONS:
                options = {
                    "cpu_offload": offload,
                    "cpu_offload_params": offload_params,
                    "zero_init": zero_init,
                    "additional_buffer_factor": factor,
                }
                result = estimate(
                    total_params=total,
                    largest_layer_params=largest,
                    num_gpus_per_node=gpus,
                    num_nodes=nodes,
                    **options,
                )
                out.append(_record(3, model, total, largest, (nodes, gpus), options, result))
    return out


def _printed_rows(printer: Any, **kwargs: Any) -> list[tuple[str, str]]:
    """The (cpu, gpu) GiB strings a ``*_all_cold`` printer prints, in its order."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        printer(**kwargs)
    rows = []
    for line in buf.getvalue().splitlines():
        m = _PRINTED_ROW.match(line)
        if m:
            rows.append((m.group(1), m.group(2)))
    return rows


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f}"


def check_printers(
    records: list[dict[str, Any]], printer2: Any, printer3: Any, factor: float
) -> None:
    """Fail unless the printers show the recorded bytes (GiB, two decimals) in their order.

    The ZeRO-2 printer runs ``cpu_offload`` True then False; the ZeRO-3 printer runs
    (offload, offload_params) = (T, T), (T, F), (F, F), each with ``zero_init`` 1 then 0.
    """
    index = {
        (
            r["stage"],
            r["model"],
            r["num_nodes"],
            r["num_gpus_per_node"],
            r["cpu_offload"],
            r["cpu_offload_params"],
            r["zero_init"],
        ): r
        for r in records
    }
    order2 = [(True, None, None), (False, None, None)]
    order3 = [
        (offload, params, init)
        for offload, params in ((True, True), (True, False), (False, False))
        for init in (True, False)
    ]
    for model, total, largest in MODELS:
        for nodes, gpus in LAYOUTS:
            common = {
                "total_params": total,
                "num_gpus_per_node": gpus,
                "num_nodes": nodes,
                "additional_buffer_factor": factor,
            }
            for stage, printer, kwargs, order in (
                (2, printer2, common, order2),
                (3, printer3, {**common, "largest_layer_params": largest}, order3),
            ):
                printed = _printed_rows(printer, **kwargs)
                expected = [
                    (_gib(r["cpu_bytes"]), _gib(r["gpu_bytes"]))
                    for r in (index[(stage, model, nodes, gpus, *opts)] for opts in order)
                ]
                if printed != expected:
                    raise AssertionError(
                        f"ZeRO-{stage} printer disagrees for {model} {nodes}x{gpus}: "
                        f"{printed} != {expected}"
                    )


def generate() -> dict[str, Any]:
    """Call DeepSpeed over the grid; return the fixture as a JSON-ready dict."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import torch
    from deepspeed.runtime.zero.stage3 import (
        estimate_zero3_model_states_mem_needs,
        estimate_zero3_model_states_mem_needs_all_cold,
    )
    from deepspeed.runtime.zero.stage_1_and_2 import (
        estimate_zero2_model_states_mem_needs,
        estimate_zero2_model_states_mem_needs_all_cold,
    )

    if deepspeed.__version__ != DEEPSPEED_VERSION:
        raise SystemExit(f"deepspeed {DEEPSPEED_VERSION} is pinned, found {deepspeed.__version__}")
    factor = _default_buffer_factor(estimate_zero2_model_states_mem_needs)
    factor3 = _default_buffer_factor(estimate_zero3_model_states_mem_needs)
    if factor3 != factor:
        raise SystemExit(f"ZeRO-2 and ZeRO-3 default buffer factors differ: {factor}, {factor3}")

    records = zero2_records(estimate_zero2_model_states_mem_needs, factor)
    records += zero3_records(estimate_zero3_model_states_mem_needs, factor)
    check_printers(
        records,
        estimate_zero2_model_states_mem_needs_all_cold,
        estimate_zero3_model_states_mem_needs_all_cold,
        factor,
    )
    return {
        "deepspeed": deepspeed.__version__,
        "torch": torch.__version__,
        "generated_by": "validation.deepspeed_estimates",
        "functions": {
            "2": "deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs",
            "3": "deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs",
        },
        "default_additional_buffer_factor": factor,
        "largest_layer_params": "parameters of the model's largest transformer block",
        "records": records,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON file to write")
    args = parser.parse_args(argv)
    data = generate()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(data['records'])} records -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How fast MemFit plans as a user meets it: the ``memfit`` console script end to end,
each run a fresh process (the interpreter's start, the imports and the output included),
with llm-analysis side by side.

Run with the interpreter MemFit is installed into, whose ``memfit`` console script is
timed: ``.venv/bin/python benchmarks/user_speed.py [--repeats 5]``. Each ``memfit`` run is
a new process, its environment as a user's shell has it (``PYTHONUNBUFFERED`` and
``PYTHONDONTWRITEBYTECODE`` removed; MemFit's bytecode written first, as an installed
package has it) and its output written to a file; a figure is the best wall time of
``--repeats`` runs (the median beside it). It prints the machine's CPU count and Python
version, then:

a. the start-up floor: the interpreter doing nothing (``python -c pass``) and
   ``memfit --version`` (the interpreter's start, the CLI's and the engine's imports), so
   that the reader sees how much of each figure below is start-up;
b. ``memfit sweep --json``, the whole default strategy space, for Llama 3 8B on 8 H100s
   and Llama 3 70B on 64 H100s (``--stack custom``): the configurations its JSON holds
   (``configs``), the wall time, configurations per second -- in one process
   (``--jobs 1``) and as it runs by default (one process per CPU; the two answers are
   checked to be the same);
c. ``memfit fit`` for Llama 3 8B on 8 H100s (as the sweep) and the README's 70B
   pretraining layout question (Llama 3 70B on 64 H100s, torchtitan, micro-batch 1,
   16 accumulation steps, 8,192 tokens, ZeRO-3), in one process and by default;
d. llm-analysis 0.2.2 (``LLMAnalysis.training``) on each sweep's configurations that it
   models too (bf16 mixed precision, AdamW, no offload, no context parallelism; no
   recomputation, selective or full), mapped as ``benchmarks/sweep_speed.py`` maps them
   (dp = GPUs / (tp x pp x cp)), in one fresh process per model: its start and imports,
   its first loop over the configurations, the best of ``--repeats`` loops, and end to
   end (from before the process's start to its first loop's result);
e. MemFit's configurations per second (the sweep end to end, a fresh process, its whole
   space; in one process and by default) over llm-analysis's (one process): over its
   best loop alone (the comparison most generous to llm-analysis) and over its end to
   end.

The targets the figures are read against are printed beside them: the 70B sweep within
1.5 s, ``memfit fit`` within 1 s, and at least 5x llm-analysis's configurations per
second. llm-analysis is not a dependency of MemFit: it is installed into ``.bench-venv``
(git-ignored) the first time (``benchmarks/llm_analysis_bench.py``); where it cannot be,
(d) and (e) are skipped and MemFit's figures still printed. Figures only; nothing is
asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import llm_analysis_bench

import memfit.engine
from memfit.engine.cli import DEFAULT_JOBS
from memfit.engine.sweep import cpus

MEMFIT = Path(sys.executable).parent / "memfit"
H100 = ["--gpu", "h100-sxm-80gb", "--gpus-per-node", "8"]
#: (label, the sweep's and the 8B fit's arguments, llm-analysis's model)
CASES: list[tuple[str, list[str], Mapping[str, object]]] = [
    (
        "Llama 3 8B on 8 H100s",
        ["--model", "llama-3-8b", *H100, "--nodes", "1", "--stack", "custom"],
        llm_analysis_bench.LLAMA_3_8B,
    ),
    (
        "Llama 3 70B on 64 H100s",
        ["--model", "llama-3-70b", *H100, "--nodes", "8", "--stack", "custom"],
        llm_analysis_bench.LLAMA_3_70B,
    ),
]
#: the fit cases: the 8B one as its sweep; the 70B one as the README's layout question
FITS: list[tuple[str, list[str]]] = [
    ("Llama 3 8B on 8 H100s", CASES[0][1]),
    (
        "Llama 3 70B on 64 H100s",
        [
            "--model", "llama-3-70b", *H100, "--nodes", "8", "--stack", "torchtitan",
            "--batch", "1", "--grad-accum", "16", "--seq", "8192", "--zero", "3",
        ],
    ),
]  # fmt: skip
SWEEP_TARGET_S = 1.5  # the 70B sweep
FIT_TARGET_S = 1.0
RATIO_TARGET = 5.0
RECOMPUTATION = ("none", "selective", "full")


def timed(command: Sequence[str], repeats: int) -> tuple[list[float], str]:
    """The wall times of ``repeats`` runs of ``command``, each a fresh process with its
    output written to a file, and the last run's output."""
    walls: list[float] = []
    out = b""
    for _ in range(repeats):
        with tempfile.TemporaryFile() as stdout:
            start = time.perf_counter()
            proc = subprocess.run(
                command,
                stdout=stdout,
                stderr=subprocess.PIPE,
                env=llm_analysis_bench.environment(),
                check=False,
            )
            walls.append(time.perf_counter() - start)
            if proc.returncode != 0:
                error = proc.stderr.decode(errors="replace")[-2000:]
                raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}): {error}")
            stdout.seek(0)
            out = stdout.read()
    return walls, out.decode()


def against(seconds: float, target: float) -> str:
    return f"target {target:g} s: {'within' if seconds <= target else 'over'}"


def line(label: str, walls: Sequence[float], extra: str = "") -> None:
    print(
        f"  {label:40s} {min(walls):7.3f} s  (median {statistics.median(walls):.3f})"
        + (f"  {extra}" if extra else "")
    )


def llm_analysis_inputs(sweep: Mapping[str, Any]) -> list[dict[str, object]]:
    """The sweep's points that llm-analysis models too, as its inputs."""
    if sweep["base"]["training"]["method"] != "full":
        return []
    seq = sweep["base"]["training"]["sequence_length"]
    inputs: list[dict[str, object]] = []
    for point in sweep["points"]:
        row = dict(zip(sweep["fields"], point, strict=True))
        if (
            row["precision"] != "bf16-mixed"
            or row["optimizer"] != "adamw"
            or row["offload"] != "none"
            or row["checkpointing"] not in RECOMPUTATION
            or row["cp"] != 1  # llm-analysis 0.2.2 has no context parallelism
        ):
            continue
        inputs.append(
            {
                "tp": row["tp"],
                "pp": row["pp"],
                "dp": row["gpus"] // (row["tp"] * row["pp"] * row["cp"]),
                "zero": row["zero_stage"],
                "checkpointing": row["checkpointing"],
                "micro": row["micro_batch_size"],
                "seq": seq,
                "accumulation": row["gradient_accumulation_steps"],
            }
        )
    return inputs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per figure (best of)")
    args = parser.parse_args(argv)
    repeats = max(1, args.repeats)
    llm_analysis_bench.bytecode(Path(memfit.engine.__file__).parent.parent)
    print(
        f"user speed: the memfit console script end to end, each run a fresh process, "
        f"best of {repeats}"
    )
    print(
        f"  machine: {os.cpu_count()} CPUs; Python {platform.python_version()} "
        f"({platform.python_implementation()}, {platform.system()} {platform.machine()})"
    )
    if not MEMFIT.exists():
        print(f"no memfit console script beside this interpreter ({sys.executable})")
        return 2

    print("(a) start-up floor")
    bare, _ = timed([sys.executable, "-c", "pass"], repeats)
    line("python -c pass (the interpreter alone)", bare)
    floor, version = timed([str(MEMFIT), "--version"], repeats)
    line("memfit --version", floor, f"({version.strip()})")

    jobs = min(cpus(), DEFAULT_JOBS)  # what memfit spreads over by default
    print(
        "(b) memfit sweep --json, the whole default strategy space (--stack custom): in one\n"
        f"    process (--jobs 1), and as it runs by default (a process per CPU up to 8: {jobs})"
    )
    sweeps: list[tuple[str, int, float, float, Mapping[str, Any]]] = []
    for label, case, _ in CASES:
        walls, out = timed([str(MEMFIT), "sweep", "--json", *case], repeats)
        alone, out_alone = timed([str(MEMFIT), "sweep", "--json", "--jobs", "1", *case], repeats)
        if out_alone != out:
            raise RuntimeError(f"{label}: --jobs 1 and the default answered differently")
        result = json.loads(out)
        n = result["configs"]
        target = f"; {against(min(walls), SWEEP_TARGET_S)}" if "70B" in label else ""
        for name, times in (("one process", alone), ("by default", walls)):
            best = min(times)
            line(
                f"{label}, {name}",
                times,
                f"{n:,} configurations, {n / best:,.0f} /s; {best - min(floor):.3f} s over "
                f"memfit --version" + (target if times is walls else ""),
            )
        sweeps.append((label, n, min(alone), min(walls), result))

    print(
        "(c) memfit fit: the 8B case as its sweep; the 70B case as the README's layout\n"
        "    question (torchtitan, micro-batch 1 x 16 steps, 8,192 tokens, ZeRO-3)"
    )
    for label, case in FITS:
        alone, _ = timed([str(MEMFIT), "fit", "--jobs", "1", *case], repeats)
        walls, out = timed([str(MEMFIT), "fit", *case], repeats)
        counted = re.search(r"(\d[\d,]*) configurations,", out)
        n = f"{int(counted.group(1).replace(',', '')):,}" if counted else "?"
        for name, times in (("one process", alone), ("by default", walls)):
            line(
                f"{label}, {name}",
                times,
                f"{n} configurations; {min(times) - min(floor):.3f} s over memfit --version"
                + (f"; {against(min(walls), FIT_TARGET_S)}" if times is walls else ""),
            )

    print(
        f"(d) {llm_analysis_bench.LLM_ANALYSIS.replace('==', ' ')} on each sweep's "
        "configurations it models too, one fresh process per model"
    )
    python = llm_analysis_bench.bench_python()
    if python is None:
        print("  llm-analysis not available here: (d) and (e) skipped")
        return 0
    ratios: list[tuple[str, float, float, float, float]] = []
    for (label, n, alone, best, result), (_, _, model) in zip(sweeps, CASES, strict=True):
        inputs = llm_analysis_inputs(result)
        m = len(inputs)
        if m == 0:
            print(f"  {label}: none of its {n:,} configurations")
            continue
        run = llm_analysis_bench.run(python, model, inputs, repeats)
        loop = min(run.rounds)
        start_up = run.to_first - run.rounds[0]
        print(
            f"  {label}: {m:,} of the sweep's {n:,} configurations "
            f"({run.failed:,} raise: does not fit)"
        )
        print(
            f"    {'start and imports':38s} {start_up:7.3f} s  "
            f"(its imports {run.imports:.3f} s, timed inside)"
        )
        figures = [
            ("first loop", run.rounds[0]),
            (f"best loop of {repeats}", loop),
            ("end to end (start to first loop)", run.to_first),
        ]
        for name, seconds in figures:
            print(f"    {name:38s} {seconds:7.3f} s  {m / seconds:,.0f} /s")
        theirs_loop, theirs_end = m / loop, m / run.to_first
        ours_alone, ours = n / alone, n / best
        ratios.append(
            (
                label,
                ours_alone / theirs_loop,
                ours_alone / theirs_end,
                ours / theirs_loop,
                ours / theirs_end,
            )
        )

    print(
        "(e) MemFit's configurations/s (the sweep end to end, a fresh process, its whole\n"
        f"    space) over llm-analysis's (target: at least {RATIO_TARGET:g}x): over its best loop\n"
        "    alone (the comparison most generous to it) and over its end to end"
    )
    for label, *four in ratios:
        a_loop, a_end, d_loop, d_end = four
        print(f"  {label:24s} one process: {a_loop:5.2f}x its loop, {a_end:5.2f}x its end to end")
        print(f"  {'':24s} by default:  {d_loop:5.2f}x its loop, {d_end:5.2f}x its end to end")
    return 0


if __name__ == "__main__":
    sys.exit(main())

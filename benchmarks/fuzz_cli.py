"""Fuzzed scenario files, Hugging Face configs and flags through the command line.

Prints, by kind of input, how many cases gave an estimate, a one-line error, a traceback,
a hang or a leak of a file's secret (targets: 0 tracebacks, 0 hangs, 0 leaks), then runs
a sample through the installed ``memfit`` console script in a process of its own, where
the terminal's encoding and the real exit path are in play. The cases are those of
``tests/engine/fuzzing.py``: files, configs, flags and special files, model folders with
hostile safetensors headers (``checkpoint``) and training configs naming hostile paths
(``paths``).

Run: ``python benchmarks/fuzz_cli.py [--cases 30000] [--seed 1] [--processes 200]``.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.engine.fuzzing import KINDS, SECRET, fuzz, make_case, seeds

RESULTS = ("ok", "error", "traceback", "hang", "leak")


def in_processes(count: int, seed: int) -> Counter[str]:
    """``count`` fuzzed command lines, each through the console script in a new process."""
    exe = shutil.which("memfit") or str(Path(sys.executable).parent / "memfit")
    rng = random.Random(seed)
    scenarios, configs = seeds()
    results: Counter[str] = Counter()
    with tempfile.TemporaryDirectory(prefix="memfit-fuzz-") as tmp:
        for _ in range(count):
            _, argv = make_case(rng, scenarios, configs, Path(tmp))
            # a command line is bytes: a lone surrogate goes as the bytes that encode it
            raw = [a.encode("utf-8", "surrogatepass") for a in argv]
            try:
                run = subprocess.run(
                    [exe.encode(), *raw],
                    capture_output=True,
                    timeout=60,
                    check=False,
                    text=True,
                    errors="replace",
                )
            except subprocess.TimeoutExpired:
                results["hang"] += 1
                continue
            lines = run.stderr.splitlines()
            if SECRET in run.stdout or SECRET in run.stderr:
                results["leak"] += 1
                print(f"  leak: {argv!r:.200}")
            elif run.returncode == 0:
                results["ok"] += 1
            elif run.returncode == 2 and len(lines) == 1 and lines[0].startswith("memfit"):
                results["error"] += 1
            else:
                results["traceback"] += 1
                print(f"  traceback: {argv!r:.200} -> {run.stderr[-300:]!r}")
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=30_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--processes", type=int, default=200)
    args = parser.parse_args()

    start = time.perf_counter()
    outcomes = fuzz(args.cases, args.seed)
    took = time.perf_counter() - start
    table = Counter((o.kind, o.result) for o in outcomes)
    print(
        f"fuzzed command lines, in process ({args.cases:,} cases, seed {args.seed}, {took:.0f} s)"
    )
    print(f"  {'input':<10}" + "".join(f"{r:>11}" for r in RESULTS))
    for kind in KINDS:
        print(f"  {kind:<10}" + "".join(f"{table[kind, r]:>11,}" for r in RESULTS))
    totals = Counter(o.result for o in outcomes)
    print(f"  {'all':<10}" + "".join(f"{totals[r]:>11,}" for r in RESULTS))
    for o in outcomes:
        if o.result in ("traceback", "hang", "leak"):
            print(f"  {o.result}: {o.detail}")
    if args.processes:
        start = time.perf_counter()
        sub = in_processes(args.processes, args.seed + 1)
        took = time.perf_counter() - start
        print(f"through the console script ({args.processes} processes, {took:.0f} s)")
        print("  " + "  ".join(f"{r} {sub[r]:,}" for r in RESULTS))
        totals.update({k: v for k, v in sub.items() if k in ("traceback", "hang", "leak")})
    bad = totals["traceback"] + totals["hang"] + totals["leak"]
    print(f"tracebacks + hangs + leaks: {bad} (target 0)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

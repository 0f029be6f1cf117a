"""Fuzzed scenario files, Hugging Face configs, training configs, flags and pasted text
through the command line and the app's import.

Prints, by kind of input, how many cases gave an estimate, a one-line error, an error line
that repeats a long value ("long error"), a traceback, a hang or a leak of a file's secret
(targets: 0 long errors, 0 tracebacks, 0 hangs, 0 leaks), then runs a sample of the
command lines through the installed ``memfit`` console script in a process of its own,
where the terminal's encoding and the real exit path are in play. The cases are those of
``tests/engine/fuzzing.py``: files, configs, flags, pasted text and special files, model
folders with hostile safetensors headers (``checkpoint``) and training configs naming
hostile paths (``paths``).

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

from tests.engine.fuzzing import (
    KINDS,
    LONG_LINE,
    SECRET,
    fuzz,
    make_case,
    one_error,
    seeds,
    train_configs,
)

RESULTS = ("ok", "error", "long error", "traceback", "hang", "leak")
#: the results that are failures
BAD = ("long error", "traceback", "hang", "leak")


def in_processes(count: int, seed: int) -> Counter[str]:
    """``count`` fuzzed command lines, each through the console script in a new process."""
    exe = shutil.which("memfit") or str(Path(sys.executable).parent / "memfit")
    rng = random.Random(seed)
    scenarios, configs = seeds()
    training = train_configs()
    results: Counter[str] = Counter()
    with tempfile.TemporaryDirectory(prefix="memfit-fuzz-") as tmp:
        for _ in range(count):
            kind = "paste"
            while kind == "paste":  # pasted text is the app's, in process only
                kind, argv = make_case(rng, scenarios, configs, Path(tmp), training)
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
            elif run.returncode in (0, 2) and any(len(line) > LONG_LINE for line in lines):
                results["long error"] += 1
                print(f"  long error: {argv!r:.200} -> {max(lines, key=len)[:200]!r}")
            elif run.returncode == 0:
                results["ok"] += 1
            elif run.returncode == 2 and one_error(lines):
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
    print(f"fuzzed cases, in process ({args.cases:,} cases, seed {args.seed}, {took:.0f} s)")
    print(f"  {'input':<14}" + "".join(f"{r:>12}" for r in RESULTS))
    for kind in KINDS:
        print(f"  {kind:<14}" + "".join(f"{table[kind, r]:>12,}" for r in RESULTS))
    totals = Counter(o.result for o in outcomes)
    print(f"  {'all':<14}" + "".join(f"{totals[r]:>12,}" for r in RESULTS))
    for o in outcomes:
        if o.result in BAD:
            print(f"  {o.result}: {o.detail}")
    if args.processes:
        start = time.perf_counter()
        sub = in_processes(args.processes, args.seed + 1)
        took = time.perf_counter() - start
        print(f"through the console script ({args.processes} processes, {took:.0f} s)")
        print("  " + "  ".join(f"{r} {sub[r]:,}" for r in RESULTS))
        totals.update({k: v for k, v in sub.items() if k in BAD})
    bad = sum(totals[r] for r in BAD)
    print(f"long errors + tracebacks + hangs + leaks: {bad} (target 0)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

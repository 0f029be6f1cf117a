"""The desktop bundle's size and its start-up time to the first painted chart.

* size of the one-folder bundle (target: at most 200 MB), its ten largest files and its
  ten largest parts (the entries of ``_internal/``, folders summed);
* start-up to first paint (target: at most 1.5 s), median of 5 runs, for the bundle, the
  one-file executable when there is one, and the source tree. Each run is a new process,
  ``memfit --selftest --first-paint-probe`` (offscreen), which prints ``time.monotonic()``
  when the chart is first painted -- the same event filter as the STARTUP probe of
  ``benchmarks/gui_latency.py``, but timed from before the process is started, so the
  figure includes the bootloader, the interpreter's start and every import. The first run
  of each is reported too; with ``--drop-caches`` (root, Linux) the page cache is emptied
  before every run, for a start from disk.

Build the bundle first (``bash packaging/build.sh``), then run:
``python benchmarks/bundle.py [--bundle dist/memfit] [--drop-caches]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MB = 1_000_000
MIB = 1 << 20
SIZE_TARGET_MB = 200
START_TARGET_S = 1.5
PROBE = ["--selftest", "--first-paint-probe"]


def tree_size(path: Path) -> int:
    """Bytes of the regular files under ``path`` (symlinks not followed nor counted)."""
    if path.is_symlink():
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def size_report(bundle: Path) -> list[str]:
    total = tree_size(bundle)
    verdict = "within" if total <= SIZE_TARGET_MB * MB else "OVER"
    lines = [
        f"bundle {bundle.name}/: {total / MB:.1f} MB ({total / MIB:.1f} MiB), "
        f"{verdict} the {SIZE_TARGET_MB} MB target"
    ]
    files = sorted(
        (p for p in bundle.rglob("*") if p.is_file() and not p.is_symlink()),
        key=lambda p: p.stat().st_size,
        reverse=True,
    )
    lines.append("  largest files:")
    lines += [f"    {p.stat().st_size / MB:7.1f} MB  {p.relative_to(bundle)}" for p in files[:10]]
    inner = bundle / "_internal"
    parts = sorted(
        ((tree_size(p), p) for p in (inner if inner.is_dir() else bundle).iterdir()),
        key=lambda item: item[0],
        reverse=True,
    )
    lines.append("  largest parts (folders summed):")
    lines += [
        f"    {size / MB:7.1f} MB  {p.relative_to(bundle)}{'/' if p.is_dir() else ''}"
        for size, p in parts[:10]
    ]
    return lines


def drop_caches() -> None:
    """Empty the page cache (root on Linux only), so the next start reads from disk."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def first_paint(command: list[str], *, cold: bool) -> tuple[float, float]:
    """(seconds from starting ``command`` to the chart's first paint, process wall time)."""
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    if cold:
        drop_caches()
    start = time.monotonic()
    proc = subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120, check=False
    )
    wall = time.monotonic() - start
    marks = [line for line in proc.stdout.splitlines() if line.startswith("first-paint ")]
    if proc.returncode != 0 or not marks:
        raise RuntimeError(f"{command[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return float(marks[-1].split()[1]) - start, wall


def start_report(name: str, command: list[str], runs: int, *, cold: bool) -> list[str]:
    times = [first_paint(command, cold=cold) for _ in range(runs)]
    paint = [t for t, _ in times]
    median = statistics.median(paint)
    verdict = "within" if median <= START_TARGET_S else "OVER"
    return [
        f"{name}: start to first paint median {median:.3f} s over {runs} runs "
        f"({verdict} the {START_TARGET_S} s target); first run {paint[0]:.3f} s, "
        f"range {min(paint):.3f}-{max(paint):.3f} s; "
        f"process wall time (with quitting) {statistics.median(w for _, w in times):.3f} s"
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, default=ROOT / "dist" / "memfit")
    parser.add_argument("--onefile", type=Path, default=ROOT / "dist" / "onefile" / "memfit")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--drop-caches", action="store_true", help="empty the page cache before each run (root)"
    )
    args = parser.parse_args()
    executable = args.bundle / ("memfit.exe" if sys.platform == "win32" else "memfit")
    if not executable.is_file():
        print(f"no bundle at {args.bundle}; build it with: bash packaging/build.sh")
        return 2
    cache = "page cache emptied before each run" if args.drop_caches else "warm page cache"
    print(f"MemFit desktop bundle ({os.cpu_count()} CPUs, offscreen, {cache})")
    for line in size_report(args.bundle):
        print(line)
    targets = [("bundle (one folder)", [str(executable), *PROBE])]
    if args.onefile.is_file():
        targets.append(("bundle (one file)", [str(args.onefile), *PROBE]))
    targets.append(
        (
            "source (python -m memfit.gui.launcher)",
            [sys.executable, "-m", "memfit.gui.launcher", *PROBE],
        )
    )
    for name, command in targets:
        for line in start_report(name, command, args.runs, cold=args.drop_caches):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

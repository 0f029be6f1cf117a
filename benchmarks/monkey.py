"""A monkey test of the app: N seeded random real-widget actions on the main window.

Spin boxes get typed values (in range, out of range, junk) and Enter, combos and check
boxes their keys, plus the what-if toggles, undo/redo, New, Open (valid and invalid files),
Save and ghost apply; paste, drop (text, files, model folders) and File > Import of
scenarios, configs, training configurations, junk, deep nesting, huge integers, markup
and configurations naming files outside their folder; the Tradeoffs tab; markup typed
into the GPU name. File dialogs are stubbed and message boxes and the read-as prompt
answered at random (:mod:`memfit.gui.monkey`). After every action it checks that every visible
field shows the scenario's value (or a rejected value with its error), that the chart is
stale exactly when the scenario has no valid estimate, that no label, tooltip, chart text,
message box or prompt renders a user's markup, and that no named file's content is shown.
It prints the slowest actions too, each with the scenario it left: a state where the app
is slow shows there; and the longest pause of Python's cycle collector, with the collector
run as the app runs it (:mod:`memfit.gui.collector`), or left to itself
(``--no-collector``: the pauses grow with what the engine's caches hold).

Run: ``QT_QPA_PLATFORM=offscreen python benchmarks/monkey.py [ACTIONS] [--seed N]
[--no-collector]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("actions", nargs="?", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--show", type=int, default=5, help="problems to print of each kind")
    parser.add_argument(
        "--no-collector",
        action="store_true",
        help="leave Python's cycle collector to itself, not as the app runs it",
    )
    args = parser.parse_args()

    from memfit.gui.app import make_app
    from memfit.gui.monkey import run_monkey

    make_app()
    with tempfile.TemporaryDirectory(prefix="memfit-monkey-") as folder:
        report = run_monkey(args.actions, args.seed, Path(folder), collector=not args.no_collector)
    rate = report.actions / report.seconds if report.seconds else float("inf")
    print(f"MemFit monkey (seed {args.seed}, offscreen, 1280x800)")
    print(f"  actions:             {report.actions:,}")
    print(f"  actions/s:           {rate:,.1f}  ({report.seconds:.1f} s)")
    how = "left to itself" if args.no_collector else "as the app runs it"
    print(f"  longest collection:  {report.longest_collection:.3f} s (the collector {how})")
    for title, problems in report.problems().items():
        print(f"  {title + ':':<21}{len(problems)}")
    print(f"  message boxes:       {report.message_boxes:,}")
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(report.kinds.items(), key=lambda kv: -kv[1]))
    print(f"  by kind:             {kinds}")
    for seconds, number, name, scenario in report.slowest:
        print(f"  slowest: {seconds:6.2f} s  action {number:,} ({name}), leaving {scenario}")
    for title, problems in report.problems().items():
        for problem in problems[: args.show]:
            print(f"--- {title}:\n{problem}")
    return 1 if any(report.problems().values()) else 0


if __name__ == "__main__":
    sys.exit(main())

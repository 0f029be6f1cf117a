"""Record the engine's answers to a fixed set of scenarios, or compare today's with them.

The set (``tests/golden/golden.json.gz``, :mod:`tests.engine.golden`): every model preset
on one H100 (default training, LoRA, and ZeRO-3 on 8 GPUs) and ``--random`` scenarios
drawn from ``--seed`` that estimate, with the refused draws on the way; for each, every
item and total of the estimate, every rank group, the timeline's highest point, the step
time with every term and, for every tenth random one, the batched totals and step times
at six shapes.

Run:

* ``python benchmarks/golden.py record [--random 2000] [--seed 1] [--out PATH]`` --
  records the set (the same code writes the same bytes);
* ``python benchmarks/golden.py compare [--golden PATH]`` -- recomputes every recorded
  scenario and prints how many answer the same, and each field that differs with its
  count and first few scenarios (old -> new); exit status 0 only when all are the same.

Both print how many scenarios per second they went through.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.engine.golden import GOLDEN, compare, dump, load, record, report


def _record(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    recorded = record(args.random, args.seed)
    seconds = time.perf_counter() - start
    data = dump(recorded.golden)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(data)
    entries = recorded.golden["scenarios"]
    presets = sum(e["kind"] != "random" for e in entries)
    refused = Counter(e["answer"]["refused"]["field"] for e in entries if "refused" in e["answer"])
    batched = sum("batch" in e["answer"] for e in entries)
    print(
        f"recorded {len(entries):,} scenarios in {seconds:.1f} s ({len(entries) / seconds:,.0f}/s)"
    )
    print(f"  {presets} preset scenarios, {recorded.drawn:,} random draws from seed {args.seed}:")
    print(
        f"  {args.random:,} estimated, {recorded.refused:,} refused; {batched} with batched shapes"
    )
    print(f"  refusals by field: {', '.join(f'{k} {v}' for k, v in refused.most_common())}")
    print(f"  {args.out}: {len(data):,} bytes")
    return 0


def _compare(args: argparse.Namespace) -> int:
    golden = load(args.golden)
    entries = golden["scenarios"]
    start = time.perf_counter()
    found = compare(golden)
    seconds = time.perf_counter() - start
    changed = len({d.scenario for d in found})
    print(
        f"compared {len(entries):,} scenarios in {seconds:.1f} s "
        f"({len(entries) / seconds:,.0f}/s): {len(entries) - changed:,} identical, "
        f"{changed:,} differ ({len(found):,} fields)"
    )
    for line in report(golden, found):
        print(line)
    return 0 if not found else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="record the golden set")
    rec.add_argument("--random", type=int, default=2000, help="random scenarios that estimate")
    rec.add_argument("--seed", type=int, default=1, help="the seed of the random draws (1)")
    rec.add_argument("--out", type=Path, default=GOLDEN, help="where to write the set")
    cmp = commands.add_parser("compare", help="compare today's answers with the golden set")
    cmp.add_argument("--golden", type=Path, default=GOLDEN, help="the golden set to check")
    args = parser.parse_args(argv)
    return _record(args) if args.command == "record" else _compare(args)


if __name__ == "__main__":
    sys.exit(main())

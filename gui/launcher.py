"""The ``memfit`` console script: the app with no arguments, the CLI with any.

Only the no-argument path imports Qt, so ``memfit estimate ...`` works where no display
or Qt library is available.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args:
        from engine.cli import main as cli_main

        return cli_main(args)
    try:
        from gui.app import run
    except ImportError as exc:  # Qt libraries missing on this machine
        print(f"memfit: error: the desktop app cannot start: {exc}", file=sys.stderr)
        return 2
    return run()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

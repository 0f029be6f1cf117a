"""The ``memfit`` console script: the app with no arguments, the CLI with any, and
``memfit --selftest [DIR]`` (:mod:`memfit.gui.selftest`), the app's headless self-test.

Only the no-argument and ``--selftest`` paths import Qt, so ``memfit estimate ...`` works
where no display or Qt library is available.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--selftest":
        try:
            from memfit.gui.selftest import main as selftest_main
        except ImportError as exc:  # Qt libraries missing on this machine
            print(f"memfit: error: the self-test cannot start: {exc}", file=sys.stderr)
            return 2
        return selftest_main(args[1:])
    if args:
        from memfit.engine.cli import main as cli_main

        return cli_main(args)
    try:
        from memfit.gui.app import run
    except ImportError as exc:  # Qt libraries missing on this machine
        print(f"memfit: error: the desktop app cannot start: {exc}", file=sys.stderr)
        return 2
    return run()


#: the exit status of a command stopped by Ctrl+C (128 + SIGINT, as a shell reports it)
INTERRUPTED = 130


def console() -> None:
    """The ``memfit`` console script: :func:`main`, then the process ends. After a CLI
    command it ends at once (:func:`end`), where the interpreter would tear itself down
    first. Ctrl+C stops it with a line, not a traceback, and status :data:`INTERRUPTED`."""
    try:
        code = main()
    except KeyboardInterrupt:
        print("memfit: interrupted", file=sys.stderr)
        code = INTERRUPTED
    if sys.argv[1:2] and sys.argv[1] != "--selftest":
        end(code)
    sys.exit(code)


def end(code: int) -> None:
    """End the process with ``code`` once its exit handlers have run and its output is
    flushed (what they write too), without the interpreter's teardown: that frees the
    engine's objects one by one (after a planning command its caches hold hundreds of
    thousands, and the teardown took a twentieth of a ``memfit fit``) and writes nothing
    a user sees."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (``| head``)
            stream.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    console()

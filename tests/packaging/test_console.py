"""The ``memfit`` console script (``memfit.gui.launcher:console``): a CLI command's process
ends without the interpreter's teardown, its output whole, its exit code and its exit
handlers kept."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: the console script as the installed one runs it, with an exit handler that says it ran
#: and a flag set where the interpreter's teardown runs (a module's finalizer)
CONSOLE = """
import atexit, sys
atexit.register(lambda: print("exit handler ran", file=sys.stderr))
#: stdout


class Teardown:
    def __del__(self):
        print("teardown ran", file=sys.stderr)

sys.modules["__main__"].teardown = Teardown()
sys.argv[0] = "memfit"
from memfit.gui.launcher import console
console()
"""


#: an exit handler that writes to stdout (buffered: flushed after the handlers run)
AT_EXIT = 'atexit.register(lambda: print("written at exit"))'


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CONSOLE.replace("#: stdout", AT_EXIT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_installed_script_is_console() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["scripts"]["memfit"] == "memfit.gui.launcher:console"
    assert "console()" in (ROOT / "packaging" / "entry.py").read_text(encoding="utf-8")


def test_a_command_ends_without_teardown_its_output_whole() -> None:
    proc = run("estimate", "--model", "llama-3-8b", "--gpu", "h100-sxm-80gb", "--json")
    assert proc.returncode == 0, proc.stderr
    document, _, after = proc.stdout.rpartition("}\n")
    data = json.loads(document + "}")  # the whole document, flushed before the end
    assert after == "written at exit\n"
    assert data["device_bytes"] > data["capacity_bytes"] > 0
    assert "exit handler ran" in proc.stderr
    assert "teardown ran" not in proc.stderr


def test_an_error_keeps_its_exit_code() -> None:
    proc = run("estimate", "--model", "llama-3-8b", "--gpu", "h100-sxm-80gb", "--batch", "0")
    assert proc.returncode == 2
    assert "micro_batch_size" in proc.stderr
    assert "exit handler ran" in proc.stderr


def test_a_closed_pipe_is_not_an_error() -> None:
    command = [sys.executable, "-c", CONSOLE, "sweep", "--model", "gpt2", "--gpu", "l4"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.readline()  # the CSV's header, then the reader goes away
        proc.stdout.close()
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=120)
    assert code == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_the_app_and_argparse_exits_keep_the_interpreters_end() -> None:
    """``--version`` ends in argparse (``SystemExit``): the usual way, its teardown run."""
    proc = run("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("MemFit ")
    assert "teardown ran" in proc.stderr


def test_ctrl_c_stops_a_command_with_a_line_not_a_traceback() -> None:
    """A command stopped by Ctrl+C (a sweep's processes stop with it) says so in one line
    and ends with a shell's status for SIGINT, its exit handlers run."""
    stopped = "import memfit.engine.cli as cli\ndef main(*_):\n    raise KeyboardInterrupt\n"
    script = CONSOLE.replace("#: stdout", stopped + "cli.main = main")
    proc = subprocess.run(
        [sys.executable, "-c", script, "sweep", "--model", "gpt2", "--gpu", "l4"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 130
    assert "memfit: interrupted" in proc.stderr and "Traceback" not in proc.stderr
    assert "exit handler ran" in proc.stderr

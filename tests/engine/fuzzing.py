"""Fuzzed input for the command line: scenario files, Hugging Face configs and flags.

Each case starts from a real input -- a scenario of the validation datasets, a preset
scenario, a ``config.json`` -- and is mutated the way hostile or careless input is: a
value replaced by one of the wrong type or out of range, a key dropped or added, strings
that are not text, numbers no float holds, nesting deeper than a parser allows, and files
that are not files at all (a FIFO, ``/dev/zero``, a directory, truncated or binary
bytes). :func:`run_case` runs one through :func:`engine.cli.main` in this process under a
time limit and sorts the outcome:

* ``ok`` -- an estimate (exit 0);
* ``error`` -- exit 2 with exactly one line on stderr, ``memfit: error: ...``;
* ``traceback`` -- any exception that escaped, or an error that is not one line;
* ``hang`` -- over the time limit.

``benchmarks/fuzz_cli.py`` runs tens of thousands of cases and prints the counts;
``tests/engine/test_fuzz.py`` runs a few hundred on every CI run.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import random
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.cli import main
from engine.presets import gpu_names, model_names

DATA = Path(__file__).resolve().parent.parent / "validation"
KINDS = ("file", "config", "flags", "special")

#: values that are wrong somewhere: other types, edges, non-text, non-numbers
JUNK: tuple[Any, ...] = (
    None, True, False, 0, -1, 1, 3, 7, 64, 2**31, 2**63, -(2**63), 10**30, 0.5, -0.0,
    1e308, -1e308, 1e-308, float("nan"), float("inf"), float("-inf"), "", " ", "64", "1e3",
    "false", "true", "no", "none", "null", "NaN", "\ud800", "a\udfffb", "\x1b[31mred\x1b[0m",
    "\x00", "line\nbreak", "<img src=x onerror=alert(1)>", "<b>bold</b>", "é漢字🙂", "x" * 5000,
    [], [1, 2], ["q_proj", 3], {}, {"a": 1}, {"preset": "gpt2"}, [[[]]],
)  # fmt: skip
#: JSON texts no value of :data:`JUNK` can stand for
RAW_JUNK = (
    "9" * 5000,  # an integer Python refuses to convert (over 4,300 digits)
    "[" * 20000 + "]" * 20000,  # nesting deeper than the recursion limit
    "1e999",
    "-1e999",
    '"\\ud800"',
)
KEYS = ("bogus", "", "preset", "spec", "model_type", "gpu", "training", "\ud800", "\x1b[2J")
FLAGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("--model", ("gpt2", "llama-3-8b", "nope", "", "\ud800", "../../etc/passwd")),
    ("--gpu", ("h100-sxm-80gb", "l4", "custom", "nope", "")),
    ("--batch", ("1", "0", "-3", "abc", "1e3", "99999999999999999999")),
    ("--seq", ("512", "0", "16777217", "x")),
    ("--memory-gib", ("24", "nan", "inf", "-1", "1e308", "0")),
    ("--host-memory-gib", ("512", "nan", "-5")),
    ("--budget", ("0.85", "2", "nan", "-1")),
    ("--method", ("full", "lora", "qlora", "freeze", "dora")),
    ("--precision", ("bf16-mixed", "fp32", "fp64")),
    ("--tp", ("1", "2", "3", "8", "0", "-1", "65537")),
    ("--pp", ("1", "2", "4", "1024", "0")),
    ("--cp", ("1", "2", "3")),
    ("--ep", ("1", "2", "8")),
    ("--zero", ("0", "1", "2", "3", "4")),
    ("--gpus-per-node", ("1", "8", "0", "65")),
    ("--nodes", ("1", "2", "0", "100001")),
    ("--rank", ("16", "0", "99999")),
    ("--targets", ("q_proj,v_proj", "all-linear", ",", "bogus")),
    ("--grad-accum", ("1", "8", "0", "2000000")),
    ("--checkpointing", ("none", "full", "selective", "every-k-layers")),
    ("--offload-optimizer", ("none", "cpu", "nvme")),
    ("--set", (
        "training.qlora.block_size=\"64\"", "training.qlora.block_size=64",
        "hardware.memory_gib=NaN", "hardware.memory_gib=1e308", "training=3",
        "training.lora.targets=[\"q_proj\", 3]", "model.preset=[1]", "a.b.c=1", "=1", "nothing",
        "training.parallelism.pp_schedule=\"interleaved-1f1b\"",
        "training.parallelism.vpp=2", "training.micro_batch_size=" + "9" * 5000,
        "training.micro_batch_size=" + "[" * 5000, "hardware.gpu=\"\\u001b[31m\"",
        "training.parallelism.expert_capacity_factor=1.37",
    )),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: str  # file | config | flags | special
    result: str  # ok | error | traceback | hang
    detail: str = ""


class _Timeout(Exception):
    pass


def seeds() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Scenario dicts and ``config.json`` dicts to mutate: every scenario of the validation
    datasets, and the Hugging Face configs inside them."""
    scenarios: list[dict[str, Any]] = []
    for name in ("dataset.json", "dataset_multi.json", "published.json"):
        for case in json.loads((DATA / name).read_text(encoding="utf-8")):
            scenarios.append(case["scenario"])
    configs = [s["model"] for s in scenarios if "preset" not in s["model"]]
    return scenarios, configs


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, (*prefix, i))


def _at(node: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        node = node[key]
    return node


def mutate(data: Any, rng: random.Random) -> Any:
    """A few random mutations of a deep copy of ``data``."""
    data = copy.deepcopy(data)
    for _ in range(rng.randint(1, 3)):
        paths = list(_paths(data))
        path = rng.choice(paths)
        if not path:
            if rng.random() < 0.2:
                data = rng.choice(JUNK)
            continue
        parent, key = _at(data, path[:-1]), path[-1]
        roll = rng.random()
        if roll < 0.55:
            parent[key] = copy.deepcopy(rng.choice(JUNK))
        elif roll < 0.7 and isinstance(parent, dict):
            del parent[key]
        elif roll < 0.85 and isinstance(parent, dict):
            parent[rng.choice(KEYS)] = copy.deepcopy(rng.choice(JUNK))
        else:
            value = parent[key]
            parent[key] = [value] if rng.random() < 0.5 else str(value)
    return data


def _text(data: Any, rng: random.Random) -> bytes:
    """The JSON of ``data`` (NaN and Infinity included, as Python writes them), sometimes
    corrupted: one value swapped for raw junk, truncated, a BOM, bytes that are not UTF-8."""
    try:
        text = json.dumps(data)
    except (ValueError, RecursionError):
        text = "{}"
    roll = rng.random()
    if roll < 0.1:
        text = text.replace("1", rng.choice(RAW_JUNK), 1)
    elif roll < 0.15:
        text = text[: rng.randrange(len(text) + 1)]
    raw = text.encode("utf-8", "surrogatepass")
    roll = rng.random()
    if roll < 0.05:
        raw = b"\xef\xbb\xbf" + raw
    elif roll < 0.08:
        raw = raw.replace(b'"', b"\xff", 1)
    elif roll < 0.1:
        raw = raw + b"\x00"
    return raw


def special_file(folder: Path, rng: random.Random) -> str:
    """A path that is not an ordinary small JSON file."""
    choice = rng.randrange(8)
    path = folder / f"special{rng.randrange(10**9)}.json"
    if choice == 0:
        os.mkfifo(path)
    elif choice == 1:
        return "/dev/zero"
    elif choice == 2:
        path.mkdir()
    elif choice == 3:
        path.symlink_to(path)  # a loop
    elif choice == 4:
        path.write_bytes(b"")
    elif choice == 5:
        path.write_bytes(b" " * (5 << 20))
    elif choice == 6:
        path.write_bytes(bytes(rng.randrange(256) for _ in range(200)))
    else:
        return str(folder / "missing.json")
    return str(path)


def make_case(
    rng: random.Random,
    scenarios: list[dict[str, Any]],
    configs: list[dict[str, Any]],
    folder: Path,
) -> tuple[str, list[str]]:
    """One fuzzed command line and its kind."""
    kind = rng.choices(KINDS, weights=(5, 2, 3, 0.3))[0]
    json_flag = ["--json"] if rng.random() < 0.5 else []
    path = folder / f"case{rng.randrange(10**9)}.json"
    if kind == "file":
        path.write_bytes(_text(mutate(rng.choice(scenarios), rng), rng))
        return kind, ["estimate", "--scenario", str(path), *json_flag]
    if kind == "config":
        path.write_bytes(_text(mutate(rng.choice(configs), rng), rng))
        gpu = rng.choice(gpu_names())
        return kind, ["estimate", "--model-config", str(path), "--gpu", gpu, *json_flag]
    if kind == "special":
        flag = rng.choice(["--scenario", "--model-config"])
        return kind, ["estimate", flag, special_file(folder, rng), "--gpu", "l4"]
    argv = ["estimate", "--model", rng.choice(model_names()), "--gpu", rng.choice(gpu_names())]
    for _ in range(rng.randint(1, 6)):
        flag, values = rng.choice(FLAGS)
        argv += [flag, rng.choice(values)]
    return kind, argv + json_flag


def run_case(kind: str, argv: list[str], limit_s: float = 10.0) -> Outcome:
    """Run one command line in this process; see the module docstring for the outcomes."""
    out, err = io.StringIO(), io.StringIO()

    def alarm(_signum: int, _frame: object) -> None:
        raise _Timeout

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        with contextlib.redirect_stderr(err):
            code = main(argv, out=out)
    except _Timeout:
        return Outcome(kind, "hang", " ".join(argv)[:300])
    except SystemExit as exc:  # argparse: a usage error
        code = exc.code if isinstance(exc.code, int) else 2
    except BaseException as exc:
        return Outcome(kind, "traceback", f"{type(exc).__name__}: {exc!s:.200} <- {argv!r:.300}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    if code == 0:
        return Outcome(kind, "ok")
    lines = err.getvalue().splitlines()
    if code == 2 and len(lines) == 1 and lines[0].startswith("memfit"):
        return Outcome(kind, "error", lines[0][:200])
    return Outcome(kind, "traceback", f"exit {code}, stderr {err.getvalue()!r:.300}")


def fuzz(cases: int, seed: int = 1, limit_s: float = 10.0) -> list[Outcome]:
    """Run ``cases`` fuzzed command lines; the outcomes in order."""
    rng = random.Random(seed)
    scenarios, configs = seeds()
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="memfit-fuzz-") as tmp:
        folder = Path(tmp)
        for _ in range(cases):
            kind, argv = make_case(rng, scenarios, configs, folder)
            outcomes.append(run_case(kind, argv, limit_s))
            for leftover in folder.iterdir():  # keep the folder small
                if leftover.is_dir() and not leftover.is_symlink():
                    leftover.rmdir()
                else:
                    leftover.unlink()
    return outcomes

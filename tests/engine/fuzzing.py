"""Fuzzed input for the command line and the app's import: files, configs, flags, text.

Each case starts from a real input -- a scenario of the validation datasets, a preset
scenario, a ``config.json``, a training config of ``tests/fixtures/train_configs`` -- and
is mutated the way hostile or careless input is: a value replaced by one of the wrong type
or out of range, a key dropped, added or given twice, strings that are not text or run to
5,000 characters, integers of 309 to 4,000 digits (no float holds them), nesting of a few
hundred levels (which parses) and of tens of thousands (which does not), and files that
are not files at all (a FIFO, ``/dev/zero``, a directory, truncated or binary bytes).

The kinds of case (:data:`KINDS`):

* ``file`` -- a scenario file, ``memfit estimate --scenario``;
* ``config`` -- a ``config.json``, ``--model-config``;
* ``flags`` -- every flag of ``memfit estimate`` that takes a value, with values in and out
  of range, and 5,000-character ones;
* ``special`` -- a path that is not a small regular file;
* ``train-config`` -- a training config (YAML or JSON), ``--from-config``;
* ``paste`` -- text pasted into the app: :func:`memfit.engine.imports.import_text`, in process.

:func:`run_case` runs one in this process under a time limit and sorts the outcome:

* ``ok`` -- an estimate (exit 0), or an import;
* ``error`` -- exit 2 with one line on stderr, ``memfit: error: ...``, after the notes of a
  training config read first, if any (for a paste, an ``EstimateError``);
* ``long error`` -- a message line (an error or a note) over :data:`LONG_LINE`
  characters: a value repeated whole;
* ``traceback`` -- any exception that escaped, or an error that is not one line;
* ``hang`` -- over the time limit;
* ``leak`` -- the output holds :data:`SECRET`, the content of a file MemFit must never
  show (a hub token a training config names).

Two kinds build folders: ``checkpoint`` -- model folders (some laid out as a snapshot of
the hub cache) whose safetensors headers are mutated: absurd shapes, odd dtypes, lengths
that claim more than the file, headers near their bound, files that are FIFOs, devices or
links out of the folder -- run through ``memfit checkpoint``; ``paths`` -- training
configs whose DeepSpeed config path is hostile: absolute, ``../`` out of the folder, a
link out, a FIFO, ``/dev/zero``, or a file inside the folder whose content is the secret.

``benchmarks/fuzz_cli.py`` runs tens of thousands of cases and prints the counts;
``tests/engine/test_fuzz.py`` runs a few hundred on every CI run.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import math
import os
import random
import shutil
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from memfit.engine.cli import main, make_parser
from memfit.engine.errors import EstimateError
from memfit.engine.imports import import_text
from memfit.engine.presets import gpu_names, model_names
from memfit.engine.scenario_io import scenario_from_dict

DATA = Path(__file__).resolve().parent.parent / "validation"
TRAIN_CONFIGS = Path(__file__).resolve().parent.parent / "fixtures" / "train_configs"
KINDS = (
    "file", "config", "flags", "special", "train-config", "paste", "checkpoint", "paths",
)  # fmt: skip
#: the longest message line that is not a value repeated whole (the longest list of
#: accepted values, the model families MemFit reads, makes a line of about 470)
LONG_LINE = 500
#: integers of 309, 400 and 4,000 digits: no float holds them
HUGE = (10**308, -(10**399), 10**3999)
#: the levels of nesting that parses (under Python's recursion limit of 1,000)
DEEP = (300, 990)
#: the content of a file no output may ever show (see the ``leak`` outcome)
SECRET = "hf_FuzzedSecretToken0123456789abcdefXYZ"

#: values that are wrong somewhere: other types, edges, non-text, non-numbers, text at
#: and over the longest a name may be (2,000 characters)
JUNK: tuple[Any, ...] = (
    None, True, False, 0, -1, 1, 3, 7, 64, 2**31, 2**63, -(2**63), 10**30, *HUGE, 0.5, -0.0,
    1e308, -1e308, 1e-308, float("nan"), float("inf"), float("-inf"), "", " ", "64", "1e3",
    "false", "true", "no", "none", "null", "NaN", "\ud800", "a\udfffb", "\x1b[31mred\x1b[0m",
    "\x00", "line\nbreak", "<img src=x onerror=alert(1)>", "<b>bold</b>", "é漢字🙂", "x" * 5000,
    "x " * 2500, "y" * 2000, [], [1, 2], ["q_proj", 3], {}, {"a": 1}, {"preset": "gpt2"}, [[[]]],
)  # fmt: skip
#: JSON texts no value of :data:`JUNK` can stand for
RAW_JUNK = (
    "9" * 5000,  # an integer Python refuses to convert (over 4,300 digits)
    "[" * 20000 + "]" * 20000,  # nesting deeper than the recursion limit
    *("[" * n + "]" * n for n in DEEP),  # nesting that parses
    *('{"a": ' * n + "1" + "}" * n for n in DEEP),
    "1e999",
    "-1e999",
    '"\\ud800"',
)
#: flag values that are long: text, text with spaces, digits, an integer no float holds
LONG_VALUES = ("x" * 5000, "x " * 2500, "9" * 5000, "1" + "0" * 400, "\x1b[2J" * 1000)
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
    ("--last-layers", ("0", "2", "12", "13", "100", "4096", "4097")),
    ("--read-as", ("llama", "gpt2", "bogus")),
    ("--set", (
        "training.qlora.block_size=\"64\"", "training.qlora.block_size=64",
        "hardware.memory_gib=NaN", "hardware.memory_gib=1e308", "training=3",
        "training.lora.targets=[\"q_proj\", 3]", "model.preset=[1]", "a.b.c=1", "=1", "nothing",
        "training.parallelism.pp_schedule=\"interleaved-1f1b\"",
        "training.parallelism.vpp=2", "training.micro_batch_size=" + "9" * 5000,
        "training.micro_batch_size=" + "[" * 5000, "hardware.gpu=\"\\u001b[31m\"",
        "training.parallelism.expert_capacity_factor=1.37",
        *(f"training.lora.alpha={n}" for n in HUGE), *(f"hardware.memory_gib={n}" for n in HUGE),
        *(f"training.lora.targets={'[' * n + ']' * n}" for n in DEEP),
        "model.spec.expert_shards=2", "model={\"preset\": \"gpt2\", \"preset\": \"gpt2\"}",
        "x" * 5000 + "=1", "training." + "x" * 5000 + "=1",
    )),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: str  # one of KINDS
    result: str  # ok | error | long error | traceback | hang
    detail: str = ""


class _Timeout(Exception):
    pass


@functools.cache
def value_flags() -> dict[str, Any]:
    """Every flag of ``memfit estimate`` that takes a value, with its argparse action."""
    sub = next(a for a in make_parser()._actions if a.dest == "command")
    parser = sub.choices["estimate"]  # type: ignore[index]
    return {
        a.option_strings[-1]: a
        for a in parser._actions
        if a.option_strings and a.nargs != 0 and a.dest != "help"
    }


#: the values tried for a flag :data:`FLAGS` does not list, by the flag's type
_BY_TYPE: dict[Any, tuple[str, ...]] = {
    int: ("1", "2", "0", "-1", "abc", "99999999999999999999"),
    float: ("0.5", "1", "0", "-1", "nan", "inf", "1e308"),
}


def flag_value(flag: str, action: Any, rng: random.Random, folder: Path) -> str:
    """A value for ``flag``: one of :data:`FLAGS`, a choice, one by type, a path for a
    file flag, and now and then a 5,000-character one."""
    if rng.random() < 0.12:
        return rng.choice(LONG_VALUES)
    listed = dict(FLAGS).get(flag)
    if listed:
        return rng.choice(listed)
    if action.choices:
        return str(rng.choice([*action.choices, "bogus", ""]))
    if flag in ("--scenario", "--model-config", "--from-config"):
        return str(folder / "missing.json")
    if flag == "--save":
        return str(folder / f"saved{rng.randrange(10**9)}.memfit.json")
    return rng.choice(_BY_TYPE.get(action.type, ("x", "", "\ud800")))


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


def train_configs() -> list[tuple[str, dict[str, Any]]]:
    """The training configs to mutate: (suffix, parsed mapping) of each fixture."""
    out = []
    for path in sorted(TRAIN_CONFIGS.iterdir()):
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        out.append((path.suffix, data))
    return out


def _nest(levels: int) -> str:
    return "[" * levels + "]" * levels


def config_text(suffix: str, data: Any, rng: random.Random) -> str:
    """A training config written as YAML or JSON (as its suffix says), sometimes made
    hostile as text: a key given twice, an integer of thousands of digits, nesting that
    parses (a few hundred levels) or does not (tens of thousands), a 5,000-character key
    or value."""
    if suffix == ".json":
        try:
            text = json.dumps(data, indent=1)
        except (ValueError, RecursionError):
            text = "{}"
    else:
        try:
            text = yaml.safe_dump(data, allow_unicode=True, sort_keys=False)
        except yaml.YAMLError:
            text = "{}"
    roll = rng.random()
    if roll < 0.5 or not isinstance(data, dict) or not data:
        return text
    key = str(rng.choice(list(data)))
    hostile = rng.choice(
        [
            f"{key}: 1",  # a duplicate of a top-level key
            f"{key}: {rng.choice(HUGE)}",
            f"lora_alpha: {rng.choice(HUGE)}",
            f"deep: {_nest(rng.choice(DEEP))}",
            f"deep: {_nest(20000)}",
            f"{'x' * 5000}: 1",
            f"optimizer: {'x' * 5000}",
        ]
    )
    if suffix == ".json":  # the same, as the first pair of the object
        name, _, value = hostile.partition(": ")
        value = value if value[:1] in "-0123456789[" else json.dumps(value)
        return "{" + json.dumps(name) + ": " + value + ",\n" + text.lstrip()[1:]
    return text + hostile + "\n"


def paste_text(
    rng: random.Random,
    scenarios: list[dict[str, Any]],
    configs: list[dict[str, Any]],
    training: list[tuple[str, dict[str, Any]]],
) -> str:
    """Text pasted into the app: a scenario, a ``config.json`` or a training config,
    mutated, sometimes hostile as text (see :func:`config_text`)."""
    roll = rng.random()
    if roll < 0.3:
        return _text(mutate(rng.choice(scenarios), rng), rng).decode("utf-8", "replace")
    if roll < 0.5:
        return _text(mutate(rng.choice(configs), rng), rng).decode("utf-8", "replace")
    suffix, data = rng.choice(training)
    return config_text(suffix, mutate(data, rng), rng)


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
    training: list[tuple[str, dict[str, Any]]] | None = None,
) -> tuple[str, list[str]]:
    """One fuzzed case and its kind: a command line, or for ``paste`` the text alone."""
    training = training if training is not None else train_configs()
    kind = rng.choices(KINDS, weights=(5, 2, 3, 0.3, 2, 1.5, 1, 1))[0]
    if kind == "checkpoint":
        return kind, checkpoint_case(rng, folder / f"ckpt{rng.randrange(10**9)}")
    if kind == "paths":
        return kind, paths_case(rng, folder / f"paths{rng.randrange(10**9)}")
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
        flag = rng.choice(["--scenario", "--model-config", "--from-config"])
        argv = ["estimate", flag, special_file(folder, rng), "--gpu", "l4"]
        return kind, argv + (["--model", "gpt2"] if flag == "--from-config" else [])
    if kind == "train-config":
        suffix, data = rng.choice(training)
        path = path.with_suffix(suffix)
        path.write_bytes(
            config_text(suffix, mutate(data, rng), rng).encode("utf-8", "surrogatepass")
        )
        model = ["--model", rng.choice(model_names())] if rng.random() < 0.7 else []
        return kind, ["estimate", "--from-config", str(path), *model, "--gpu", "h100-sxm-80gb"]
    if kind == "paste":
        return kind, [paste_text(rng, scenarios, configs, training)]
    argv = ["estimate", "--model", rng.choice(model_names()), "--gpu", rng.choice(gpu_names())]
    flags = value_flags()
    for _ in range(rng.randint(1, 6)):
        flag = rng.choice([*dict(FLAGS), *flags])
        argv += [flag, flag_value(flag, flags[flag], rng, folder)]
    return kind, argv + json_flag


def one_error(lines: list[str]) -> bool:
    """Whether stderr's ``lines`` are one error: a ``memfit: error:`` line (``memfit
    estimate: error:`` from argparse), after the notes of a training config read before
    the error, if any."""
    return (
        bool(lines)
        and lines[-1].startswith("memfit")
        and ": error: " in lines[-1]
        and all(line.startswith("memfit: note: ") for line in lines[:-1])
    )


_PASTE_BASE = {"memfit_scenario": 1, "model": {"preset": "gpt2"}, "hardware": {"gpu": "l4"}}


def _paste(text: str) -> Outcome:
    """Pasted text through the app's import; see the module docstring for the outcomes."""
    try:
        imported = import_text(text, scenario_from_dict(_PASTE_BASE))
    except EstimateError as exc:
        message = str(exc)
        if len(message) > LONG_LINE or "\n" in message:
            return Outcome("paste", "long error", message[:200])
        return Outcome("paste", "error", message[:200])
    long = [m for m in imported.messages if len(m) > LONG_LINE]
    return Outcome("paste", "long error", long[0][:200]) if long else Outcome("paste", "ok")


def run_case(kind: str, argv: list[str], limit_s: float = 10.0) -> Outcome:
    """Run one case in this process; see the module docstring for the outcomes."""
    out, err = io.StringIO(), io.StringIO()

    def alarm(_signum: int, _frame: object) -> None:
        raise _Timeout

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        with contextlib.redirect_stderr(err):
            if kind == "paste":
                return _paste(argv[0])
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
    if SECRET in out.getvalue() or SECRET in err.getvalue():
        return Outcome(kind, "leak", " ".join(argv)[:300])
    lines = err.getvalue().splitlines()
    long = [line for line in lines if len(line) > LONG_LINE]
    if long and code in (0, 2):
        return Outcome(kind, "long error", f"{len(long[0]):,} characters: {long[0][:200]}")
    if code == 0:
        return Outcome(kind, "ok")
    if code == 2 and one_error(lines):
        return Outcome(kind, "error", lines[-1][:200])
    return Outcome(kind, "traceback", f"exit {code}, stderr {err.getvalue()!r:.300}")


def fuzz(cases: int, seed: int = 1, limit_s: float = 10.0) -> list[Outcome]:
    """Run ``cases`` fuzzed command lines; the outcomes in order."""
    rng = random.Random(seed)
    scenarios, configs = seeds()
    training = train_configs()
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="memfit-fuzz-") as tmp:
        folder = Path(tmp)
        for _ in range(cases):
            kind, argv = make_case(rng, scenarios, configs, folder, training)
            outcomes.append(run_case(kind, argv, limit_s))
            for leftover in folder.iterdir():  # keep the folder small
                if leftover.is_dir() and not leftover.is_symlink():
                    shutil.rmtree(leftover)
                else:
                    leftover.unlink()
    return outcomes


# -- model folders with hostile safetensors headers ------------------------------------------

#: a tiny Llama whose tensors a checkpoint case starts from
TINY_CONFIG = {
    "model_type": "llama",
    "num_hidden_layers": 1,
    "hidden_size": 8,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 16,
    "vocab_size": 32,
    "tie_word_embeddings": False,
}
_TINY: dict[str, list[int]] = {
    "model.embed_tokens.weight": [32, 8],
    "model.layers.0.self_attn.q_proj.weight": [8, 8],
    "model.layers.0.self_attn.k_proj.weight": [4, 8],
    "model.layers.0.self_attn.v_proj.weight": [4, 8],
    "model.layers.0.self_attn.o_proj.weight": [8, 8],
    "model.layers.0.mlp.gate_proj.weight": [16, 8],
    "model.layers.0.mlp.up_proj.weight": [16, 8],
    "model.layers.0.mlp.down_proj.weight": [8, 16],
    "model.layers.0.input_layernorm.weight": [8],
    "model.layers.0.post_attention_layernorm.weight": [8],
    "model.norm.weight": [8],
    "lm_head.weight": [32, 8],
}
#: shapes no safetensors file holds, and edges of the ones it does
SHAPES: tuple[Any, ...] = (
    [10**400], [3**840], [2**64], [2**64 - 1], [2**64, 2**64], [2**32, 2**32], [2**63, 3],
    [0, 2**64], [2] * 64, [1] * 65, [-1], [True], [1.5], ["8"], [], [0], 8, None, {},
)  # fmt: skip
#: dtypes of every width, odd ones first, and ones no file should hold
DTYPES: tuple[Any, ...] = (
    "F4", "F6_E2M3", "F6_E3M2", "F8_E4M3", "BF16", "F32", "C64", "BOOL", "Q3_K", "", "\x00",
    "é", 7, None, ["F32"],
)  # fmt: skip
#: data offsets past every limit
OFFSETS: tuple[Any, ...] = (
    [0, 2**64], [0, 10**30], [-1, 4], [8, 4], [0], [0, 1, 2], ["0", "4"], None, [0, 2**63],
)  # fmt: skip


def _header(tensors: dict[str, Any]) -> bytes:
    raw = json.dumps(tensors).encode()
    return len(raw).to_bytes(8, "little") + raw


def _tiny_header(rng: random.Random) -> tuple[dict[str, Any], int]:
    """The tiny model's header as a dict, some entries mutated, and its data's bytes."""
    tensors: dict[str, Any] = {}
    offset = 0
    for name, shape in _TINY.items():
        size = 2 * math.prod(shape)
        tensors[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    for _ in range(rng.randint(0, 3)):
        entry = tensors[rng.choice(list(tensors))]
        field = rng.choice(("shape", "dtype", "data_offsets", "entry"))
        if not isinstance(entry, dict):
            continue
        if field == "shape" and rng.random() < 0.5:  # an absurd size in an odd width
            entry["dtype"] = rng.choice(("F4", "F6_E2M3", "F6_E3M2"))
            entry["shape"] = rng.choice(([3**840], [3**41, 3**41], [10**400 + 1], [2**64 + 1]))
        elif field == "shape":
            entry["shape"] = copy.deepcopy(rng.choice(SHAPES))
        elif field == "dtype":
            entry["dtype"] = copy.deepcopy(rng.choice(DTYPES))
        elif field == "data_offsets":
            entry["data_offsets"] = copy.deepcopy(rng.choice(OFFSETS))
        else:
            tensors[rng.choice(list(tensors))] = copy.deepcopy(rng.choice(JUNK))
    if rng.random() < 0.1:
        tensors["__metadata__"] = copy.deepcopy(rng.choice(JUNK))
    return tensors, offset


def expert_tensors(count: int) -> dict[str, Any]:
    """Header entries of ``count`` 1-element F32 tensors, named as a large MoE's experts
    are (about 110 bytes of JSON each), over ``4 * count`` bytes of data."""
    return {
        f"model.layers.{i // 1000}.mlp.experts.{i % 1000}.down_proj.weight": {
            "dtype": "F32",
            "shape": [1],
            "data_offsets": [4 * i, 4 * i + 4],
        }
        for i in range(count)
    }


def _many_tensors(rng: random.Random) -> tuple[dict[str, Any], int]:
    """A header of tens of thousands of tiny tensors: large, still under the bound."""
    count = rng.choice((5_000, 20_000, 60_000))
    return {**expert_tensors(count), **_tiny_header(rng)[0]}, 4 * count


def _huge_header(rng: random.Random) -> tuple[bytes, int]:
    """A real header of 600,000 tiny tensors, ~60 MB: past the bound, read whole by a
    reader without one."""
    count = rng.choice((200_000, 600_000))
    parts = [
        b'"t%d":{"dtype":"F32","shape":[1],"data_offsets":[%d,%d]}' % (i, 4 * i, 4 * i + 4)
        for i in range(count)
    ]
    raw = b"{" + b",".join(parts) + b"}"
    return len(raw).to_bytes(8, "little") + raw, 4 * count


def _safetensors(path: Path, rng: random.Random) -> None:
    """One shard: a mutated header, a length that may claim more than there is, the data
    (some of it missing), or something that is no file at all."""
    roll = rng.random()
    if roll < 0.04:
        os.mkfifo(path)
        return
    if roll < 0.06:
        path.symlink_to("/dev/zero")
        return
    if roll < 0.08:
        path.mkdir()
        return
    if roll < 0.09:
        raw, data = _huge_header(rng)
        with open(path, "wb") as f:
            f.write(raw)
            f.truncate(len(raw) + data)
        return
    tensors, data = _many_tensors(rng) if roll < 0.12 else _tiny_header(rng)
    raw = _header(tensors)
    roll = rng.random()
    if roll < 0.1:  # the length claims more: past the file, past the bound, past 2^63
        claim = rng.choice((len(raw) - 8 + 1, 17 << 20, 60_000_000, 2**63, 2**64 - 1))
        raw = claim.to_bytes(8, "little") + raw[8:]
    elif roll < 0.15:
        raw = raw[: rng.randrange(len(raw))]
    elif roll < 0.18:
        raw = raw.replace(b'"BF16"', b'"BF16", "dtype": "F32"', 1)  # a repeated key
    elif roll < 0.2:
        raw = raw[:8] + raw[8:].replace(b"8", b"9" * 5000, 1)  # a number past 4,300 digits
    data_bytes = data if rng.random() < 0.9 else rng.randrange(data + 1)
    with open(path, "wb") as f:
        f.write(raw)
        f.truncate(len(raw) + data_bytes)  # sparse: the data is never read


def _link_out(path: Path, outside: Path, rng: random.Random) -> None:
    """``path`` replaced by a link out of its folder, absolute or relative."""
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    elif os.path.lexists(path):
        path.unlink()
    target = outside if rng.random() < 0.5 else Path(os.path.relpath(outside, path.parent))
    path.symlink_to(target)


def checkpoint_case(rng: random.Random, case: Path) -> list[str]:
    """``memfit checkpoint`` of a model folder with hostile safetensors headers, an index
    and a ``config.json`` -- half of them laid out as a snapshot of the hub cache, where a
    link out of the model's folder must read as missing."""
    snapshot = rng.random() < 0.5
    folder = case / "hub" / "models--org--fuzz" / "snapshots" / ("a" * 40) if snapshot else case
    folder.mkdir(parents=True)
    outside = case / "outside"
    outside.mkdir()
    (outside / "config.json").write_text(json.dumps(TINY_CONFIG))
    (outside / "token").write_text(SECRET + "\n")
    _safetensors(outside / "model.safetensors", random.Random(rng.random()))
    config: Any = TINY_CONFIG if rng.random() < 0.8 else mutate(TINY_CONFIG, rng)
    (folder / "config.json").write_bytes(
        _text(config, rng) if rng.random() < 0.1 else json.dumps(config).encode()
    )
    shards = rng.choice((1, 1, 2, 3))
    names = (
        ["model.safetensors"]
        if shards == 1
        else [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    )
    for name in names:
        _safetensors(folder / name, rng)
    if shards > 1 and rng.random() < 0.8:
        weight_map: Any = {f"t{i}": rng.choice(names) for i in range(rng.randint(0, 5))}
        if rng.random() < 0.2:
            weight_map = mutate(weight_map, rng)
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": weight_map}, default=str)
        )
    for name in ("config.json", rng.choice(names), "model.safetensors.index.json"):
        if rng.random() < 0.15:
            source = {"config.json": "config.json"}.get(name, "model.safetensors")
            _link_out(folder / name, outside / (source if rng.random() < 0.8 else "token"), rng)
    return ["checkpoint", str(folder), *(["--json"] if rng.random() < 0.3 else [])]


# -- training configs that name hostile paths -------------------------------------------------


def _secret_files(rng: random.Random, path: Path) -> None:
    """A file whose content holds :data:`SECRET` in one of the shapes a named file may
    take: a one-line token, a page, a YAML or JSON mapping with it where a value is read."""
    shapes = (
        SECRET + "\n",
        f"<html><body><h1>{SECRET}</h1><img src=x></body></html>",
        f"zero_optimization:\n  stage: {SECRET}\n",
        f"zero_optimization:\n  stage: 3\n  offload_optimizer:\n    device: {SECRET}\n",
        json.dumps({"optimizer": {"type": SECRET}}),
        json.dumps({"bf16": {"enabled": SECRET}}),
        json.dumps({"train_micro_batch_size_per_gpu": [SECRET]}),
        json.dumps({"zero_optimization": SECRET}),
        f"zero_optimization: *{SECRET}\n",
        f"HF_TOKEN={SECRET}\n",
        f"\t{SECRET}: 1\n",
    )
    path.write_text(rng.choice(shapes))


def paths_case(rng: random.Random, case: Path) -> list[str]:
    """``memfit estimate --from-config`` of a training config whose DeepSpeed config path
    is hostile; the user's hub token sits beside the config's folder."""
    token = case / "home" / ".cache" / "huggingface" / "token"
    token.parent.mkdir(parents=True)
    token.write_text(SECRET + "\n")
    run = case / "run"
    (run / "sub").mkdir(parents=True)
    named = rng.choice(("ds_zero3.json", "ds.json", "deepspeed.yaml", "token", "ds"))
    roll = rng.randrange(12)
    if roll == 0:
        ref = str(token)
    elif roll == 1:
        ref = "../home/.cache/huggingface/token"
    elif roll == 2:
        ref = "sub/../../home/.cache/huggingface/token"
    elif roll == 3:
        (run / named).symlink_to(os.path.relpath(token, run) if rng.random() < 0.5 else token)
        ref = named
    elif roll == 4:
        (run / "configs").symlink_to(token.parent)
        ref = "configs/token"
    elif roll == 5:
        os.mkfifo(run / named)
        ref = named
    elif roll == 6:
        ref = rng.choice(("/dev/zero", "/dev/null", "/proc/self/environ", "/"))
    elif roll == 7:
        (run / named).mkdir()
        ref = named
    elif roll == 8:
        ref = rng.choice(("zero3_missing.json", "x" * 3000, "a\x00b", "\ud800", "", "~/token"))
    elif roll == 9:
        (run / named).write_text(json.dumps({"zero_optimization": {"stage": rng.randrange(5)}}))
        ref = named
    else:
        _secret_files(rng, run / named)
        ref = named
    fmt = rng.randrange(3)
    value = json.dumps(ref)
    if fmt == 0:
        config, text = run / "run.yml", f"base_model: gpt2\ndeepspeed: {value}\n"
    elif fmt == 1:
        config = run / "args.json"
        text = json.dumps(
            {"per_device_train_batch_size": 1, "optim": "adamw_torch", "deepspeed": ref}
        )
    else:
        config = run / "accelerate.yaml"
        text = (
            "distributed_type: DEEPSPEED\nnum_processes: 2\n"
            f"deepspeed_config:\n  deepspeed_config_file: {value}\n"
        )
    config.write_text(text, encoding="utf-8", errors="surrogatepass")
    argv = ["estimate", "--from-config", str(config), "--model", "gpt2", "--gpu", "l4"]
    if rng.random() < 0.3:
        argv.append("--allow-outside-paths")
    return argv + (["--json"] if rng.random() < 0.3 else [])

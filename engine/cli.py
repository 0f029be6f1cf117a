"""The ``memfit`` command line, on the same engine as the app.

``memfit estimate --scenario FILE --json`` prints the estimate in the stable JSON shape;
``memfit estimate --model llama-3-8b --gpu h100-sxm-80gb --method lora ...`` prints a table;
flags override any field of the scenario (``--set training.lora.alpha=64`` reaches the
ones without a flag of their own); ``memfit presets models|gpus|stacks`` lists the presets,
built-in and the user's own.
``memfit fit`` prints the largest micro-batch and sequence length that fit, the fewest
GPUs, and the best fitting configurations of the strategy space with their memory,
tokens/s and bound; ``memfit sweep`` prints (or ``--csv FILE`` writes) the whole space.
On more than one GPU the table adds the device mesh and one row per distinct rank group
(pipeline stage), the worst marked; with offload, or the host RAM given, the host RAM per
node and its verdict.
Bad input prints one line naming the field and exits with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from memfit.engine.errors import EstimateError, bounded, shown
from memfit.engine.estimate import GIB, Estimate, estimate
from memfit.engine.files import ALLOW_FLAG, NotJson, parse_json, read_json, write_text
from memfit.engine.locate import KINDS, USER_PRESETS_ENV, user_presets_dir
from memfit.engine.params import count_parameters
from memfit.engine.presets import (
    custom_names,
    gpu_names,
    load_gpu,
    load_model,
    model_names,
    preset_problems,
)
from memfit.engine.report import (
    conventions_text,
    mesh_text,
    model_reading,
    peak_phase,
    shows_host,
    shows_ranks,
)
from memfit.engine.scenario_io import (
    load_scenario,
    save_scenario,
    scenario_from_dict,
    scenario_to_dict,
)
from memfit.engine.solve import (
    SERVER_GPUS,
    fits,
    max_micro_batch,
    max_sequence_length,
    min_gpus,
    models_that_fit,
    search,
    shape_grid,
    with_gpus,
)
from memfit.engine.specs import (
    ACTIVATION_OFFLOAD,
    ATTENTION_KERNELS,
    CHECKPOINTING,
    FP8_RECIPES,
    FRAMEWORKS,
    LOSSES,
    METHODS,
    OFFLOAD_TARGETS,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    PARALLEL_AXES,
    PP_SCHEDULES,
    PRECISIONS,
    Scenario,
    stack_names,
)
from memfit.engine.stacks import stacks
from memfit.engine.steptime import StepTime
from memfit.engine.sweep import (
    LOCKS,
    NUMERICS_MARK,
    ROW_FIELDS,
    TIME_FIELDS,
    Beyond,
    best,
    beyond_stack,
    check_locks,
    cpus,
    default_space,
    describe,
    locked,
    numerics_changed,
    only,
    points_csv,
    sweep,
)

if TYPE_CHECKING:
    from memfit.engine.scaling import Axis, AxisFit

# Imported where a command needs them, not here, so that every other command starts
# without them: the checkpoint and hub-cache readers, the training-config importers
# (YAML), the activation explainer, the size axis, the comparison and the package
# metadata.

EXIT_USAGE = 2
#: the most processes a sweep spreads over (``--jobs``), and by default (one per CPU up
#: to this: each process builds the block profiles and compiled steps of its share, and
#: starting one costs the calling process a few milliseconds)
MAX_JOBS = 64
DEFAULT_JOBS = 8


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error on one line."""

    def error(self, message: str) -> NoReturn:
        # argparse repeats the value it refuses (``invalid choice: 'xxx…'``): cut it
        self.exit(EXIT_USAGE, message_line(f"{self.prog}: error: {message}") + "\n")


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


#: flag -> (path in the scenario dict, converter)
_FLAGS: dict[str, tuple[tuple[str, ...], Callable[[str], Any]]] = {
    "gpus_per_node": (("hardware", "gpus_per_node"), int),
    "nodes": (("hardware", "nodes"), int),
    "memory_gib": (("hardware", "memory_gib"), float),
    "host_memory_gib": (("hardware", "host_memory_gib"), float),
    "budget": (("hardware", "utilization_target"), float),
    "stack": (("training", "stack"), str),
    "loss": (("training", "loss"), str),
    "method": (("training", "method"), str),
    "precision": (("training", "precision"), str),
    "fp8_recipe": (("training", "fp8_recipe"), str),
    "torch_compile": (("training", "torch_compile"), bool),
    "optimizer": (("training", "optimizer"), str),
    "optimizer_impl": (("training", "optimizer_impl"), str),
    "batch": (("training", "micro_batch_size"), int),
    "seq": (("training", "sequence_length"), int),
    "grad_accum": (("training", "gradient_accumulation_steps"), int),
    "checkpointing": (("training", "activation_checkpointing"), str),
    "attention": (("training", "attention"), str),
    "rank": (("training", "lora", "rank"), int),
    "alpha": (("training", "lora", "alpha"), float),
    "targets": (("training", "lora", "targets"), _csv),
    "lora_dropout": (("training", "lora", "dropout"), float),
    "double_quant": (("training", "qlora", "double_quant"), bool),
    "trainable": (("training", "freeze", "trainable"), _csv),
    "last_layers": (("training", "freeze", "last_layers"), int),
    **{axis.key: (("training", "parallelism", axis.key), int) for axis in PARALLEL_AXES},
    "zero": (("training", "parallelism", "zero_stage"), int),
    "vpp": (("training", "parallelism", "vpp"), int),
    "pp_schedule": (("training", "parallelism", "pp_schedule"), str),
    "sequence_parallel": (("training", "parallelism", "sequence_parallel"), bool),
    "tp_comm_overlap": (("training", "parallelism", "tp_comm_overlap"), bool),
    "framework": (("training", "parallelism", "framework"), str),
    "hybrid_shard": (("training", "parallelism", "hybrid_shard"), bool),
    "offload_optimizer": (("training", "offload", "optimizer"), str),
    "offload_parameters": (("training", "offload", "parameters"), str),
    "offload_activations": (("training", "offload", "activations"), str),
}


def _set_path(data: dict[str, Any], path: Sequence[str], value: Any) -> None:
    node = data
    for key in path[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise EstimateError(
                ".".join(path), f"cannot set inside {shown(key)}, which is not an object"
            )
        node = child
    node[path[-1]] = value


def _parse_set(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise EstimateError(
            "--set", f"got {shown(text)}, expected FIELD=VALUE (e.g. training.lora.alpha=64)"
        )
    path, raw = text.split("=", 1)
    try:
        value = parse_json(raw, f"--set {shown(path)[1:-1]}", "the value")
    except NotJson:
        value = raw  # a bare word is a string
    parts = [p for p in path.strip().split(".") if p]
    if not parts:
        raise EstimateError("--set", f"got {shown(text)}, expected FIELD=VALUE")
    return parts, value


def model_section(name: str) -> dict[str, Any]:
    """``--model NAME``: a preset, a local model folder (its ``config.json``), or
    ``org/name[@revision]`` in the local Hugging Face cache (:mod:`memfit.engine.hub_cache`;
    nothing is downloaded)."""
    from memfit.engine.hub_cache import find_model

    if name in model_names():
        return {"preset": name}
    folder = Path(name).expanduser()
    if folder.is_dir():
        return _config_of(folder, folder.resolve().name)
    if "/" in name:
        snapshot = find_model(name)
        if not snapshot.has_config:
            raise EstimateError("model", f"{name}: the cached snapshot has no config.json")
        return _config_of(snapshot.path, snapshot.repo_id)
    return {"preset": name}  # not a preset: load_model says which there are


def _config_of(folder: Path, label: str) -> dict[str, Any]:
    from memfit.engine.checkpoint import model_config

    return {**model_config(folder), "_name_or_path": label}


def _import_training(args: argparse.Namespace, data: dict[str, Any], notes: list[str]) -> None:
    """``--from-config FILE`` merged into ``data`` (which has its model and hardware by now:
    the file sets training and GPU-count fields; flags and ``--set`` still override it)."""
    from memfit.engine.imports import config_notes
    from memfit.engine.train_configs import apply as apply_training_config
    from memfit.engine.train_configs import import_training_config

    imported = import_training_config(
        path=args.from_config, allow_outside_paths=args.allow_outside_paths
    )
    notes.append(f"{imported.format} configuration read from {Path(args.from_config).name}")
    if "model" not in data:
        if imported.model_preset:
            data["model"] = {"preset": imported.model_preset}
            notes.append(f"model: the preset {imported.model_preset} ({imported.model})")
        elif imported.model:
            raise EstimateError(
                "model", f"the file names {shown(imported.model)}, not a preset: give --model NAME"
            )
    for key, flags in (("model", "--model NAME"), ("hardware", "--gpu NAME")):
        if key not in data:
            raise EstimateError(key, f"missing; give {flags} beside --from-config")
    data.update(apply_training_config(data, imported))
    notes += config_notes(imported)


def build_scenario_dict(args: argparse.Namespace, notes: list[str] | None = None) -> dict[str, Any]:
    """The scenario as a dict: the file (if any), the run's training configuration
    (``--from-config``), then each flag given, then ``--set``; what the import assumed
    and could not model goes to ``notes``."""
    data: dict[str, Any]
    if args.scenario:
        loaded = read_json(args.scenario)
        if not isinstance(loaded, dict):
            raise EstimateError("scenario", f"{args.scenario} does not hold a JSON object")
        data = loaded
    else:
        data = {"memfit_scenario": 1}
    if args.model:
        data["model"] = model_section(args.model)
    if args.model_config:
        data["model"] = read_json(args.model_config, "model")
    if args.read_as:
        model = data.get("model")
        if not isinstance(model, dict) or "preset" in model or "spec" in model:
            raise EstimateError(
                "--read-as", "reads a Hugging Face config: give one with --model-config FILE"
            )
        model["read_as"] = args.read_as
    if args.gpu:
        data.setdefault("hardware", {})
        if not isinstance(data["hardware"], dict):
            raise EstimateError("hardware", "expected an object")
        data["hardware"]["gpu"] = args.gpu
    if args.from_config:
        _import_training(args, data, notes if notes is not None else [])
    for flag, (path, convert) in _FLAGS.items():
        value = getattr(args, flag)
        if value is not None:
            _set_path(data, path, convert(value) if isinstance(value, str) else value)
    for item in args.set or ():
        set_path, set_value = _parse_set(item)
        _set_path(data, set_path, set_value)
    if "model" not in data:
        raise EstimateError(
            "model", "missing; give --model NAME, --model-config FILE or --scenario"
        )
    if "hardware" not in data:
        raise EstimateError("hardware", "missing; give --gpu NAME, --memory-gib or --scenario")
    return data


def _gib(n: int) -> str:
    return f"{n / GIB:,.2f}"


def format_table(est: Estimate) -> str:
    """A readable report of ``est`` (GiB = 2^30 bytes)."""
    s = est.scenario
    t, hw = s.training, s.hardware
    method = t.method
    if t.method in ("lora", "qlora"):
        method += f" (r={t.lora.rank}, alpha={t.lora.alpha:g}, {','.join(t.lora.targets)})"
    if t.method == "freeze":
        parts = ",".join(t.freeze.trainable) or "-"
        method += f" (trainable: {parts}; last {t.freeze.last_layers} layers)"
    share = 100.0 * est.trainable_params / est.total_params if est.total_params else 0.0
    lines = [
        f"MemFit estimate: {s.model.label} on {hw.gpu.display_name}"
        f" ({hw.world_size} GPU{'s' if hw.world_size > 1 else ''})",
        f"  {method} | {t.precision} | {t.optimizer} ({t.optimizer_impl}) | "
        f"micro-batch {t.micro_batch_size} x sequence {t.sequence_length}",
        "",
        f"Parameters   total {est.total_params:,}   trainable {est.trainable_params:,}"
        f" ({share:.3g} %)",
        f"Bytes/param  {est.bytes_per_param_formula}",
    ]
    if model_reading(s.model):
        lines.insert(4, f"Model        {model_reading(s.model)}")
    if est.bytes_per_frozen_param:
        lines.append(
            f"             frozen weights: {est.bytes_per_frozen_param:.4g} B per parameter"
        )
    lines.append(f"Stack        {conventions_text(est)}")
    lines += ["", f"{'Per GPU, GiB (2^30 B)':<58}{'GiB':>10}"]
    if len(est.rank_groups) > 1:
        lines.append(f"(the worst rank group: {est.worst_group})")
    breakdown = est.breakdown
    for category, total in breakdown.items():
        items = [i for i in est.items if i.category == category]
        if category == "activations" and not items:
            lines.append(f"{category:<58}{_gib(0):>10}   none live at the peak")
            continue
        lines.append(f"{category:<58}{_gib(total):>10}")
        for item in items:
            lines.append(f"  {item.name:<56}{_gib(item.bytes):>10}   {item.formula}")
    pct = 100.0 * hw.utilization_target
    lines += [
        "",
        f"{'allocated':<58}{_gib(est.allocated_bytes):>10}",
        f"{'reserved':<58}{_gib(est.reserved_bytes):>10}",
        f"{'device':<58}{_gib(est.device_bytes):>10}",
        f"{'capacity':<58}{_gib(est.capacity_bytes):>10}",
        f"{f'budget ({pct:g} % of capacity)':<58}{_gib(est.budget_bytes):>10}",
        f"verdict: {est.verdict.upper()}"
        + (" (a lower bound: parts of the step are not modelled yet)" if est.not_modelled else ""),
    ]
    lines += time_lines(est.time)
    lines += [f"warning: {w}" for w in est.warnings]
    lines += _rank_lines(est) + _host_lines(est)
    if est.not_modelled:
        lines += ["", "Not yet modelled (counted as 0 above):"]
        lines += [f"  - {note}" for note in est.not_modelled]
    return "\n".join(lines)


def time_lines(t: StepTime) -> list[str]:
    """The step time, throughput, MFU and bound, and the run's cost for a token budget."""
    lines = [
        "",
        f"step time {t.step_time_s:.4g} s   {t.tokens_per_s:,.0f} tokens/s "
        f"({t.tokens_per_s_per_gpu:,.0f} per GPU)   MFU {100 * t.mfu:.1f} %   "
        f"bound: {t.bound.replace('_', ' ')}",
    ]
    for term in t.terms:
        if term.seconds > 0:
            lines.append(f"  {term.name:<56}{term.seconds:>10.4g} s   {term.kind}")
    if t.run_time_s is not None:
        cost = f"   cost {t.cost:,.0f}" if t.cost is not None else ""
        lines.append(
            f"token budget: {t.run_time_s / 3600:,.1f} h wall time   "
            f"{t.gpu_hours:,.0f} GPU-hours{cost}"
        )
    lines += [f"assumed: {a}" for a in t.assumptions]
    return lines


def _rank_lines(est: Estimate) -> list[str]:
    """The mesh and one row per rank group, the worst marked; none on a single GPU."""
    if not shows_ranks(est):
        return []
    width = max(len(g.group) for g in est.rank_groups) + 4
    lines = [
        "",
        f"mesh: {mesh_text(est)}",
        "",
        "Per rank group, per GPU, GiB (2^30 B)",
        f"{'  group':<{width}}{'allocated':>10}{'reserved':>10}{'device':>10}  "
        f"{'peak':<10}{'host':>8}",
    ]
    for g in est.rank_groups:
        mark = "* " if g.group == est.worst_group else "  "
        lines.append(
            f"{mark + g.group:<{width}}{_gib(g.allocated_bytes):>10}{_gib(g.reserved_bytes):>10}"
            f"{_gib(g.device_bytes):>10}  {peak_phase(g):<10}{_gib(g.host_bytes):>8}"
        )
    lines.append("* the worst group: its device total is the headline and sets the verdict")
    return lines


def _host_lines(est: Estimate) -> list[str]:
    """Host RAM per node against the given host RAM; none without offload or a figure."""
    if not shows_host(est):
        return []
    n = est.scenario.hardware.gpus_per_node
    per_gpu = est.host_node_bytes // n
    given = f"{'host RAM per node (given)':<58}"
    if est.host_capacity_bytes is None:
        given += f"{'unknown':>10}   give it with --host-memory-gib N"
    else:
        given += f"{_gib(est.host_capacity_bytes):>10}"
    return [
        "",
        f"{'host RAM per node (offload)':<58}{_gib(est.host_node_bytes):>10}"
        f"   {n} GPU{'s' if n > 1 else ''} x {_gib(per_gpu)} GiB",
        given,
        f"host verdict: {est.host_verdict.upper()}",
    ]


def _add_estimate_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", metavar="FILE", help="a *.memfit.json scenario file")
    p.add_argument(
        "--from-config",
        metavar="FILE",
        help="the run's training configuration: Axolotl, TRL/transformers TrainingArguments, "
        "LitGPT, torchtune, DeepSpeed or accelerate",
    )
    p.add_argument(
        ALLOW_FLAG,
        action="store_true",
        help="let the --from-config file name files (a DeepSpeed config) outside its own "
        "folder; without it they are not read",
    )
    p.add_argument("--json", action="store_true", help="print the estimate as JSON")
    p.add_argument(
        "--activations",
        action="store_true",
        help="also tell the activations at the peak apart by source, with the change that "
        "removes each (estimated)",
    )
    p.add_argument("--save", metavar="FILE", help="also write the scenario to FILE")
    m = p.add_argument_group("model and hardware")
    m.add_argument(
        "--model",
        metavar="NAME",
        help="a model preset (memfit presets models), a local model folder, or org/name in "
        "the local Hugging Face cache (memfit cache)",
    )
    m.add_argument("--model-config", metavar="FILE", help="a Hugging Face config.json")
    m.add_argument(
        "--read-as",
        metavar="TYPE",
        help="read the config as this model_type, for a look-alike family without a reader",
    )
    m.add_argument("--gpu", metavar="PRESET", help="GPU preset (memfit presets gpus)")
    m.add_argument("--gpus-per-node", type=int)
    m.add_argument("--nodes", type=int)
    m.add_argument("--memory-gib", type=float, help="device memory in GiB (2^30 B)")
    m.add_argument("--budget", type=float, metavar="FRACTION", help="utilization target, 0.85")
    m.add_argument(
        "--host-memory-gib", type=float, help="host RAM per node in GiB, to check offload"
    )
    t = p.add_argument_group("training")
    t.add_argument(
        "--stack",
        choices=stack_names(),
        help="the training stack whose conventions the step follows (default hf-trainer; "
        "your own stacks too, memfit presets stacks)",
    )
    t.add_argument("--loss", choices=LOSSES)
    t.add_argument("--method", choices=METHODS)
    t.add_argument("--precision", choices=PRECISIONS)
    t.add_argument("--fp8-recipe", choices=FP8_RECIPES, help="how FP8 GEMMs scale their inputs")
    t.add_argument(
        "--torch-compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the model runs under torch.compile: element-wise ops fused (step time)",
    )
    t.add_argument("--optimizer", choices=OPTIMIZERS)
    t.add_argument("--optimizer-impl", choices=OPTIMIZER_IMPLS)
    t.add_argument("--batch", type=int, help="micro-batch size per GPU")
    t.add_argument("--seq", type=int, help="sequence length")
    t.add_argument("--grad-accum", type=int)
    t.add_argument("--checkpointing", choices=CHECKPOINTING)
    t.add_argument("--attention", choices=ATTENTION_KERNELS)
    t.add_argument("--rank", type=int, help="LoRA rank")
    t.add_argument("--alpha", type=float, help="LoRA alpha")
    t.add_argument(
        "--targets", metavar="A,B", help="LoRA targets, e.g. q_proj,v_proj or all-linear"
    )
    t.add_argument("--lora-dropout", type=float)
    t.add_argument("--double-quant", action=argparse.BooleanOptionalAction, default=None)
    t.add_argument("--trainable", metavar="A,B", help="parts left trainable by --method freeze")
    t.add_argument("--last-layers", type=int, help="last N layers trainable (--method freeze)")
    for axis in PARALLEL_AXES:  # a flag's words are joined by "-" (its field's by "_")
        flag = "--" + axis.key.replace("_", "-")
        t.add_argument(flag, type=int, metavar="N", help=f"{axis.label}: {axis.help}")
    t.add_argument("--zero", type=int, metavar="STAGE")
    t.add_argument("--pp-schedule", choices=PP_SCHEDULES)
    t.add_argument("--vpp", type=int, help="virtual stages per rank (interleaved-1f1b)")
    t.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None)
    t.add_argument(
        "--tp-comm-overlap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="hide the tensor-parallel collectives behind the GEMMs (needs --sequence-parallel)",
    )
    t.add_argument("--framework", choices=FRAMEWORKS)
    t.add_argument(
        "--hybrid-shard",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="shard within a node, replicate across nodes (FSDP HYBRID_SHARD)",
    )
    t.add_argument("--offload-optimizer", choices=OFFLOAD_TARGETS)
    t.add_argument("--offload-parameters", choices=OFFLOAD_TARGETS)
    t.add_argument("--offload-activations", choices=ACTIVATION_OFFLOAD)
    p.add_argument(
        "--set",
        action="append",
        metavar="FIELD=VALUE",
        help="set any scenario field, e.g. training.qlora.block_size=128",
    )


def version() -> str:
    """MemFit's version, from the installed package's metadata (``pyproject.toml``)."""
    from importlib import metadata

    try:
        return metadata.version("memfit")
    except metadata.PackageNotFoundError:
        return "0+unknown"


class _Version(argparse.Action):
    """``--version``, as argparse's own prints it, the version read only when asked: the
    package's metadata takes about 9 ms to find and read, a sixteenth of every command's
    start."""

    def __init__(self, option_strings: list[str], dest: str, **_: object) -> None:
        super().__init__(
            option_strings, argparse.SUPPRESS, nargs=0, default=argparse.SUPPRESS,
            help="show program's version number and exit",
        )  # fmt: skip

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        sys.stdout.write(f"MemFit {version()}\n")
        parser.exit()


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="memfit", description="How much GPU memory will this training run take?")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    est = sub.add_parser("estimate", help="estimate the memory of a training step")
    _add_estimate_flags(est)
    fit = sub.add_parser("fit", help="the best configurations that fit, and the limits")
    _add_estimate_flags(fit)
    fit.add_argument("--top", type=int, default=10, help="how many configurations (10)")
    fit.add_argument("--gpus", type=int, help="the GPU count to plan for (default: the scenario's)")
    sw = sub.add_parser("sweep", help="every configuration of the strategy space")
    _add_estimate_flags(sw)
    sw.add_argument("--gpus", type=int, help="the GPU count to sweep (default: the scenario's)")
    for plan in (fit, sw):
        plan.add_argument(
            "--lock",
            type=_csv,
            default=[],
            metavar="WHAT,...",
            help=f"keep these as the scenario has them: {', '.join(LOCKS)}",
        )
        plan.add_argument(
            "--only",
            type=_csv,
            default=[],
            metavar="FIELD=VALUE,...",
            help="keep only the configurations with these values (fields: the CSV's "
            "columns, e.g. zero_stage=3,precision=bf16-mixed,tp=2)",
        )
        plan.add_argument(
            "--jobs",
            type=int,
            default=0,
            metavar="N",
            help="processes to sweep in (default: one per CPU up to 8, on Linux; 1: "
            "this process alone); the answer is the same",
        )
    sw.add_argument("--csv", metavar="FILE", help="write the points as CSV to FILE")
    big = sub.add_parser(
        "largest",
        help="the largest model preset that fits these GPUs with this training",
        description="Every model preset (or those of one family) with the hardware and "
        "training given, largest first: the first that fits the budget is the answer. "
        "Then the largest that fits along the family's size axis: models of its presets' "
        "shape at the sizes between theirs (not beyond its largest preset). "
        "--model is not needed (any given is only the starting point of the flags).",
    )
    _add_estimate_flags(big)
    big.add_argument(
        "--family",
        help="only the presets of this family (e.g. llama, qwen3), and its size axis "
        "(default: the axis of the largest preset that fits)",
    )
    grid = sub.add_parser(
        "grid",
        help="memory and tokens/s over micro-batch sizes and sequence lengths",
    )
    _add_estimate_flags(grid)
    grid.add_argument(
        "--batches", type=_csv, default=["1", "2", "4", "8", "16"], metavar="B,...",
        help="the micro-batch sizes (1,2,4,8,16)",
    )  # fmt: skip
    grid.add_argument(
        "--seqs", type=_csv, default=["512", "1024", "2048", "4096", "8192", "16384"],
        metavar="N,...", help="the sequence lengths (512 to 16384)",
    )  # fmt: skip
    cmp_ = sub.add_parser(
        "compare",
        help="two or more scenario files side by side",
        description="The settings that differ, memory per category, the totals, the step "
        "time, tokens/s and the cost of each scenario file, as a table (Markdown), CSV or "
        "JSON.",
    )
    cmp_.add_argument("files", nargs="+", metavar="SCENARIO", help="scenario files (2 or more)")
    cmp_.add_argument("--csv", metavar="FILE", help="write the table as CSV to FILE")
    cmp_.add_argument("--json", action="store_true", help="print JSON")
    pre = sub.add_parser(
        "presets",
        help="list the model, GPU or stack presets, built-in and your own",
        description="List the presets of a kind: the built-in ones and your own, read from "
        f"{user_presets_dir()} (set ${USER_PRESETS_ENV} for another folder), marked "
        "(custom). A file of yours that does not load is named on stderr with the field.",
    )
    pre.add_argument(
        "kind",
        choices=(*KINDS, "folder"),
        help="the presets to list, or 'folder': where your own presets go",
    )
    pre.add_argument("--json", action="store_true")
    cache = sub.add_parser("cache", help="list the models of the local Hugging Face cache")
    cache.add_argument("--root", metavar="DIR", help="the hub cache folder (default: as the hub)")
    cache.add_argument("--json", action="store_true")
    ckpt = sub.add_parser(
        "checkpoint", help="a model folder's checkpoint: tensors, dtypes, parameters"
    )
    ckpt.add_argument("target", metavar="FOLDER|ORG/NAME", help="a model folder or a cached model")
    ckpt.add_argument("--json", action="store_true")
    return parser


def _cache(root: str | None, as_json: bool, out: TextIO) -> None:
    from memfit.engine.hub_cache import cache_root, scan_cache

    where = Path(root).expanduser() if root else cache_root()
    models = scan_cache(where)
    rows = [
        {
            "repo_id": m.repo_id,
            "revisions": [
                {"commit": s.commit, "refs": list(s.refs), "has_config": s.has_config}
                for s in m.revisions
            ],
            "size_on_disk_bytes": m.size_on_disk,
            "warnings": list(m.warnings),
        }
        for m in models
    ]
    if as_json:
        json.dump({"cache": str(where), "models": rows}, out, indent=2)
        out.write("\n")
        return
    print(printable(f"{len(rows)} models in {where}"), file=out)
    for m in models:
        newest = m.revisions[0] if m.revisions else None
        rev = ", ".join(newest.refs) or newest.commit[:12] if newest else "no snapshot"
        config = "" if m.has_config else "  (no config.json)"
        print(
            printable(f"  {m.repo_id:<48}{rev:<14}{m.size_on_disk / GIB:>9.2f} GiB{config}"),
            file=out,
        )


def _checkpoint(target: str, as_json: bool, out: TextIO) -> None:
    from memfit.engine.checkpoint import compare, model_from_folder
    from memfit.engine.hub_cache import find_model

    folder = Path(target).expanduser()
    if not folder.is_dir():
        folder = Path(find_model(target).path)
    model, info = model_from_folder(folder)
    c = compare(model, info)
    quant = info.quantization
    if as_json:
        json.dump(
            {
                "folder": str(folder),
                "model": model.label,
                "files": len(info.files),
                "tensors": info.tensor_count,
                "total_bytes": info.total_bytes,
                "by_dtype": {
                    d.dtype: {"tensors": d.tensors, "elements": d.elements, "bytes": d.bytes}
                    for d in info.by_dtype
                },
                "quantization": None if quant is None else quant.method,
                "checkpoint_parameters": c.checkpoint_parameters,
                "engine_parameters": c.engine_parameters,
                "mismatch": c.mismatch,
                "notes": list(c.notes) + list(info.warnings),
            },
            out,
            indent=2,
        )
        out.write("\n")
        return
    lines = [
        f"{model.label}: {len(info.files)} file(s), {info.tensor_count:,} tensors, "
        f"{info.total_bytes / GIB:.2f} GiB (2^30 B)",
        *(
            f"  {d.dtype:<10}{d.tensors:>8,} tensors{d.elements:>18,} elements"
            f"{d.bytes / GIB:>10.2f} GiB"
            for d in info.by_dtype
        ),
    ]
    if quant is not None:
        lines.append(f"quantized: {quant.method}" + (f" ({quant.detail})" if quant.detail else ""))
    lines.append(
        f"parameters: checkpoint {c.checkpoint_parameters:,}, MemFit {c.engine_parameters:,}"
    )
    if c.mismatch:
        lines.append(
            f"MISMATCH: the checkpoint has {c.difference:+,} ({c.relative_difference:+.2%}) "
            "parameters against MemFit's model"
        )
    lines += [*c.notes, *info.warnings]
    print(printable("\n".join(lines)), file=out)


def _presets(kind: str, as_json: bool, out: TextIO) -> None:
    """The presets of ``kind``, built-in and the user's own (marked ``custom``); one line on
    stderr for each of the user's files left out, naming the file and the field."""
    rows: list[dict[str, Any]] = []
    custom = custom_names(kind)
    if kind == "models":
        for name in model_names():
            m = load_model(name)
            rows.append(
                {
                    "name": name,
                    "display_name": m.label,
                    "family": m.family,
                    "parameters": count_parameters(m).total,
                    "custom": name in custom,
                }
            )
        lines = [
            f"{r['name']:<22}{r['family']:<14}{r['parameters']:>20,}  {r['display_name']}"
            for r in rows
        ]
    elif kind == "gpus":
        for name in gpu_names():
            g = load_gpu(name)
            rows.append(
                {
                    "name": name,
                    "display_name": g.display_name,
                    "memory_bytes": g.memory_bytes,
                    "bf16_tflops": g.bf16_tflops,
                    "custom": name in custom,
                }
            )
        lines = [
            f"{r['name']:<22}{r['memory_bytes'] / GIB:>9.2f} GiB  "
            f"{r['bf16_tflops']:>8g} TFLOP/s bf16  {r['display_name']}"
            for r in rows
        ]
    else:
        for stack in stacks():  # the built-in ones first, then the user's
            rows.append(
                {
                    "name": stack.name,
                    "display_name": stack.label,
                    "source": stack.source,
                    "custom": stack.name in custom,
                }
            )
        lines = [f"{r['name']:<22}{r['display_name']}" for r in rows]
    for problem in preset_problems(kind):
        print(message_line(f"memfit: note: {problem}"), file=sys.stderr)
    if as_json:
        json.dump(rows, out, indent=2)
        out.write("\n")
        return
    for row, line in zip(rows, lines, strict=True):
        print(printable(line + ("  (custom)" if row["custom"] else "")), file=out)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the CLI; returns the exit status (0, or 2 for bad input). Python's cycle
    collector is off while the command runs (:func:`_collector_off`)."""
    out = out or sys.stdout
    parser = make_parser()
    args = parser.parse_args(argv)
    with _collector_off():
        return _main(args, parser, out)


@contextlib.contextmanager
def _collector_off() -> Iterator[None]:
    """Python's cycle collector off, and back as it was after: one command is a short
    run that builds many objects and keeps most of them (the engine's caches), so the
    collector's passes find almost nothing to free and cost about a sixth of a planning
    command's time (the 70B ``fit``), while the engine's objects rarely form cycles
    (reference counting frees them; the process's peak memory is the same). Turned back
    on, it would first walk every object the command made (its count of new objects is
    past every threshold): they join the oldest generation unwalked instead
    (``gc.freeze`` then ``gc.unfreeze``), where its rare full passes still reach them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.freeze()
            gc.enable()
            gc.unfreeze()


def _main(args: argparse.Namespace, parser: argparse.ArgumentParser, out: TextIO) -> int:
    """:func:`main` with its arguments parsed."""
    try:
        if args.command == "presets" and args.kind == "folder":
            folder = user_presets_dir()
            if args.json:
                json.dump({"folder": str(folder), "exists": folder.is_dir()}, out)
                out.write("\n")
            else:
                print(printable(str(folder)), file=out)
            return 0
        if args.command == "presets":
            _presets(args.kind, args.json, out)
            return 0
        if args.command == "cache":
            _cache(args.root, args.json, out)
            return 0
        if args.command == "checkpoint":
            _checkpoint(args.target, args.json, out)
            return 0
        if args.command == "compare":
            return _compare(args, out)
        if args.command not in ("estimate", "fit", "sweep", "largest", "grid"):
            parser.print_help(out)
            return EXIT_USAGE
        if args.command == "largest" and not (args.model or args.model_config or args.scenario):
            args.model = "gpt2"  # a starting point only: every preset is tried
        notes: list[str] = []
        scenario = scenario_from_dict(build_scenario_dict(args, notes))
        for note in notes:
            print(message_line(f"memfit: note: {note}"), file=sys.stderr)
        if args.command in ("fit", "sweep"):
            return _plan(args, scenario, out)
        if args.command == "largest":
            return _largest(args, scenario, out)
        if args.command == "grid":
            return _grid(args, scenario, out)
        result = estimate(scenario)
        if args.save:
            save_scenario(scenario, args.save)
    except EstimateError as exc:
        print(message_line(f"memfit: error: {exc}"), file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # e.g. piped into `head`
        return 0
    except OSError as exc:
        where = exc.filename or "file"
        print(message_line(f"memfit: error: {where}: {exc.strerror or exc}"), file=sys.stderr)
        return EXIT_USAGE
    try:
        from memfit.engine.explain import explained, groups_text, groups_to_dict

        groups = explained(result) if getattr(args, "activations", False) else None
        if args.json:
            data = result.to_dict()
            if groups is not None:
                data["activation_sources"] = groups_to_dict(groups)
            json.dump(data, out, indent=2)
            out.write("\n")
        else:
            print(printable(format_table(result)), file=out)
            if groups is not None:
                print(printable("\n" + groups_text(result, groups)), file=out)
    except BrokenPipeError:
        return 0
    return 0


def _only(pairs: list[str]) -> dict[str, str]:
    """``--only FIELD=VALUE,...`` as a mapping, each field one of the CSV's columns."""
    out: dict[str, str] = {}
    for pair in pairs:
        field, sep, value = pair.partition("=")
        if not sep or field not in ROW_FIELDS:
            raise EstimateError(
                "--only",
                f"got {shown(pair)}, expected FIELD=VALUE with FIELD one of "
                + ", ".join(ROW_FIELDS),
            )
        out[field] = value
    return out


def _compare(args: argparse.Namespace, out: TextIO) -> int:
    """``memfit compare``: scenario files side by side."""
    from memfit.engine.compare import compare as compare_scenarios
    from memfit.engine.compare import to_csv as compare_csv
    from memfit.engine.compare import to_markdown as compare_markdown

    if len(args.files) < 2:
        raise EstimateError("compare", f"got {len(args.files)} file, expected 2 or more")
    named = [(Path(f).name, load_scenario(f)) for f in args.files]
    compared = compare_scenarios(named)
    if args.csv:
        write_text(args.csv, compare_csv(compared))
    if args.json:
        data = {
            "names": list(compared.names),
            "differing": {k: list(v) for k, v in compared.differing},
            "estimates": [e.to_dict() for e in compared.estimates],
        }
        json.dump(data, out, indent=2)
        out.write("\n")
    elif not args.csv:
        out.write(printable(compare_markdown(compared)))
    else:
        print(f"comparison written to {printable(args.csv)}", file=out)
    return 0


def _axis_of(
    scenario: Scenario, family: str | None, best: str | None
) -> tuple[Axis | None, AxisFit | None, str]:
    """The size axis ``memfit largest`` reports on -- ``--family``'s, else the family of
    the largest preset that fits -- with its largest point that fits, or why there is
    none."""
    from memfit.engine.scaling import families_with_axis, largest_on_axis, size_axis

    if family is None and best is None:
        return None, None, "no preset fits to pick a family by (--family picks one)"
    try:
        axis = size_axis(family if family is not None else load_model(str(best)).family)
    except EstimateError as exc:
        if family is not None:
            return None, None, exc.detail
        others = ", ".join(families_with_axis())
        return None, None, f"{exc.detail}; --family picks one of {others}"
    return axis, largest_on_axis(scenario, axis), ""


def _axis_dict(scenario: Scenario, axis: Axis | None, fit: AxisFit | None) -> dict[str, Any]:
    """The ``"axis"`` object of ``memfit largest --json`` (no fit: its fields ``None``)."""
    p = fit.point if fit is not None else None
    m = p.model if p is not None else None
    return {
        "family": axis.family if axis is not None else None,
        "presets": list(axis.presets) if axis is not None else [],
        "left_out": [{"preset": n, "why": w} for n, w in axis.left_out] if axis else [],
        "name": m.name if m is not None else None,
        "preset": p.preset if p is not None else None,
        "between": [p.below, p.above] if p is not None and not p.preset else None,
        "parameters": p.params if p is not None else None,
        "hidden_size": m.hidden_size if m is not None else None,
        "num_layers": m.num_layers if m is not None else None,
        "num_attention_heads": m.num_attention_heads if m is not None else None,
        "num_key_value_heads": m.num_key_value_heads if m is not None else None,
        "intermediate_size": m.intermediate_size if m is not None else None,
        "device_bytes": fit.device_bytes if fit is not None else None,
        "budget_bytes": fit.budget_bytes if fit is not None else None,
        "tokens_per_s": fit.tokens_per_s if fit is not None else None,
        "next": fit.above.model.name if fit is not None and fit.above is not None else None,
        "model": scenario_to_dict(Scenario(m, scenario.hardware, scenario.training))["model"]
        if m is not None
        else None,
    }


def _axis_line(axis: Axis | None, fit: AxisFit | None, problem: str) -> str:
    """The line ``memfit largest`` ends with: the largest that fits along the size axis."""
    if axis is None:
        return f"size axis: none ({problem})"
    where = f"largest along the {axis.family} size axis"
    if fit is None:
        return f"{where}: none fits (it starts at {axis.points[0].model.label})"
    p, m = fit.point, fit.point.model
    if p.preset:
        what = (
            "the family's largest preset: the axis does not go beyond it"
            if fit.above is None
            else f"a preset; the next point up, {fit.above.params / 1e9:,.1f} B, does not fit"
        )
    else:
        what = f"of the family's shape between {p.below} and {p.above}, not a released model"
    return (
        f"{where}: {m.label} ({p.params / 1e9:,.1f} B: hidden {m.hidden_size:,}, "
        f"{m.num_layers} layers, {m.num_attention_heads} heads ({m.num_key_value_heads} "
        f"key/value), intermediate {m.intermediate_size:,}), {fit.device_bytes / GIB:.2f} of "
        f"{fit.budget_bytes / GIB:.2f} GiB per GPU, {fit.tokens_per_s:,.0f} tokens/s -- {what}"
    )


def _largest(args: argparse.Namespace, scenario: Scenario, out: TextIO) -> int:
    """``memfit largest``: every preset under the scenario's hardware and training, then
    the largest that fits along a family's size axis."""
    rows = models_that_fit(scenario, family=args.family)
    if not rows:
        raise EstimateError("--family", f"got {shown(args.family)}: no preset of that family")
    best_row = next((r for r in rows if r.fits), None)
    axis, fit, problem = _axis_of(scenario, args.family, best_row.name if best_row else None)
    hw = scenario.hardware
    if args.json:
        data = {
            "largest": best_row.name if best_row else None,
            "models": [
                {
                    "preset": r.name,
                    "parameters": r.params,
                    "device_bytes": r.device_bytes,
                    "budget_bytes": r.budget_bytes,
                    "fits": r.fits,
                    "tokens_per_s": r.tokens_per_s,
                    "problem": r.problem,
                }
                for r in rows
            ],
            "axis": _axis_dict(scenario, axis, fit) if axis is not None else None,
            "axis_problem": problem,
        }
        json.dump(data, out, indent=2)
        out.write("\n")
        return 0
    where = f"{hw.world_size} x {hw.gpu.display_name}"
    head = (
        f"largest that fits on {where}: {best_row.label} ({best_row.params / 1e9:,.1f} B), "
        f"{best_row.device_bytes / GIB:.2f} of {best_row.budget_bytes / GIB:.2f} GiB per GPU"
        if best_row is not None and best_row.device_bytes is not None
        else f"no preset fits on {where} with this training"
    )
    print(printable(head), file=out)
    print(f"\n{'model':<28} {'params':>10} {'GiB':>9}  {'verdict':<12} {'tokens/s':>10}", file=out)
    for r in rows:
        gib = f"{r.device_bytes / GIB:9.2f}" if r.device_bytes is not None else f"{'-':>9}"
        verdict = "fits" if r.fits else ("refused" if r.device_bytes is None else "too big")
        speed = f"{r.tokens_per_s:10,.0f}" if r.tokens_per_s else f"{'-':>10}"
        line = f"{r.name:<28} {r.params / 1e9:9.2f}B {gib}  {verdict:<12} {speed}"
        print(printable(line), file=out)
    print(printable("\n" + _axis_line(axis, fit, problem)), file=out)
    return 0


def _grid(args: argparse.Namespace, scenario: Scenario, out: TextIO) -> int:
    """``memfit grid``: memory and tokens/s over micro-batches and sequence lengths."""

    def sizes(values: list[str], flag: str) -> list[int]:
        try:
            out = [int(v) for v in values]
        except ValueError:
            raise EstimateError(
                flag, f"got {shown(','.join(values))}, expected whole numbers"
            ) from None
        if not out or min(out) < 1:
            raise EstimateError(flag, "expected sizes of 1 or more")
        return out

    batches, seqs = sizes(args.batches, "--batches"), sizes(args.seqs, "--seqs")
    cells = shape_grid(scenario, batches, seqs)
    if args.json:
        data = [
            {
                "micro_batch_size": c.micro_batch_size,
                "sequence_length": c.sequence_length,
                "device_bytes": c.device_bytes,
                "budget_bytes": c.budget_bytes,
                "fits": c.fits,
                "tokens_per_s": c.tokens_per_s,
            }
            for row in cells
            for c in row
        ]
        json.dump({"cells": data}, out, indent=2)
        out.write("\n")
        return 0
    budget = scenario.hardware.budget_bytes / GIB
    print(
        printable(
            f"{scenario.model.label}: GiB per GPU (budget {budget:.1f}; * over it) and "
            "tokens/s, micro-batch down, sequence length across"
        ),
        file=out,
    )
    print(f"{'mb':>4} " + "".join(f"{n:>18,}" for n in seqs), file=out)
    for row in cells:
        parts = []
        for c in row:
            if c.device_bytes is None:
                parts.append(f"{'-':>18}")
                continue
            mark = " " if c.fits else "*"
            parts.append(f"{c.device_bytes / GIB:8.1f}{mark}{(c.tokens_per_s or 0):>9,.0f}")
        print(f"{row[0].micro_batch_size:>4} " + "".join(parts), file=out)
    return 0


def _on_gpus(scenario: Scenario, gpus: int | None) -> Scenario:
    """``scenario`` on ``gpus`` GPUs: one node up to its size, else whole nodes."""
    if gpus is None:
        return scenario
    hw = scenario.hardware
    node = hw.gpus_per_node if hw.nodes > 1 else max(hw.gpus_per_node, SERVER_GPUS)
    if gpus < 1 or (gpus > node and gpus % node):
        raise EstimateError(
            "--gpus",
            f"got {shown(gpus)}, expected 1 to {node} or a multiple of {node} (GPUs per node)",
        )
    per_node, nodes = (gpus, 1) if gpus <= node else (node, gpus // node)
    return with_gpus(scenario, per_node, nodes)


def _plan(args: argparse.Namespace, scenario: Scenario, out: TextIO) -> int:
    """``memfit fit`` and ``memfit sweep``."""
    scenario = _on_gpus(scenario, args.gpus)
    locks = check_locks(args.lock)
    space = locked(default_space(scenario), scenario, locks)
    left: list[Scenario] = []
    if args.jobs < 0 or args.jobs > MAX_JOBS:
        raise EstimateError(
            "--jobs", f"got {shown(args.jobs)}, expected 0 (one per CPU) to {MAX_JOBS}"
        )
    workers = args.jobs or min(cpus(), DEFAULT_JOBS)
    if args.command == "fit" and args.top < 1:
        raise EstimateError("--top", f"got {shown(args.top)}, expected at least 1")
    planned: dict[str, Any] = {}
    wanted = _only(args.only)

    def meanwhile() -> None:
        """What the command answers beside the sweep's points, worked out while the
        sweep's processes run (it reads none of their points): the strategies the stack
        cannot run (the sweep has gathered them by then), and for ``fit`` the limits and
        make-it-fit."""
        planned["beyond"] = beyond_stack(scenario, space, left)
        if args.command != "fit":
            return
        planned["limits"] = {
            "max_micro_batch_size": max_micro_batch(scenario),
            "max_sequence_length": max_sequence_length(scenario),
            "min_gpus": (lambda s: s.hardware.world_size if s else None)(min_gpus(scenario)),
        }
        leave_out = [c for lock in locks for c in LOCKS[lock]]
        fitting = fits(scenario)
        planned["found"] = None if fitting else search(scenario, top=args.top, leave_out=leave_out)

    swept = sweep(
        scenario,
        space,
        beyond=left,
        workers=workers,
        meanwhile=meanwhile,
        # fit reads the times of the points that fit (the fastest of them), unless its
        # filter reads every point's
        times="fitting" if args.command == "fit" and not set(wanted) & set(TIME_FIELDS) else "all",
    )
    points = only(swept, wanted)
    beyond: Beyond = planned["beyond"]
    left_out = {
        "strategies": beyond.strategies,
        "stack_cannot_run": list(beyond.needs),
        "stacks_that_can": list(beyond.stacks),
    }
    if args.command == "sweep":
        if args.csv:
            write_text(args.csv, points_csv(points))
        if args.json:
            # compact: the scenario swept around once, then each point's varying settings
            # and results as a row of "fields" (one string, written at once)
            data = {
                "configs": len(points),
                "left_out": left_out,
                "base": scenario_to_dict(scenario),
                "fields": list(ROW_FIELDS),
                "points": [p.values() for p in points],
            }
            out.write(json.dumps(data) + "\n")
        elif not args.csv:
            out.write(points_csv(points))
        else:
            print(f"{len(points):,} configurations written to {printable(args.csv)}", file=out)
        return 0
    top = best(points, args.top)
    limits, found = planned["limits"], planned["found"]
    fixes = list(found.fixes) if found is not None else []
    floor = found.floor if found is not None and not fixes else None
    if args.json:
        fix_rows = [
            {
                "changes": list(f.changes),
                "labels": list(f.labels),
                "device_bytes": f.device_bytes,
                "time": f.time.as_dict(),
                "scenario": scenario_to_dict(f.scenario),
            }
            for f in fixes
        ]
        json.dump(
            {
                **limits,
                "configs": [p.as_dict() for p in top],
                "fixes": fix_rows,
                "floor": None
                if floor is None
                else {
                    "changes": list(floor.changes),
                    "labels": list(floor.labels),
                    "device_bytes": floor.device_bytes,
                    "budget_bytes": floor.budget_bytes,
                    "breakdown": dict(estimate(floor.scenario).breakdown),
                },
                "left_out": left_out,
            },
            out,
            indent=2,
        )
        out.write("\n")
        return 0
    print(
        printable(
            f"{scenario.model.label} on {scenario.hardware.world_size} x "
            f"{scenario.hardware.gpu.display_name}: {len(points):,} configurations, "
            f"{sum(p.fits for p in points):,} fit the budget"
        ),
        file=out,
    )
    for key, value in limits.items():
        print(f"  {key.replace('_', ' ')}: {value if value is not None else 'none fits'}", file=out)
    if beyond.strategies:
        print(printable(f"  {beyond.sentence()}"), file=out)
    print(
        f"\n{'#':>3} {'GiB':>8} {'tokens/s':>12} {'MFU':>6}  {'bound':<17} configuration", file=out
    )
    differs: dict[str, None] = {}
    for i, p in enumerate(top, 1):
        changed = numerics_changed(scenario, p.scenario)
        differs.update(dict.fromkeys(changed))
        mark = f" {NUMERICS_MARK}" if changed else ""
        print(
            f"{i:>3} {p.device_bytes / GIB:>8.2f} {p.time.tokens_per_s:>12,.0f} "
            f"{100 * p.time.mfu:>5.1f}%  {p.time.bound:<17} {describe(p.scenario)}{mark}",
            file=out,
        )
    if differs:
        print(f"  {NUMERICS_MARK} trains differently: {'; '.join(differs)}", file=out)
    if not top:
        print("no configuration of the space fits the budget", file=out)
    if floor is not None:
        made = " + ".join(floor.labels) or "the scenario as it is"
        lowest = estimate(floor.scenario)
        parts = ", ".join(f"{c} {b / GIB:.2f}" for c, b in lowest.breakdown.items() if b)
        print(
            f"\nnothing makes it fit: the least it goes down to is {floor.device_bytes / GIB:.2f}"
            f" GiB per GPU ({made}), over the budget of {floor.budget_bytes / GIB:.2f} GiB;"
            f" that floor is {parts} (GiB)",
            file=out,
        )
    if fixes:
        print("\nmake it fit: the changes to this scenario, fastest first", file=out)
        for i, f in enumerate(fixes, 1):
            mark = f" {NUMERICS_MARK}" if numerics_changed(scenario, f.scenario) else ""
            print(
                f"{i:>3} {f.device_bytes / GIB:>8.2f} {f.time.tokens_per_s:>12,.0f}  "
                f"{' + '.join(f.labels)}{mark}",
                file=out,
            )
    return 0


def printable(text: str) -> str:
    """``text`` with every control character but the line break, and anything that is not
    valid Unicode, shown as an escape: nothing a file holds can drive the terminal."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


_UNPRINTABLE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
#: the longest line an error or a note of the command line takes
MAX_LINE = 500


def message_line(text: str) -> str:
    """An error or a note as one printable line of at most :data:`MAX_LINE` characters: a
    line break is shown as ``\\n``, and a long value the message repeats is cut
    (:func:`memfit.engine.errors.bounded`)."""
    return bounded(printable(text).replace("\n", "\\n"), MAX_LINE)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""DeepSpeed's JSON config (``zero_optimization``, offload, buckets, optimizer, precision),
read on its own or where another format names one."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from memfit.engine.errors import EstimateError, check_text, shown
from memfit.engine.files import read_text
from memfit.engine.train_configs.common import (
    _OFFLOAD_DEVICES,
    _named_file,
    _Out,
    _Reader,
    _unshown,
)
from memfit.engine.train_configs.parse import _FIELD, _SIGNATURES, MAX_CONFIG_BYTES, _parse

#: DeepSpeed settings whose value MemFit takes as DeepSpeed's default (its buckets)
_DS_BUCKETS = (
    "reduce_bucket_size",
    "allgather_bucket_size",
    "stage3_prefetch_bucket_size",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
    "stage3_param_persistence_threshold",
    "sub_group_size",
)
_DS_QUIET_ZERO = frozenset(
    {
        "overlap_comm",
        "contiguous_gradients",
        "reduce_scatter",
        "allgather_partitions",
        "round_robin_gradients",
        "stage3_gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save",
        "load_from_fp32_weights",
        "elastic_checkpoint",
        "ignore_unused_parameters",
        "cpu_offload",
        "memory_efficient_linear",
        "use_multi_rank_bucket_allreduce",
        "log_trace_cache_warnings",
    }
)
_DS_QUIET = frozenset(
    {
        "scheduler",
        "gradient_clipping",
        "steps_per_print",
        "wall_clock_breakdown",
        "prescale_gradients",
        "gradient_predivide_factor",
        "communication_data_type",
        "zero_allow_untested_optimizer",
        "zero_force_ds_cpu_optimizer",
        "flops_profiler",
        "tensorboard",
        "wandb",
        "csv_monitor",
        "comet",
        "comms_logger",
        "dump_state",
        "checkpoint",
        "elasticity",
        "aio",
        "memory_breakdown",
        "sparse_gradients",
        "seed",
        "dataloader_drop_last",
        "train_batch_size",
    }
)
_DS_OPTIMIZERS = {"Adam": "adamw", "AdamW": "adamw", "Lion": "lion"}


def _auto(value: Any) -> bool:
    return isinstance(value, str) and value == "auto"


def _deepspeed(out: _Out, ds: _Reader, key: str) -> None:
    """A DeepSpeed config (a file of its own, or the dict a Trainer or accelerate holds)."""
    out.set("parallelism.framework", "deepspeed", key)
    zero = ds.section("zero_optimization")
    value = zero.raw("stage") if zero is not None else None
    stage = 0
    if _auto(value):
        out.note(f'{ds.key("zero_optimization.stage")} is "auto": the launcher sets the stage')
    elif value is not None:
        out.set("parallelism.zero_stage", value, ds.key("zero_optimization.stage"))
        stage = value
    else:
        out.set("parallelism.zero_stage", 0, ds.key("zero_optimization.stage"))
        out.note(f"{ds.key('zero_optimization.stage')} not set: DeepSpeed's default, stage 0")
    if zero is not None:
        for section, target in (
            ("offload_optimizer", "offload.optimizer"),
            ("offload_param", "offload.parameters"),
        ):
            sub = zero.section(section)
            if sub is None:
                continue
            device = sub.choice("device", _OFFLOAD_DEVICES)
            if device is None or device == "none":
                continue
            if target == "offload.parameters" and stage < 3:
                out.ignore(
                    sub.key("device"),
                    "parameter offload needs ZeRO stage 3 (DeepSpeed ignores it below)",
                )
                continue
            out.set(target, device, sub.key("device"))
            sub.rest(
                (
                    "pin_memory",
                    "buffer_count",
                    "buffer_size",
                    "nvme_path",
                    "fast_init",
                    "ratio",
                    "pipeline",
                    "pipeline_read",
                    "pipeline_write",
                    "max_in_cpu",
                )
            )
        for bucket in _DS_BUCKETS:
            value = zero.raw(bucket)
            if value is not None and not _auto(value):
                out.ignore(zero.key(bucket), "DeepSpeed's default is modelled, not this value")
        zero.rest(_DS_QUIET_ZERO)
    precision = None
    for name, label in (("bf16", "bf16-mixed"), ("bfloat16", "bf16-mixed"), ("fp16", "fp16-mixed")):
        sub = ds.section(name)
        if sub is None:
            continue
        enabled = sub.raw("enabled")
        if _auto(enabled):
            out.note(f'{sub.key("enabled")} is "auto": the precision comes from the Trainer')
        elif enabled is not None:
            if not isinstance(enabled, bool):
                raise EstimateError(
                    sub.key("enabled"), f'got {shown(enabled)}, expected true, false or "auto"'
                )
            if enabled:
                if precision is not None:
                    raise EstimateError(sub.key("enabled"), "bf16 and fp16 are both enabled")
                precision = label
                out.set("precision", label, sub.key("enabled"))
        sub.seen.update(sub.data)  # loss scaling and the like: no effect on memory
    micro = ds.raw("train_micro_batch_size_per_gpu")
    if _auto(micro):
        where = ds.key("train_micro_batch_size_per_gpu")
        out.note(f'{where} is "auto": the Trainer\'s per-device batch is used')
    elif micro is not None:
        out.set("micro_batch_size", micro, ds.key("train_micro_batch_size_per_gpu"))
    accum = ds.raw("gradient_accumulation_steps")
    if accum is not None and not _auto(accum):
        out.set("gradient_accumulation_steps", accum, ds.key("gradient_accumulation_steps"))
    total = ds.raw("train_batch_size")
    if (
        isinstance(total, int)
        and not isinstance(total, bool)
        and isinstance(micro, int)
        and isinstance(accum, int)
        and micro > 0
        and accum > 0
    ):
        out.note(
            f"train_batch_size {total} = {micro} x {accum} x {total // (micro * accum)} GPUs (the "
            "GPUs are not set from it)"
        )
    opt = ds.section("optimizer")
    if opt is not None:
        kind = opt.text("type")
        if kind is not None:
            if kind not in _DS_OPTIMIZERS:
                raise EstimateError(
                    opt.key("type"),
                    f"got {shown(kind)}, expected one of {', '.join(_DS_OPTIMIZERS)}",
                )
            out.set("optimizer", _DS_OPTIMIZERS[kind], opt.key("type"))
            params = opt.section("params")
            torch_adam = params.boolean("torch_adam") if params is not None else None
            if kind != "Lion":
                out.set("optimizer_impl", "foreach" if torch_adam else "fused", opt.key("type"))
            if params is not None:
                params.seen.update(params.data)
    if ds.has("activation_checkpointing"):
        ds.raw("activation_checkpointing")
        out.ignore(
            ds.key("activation_checkpointing"),
            "configures deepspeed.checkpointing for models that call it; whether the model "
            "checkpoints is the training script's choice",
        )
    for name, reason in (
        ("data_types", "the gradient accumulation dtype is not modelled"),
        ("amp", "apex AMP is not modelled"),
        ("pipeline", "the pipeline split is set in the model code"),
        ("sequence_parallel_size", "DeepSpeed-Ulysses sequence parallelism is not modelled"),
        ("compression_training", "compression training is not modelled"),
        ("zero_quantized_weights", "ZeRO++ quantized weights are not modelled"),
        ("zero_hpz_partition_size", "ZeRO++ hierarchical partitioning is not modelled"),
    ):
        ds.flag(name, reason)
    ds.rest(_DS_QUIET)


_ZERO_NAME = re.compile(r"zero[_-]?([0-3])", re.IGNORECASE)
#: keys a DeepSpeed config has at its top level; a named file with none of them is no
#: DeepSpeed config (a token, a page, someone else's settings) and is not read further
_DS_TOP_KEYS = _SIGNATURES["deepspeed"] | {
    "bf16", "bfloat16", "fp16", "optimizer", "scheduler", "gradient_accumulation_steps",
    "amp", "data_types", "zero_quantized_weights", "zero_hpz_partition_size",
}  # fmt: skip


def _deepspeed_reference(out: _Out, value: Any, key: str) -> None:
    """The ``deepspeed`` key of a Trainer or Axolotl config: a DeepSpeed config as a dict,
    or the path of one: read when it is in the config's folder (:func:`_named_file`), else
    its name is read for the ZeRO stage, as Axolotl's shipped
    ``deepspeed_configs/zero3_bf16.json``. Nothing the named file holds is ever shown."""
    if isinstance(value, dict):
        _deepspeed(out, _Reader(value, key + ".", out), key)
        return
    path = check_text(key, value)
    target = _named_file(out, key, path)
    if isinstance(target, Path):
        # a FIFO, a device or a folder is refused here, at once, by read_text
        text = read_text(target, key, MAX_CONFIG_BYTES)
        try:
            data = _parse(text, target.name, target.suffix.lower())
            if not _DS_TOP_KEYS & set(data):
                raise EstimateError(_FIELD, "no DeepSpeed key")
            _deepspeed(out, _Reader(data, f"{key}[{target.name}].", out), key)
        except EstimateError as exc:
            raise _unshown(exc, key, target.name) from None
        return
    why = target or "was not found"
    out.set("parallelism.framework", "deepspeed", key)
    match = _ZERO_NAME.search(Path(path).name)
    if match is None:
        out.note(f"{key} {shown(path)} {why}: DeepSpeed with the scenario's ZeRO stage")
        return
    stage = int(match.group(1))
    out.set("parallelism.zero_stage", stage, key)
    name = Path(path).name.lower()
    if stage == 3 and "cpuoffload_all" in name:
        out.set("offload.optimizer", "cpu", key)
        out.set("offload.parameters", "cpu", key)
    elif stage == 3 and "cpuoffload_params" in name:
        out.set("offload.parameters", "cpu", key)
    out.note(f"{key} {shown(path)} {why}: ZeRO stage {stage} read from its name")


# --------------------------------------------------------------------------------------
# DeepSpeed and accelerate files


def _deepspeed_file(r: _Reader) -> None:
    _deepspeed(r.out, r, "zero_optimization")
    r.out.note("a DeepSpeed config names no training loop: the scenario's stack is kept")

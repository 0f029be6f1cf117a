"""Accelerate's config YAML: the distributed type, mixed precision, and its FSDP, DeepSpeed
or Megatron-LM section."""

from __future__ import annotations

from memfit.engine.errors import EstimateError, shown
from memfit.engine.train_configs.common import _OFFLOAD_DEVICES, _fsdp, _Reader
from memfit.engine.train_configs.deepspeed import _auto, _deepspeed_reference

_ACCELERATE_PRECISIONS = {
    "no": "fp32",
    "fp16": "fp16-mixed",
    "bf16": "bf16-mixed",
    "fp8": "fp8-mixed",
}
_ACCELERATE_TYPES = ("NO", "MULTI_GPU", "FSDP", "DEEPSPEED", "MEGATRON_LM")
_ACCELERATE_OTHER = (
    "MULTI_CPU",
    "MULTI_XPU",
    "MULTI_NPU",
    "MULTI_MLU",
    "MULTI_SDAA",
    "MULTI_MUSA",
    "MULTI_HPU",
    "XLA",
    "TPU",
)
_ACCELERATE_QUIET = frozenset(
    {
        "compute_environment", "debug", "machine_rank", "main_process_ip", "main_process_port",
        "main_training_function", "rdzv_backend", "same_network", "tpu_env", "tpu_use_cluster",
        "tpu_use_sudo", "tpu_name", "tpu_zone", "gpu_ids", "downcast_bf16",
        "enable_cpu_affinity", "use_cpu", "ipex_config", "mpirun_config", "fsdp_config",
        "deepspeed_config", "megatron_lm_config", "commands", "command_file", "dynamo_backend",
    }
)  # fmt: skip


def _accelerate(r: _Reader) -> None:
    out = r.out
    out.note("an accelerate config names no training loop: the scenario's stack is kept")
    kind_value = r.text("distributed_type")
    kind = kind_value.upper() if kind_value is not None else None
    if kind in _ACCELERATE_OTHER:
        raise EstimateError(
            "distributed_type",
            f"got {shown(kind_value)}: only GPU training is modelled; expected one of "
            f"{', '.join(_ACCELERATE_TYPES)}",
        )
    if kind is not None and kind not in _ACCELERATE_TYPES:
        raise EstimateError(
            "distributed_type",
            f"got {shown(kind_value)}, expected one of {', '.join(_ACCELERATE_TYPES)}",
        )
    if r.boolean("use_cpu"):
        raise EstimateError("use_cpu", "training on the CPU is not modelled")
    processes = r.integer("num_processes")
    machines = r.integer("num_machines")
    if machines is not None:
        out.set_hardware("nodes", machines, "num_machines")
    if processes is not None:
        if processes < 1 or processes % (machines or 1):
            raise EstimateError(
                "num_processes",
                f"got {shown(processes)}, expected a positive multiple of num_machines "
                f"({machines or 1})",
            )
        out.set_hardware("gpus_per_node", processes // (machines or 1), "num_processes")
        per_node = processes // (machines or 1)
        if (machines or 1) > 1:
            out.note(f"num_processes {processes} is every process of the run: {per_node} per node")
    precision = "no" if r.data.get("mixed_precision") is False else None  # YAML's bare no
    if precision is None:
        precision = r.choice("mixed_precision", _ACCELERATE_PRECISIONS, lower=True)
    r.seen.add("mixed_precision")
    if precision is not None:
        out.set("precision", _ACCELERATE_PRECISIONS[precision], "mixed_precision")
    if kind == "FSDP":
        config = r.section("fsdp_config")
        _fsdp(out, None, config, "distributed_type")
    elif kind == "DEEPSPEED":
        _accelerate_deepspeed(r)
    elif kind == "MEGATRON_LM":
        _accelerate_megatron(r)
    elif kind == "MULTI_GPU":
        out.set("parallelism.framework", "pytorch", "distributed_type")
        out.set("parallelism.zero_stage", 0, "distributed_type")
    dynamo = r.raw("dynamo_config")
    backend = dynamo.get("dynamo_backend") if isinstance(dynamo, dict) else r.raw("dynamo_backend")
    if isinstance(backend, str) and backend.upper() != "NO":
        out.set("torch_compile", True, "dynamo_config" if dynamo else "dynamo_backend")
    parallel = r.section("parallelism_config")
    if parallel is not None:
        for key, name in (
            ("parallelism_config_tp_size", "parallelism.tp"),
            ("parallelism_config_cp_size", "parallelism.cp"),
            # HSDP: groups of ranks that each hold one whole set of shards
            ("parallelism_config_dp_replicate_size", "parallelism.dp_replicate"),
        ):
            value = parallel.integer(key)
            if value is not None and value > 1:
                out.set(name, value, parallel.key(key))
        # the shard group is what the GPUs leave after tp, cp and the replicas
        parallel.rest(("parallelism_config_dp_shard_size",))
    r.rest(_ACCELERATE_QUIET)


def _accelerate_deepspeed(r: _Reader) -> None:
    out = r.out
    ds = r.section("deepspeed_config")
    if ds is None:
        out.set("parallelism.framework", "deepspeed", "distributed_type")
        return
    file = ds.text("deepspeed_config_file")
    if file is not None:
        _deepspeed_reference(out, file, ds.key("deepspeed_config_file"))
    else:
        out.set("parallelism.framework", "deepspeed", "distributed_type")
    stage = ds.integer("zero_stage")
    if stage is not None:
        out.set("parallelism.zero_stage", stage, ds.key("zero_stage"))
    for key, target in (
        ("offload_optimizer_device", "offload.optimizer"),
        ("offload_param_device", "offload.parameters"),
    ):
        device = ds.choice(key, _OFFLOAD_DEVICES)
        if device is not None and device != "none":
            out.set(target, device, ds.key(key))
    accum = ds.raw("gradient_accumulation_steps")
    if accum is not None and not _auto(accum):
        out.set("gradient_accumulation_steps", accum, ds.key("gradient_accumulation_steps"))
    ds.rest(
        (
            "gradient_clipping",
            "zero3_init_flag",
            "zero3_save_16bit_model",
            "offload_optimizer_nvme_path",
            "offload_param_nvme_path",
            "deepspeed_multinode_launcher",
            "deepspeed_hostfile",
            "deepspeed_exclusion_filter",
            "deepspeed_inclusion_filter",
        )
    )


def _accelerate_megatron(r: _Reader) -> None:
    out = r.out
    out.set("parallelism.framework", "megatron", "distributed_type")
    mg = r.section("megatron_lm_config")
    if mg is None:
        return
    for key, name in (
        ("megatron_lm_tp_degree", "parallelism.tp"),
        ("megatron_lm_pp_degree", "parallelism.pp"),
    ):
        value = mg.integer(key)
        if value is not None:
            out.set(name, value, mg.key(key))
    sp = mg.boolean("megatron_lm_sequence_parallelism")
    if sp is not None:
        out.set("parallelism.sequence_parallel", sp, mg.key("megatron_lm_sequence_parallelism"))
    if mg.boolean("megatron_lm_recompute_activations"):
        out.set(
            "activation_checkpointing", "selective", mg.key("megatron_lm_recompute_activations")
        )
    if mg.boolean("megatron_lm_use_distributed_optimizer"):
        out.set("parallelism.zero_stage", 1, mg.key("megatron_lm_use_distributed_optimizer"))
    mg.rest(("megatron_lm_num_micro_batches", "megatron_lm_gradient_clipping"))

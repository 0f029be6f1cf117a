"""torchtune's recipe YAML configs: the model component, the loss, checkpointing, offload
and the distributed set-up."""

from __future__ import annotations

from memfit.engine.errors import EstimateError, shown
from memfit.engine.train_configs.common import (
    _TORCHTUNE_MODELS,
    _component_optimizer,
    _fsdp_offload,
    _Reader,
    _sequence,
)

# --------------------------------------------------------------------------------------
# torchtune


_TORCHTUNE_ATTN = {
    "q_proj": "q_proj",
    "k_proj": "k_proj",
    "v_proj": "v_proj",
    "output_proj": "o_proj",
}
_TORCHTUNE_DTYPES = {"bf16": "bf16", "fp32": "fp32"}
_TORCHTUNE_LOSSES = {
    "torchtune.modules.loss.CEWithChunkedOutputLoss": "chunked-output",
    "torchtune.modules.loss.LinearCrossEntropyLoss": "chunked-output",
    "torch.nn.CrossEntropyLoss": "standard",
}
_TORCHTUNE_QUIET = frozenset(
    {
        "output_dir", "tokenizer", "dataset", "seed", "shuffle", "epochs",
        "max_steps_per_epoch", "checkpointer", "resume_from_checkpoint",
        "save_adapter_weights_only", "lr_scheduler", "metric_logger", "log_every_n_steps",
        "log_peak_memory_stats", "log_level", "profiler", "device", "low_cpu_ram",
        "clip_grad_norm", "save_every_n_steps", "run_val_every_n_steps", "dataset_val",
        "custom_sharded_layers", "data_parallel_shard_dim", "cudnn_deterministic_mode",
        "enable_kv_cache", "collate_fn", "cpu_offload_optimizer",
    }
)  # fmt: skip


def _torchtune(r: _Reader) -> None:
    out = r.out
    out.set("stack", "torchtune", "(format)")
    model = r.section("model")
    if model is not None:
        _torchtune_model(model)
    batch = r.integer("batch_size")
    if batch is not None:
        out.set("micro_batch_size", batch, "batch_size")
    accum = r.integer("gradient_accumulation_steps")
    if accum is not None:
        out.set("gradient_accumulation_steps", accum, "gradient_accumulation_steps")
    dtype = r.choice("dtype", _TORCHTUNE_DTYPES)
    if dtype is not None:
        out.set("precision", _TORCHTUNE_DTYPES[dtype], "dtype")
    _torchtune_sequence(r)
    _torchtune_checkpointing(r)
    optimizer = r.section("optimizer")
    if optimizer is not None:
        _component_optimizer(out, optimizer)
    in_backward = r.boolean("optimizer_in_bwd")
    if in_backward is not None:
        out.set("optimizer_in_backward", in_backward, "optimizer_in_bwd")
    loss = r.section("loss")
    if loss is not None:
        component = loss.text("_component_")
        if component in _TORCHTUNE_LOSSES:
            out.set("loss", _TORCHTUNE_LOSSES[component], loss.key("_component_"))
            if component.endswith("LinearCrossEntropyLoss"):
                out.note(
                    "LinearCrossEntropyLoss counted as CEWithChunkedOutputLoss (every chunk's "
                    "logits kept); its skipping of masked positions is not modelled"
                )
            chunks = loss.integer("num_output_chunks")
            if chunks is not None:
                out.set("loss_chunks", chunks, loss.key("num_output_chunks"))
        elif component is not None:
            out.ignore(
                loss.key("_component_"),
                f"{shown(component)} is not modelled; the stack's loss is used",
            )
        loss.seen.update(loss.data)
    _torchtune_distributed(r)
    r.compiled("compile")
    for key, reason in (
        ("ref_model", "preference training (a reference model) is not modelled"),
        ("teacher_model", "knowledge distillation (a teacher model) is not modelled"),
        ("quantizer", "quantization-aware training is not modelled"),
    ):
        r.flag(key, reason)
    r.rest(_TORCHTUNE_QUIET)


def _torchtune_model(model: _Reader) -> None:
    out = model.out
    component = model.text("_component_")
    if component is None:
        raise EstimateError(model.key("_component_"), "missing: the model builder")
    out.model = component
    builder = component.rsplit(".", 1)[-1]
    method = (
        "qlora"
        if builder.startswith("qlora_")
        else "lora"
        if builder.startswith("lora_")
        else "full"
    )
    base = builder.removeprefix("qlora_").removeprefix("lora_")
    base = base.removesuffix("_base").removesuffix("_instruct")
    if base not in _TORCHTUNE_MODELS:
        out.note(
            f"model._component_ {shown(component)} is not a builder of a MemFit preset: the "
            "scenario's model is kept"
        )
    if model.boolean("quantize_base") and method == "lora":
        method = "qlora"
    out.set("method", method, model.key("_component_"))
    if method == "full":
        model.seen.update(model.data)
        return
    for key, name in (
        ("lora_rank", "lora.rank"),
        ("lora_alpha", "lora.alpha"),
        ("lora_dropout", "lora.dropout"),
    ):
        value = model.integer(key) if name == "lora.rank" else model.number(key)
        if value is not None:
            out.set(name, value, model.key(key))
    modules = model.names("lora_attn_modules")
    mlp = model.boolean("apply_lora_to_mlp")
    if modules is not None or mlp:
        targets: list[str] = []
        for name in modules or ():
            if name not in _TORCHTUNE_ATTN:
                accepted = ", ".join(_TORCHTUNE_ATTN)
                raise EstimateError(
                    model.key("lora_attn_modules"), f"got {shown(name)}, expected one of {accepted}"
                )
            targets.append(_TORCHTUNE_ATTN[name])
        if mlp:
            targets.extend(("gate_proj", "up_proj", "down_proj"))
        out.set("lora.targets", targets, model.key("lora_attn_modules"))
    model.flag("apply_lora_to_output", "LoRA on the output projection (LM head) is not modelled")
    model.flag("use_dora", "DoRA's magnitude vectors and weight norms are not modelled")
    model.rest(())


def _preset_of_component(component: str) -> str | None:
    builder = component.rsplit(".", 1)[-1].removeprefix("qlora_").removeprefix("lora_")
    return _TORCHTUNE_MODELS.get(builder.removesuffix("_base").removesuffix("_instruct"))


def _torchtune_sequence(r: _Reader) -> None:
    out = r.out
    tokenizer = r.data.get("tokenizer")
    dataset = r.data.get("dataset")
    datasets = dataset if isinstance(dataset, list) else [dataset]
    packed = any(isinstance(d, dict) and d.get("packed") is True for d in datasets)
    if isinstance(tokenizer, dict):
        sub = _Reader(tokenizer, "tokenizer.", out)
        length = sub.integer("max_seq_len")
        if length is not None:
            _sequence(out, length, "tokenizer.max_seq_len", packed)
        elif "max_seq_len" in tokenizer:
            out.note(
                "tokenizer.max_seq_len is null: samples keep their own lengths; the scenario's "
                "sequence length is kept"
            )


def _torchtune_checkpointing(r: _Reader) -> None:
    out = r.out
    on = r.boolean("enable_activation_checkpointing")
    mode = r.text("ac_mode")
    option = r.raw("ac_option")
    if on is not None:
        if on and mode == "selective" and isinstance(option, int) and not isinstance(option, bool):
            out.set("activation_checkpointing", "every-k-layers", "ac_mode")
            out.set("checkpoint_every_k", option, "ac_option")
        else:
            out.set(
                "activation_checkpointing",
                "full" if on else "none",
                "enable_activation_checkpointing",
            )
    if r.boolean("enable_activation_offloading"):
        if on:
            out.set("offload.activations", "cpu", "enable_activation_offloading")
        else:
            out.ignore(
                "enable_activation_offloading",
                "offloading every saved activation (without checkpointing) is not modelled",
            )


def _torchtune_distributed(r: _Reader) -> None:
    """The distributed recipes' keys: FSDP2 over every GPU of the run (how many is a
    command-line choice, ``tune run --nproc_per_node``)."""
    out = r.out
    keys = (
        "fsdp_cpu_offload",
        "fsdp_reshard_after_forward",
        "custom_sharded_layers",
        "tensor_parallel_dim",
        "tensor_parallel_plan",
        "data_parallel_shard_dim",
        "data_parallel_replicate_dim",
        "context_parallel_dim",
    )
    present = [k for k in keys if k in r.data]
    if not present:
        return
    out.set("parallelism.framework", "pytorch", present[0])
    reshard = r.boolean("fsdp_reshard_after_forward")
    stage = 2 if reshard is False else 3
    out.set(
        "parallelism.zero_stage",
        stage,
        "fsdp_reshard_after_forward" if reshard is not None else present[0],
    )
    if r.boolean("fsdp_cpu_offload"):
        _fsdp_offload(out, stage, "fsdp_cpu_offload")
    for key, name in (
        ("tensor_parallel_dim", "parallelism.tp"),
        ("context_parallel_dim", "parallelism.cp"),
    ):
        value = r.integer(key)
        if value is not None and value > 1:
            out.set(name, value, key)
    replicate = r.raw("data_parallel_replicate_dim")
    if isinstance(replicate, int) and not isinstance(replicate, bool) and replicate > 1:
        out.ignore(
            "data_parallel_replicate_dim",
            "replicated FSDP groups are derived from the GPUs, not given",
        )
    r.raw("tensor_parallel_plan")
    out.note(
        "a distributed recipe: FSDP2 over the run's GPUs; their number is given to tune run "
        "(--nproc_per_node), so the scenario's GPUs are kept"
    )

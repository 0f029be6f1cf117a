"""Axolotl's YAML config: base model, adapter (LoRA/QLoRA), precision, checkpointing,
attention, the loss (and Liger's kernels), FSDP/DeepSpeed."""

from __future__ import annotations

from memfit.engine.errors import EstimateError, shown
from memfit.engine.train_configs.common import (
    _attention,
    _fsdp,
    _hf_optimizer,
    _modules_to_save,
    _name_model,
    _Reader,
    _reentrant_checkpointing,
    _sequence,
    _targets,
)
from memfit.engine.train_configs.deepspeed import _deepspeed_reference

# --------------------------------------------------------------------------------------
# Axolotl


_AXOLOTL_QUIET = frozenset(
    {
        "base_model_config", "model_type", "tokenizer_type", "tokenizer_config",
        "tokenizer_use_fast", "tokenizer_legacy", "trust_remote_code", "is_llama_derived_model",
        "is_mistral_derived_model", "is_falcon_derived_model", "is_qwen_derived_model",
        "revision_of_model", "strict", "chat_template", "chat_template_jinja",
        "default_system_message", "datasets", "test_datasets", "dataset_prepared_path",
        "dataset_processes", "dataset_num_proc", "dataset_exact_deduplication",
        "shuffle_merged_datasets", "val_set_size", "output_dir", "hub_model_id",
        "hub_strategy", "push_dataset_to_hub", "hf_use_auth_token", "wandb_project",
        "wandb_entity", "wandb_watch", "wandb_name", "wandb_run_id", "wandb_log_model",
        "mlflow_tracking_uri", "mlflow_experiment_name", "use_wandb", "use_mlflow",
        "use_tensorboard", "comet_api_key", "comet_project_name", "num_epochs", "max_steps",
        "learning_rate", "lr_scheduler", "lr_scheduler_kwargs", "cosine_min_lr_ratio",
        "cosine_constant_lr_ratio", "lr_quadratic_warmup", "lr_div_factor", "warmup_steps",
        "warmup_ratio", "weight_decay", "adam_beta1", "adam_beta2", "adam_beta3",
        "adam_epsilon", "adam_epsilon2", "max_grad_norm", "optim_args", "loraplus_lr_ratio",
        "loraplus_lr_embedding", "embedding_lr", "embedding_lr_scale", "train_on_inputs",
        "group_by_length", "eval_sample_packing", "pad_to_sequence_len", "sample_packing_eff_est",
        "sample_packing_group_size", "sample_packing_bin_size", "sample_packing_sequentially",
        "multipack_real_batches", "evals_per_epoch", "eval_steps", "eval_strategy",
        "saves_per_epoch", "save_steps", "save_strategy", "save_total_limit",
        "save_safetensors", "save_first_step", "save_only_model", "logging_steps",
        "early_stopping_patience", "resume_from_checkpoint", "auto_resume_from_checkpoints",
        "local_rank", "debug", "seed", "special_tokens", "tokens", "added_tokens_overrides",
        "lora_model_dir", "lora_fan_in_fan_out", "peft_use_rslora", "lora_bias",
        "lora_task_type", "tf32", "eval_table_size",
        "eval_max_new_tokens", "eval_causal_lm_metrics", "do_causal_lm_eval",
        "dataloader_num_workers", "dataloader_pin_memory", "dataloader_prefetch_factor",
        "dataloader_drop_last", "ddp_timeout", "ddp_find_unused_parameters",
        "ddp_broadcast_buffers", "plugins", "gc_steps", "include_tokens_per_second",
        "fsdp_version", "flash_attn_cross_entropy", "flash_attn_rms_norm",
        "flash_attn_fuse_qkv", "flash_attn_fuse_mlp", "flash_optimum", "pretraining_dataset",
        "streaming", "skip_prepare_dataset", "remove_unused_columns",
        "sequence_len_overflow_handling",
        "excess_length_strategy", "train_on_eos", "roles_to_train", "field_messages",
        "message_property_mappings", "bnb_4bit_quant_storage", "model_config_type",
        "processor_type", "eval_batch_size", "profiler_steps",
        "torch_compile_backend", "torch_compile_mode",
    }
)  # fmt: skip


_LIGER = "Liger's fused kernels are not modelled (the unfused activations are counted)"
_LIGER_KERNELS = (
    "liger_rope",
    "liger_rms_norm",
    "liger_glu_activation",
    "liger_layer_norm",
    "liger_swiglu",
    "liger_cross_entropy",
)


def _axolotl(r: _Reader) -> None:
    out = r.out
    out.set("stack", "axolotl", "(format)")
    model = r.text("base_model")
    if model is not None:
        _name_model(out, model, "base_model")
    _axolotl_method(r)
    _axolotl_precision(r)
    for key, name in (
        ("micro_batch_size", "micro_batch_size"),
        ("gradient_accumulation_steps", "gradient_accumulation_steps"),
    ):
        value = r.integer(key)
        if value is not None:
            out.set(name, value, r.key(key))
    if r.has("batch_size"):
        r.raw("batch_size")
        out.ignore(
            "batch_size", "a global batch needs the GPU count; give gradient_accumulation_steps"
        )
    packed = r.boolean("sample_packing")
    _sequence(out, r.integer("sequence_len"), "sequence_len", packed)
    optimizer = r.text("optimizer")
    if optimizer is not None:
        _hf_optimizer(out, optimizer, "optimizer")
    _axolotl_checkpointing(r)
    _axolotl_attention(r)
    _axolotl_loss(r)
    for key, name in (
        ("tensor_parallel_size", "parallelism.tp"),
        ("context_parallel_size", "parallelism.cp"),
        ("sequence_parallel_degree", "parallelism.cp"),
        # HSDP: groups of ranks that each hold one whole set of shards
        ("dp_replicate_size", "parallelism.dp_replicate"),
    ):
        value = r.integer(key)
        if value is not None and value > 1:
            out.set(name, value, key)
    if r.has("deepspeed"):
        _deepspeed_reference(out, r.raw("deepspeed"), "deepspeed")
    fsdp = r.raw("fsdp")
    fsdp_config = r.section("fsdp_config")
    if fsdp or (fsdp_config is not None and r.has("fsdp_version")):
        options = (
            fsdp.split()
            if isinstance(fsdp, str)
            else r.names("fsdp")
            if isinstance(fsdp, list)
            else None
        )
        r.raw("fsdp_version")
        _fsdp(out, options, fsdp_config, "fsdp" if fsdp else "fsdp_config")
    r.compiled("torch_compile")
    for key, reason in (
        ("neftune_noise_alpha", "no memory effect"),
        ("peft_use_dora", "DoRA's magnitude vectors and weight norms are not modelled"),
        ("unfrozen_parameters", "training a chosen subset of parameters is not modelled"),
        ("gptq", "a GPTQ-quantized base is not modelled"),
        (
            "rl",
            "preference / RL training (a reference model, paired sequences) is not modelled: read "
            "as SFT",
        ),
        ("reward_model", "reward-model training is not modelled"),
        ("relora_steps", "ReLoRA is not modelled"),
        ("s2_attention", "shifted sparse attention is not modelled"),
        *((name, _LIGER) for name in _LIGER_KERNELS),
        (
            "chunked_cross_entropy",
            "Axolotl's chunked cross-entropy is not modelled; the stack's loss is used",
        ),
        ("gpu_memory_limit", "a memory cap is not modelled"),
        ("lora_on_cpu", "LoRA loading on the CPU has no effect on the step"),
        ("auto_find_batch_size", "the batch size it settles on is not known"),
        ("fp8_enable_fsdp_float8_all_gather", "FP8 all-gathers are not modelled"),
        ("dp_shard_size", "the shard group is derived from the GPUs, not given"),
    ):
        r.flag(key, reason)
    r.rest(_AXOLOTL_QUIET)


def _axolotl_method(r: _Reader) -> None:
    out = r.out
    adapter = r.text("adapter")
    four, eight = r.boolean("load_in_4bit"), r.boolean("load_in_8bit")
    if adapter is None:
        out.set("method", "full", "adapter")
        out.note("no adapter: full fine-tuning, as Axolotl trains every weight without one")
        r.flag("lora_modules_to_save", "no adapter is trained")
        if four or eight:
            out.ignore(
                "load_in_4bit" if four else "load_in_8bit",
                "a quantized base needs an adapter (Axolotl refuses it)",
            )
        return
    if adapter not in ("lora", "qlora"):
        raise EstimateError(
            "adapter",
            f"got {shown(adapter)}, expected lora or qlora (other adapters are not modelled)",
        )
    qlora = adapter == "qlora" or bool(four)
    out.set("method", "qlora" if qlora else "lora", "adapter")
    if adapter == "qlora" and not four:
        out.note(
            "adapter qlora without load_in_4bit: read as QLoRA (Axolotl requires load_in_4bit)"
        )
    elif adapter == "lora" and four:
        out.note("adapter lora with load_in_4bit: the base is 4-bit, read as QLoRA")
    if eight and not qlora:
        out.ignore(
            "load_in_8bit",
            "an 8-bit (LLM.int8) base is not modelled: read as LoRA on a 16-bit base",
        )
    for key, name in (
        ("lora_r", "lora.rank"),
        ("lora_alpha", "lora.alpha"),
        ("lora_dropout", "lora.dropout"),
    ):
        value = r.number(key) if name != "lora.rank" else r.integer(key)
        if value is not None:
            out.set(name, value, key)
    linear = r.boolean("lora_target_linear")
    modules = r.names("lora_target_modules")
    if linear:
        _targets(out, ["all-linear"], "lora_target_linear")
    elif modules:
        _targets(out, modules, "lora_target_modules")
    _modules_to_save(r, "lora_modules_to_save")
    if qlora:
        bnb = r.section("bnb_config_kwargs")
        if bnb is not None:
            quant = bnb.choice("bnb_4bit_quant_type", ("nf4", "fp4"))
            if quant is not None:
                out.set("qlora.quant_type", quant, bnb.key("bnb_4bit_quant_type"))
            double = bnb.boolean("bnb_4bit_use_double_quant")
            if double is not None:
                out.set("qlora.double_quant", double, bnb.key("bnb_4bit_use_double_quant"))
            bnb.rest(
                (
                    "llm_int8_has_fp16_weight",
                    "llm_int8_threshold",
                    "bnb_4bit_quant_storage",
                    "bnb_4bit_compute_dtype",
                )
            )


def _axolotl_precision(r: _Reader) -> None:
    out = r.out
    bf16, fp16 = r.raw("bf16"), r.raw("fp16")
    if bf16 is not None and not isinstance(bf16, bool) and bf16 not in ("auto", "full"):
        raise EstimateError("bf16", f"got {shown(bf16)}, expected true, false, auto or full")
    if fp16 is not None and not isinstance(fp16, bool):
        raise EstimateError("fp16", f"got {shown(fp16)}, expected true or false")
    fp8, bfloat16, float16 = r.boolean("fp8"), r.boolean("bfloat16"), r.boolean("float16")
    if float16:
        raise EstimateError(
            "float16",
            "pure fp16 training (no AMP) is not modelled; expected bf16, bfloat16 or fp16 (AMP)",
        )
    if bf16 in (True, "auto", "full") and fp16:
        raise EstimateError("fp16", "bf16 and fp16 are both on")
    precision, key = None, ""
    if fp8:
        precision, key = "fp8-mixed", "fp8"
    elif bfloat16:
        precision, key = "bf16", "bfloat16"
    elif bf16 in (True, "auto", "full"):
        precision, key = "bf16-mixed", "bf16"
        if bf16 == "auto":
            out.note("bf16: auto read as bf16 (Axolotl turns it on where the GPU supports it)")
    elif fp16:
        precision, key = "fp16-mixed", "fp16"
    elif bf16 is False or fp16 is False:
        precision, key = "fp32", "bf16" if bf16 is False else "fp16"
        out.note("bf16 and fp16 off: fp32 training")
    if precision is not None:
        out.set("precision", precision, key)
        if out.get("method") == "qlora" and precision in ("bf16-mixed", "bf16", "fp16-mixed"):
            out.set("qlora.compute_dtype", "fp16" if precision == "fp16-mixed" else "bf16", key)


def _axolotl_checkpointing(r: _Reader) -> None:
    out = r.out
    value = r.raw("gradient_checkpointing")
    if value is None:
        pass
    elif isinstance(value, bool):
        out.set("activation_checkpointing", "full" if value else "none", "gradient_checkpointing")
    elif value in ("unsloth", "offload"):
        out.set("activation_checkpointing", "full", "gradient_checkpointing")
        out.set("offload.activations", "cpu", "gradient_checkpointing")
    else:
        raise EstimateError(
            "gradient_checkpointing",
            f"got {shown(value)}, expected true, false, offload or unsloth",
        )
    _reentrant_checkpointing(r, value is not False)
    offload = r.raw("activation_offloading")
    if offload is not None and offload is not False:
        if out.get("activation_checkpointing") in ("full",):
            out.set("offload.activations", "cpu", "activation_offloading")
        else:
            out.ignore(
                "activation_offloading",
                "offloading every saved activation (without checkpointing) is not modelled",
            )


def _axolotl_attention(r: _Reader) -> None:
    out = r.out
    attention = r.text("attention")
    if attention is not None:
        _attention(out, attention, "attention")
    for key, kernel in (
        ("flash_attention", "flash"),
        ("sdp_attention", "sdpa"),
        ("xformers_attention", "mem-efficient"),
        ("eager_attention", "eager"),
    ):
        if r.boolean(key):
            out.set("attention", kernel, key)
    r.flag("flex_attention", "flex attention is not modelled; the scenario's attention is kept")


def _axolotl_loss(r: _Reader) -> None:
    out = r.out
    for key in ("liger_fused_linear_cross_entropy", "cut_cross_entropy"):
        if r.boolean(key):
            out.set("loss", "chunked", key)

"""Hugging Face ``TrainingArguments`` (and TRL's ``SFTConfig``) as JSON or YAML, with PEFT's
LoRA config and bitsandbytes' quantization beside them."""

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
# transformers TrainingArguments / TRL SFTConfig


#: keys only TRL's configs have (SFTConfig, ModelConfig, ScriptArguments): the SFT stack
_TRL_KEYS = frozenset(
    {
        "max_seq_length", "max_length", "packing", "packing_strategy", "padding_free",
        "dataset_text_field", "dataset_kwargs", "dataset_num_proc", "dataset_batch_size",
        "completion_only_loss", "assistant_only_loss", "activation_offloading",
        "model_init_kwargs", "eval_packing", "chat_template_path", "use_peft",
        "model_name_or_path", "lora_target_modules", "use_bnb_nested_quant", "dataset_name",
    }
)  # fmt: skip
_HF_QUIET = frozenset(
    {
        "output_dir", "overwrite_output_dir", "do_train", "do_eval", "do_predict",
        "eval_strategy", "evaluation_strategy", "prediction_loss_only",
        "per_device_eval_batch_size", "per_gpu_eval_batch_size", "eval_accumulation_steps",
        "eval_delay", "learning_rate", "weight_decay", "adam_beta1", "adam_beta2",
        "adam_epsilon", "max_grad_norm", "num_train_epochs", "max_steps",
        "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_ratio", "warmup_steps",
        "log_level", "log_level_replica", "log_on_each_node", "logging_dir",
        "logging_strategy", "logging_first_step", "logging_steps", "logging_nan_inf_filter",
        "save_strategy", "save_steps", "save_total_limit", "save_safetensors",
        "save_on_each_node", "save_only_model", "restore_callback_states_from_checkpoint",
        "use_mps_device", "seed", "data_seed", "jit_mode_eval", "use_ipex",
        "fp16_opt_level", "half_precision_backend", "fp16_backend", "bf16_full_eval",
        "fp16_full_eval", "tf32", "local_rank", "ddp_backend", "tpu_num_cores",
        "tpu_metrics_debug", "debug", "dataloader_drop_last", "eval_steps",
        "dataloader_num_workers", "dataloader_prefetch_factor", "past_index", "run_name",
        "disable_tqdm", "remove_unused_columns", "label_names", "load_best_model_at_end",
        "metric_for_best_model", "greater_is_better", "ignore_data_skip",
        "fsdp_min_num_params", "fsdp_transformer_layer_cls_to_wrap", "accelerator_config",
        "label_smoothing_factor", "optim_args", "group_by_length", "length_column_name",
        "report_to", "ddp_find_unused_parameters", "ddp_bucket_cap_mb",
        "ddp_broadcast_buffers", "dataloader_pin_memory", "dataloader_persistent_workers",
        "skip_memory_metrics", "use_legacy_prediction_loop", "push_to_hub",
        "resume_from_checkpoint", "hub_model_id", "hub_strategy", "hub_token",
        "hub_private_repo", "hub_always_push", "hub_revision",
        "include_inputs_for_metrics", "include_for_metrics", "eval_do_concat_batches",
        "push_to_hub_model_id", "push_to_hub_organization", "push_to_hub_token",
        "mp_parameters", "full_determinism", "ray_scope", "ddp_timeout",
        "torch_compile_backend", "torch_compile_mode", "include_tokens_per_second",
        "include_num_input_tokens_seen", "batch_eval_metrics", "eval_on_start",
        "eval_use_gather_object", "average_tokens_across_devices", "liger_kernel_config",
        "dispatch_batches", "split_batches", "project", "trackio_space_id",
        # TRL
        "dataset_text_field", "dataset_kwargs", "dataset_num_proc", "dataset_batch_size",
        "eos_token", "pad_token", "truncation_mode", "shuffle_dataset", "pad_to_multiple_of",
        "eval_packing", "packing_strategy", "completion_only_loss", "assistant_only_loss",
        "chat_template_path", "dataset_name", "dataset_config", "dataset_train_split",
        "dataset_test_split", "dataset_streaming", "gradient_checkpointing_use_reentrant",
        "ignore_bias_buffers", "model_revision", "trust_remote_code", "lora_task_type",
        "use_rslora", "bnb_4bit_quant_storage", "num_of_sequences", "chars_per_token",
        "dataset_prepare",
    }
)  # fmt: skip
_DTYPES = ("bfloat16", "float16", "float32", "auto", "bf16", "fp16", "fp32")


def _training_arguments(r: _Reader) -> None:
    out = r.out
    for key in ("use_cpu", "no_cuda"):
        if r.boolean(key):
            raise EstimateError(key, "training on the CPU is not modelled")
    trl = any(k in r.data for k in _TRL_KEYS)
    out.set("stack", "trl-sft" if trl else "hf-trainer", "(format)")
    if trl:
        out.note("keys of TRL's SFTConfig or ModelConfig: the trl-sft stack")
    model = r.text("model_name_or_path")
    if model is not None:
        _name_model(out, model, "model_name_or_path")
    init = r.section("model_init_kwargs")
    batch = r.integer("per_device_train_batch_size")
    old = r.integer("per_gpu_train_batch_size")
    if batch is not None:
        out.set("micro_batch_size", batch, "per_device_train_batch_size")
    elif old is not None:
        out.set("micro_batch_size", old, "per_gpu_train_batch_size")
    accum = r.integer("gradient_accumulation_steps")
    if accum is not None:
        out.set("gradient_accumulation_steps", accum, "gradient_accumulation_steps")
    _hf_method(r)
    _hf_precision(r, init)
    optim = r.text("optim")
    if optim is not None:
        _hf_optimizer(out, optim, "optim")
    if r.boolean("adafactor"):
        out.set("optimizer", "adafactor", "adafactor")
    checkpointing = r.boolean("gradient_checkpointing")
    if checkpointing is not None:
        out.set(
            "activation_checkpointing",
            "full" if checkpointing else "none",
            "gradient_checkpointing",
        )
    elif trl:
        out.note(
            "gradient_checkpointing not set: TRL's SFTConfig turns it on by default in recent "
            "versions; the scenario's checkpointing is kept"
        )
    _reentrant_checkpointing(r, checkpointing is not False)
    if r.boolean("activation_offloading"):
        if checkpointing:
            out.set("offload.activations", "cpu", "activation_offloading")
        else:
            out.ignore(
                "activation_offloading",
                "offloading every saved activation (without checkpointing) is not modelled",
            )
    attention = r.text("attn_implementation")
    if attention is None and init is not None:
        attention = init.text("attn_implementation")
    if attention is not None:
        _attention(out, attention, "attn_implementation")
    length_key = "max_seq_length" if r.has("max_seq_length") else "max_length"
    packed = r.boolean("packing")
    _sequence(out, r.integer(length_key), length_key, packed)
    if trl and not r.has("max_seq_length") and "max_length" not in r.data:
        out.note(
            "max_length not set: SFTConfig's default is 1024 tokens; the scenario's sequence "
            "length is kept"
        )
    if r.boolean("padding_free"):
        out.note(
            "padding_free: the batch is one row of its tokens; MemFit counts the same tokens as a "
            "padded batch"
        )
    if r.boolean("use_liger_kernel"):
        out.set("loss", "chunked", "use_liger_kernel")
        out.ignore(
            "use_liger_kernel",
            "Liger's other fused kernels are not modelled (its fused linear cross-entropy is)",
        )
    loss_type = r.text("loss_type")
    if loss_type == "nll":
        out.set("loss", "standard", "loss_type")
    elif loss_type is not None:
        out.ignore("loss_type", f"{loss_type} is not modelled; the stack's loss is used")
    tp = r.integer("tp_size")
    if tp is not None and tp > 1:
        out.set("parallelism.tp", tp, "tp_size")
    if r.has("deepspeed"):
        _deepspeed_reference(out, r.raw("deepspeed"), "deepspeed")
    _hf_fsdp(r)
    r.compiled("torch_compile")
    r.compiled("torchdynamo")
    for key, reason in (
        ("neftune_noise_alpha", "no memory effect"),
        ("auto_find_batch_size", "the batch size it settles on is not known"),
        (
            "torch_empty_cache_steps",
            "emptying the cache between steps does not change a step's peak",
        ),
        ("optim_target_modules", "GaLore-style low-rank optimizer states are not modelled"),
        ("lora_target_parameters", "LoRA on parameters (MoE experts) is not modelled"),
        ("use_dora", "DoRA's magnitude vectors and weight norms are not modelled"),
        (
            "beta",
            "preference training (a reference model, paired sequences) is not modelled: read as "
            "SFT",
        ),
        ("max_prompt_length", "preference training is not modelled: read as SFT"),
        ("parallelism_config", "not read: give tp and cp in the scenario"),
    ):
        r.flag(key, reason)
    if init is not None:
        init.rest(
            (
                "torch_dtype",
                "dtype",
                "attn_implementation",
                "trust_remote_code",
                "revision",
                "use_cache",
                "device_map",
            )
        )
    r.rest(_HF_QUIET)


_PEFT_KEYS = (
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
    "lora_modules_to_save",
    "bnb_4bit_quant_type",
    "use_bnb_nested_quant",
)


def _hf_method(r: _Reader) -> None:
    """PEFT as TRL's ModelConfig says it (``use_peft``, ``lora_*``, ``load_in_4bit``); a
    plain TrainingArguments file does not say, and the scenario's method is kept."""
    out = r.out
    peft = r.boolean("use_peft")
    four, eight = r.boolean("load_in_4bit"), r.boolean("load_in_8bit")
    if peft is None:
        lora_keys = [k for k in ("lora_r", "lora_alpha", "lora_target_modules") if r.has(k)]
        if lora_keys:
            r.seen.update(_PEFT_KEYS)
            out.ignore(", ".join(lora_keys), "use_peft is not set, so no adapter is trained")
        out.note(
            "the file does not say whether a PEFT adapter is trained: the scenario's method is kept"
        )
        if four or eight:
            out.ignore(
                "load_in_4bit" if four else "load_in_8bit", "a quantized base needs use_peft"
            )
        return
    if not peft:
        out.set("method", "full", "use_peft")
        for key in _PEFT_KEYS:
            r.raw(key)
        return
    out.set("method", "qlora" if four else "lora", "load_in_4bit" if four else "use_peft")
    if eight and not four:
        out.ignore(
            "load_in_8bit",
            "an 8-bit (LLM.int8) base is not modelled: read as LoRA on a 16-bit base",
        )
    for key, name in (
        ("lora_r", "lora.rank"),
        ("lora_alpha", "lora.alpha"),
        ("lora_dropout", "lora.dropout"),
    ):
        value = r.integer(key) if name == "lora.rank" else r.number(key)
        if value is not None:
            out.set(name, value, key)
    targets = r.names("lora_target_modules")
    if targets:
        _targets(out, targets, "lora_target_modules")
    _modules_to_save(r, "lora_modules_to_save")
    if four:
        quant = r.choice("bnb_4bit_quant_type", ("nf4", "fp4"))
        if quant is not None:
            out.set("qlora.quant_type", quant, "bnb_4bit_quant_type")
        nested = r.boolean("use_bnb_nested_quant")
        if nested is not None:
            out.set("qlora.double_quant", nested, "use_bnb_nested_quant")
        else:
            out.note(
                "use_bnb_nested_quant not set: TRL's default is false; the scenario's "
                "qlora.double_quant is kept"
            )


def _hf_precision(r: _Reader, init: _Reader | None) -> None:
    out = r.out
    bf16, fp16 = r.boolean("bf16"), r.boolean("fp16")
    dtype_key = next((k for k in ("dtype", "torch_dtype") if r.has(k)), None)
    dtype = r.choice(dtype_key, _DTYPES) if dtype_key else None
    if dtype is None and init is not None:
        init_key = next((k for k in ("dtype", "torch_dtype") if init.has(k)), None)
        dtype = init.choice(init_key, _DTYPES) if init_key else None
        dtype_key = init.key(init_key) if init_key else None
    if bf16 and fp16:
        raise EstimateError("fp16", "bf16 and fp16 are both true")
    if bf16:
        out.set("precision", "bf16-mixed", "bf16")
    elif fp16:
        out.set("precision", "fp16-mixed", "fp16")
    elif bf16 is False or fp16 is False:
        if dtype in ("bfloat16", "bf16"):
            out.set("precision", "bf16", dtype_key or "bf16")
            out.note("bf16 and fp16 off with a bf16 model: the weights train in bf16 (no autocast)")
        elif dtype in ("float16", "fp16"):
            raise EstimateError(
                dtype_key or "fp16",
                "pure fp16 training (no AMP) is not modelled; expected bf16 or fp16 AMP",
            )
        else:
            out.set("precision", "fp32", "bf16" if bf16 is False else "fp16")
            out.note("bf16 and fp16 off: fp32 training")
    elif bf16 is None and fp16 is None and r.data.get("model_name_or_path") is not None:
        out.note(
            "bf16 and fp16 not set: TRL turns bf16 on by default in recent versions; the "
            "scenario's precision is kept"
        )
    if out.get("method") == "qlora" and out.get("precision") in (
        "bf16-mixed",
        "bf16",
        "fp16-mixed",
    ):
        compute = "fp16" if out.get("precision") == "fp16-mixed" else "bf16"
        out.set("qlora.compute_dtype", compute, "bf16" if compute == "bf16" else "fp16")


def _hf_fsdp(r: _Reader) -> None:
    out = r.out
    value = r.raw("fsdp")
    config_value = r.raw("fsdp_config")
    options: list[str] | None
    if value is None or value is False or value in ("", []):
        return
    if value is True:
        options = ["full_shard"]
    elif isinstance(value, str):
        options = value.split()
    else:
        options = r.names("fsdp")
    config = None
    if isinstance(config_value, dict):
        config = _Reader(config_value, "fsdp_config.", out)
    elif isinstance(config_value, str):
        out.note(f"fsdp_config {shown(config_value)} is a file: its settings are not read")
    _fsdp(out, options, config, "fsdp")

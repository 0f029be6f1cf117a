"""LitGPT's finetune and pretrain YAML configs: precision, quantization, LoRA, the optimizer
and the devices."""

from __future__ import annotations

from memfit.engine.errors import EstimateError, shown
from memfit.engine.train_configs.common import _class_optimizer, _name_model, _Reader, _sequence

# --------------------------------------------------------------------------------------
# LitGPT


_LITGPT_PRECISIONS = {
    "bf16-true": "bf16",
    "bf16-mixed": "bf16-mixed",
    "16-mixed": "fp16-mixed",
    "32-true": "fp32",
    "32": "fp32",
    "bf16": "bf16-mixed",
    "16": "fp16-mixed",
}
_LITGPT_QUANTIZE = {
    "bnb.nf4": ("nf4", False),
    "bnb.nf4-dq": ("nf4", True),
    "bnb.fp4": ("fp4", False),
    "bnb.fp4-dq": ("fp4", True),
}
_LITGPT_TARGETS = (
    ("lora_query", ("q_proj",), True),
    ("lora_key", ("k_proj",), False),
    ("lora_value", ("v_proj",), True),
    ("lora_projection", ("o_proj",), False),
    ("lora_mlp", ("gate_proj", "up_proj", "down_proj"), False),
)
_LITGPT_QUIET = frozenset(
    {
        "out_dir",
        "data",
        "eval",
        "logger_name",
        "seed",
        "resume",
        "access_token",
        "tokenizer_dir",
        "initial_checkpoint_dir",
        "log",
        "optimizer_args",
    }
)
_LITGPT_TRAIN_QUIET = frozenset(
    {
        "save_interval",
        "log_interval",
        "lr_warmup_steps",
        "lr_warmup_fraction",
        "epochs",
        "max_tokens",
        "max_steps",
        "max_time",
        "max_norm",
        "min_lr",
        "learning_rate",
        "weight_decay",
        "beta1",
        "beta2",
        "tie_embeddings",
    }
)


def _litgpt(r: _Reader) -> None:
    out = r.out
    out.set("stack", "lightning", "(format)")
    checkpoint = r.text("checkpoint_dir") or r.text("model_name")
    if checkpoint is not None:
        key = "checkpoint_dir" if r.has("checkpoint_dir") else "model_name"
        _name_model(out, checkpoint.removeprefix("checkpoints/"), key)
    precision = r.choice("precision", _LITGPT_PRECISIONS)
    if precision is not None:
        out.set("precision", _LITGPT_PRECISIONS[precision], "precision")
    else:
        out.note(
            "precision not set: LitGPT picks bf16-mixed where the GPU supports bf16; the "
            "scenario's precision is kept"
        )
    devices_value = r.raw("devices")
    devices: int | None = None
    if isinstance(devices_value, int) and not isinstance(devices_value, bool) and devices_value > 0:
        devices = devices_value
        out.set_hardware("gpus_per_node", devices, "devices")
    elif devices_value is not None:
        if devices_value in ("auto", -1):
            out.note("devices: every visible GPU; the scenario's GPU count is kept")
        else:
            raise EstimateError(
                "devices", f"got {shown(devices_value)}, expected a positive integer or auto"
            )
    nodes = r.integer("num_nodes")
    if nodes is not None:
        out.set_hardware("nodes", nodes, "num_nodes")
    world = (devices or 1) * (nodes or 1) if devices is not None else None
    _litgpt_method(r, world)
    if world is not None and world > 1:
        out.set("parallelism.framework", "pytorch", "devices")
        out.set("parallelism.zero_stage", 3, "devices")
        out.set("activation_checkpointing", "full", "devices")
        out.note(
            "more than one device: LitGPT's finetune scripts shard with FSDP (FULL_SHARD) and "
            "checkpoint every block"
        )
    train = r.section("train")
    if train is not None:
        micro = train.integer("micro_batch_size")
        if micro is not None:
            out.set("micro_batch_size", micro, train.key("micro_batch_size"))
        total = train.integer("global_batch_size")
        if total is not None:
            if micro is None or world is None:
                out.note(
                    "train.global_batch_size: gradient accumulation needs micro_batch_size and an "
                    "integer devices; not derived"
                )
            else:
                per_rank = total // world
                if per_rank < 1 or per_rank // micro < 1:
                    raise EstimateError(
                        train.key("global_batch_size"),
                        f"got {shown(total)}, smaller than micro_batch_size {micro} x {world} "
                        "devices",
                    )
                out.set(
                    "gradient_accumulation_steps", per_rank // micro, train.key("global_batch_size")
                )
                out.note(
                    f"gradient accumulation {per_rank // micro} = global_batch_size {total} // "
                    f"{world} device(s) // micro_batch_size {micro}"
                )
        length = train.integer("max_seq_length")
        if length is not None:
            _sequence(out, length, train.key("max_seq_length"), False)
        elif "max_seq_length" in train.data:
            out.note(
                "train.max_seq_length is null: LitGPT trains on the longest sample; the "
                "scenario's sequence length is kept"
            )
        if train.boolean("tie_embeddings"):
            out.ignore(
                train.key("tie_embeddings"),
                "weight tying is not modelled under LitGPT's GPT (it never ties)",
            )
        train.rest(_LITGPT_TRAIN_QUIET)
    _litgpt_optimizer(r)
    r.rest(_LITGPT_QUIET)


def _litgpt_method(r: _Reader, world: int | None) -> None:
    out = r.out
    lora = any(
        k in r.data
        for k in ("lora_r", "lora_alpha", *[t for t, _, _ in _LITGPT_TARGETS], "lora_head")
    )
    quantize = r.text("quantize")
    if quantize is not None and quantize not in _LITGPT_QUANTIZE:
        accepted = ", ".join(_LITGPT_QUANTIZE)
        raise EstimateError(
            "quantize", f"got {shown(quantize)}, expected one of {accepted} (8-bit is not modelled)"
        )
    if quantize is not None and not lora:
        raise EstimateError(
            "quantize",
            "a quantized base without LoRA (LitGPT's adapter finetuning) is not modelled",
        )
    if quantize is not None and world is not None and world > 1:
        raise EstimateError(
            "quantize",
            f"LitGPT does not quantize on more than one device (devices x num_nodes = {world})",
        )
    if not lora:
        out.set("method", "full", "(no lora_* keys)")
        out.note("no lora_* keys: full fine-tuning (litgpt finetune_full)")
        return
    out.set("method", "qlora" if quantize else "lora", "quantize" if quantize else "lora_r")
    for key, name in (
        ("lora_r", "lora.rank"),
        ("lora_alpha", "lora.alpha"),
        ("lora_dropout", "lora.dropout"),
    ):
        value = r.integer(key) if name == "lora.rank" else r.number(key)
        if value is not None:
            out.set(name, value, key)
    if any(r.has(k) for k, _, _ in _LITGPT_TARGETS):
        targets: list[str] = []
        for key, names, default in _LITGPT_TARGETS:
            on = r.boolean(key)
            if on if on is not None else default:
                targets.extend(names)
        out.set("lora.targets", targets, "lora_query")
    if r.boolean("lora_head"):
        out.ignore("lora_head", "LoRA on the LM head is not modelled")
    if quantize is not None:
        quant, double = _LITGPT_QUANTIZE[quantize]
        out.set("qlora.quant_type", quant, "quantize")
        out.set("qlora.double_quant", double, "quantize")
        precision = out.get("precision")
        if precision in ("bf16-mixed", "fp16-mixed"):
            raise EstimateError(
                "quantize",
                f"LitGPT quantizes only with a -true precision (got {r.raw('precision')})",
            )
        if precision == "bf16":
            out.set("qlora.compute_dtype", "bf16", "precision")


def _litgpt_optimizer(r: _Reader) -> None:
    out = r.out
    value = r.raw("optimizer")
    if value is None:
        return
    if isinstance(value, str):
        _class_optimizer(out, "optimizer", value, None)
        return
    opt = r.section("optimizer")
    assert opt is not None
    path = opt.text("class_path")
    if path is None:
        raise EstimateError("optimizer.class_path", "missing: the optimizer's class")
    args = opt.section("init_args")
    _class_optimizer(out, opt.key("class_path"), path, args)
    if args is not None:
        args.seen.update(args.data)

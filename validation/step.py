"""One training step of a Hugging Face model, measured by the storage tracker.

The step mirrors MemFit's scenario semantics (see ``engine/model_state.py``):

* precision ``fp32``: model in fp32, no autocast; ``bf16-mixed``: model in fp32 (the
  master weights), ``torch.autocast("cuda", torch.bfloat16)`` around forward and loss;
  ``bf16``: model in bf16, no autocast;
* method ``full``: every parameter trains; ``lora``: the base model is built in bf16 (fp32
  under ``fp32``) and PEFT adds adapters -- in fp32 (PEFT's ``autocast_adapter_dtype``)
  except under pure bf16, where they stay bf16; ``freeze``: only the named parts and the
  last N blocks train, and under ``bf16-mixed`` the frozen weights are held in bf16;
  ``lora.modules_to_save``: PEFT's ``modules_to_save`` (a trained copy of each named module);
* optimizer ``adamw`` (``foreach=True`` or ``fused=True``) or ``sgd`` without momentum;
* activation checkpointing ``full``: HF's non-reentrant checkpointing of every block;
* the step: ``out = model(input_ids=ids, labels=ids)``, ``out.loss.backward()``,
  ``opt.step()``, ``opt.zero_grad(set_to_none=True)``, with ``out`` released at the end of
  the step; run twice, the second is reported (AdamW creates its state lazily in the
  first). A third step releases ``out`` right after taking its loss, before ``backward``,
  as Hugging Face's ``Trainer`` does (its ``compute_loss`` returns only the loss): that peak
  lacks the logits (and, without checkpointing, the KV cache HF builds in training).

The conventions of other training stacks, each a scenario field (absent: the step above):

* ``outputs_held_through_backward``: ``true`` reports the step that holds ``out`` through
  backward, ``false`` the one that releases it first; both are measured (the case's own
  convention twice, then the other once);
* ``kv_cache_in_outputs`` ``false``: the model is called with ``use_cache=False``;
* ``frozen_weights_dtype`` (``auto``, ``fp32``, ``bf16``, ``fp16``): the storage dtype of
  every frozen parameter; ``lora.adapter_dtype`` (``auto``, ``fp32``, ``bf16``): the
  adapters' dtype;
* ``loss`` ``no-upcast``: the model is called without labels and the loop takes
  ``F.cross_entropy`` of the logits as they come; ``chunked-output``: torchtune's
  ``CEWithChunkedOutputLoss``, the LM head applied to ``loss_chunks`` pieces of the last
  hidden state, each piece's loss upcast to fp32 on its own;
* ``activation_checkpointing`` ``per-op``: torchtitan's per-op selective checkpointing of
  every decoder layer (:func:`per_op_policy`);
* ``moe_implementation`` ``eager``: transformers' per-expert loop instead of ``grouped_mm``
  (:func:`_eager_experts`).

Everything runs on fake CUDA tensors (:mod:`validation.fakecuda`) with the CUDA kernel
choice of ``scaled_dot_product_attention`` emulated (:mod:`validation.sdpa`).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

# isort: off
from validation import fakecuda  # first: registers the fake CUDA hooks before torch loads
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
# isort: on

from validation.sdpa import GpuProfile, KernelLog, cuda_sdpa
from validation.tracker import StorageTracker

#: MemFit LoRA target role -> module names per family (PEFT matches name suffixes)
LORA_MODULES: dict[str, dict[str, list[str]]] = {
    "gpt2": {"q_proj": ["c_attn"], "k_proj": ["c_attn"], "v_proj": ["c_attn"],
             "o_proj": ["attn.c_proj"], "up_proj": ["c_fc"], "down_proj": ["mlp.c_proj"]},
    "bert": {"q_proj": ["query"], "k_proj": ["key"], "v_proj": ["value"],
             "o_proj": ["attention.output.dense"], "up_proj": ["intermediate.dense"],
             "down_proj": ["output.dense"]},
    "falcon": {"q_proj": ["query_key_value"], "k_proj": ["query_key_value"],
               "v_proj": ["query_key_value"], "o_proj": ["self_attention.dense"],
               "up_proj": ["dense_h_to_4h"], "down_proj": ["dense_4h_to_h"]},
}  # fmt: skip

#: Dropout keys set to 0.0 unless a case asks for dropout
DROPOUT_KEYS = (
    "attention_dropout",
    "hidden_dropout",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "summary_first_dropout",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "classifier_dropout",
)


@dataclass
class StepSpec:
    """What one measurement needs; built from a MemFit scenario by :func:`spec_from_scenario`."""

    hf_config: dict[str, Any]
    method: str = "full"
    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    optimizer_impl: str = "foreach"
    batch: int = 1
    seq: int = 512
    checkpointing: str = "none"
    attention: str = "sdpa"
    lora_rank: int = 16
    lora_alpha: float = 32.0
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj")
    #: PEFT's ``modules_to_save`` (each trained as a full copy)
    modules_to_save: tuple[str, ...] = ()
    freeze_trainable: tuple[str, ...] = ("lm_head",)
    freeze_last_layers: int = 0
    #: None (the field absent): the original dataset's order -- held, held, released, the
    #: held step reported; True/False: the case's convention reported, the other measured too
    outputs_held_through_backward: bool | None = None
    kv_cache_in_outputs: bool = True
    frozen_weights_dtype: str = "auto"
    adapter_dtype: str = "auto"
    #: QLoRA: PEFT's ``prepare_model_for_kbit_training`` run on the 4-bit model
    prepare_kbit: bool = False
    #: QLoRA: the 4-bit matmul keeps its input with the weight (bitsandbytes before 0.43.2)
    matmul_keeps_input: bool = False
    #: checkpointing through torch's reentrant implementation (``use_reentrant=True``)
    checkpoint_reentrant: bool = False
    loss: str = "standard"
    loss_chunks: int = 8
    moe_implementation: str = "grouped"


#: the values each convention field takes
CONVENTIONS: dict[str, tuple[Any, ...]] = {
    "frozen_weights_dtype": ("auto", "fp32", "bf16", "fp16"),
    "adapter_dtype": ("auto", "fp32", "bf16"),
    "loss": ("standard", "no-upcast", "chunked-output"),
    "checkpointing": ("none", "full", "per-op"),
    "moe_implementation": ("grouped", "eager"),
}

#: the frozen weights' dtypes measured under each precision: without autocast every frozen
#: weight has the compute dtype; under autocast any of them is cast to bf16 where it is used
FROZEN_DTYPES: dict[str, tuple[str, ...]] = {
    "fp32": ("auto", "fp32"),
    "bf16-mixed": ("auto", "fp32", "bf16", "fp16"),
    "bf16": ("auto", "bf16"),
}
#: the adapters' dtypes measured under each precision (PEFT casts a LoRA layer's input to
#: the adapter's dtype, so fp32 adapters on a bf16 base run without autocast too)
ADAPTER_DTYPES: dict[str, tuple[str, ...]] = {
    "fp32": ("auto", "fp32"),
    "bf16-mixed": ("auto", "fp32", "bf16"),
    "bf16": ("auto", "fp32", "bf16"),
}
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: the precisions the harness runs as they train: fp32, bf16 autocast over fp32 weights,
#: pure bf16
MEASURED_PRECISIONS = ("fp32", "bf16-mixed", "bf16")


def check_spec(spec: StepSpec) -> None:
    """Refuse a combination the harness would not run faithfully (``ValueError``)."""
    if spec.precision not in MEASURED_PRECISIONS:
        # fp16-mixed would run as fp32 here (no fp16 autocast, no gradient scaler)
        raise ValueError(f"precision {spec.precision!r}: expected one of {MEASURED_PRECISIONS}")
    for name, values in CONVENTIONS.items():
        if getattr(spec, name) not in values:
            raise ValueError(f"{name} {getattr(spec, name)!r}: expected one of {values}")
    allowed = FROZEN_DTYPES.get(spec.precision, ("auto",))
    if spec.method != "full" and spec.frozen_weights_dtype not in allowed:
        raise ValueError(
            f"frozen_weights_dtype {spec.frozen_weights_dtype!r} under {spec.precision}: "
            "without autocast every weight has the compute dtype"
        )
    if spec.method == "qlora" and (
        spec.precision != "bf16-mixed" or spec.frozen_weights_dtype not in ("auto", "bf16")
    ):
        raise ValueError("QLoRA is measured under bf16-mixed on a base loaded in bf16")
    if (spec.prepare_kbit or spec.matmul_keeps_input) and spec.method != "qlora":
        raise ValueError("prepare_kbit and matmul_keeps_input are QLoRA settings")
    if spec.checkpoint_reentrant and spec.checkpointing != "full":
        raise ValueError("reentrant checkpointing is measured under full checkpointing")
    lora_like = spec.method in ("lora", "qlora")
    if lora_like and spec.adapter_dtype not in ADAPTER_DTYPES.get(spec.precision, ()):
        raise ValueError(f"adapter_dtype {spec.adapter_dtype!r} under {spec.precision}")
    bert = _family(spec.hf_config) == "bert"
    if bert and (spec.loss != "standard" or spec.checkpointing == "per-op"):
        raise ValueError("BERT is measured with its own masked-LM loss and full checkpointing")
    if spec.loss_chunks < 1:
        raise ValueError("loss_chunks must be at least 1")


def spec_from_scenario(scenario: dict[str, Any]) -> StepSpec:
    t = scenario.get("training", {})
    lora = t.get("lora", {})
    freeze = t.get("freeze", {})
    return StepSpec(
        hf_config=dict(scenario["model"]),
        method=t.get("method", "full"),
        precision=t.get("precision", "bf16-mixed"),
        optimizer=t.get("optimizer", "adamw"),
        optimizer_impl=t.get("optimizer_impl", "foreach"),
        batch=t.get("micro_batch_size", 1),
        seq=t.get("sequence_length", 2048),
        checkpointing=t.get("activation_checkpointing", "none"),
        attention=t.get("attention", "sdpa"),
        lora_rank=lora.get("rank", 16),
        lora_alpha=lora.get("alpha", 32.0),
        lora_targets=tuple(lora.get("targets", ("q_proj", "v_proj"))),
        modules_to_save=tuple(lora.get("modules_to_save", ())),
        freeze_trainable=tuple(freeze.get("trainable", ("lm_head",))),
        freeze_last_layers=freeze.get("last_layers", 0),
        outputs_held_through_backward=t.get("outputs_held_through_backward"),
        kv_cache_in_outputs=t.get("kv_cache_in_outputs", True),
        frozen_weights_dtype=t.get("frozen_weights_dtype", "auto"),
        adapter_dtype=lora.get("adapter_dtype", "auto"),
        prepare_kbit=bool(t.get("qlora", {}).get("prepare_kbit", False)),
        matmul_keeps_input=bool(t.get("qlora", {}).get("matmul_keeps_input", False)),
        checkpoint_reentrant=bool(t.get("reentrant_checkpointing", False)),
        loss=t.get("loss", "standard"),
        loss_chunks=t.get("loss_chunks", 8),
        moe_implementation=t.get("moe_implementation", "grouped"),
    )


# ---------------------------------------------------------------------------- model parts
def _block_index(name: str) -> int | None:
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part in ("layers", "h", "layer") and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


def part_of(family: str, name: str) -> str:
    """The MemFit component (``engine.specs.FREEZE_PARTS``) a parameter name belongs to."""
    n = name
    if family == "bert":
        if n.startswith("cls.") or ".pooler." in n or n.startswith("bert.pooler"):
            return "lm_head"
        if ".embeddings." in n or n.startswith("bert.embeddings"):
            return "embeddings"
        if "LayerNorm" in n:
            return "norms"
        if ".attention." in n:
            return "attention"
        return "mlp"
    if family == "gpt2":
        if n.startswith("lm_head"):
            return "lm_head"
        if ".wte." in n or ".wpe." in n or n.startswith(("transformer.wte", "transformer.wpe")):
            return "embeddings"
        if ".ln_" in n or n.startswith("transformer.ln_f"):
            return "norms"
        if ".attn." in n:
            return "attention"
        return "mlp"
    if family == "falcon":
        if n.startswith("lm_head"):
            return "lm_head"
        if "word_embeddings" in n:
            return "embeddings"
        if "layernorm" in n or ".ln_" in n or n.startswith("transformer.ln_f"):
            return "norms"
        if ".self_attention." in n:
            return "attention"
        return "mlp"
    if n.startswith("lm_head"):
        return "lm_head"
    if "embed_tokens" in n:
        return "embeddings"
    module = n.split(".")[-2] if "." in n else n
    if "norm" in module:
        return "norms"
    if ".self_attn." in n:
        return "attention"
    if ".mlp.gate." in n or ".router." in n:
        return "router"
    return "mlp"


def _trainable_in_freeze(
    family: str, name: str, spec: StepSpec, num_layers: int, tied_embedding: bool
) -> bool:
    """MemFit's ``freeze`` semantics: the named parts and the last N blocks train; with
    tied embeddings, a trainable ``lm_head`` is the (shared) embedding matrix."""
    parts = set(spec.freeze_trainable)
    if "mlp" in parts:
        parts.add("experts")
    if tied_embedding and "lm_head" in parts:
        return True
    part = part_of(family, name)
    if part in parts:
        return True
    block = _block_index(name)
    first = num_layers - spec.freeze_last_layers
    return spec.freeze_last_layers > 0 and block is not None and block >= first


def _family(cfg: dict[str, Any]) -> str:
    mt = str(cfg.get("model_type", "llama"))
    return "bert" if mt in ("bert", "roberta") else mt


# ---------------------------------------------------------------------------- building
def _hf_config(spec: StepSpec) -> Any:
    from transformers import AutoConfig

    cfg = {k: v for k, v in spec.hf_config.items() if not k.startswith("_")}
    model_type = cfg.pop("model_type")
    cfg.pop("architectures", None)
    config = AutoConfig.for_model(model_type, **cfg)
    return config


def frozen_dtype(spec: StepSpec) -> torch.dtype:
    """The storage dtype of the frozen (non-trainable) weights.

    ``auto``: fp32 under ``fp32``, bf16 otherwise (a LoRA base is built in bf16; under
    ``bf16-mixed`` the frozen parts of ``freeze`` are cast to bf16).
    """
    if spec.frozen_weights_dtype == "auto":
        return torch.float32 if spec.precision == "fp32" else torch.bfloat16
    return _DTYPES[spec.frozen_weights_dtype]


def _build_model(spec: StepSpec) -> tuple[torch.nn.Module, str]:
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    config = _hf_config(spec)
    family = _family(spec.hf_config)
    if spec.method in ("lora", "qlora"):  # the base is built in the frozen weights' dtype
        dtype = frozen_dtype(spec)
    else:
        dtype = torch.bfloat16 if spec.precision == "bf16" else torch.float32
    auto = AutoModelForMaskedLM if family == "bert" else AutoModelForCausalLM
    kwargs: dict[str, Any] = {"attn_implementation": spec.attention, "dtype": dtype}
    if spec.moe_implementation == "eager":  # transformers' own switch (default: grouped_mm)
        kwargs["experts_implementation"] = "eager"
    model = auto.from_config(config, **kwargs)
    model.train()
    return model, family


# ---------------------------------------------------------------------------- QLoRA
#: bitsandbytes' default block size of the 4-bit absmax (64 elements each)
BLOCK = 64


class _MatMul4Bit(torch.autograd.Function):
    """The memory of bitsandbytes' ``MatMul4Bit`` (0.50.2; the same since 0.43.2 for
    these shapes): the weight dequantized in the quant state's dtype (the dtype it was
    loaded in) and ``F.linear`` -- 0.50's ``gemm_4bit`` takes that path above 1536 rows --
    and ``ctx.tensors = (None, B)``: only the 4-bit weight is kept (0.43.2 stopped keeping
    the input, "delete useless buffered activation"); ``keep``: ``(A, B)``, as before
    0.43.2. Backward dequantizes again, cast to the gradient's dtype, for the input's
    gradient. The tensors are a ctx attribute, not ``save_for_backward``: no saved-tensor
    hook sees them."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, a: torch.Tensor, packed: torch.Tensor, shape: tuple[int, int],
        bias: Any, dtype: torch.dtype, keep: bool = False,
    ) -> torch.Tensor:  # fmt: skip
        weight = torch.empty(shape, dtype=dtype, device=a.device).to(a.dtype)
        out = F.linear(a, weight, bias)
        ctx.shape, ctx.dtype = shape, dtype
        needed = any(ctx.needs_input_grad[:2])
        ctx.tensors = ((a if keep else None), packed) if needed else (None, None)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        grad_a = None
        if ctx.needs_input_grad[0]:
            weight = torch.empty(ctx.shape, dtype=ctx.dtype, device=grad.device)
            grad_a = grad @ weight.to(grad.dtype)
        return grad_a, None, None, None, None, None


def _four_bit_class(keep: bool = False) -> type[torch.nn.Module]:
    """:class:`FourBitLinear`'s class, made once bitsandbytes is imported: a subclass of
    its ``Linear4bit``, so that PEFT wraps it with its own 4-bit LoRA layer (which clones
    the base output and adds the adapters' product) as it wraps the real one."""
    import bitsandbytes as bnb

    class FourBitLinear(bnb.nn.Linear4bit):  # type: ignore[misc]
        """A frozen linear stored in 4 bits, as transformers' bitsandbytes integration
        loads it: ``out x in / 2`` bytes of uint8 codes and one fp32 absmax per block of 64
        (no double quantization), quantized from the weight as loaded (bf16). Its forward
        is ``Linear4bit.forward``'s: the input cast to the compute dtype, the 4-bit matmul
        (:class:`_MatMul4Bit`), the output cast back to the input's dtype (``.to(inp_dtype)``:
        an fp32 input gets an fp32 output); a bias of another dtype than the compute dtype
        is converted in place on the first call. Nothing of bitsandbytes' kernels runs.
        ``keep``: the matmul keeps its input (bitsandbytes before 0.43.2)."""

        def __init__(self, linear: torch.nn.Linear) -> None:
            torch.nn.Module.__init__(self)
            out_f, in_f = linear.weight.shape
            device = linear.weight.device
            self.in_features, self.out_features = in_f, out_f
            self.shape = (out_f, in_f)
            self.quant_dtype = linear.weight.dtype
            codes = torch.empty(out_f * in_f // 2, dtype=torch.uint8, device=device)
            self.weight = torch.nn.Parameter(codes, requires_grad=False)
            self.weight.quant_type, self.weight.compress_statistics = "nf4", False
            self.register_buffer("absmax", torch.empty(out_f * in_f // BLOCK, device=device))
            self.bias = linear.bias
            if self.bias is not None:
                self.bias.requires_grad_(False)
            self.compute_dtype = torch.bfloat16
            self.compute_type_is_set = True

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            inp_dtype = x.dtype
            x = x.to(self.compute_dtype)
            bias = self.bias
            if bias is not None and bias.dtype != x.dtype:
                bias.data = bias.data.to(x.dtype)
            out = _MatMul4Bit.apply(x, self.weight, self.shape, bias, self.quant_dtype, keep)
            return out.to(inp_dtype)  # type: ignore[no-any-return]

    return FourBitLinear


def quantize(model: torch.nn.Module, keep: bool = False) -> None:
    """transformers' bitsandbytes 4-bit loading (``load_in_4bit``): every ``nn.Linear``
    but the output layer (``get_keys_to_not_convert``) becomes a 4-bit linear; the rest
    stays in the dtype it was loaded in; the model says it is loaded in 4 bits (PEFT and
    ``prepare_model_for_kbit_training`` read ``is_loaded_in_4bit``)."""
    four_bit = _four_bit_class(keep)
    head = model.get_output_embeddings()
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear) and child is not head:
                setattr(module, name, four_bit(child))
    model.is_loaded_in_4bit = True


def _apply_method(model: torch.nn.Module, family: str, spec: StepSpec) -> torch.nn.Module:
    if spec.method == "full":
        return model
    if spec.method == "freeze":
        num_layers = int(getattr(model.config, "num_hidden_layers", 0) or model.config.n_layer)
        out_emb = model.get_output_embeddings()
        tied = out_emb is not None and out_emb.weight is model.get_input_embeddings().weight
        for name, p in model.named_parameters():
            is_tied = tied and p is out_emb.weight
            keep = _trainable_in_freeze(family, name, spec, num_layers, is_tied)
            p.requires_grad_(keep)
            if not keep and p.dtype != frozen_dtype(spec):
                p.data = p.data.to(frozen_dtype(spec))
        return model
    if spec.method == "qlora":
        quantize(model, spec.matmul_keeps_input)
        if spec.prepare_kbit:
            from peft import prepare_model_for_kbit_training

            # checkpointing, when the case asks for it, is enabled afterwards as for every
            # case (non-reentrant, with the embedding output requiring grad)
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if spec.method in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model

        names: list[str] = []
        mapping = LORA_MODULES.get(family)
        for target in spec.lora_targets:
            if target == "all-linear":
                names = ["all-linear"]
                break
            for n in mapping[target] if mapping else [target]:
                if n not in names:
                    names.append(n)
        target_modules: Any = "all-linear" if names == ["all-linear"] else names
        lcfg = LoraConfig(
            r=spec.lora_rank,
            lora_alpha=spec.lora_alpha,
            target_modules=target_modules,
            lora_dropout=0.0,
            bias="none",
            fan_in_fan_out=family == "gpt2",
            modules_to_save=list(spec.modules_to_save) or None,
        )
        if spec.adapter_dtype == "auto":  # fp32, except bf16 under pure bf16
            return get_peft_model(model, lcfg, autocast_adapter_dtype=spec.precision != "bf16")
        # fp32: PEFT's default upcast of adapters on a 16-bit base; bf16: adapters in the
        # base's dtype, cast to bf16 where the base is not
        peft_model = get_peft_model(
            model, lcfg, autocast_adapter_dtype=spec.adapter_dtype == "fp32"
        )
        target = _DTYPES[spec.adapter_dtype]
        for p in peft_model.parameters():
            if p.requires_grad and p.dtype != target:
                p.data = p.data.to(target)
        return peft_model
    raise ValueError(f"method {spec.method!r} is not measured by this harness")


def _make_optimizer(params: list[torch.nn.Parameter], spec: StepSpec) -> torch.optim.Optimizer:
    if spec.optimizer == "adamw":
        impl = {"fused": {"fused": True}, "foreach": {"foreach": True}}.get(
            spec.optimizer_impl, {"foreach": False}
        )
        return torch.optim.AdamW(params, lr=1e-4, **impl)
    if spec.optimizer == "sgd":
        impl = {"fused": {"fused": True}, "foreach": {"foreach": True}}.get(
            spec.optimizer_impl, {"foreach": False}
        )
        return torch.optim.SGD(params, lr=1e-4, momentum=0.0, **impl)
    raise ValueError(f"optimizer {spec.optimizer!r} is not measured by this harness")


def _enable_checkpointing(
    model: torch.nn.Module, per_op: bool = False, reentrant: bool = False
) -> None:
    """HF's non-reentrant checkpointing of every decoder layer; ``per_op``: with torchtitan's
    per-op selective policy (:func:`per_op_context`) as the checkpoint's ``context_fn``;
    ``reentrant``: torch's reentrant checkpointing (``use_reentrant=True``), the embedding
    output made to require a gradient (``enable_input_require_grads``), as Answer.AI's
    fsdp_qlora ``train.py`` and transformers 4.x (for a PEFT model) do with it."""
    kwargs: dict[str, Any] = {"use_reentrant": reentrant}
    if per_op:
        kwargs["context_fn"] = per_op_context
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # older transformers
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        model.enable_input_require_grads()
    if reentrant:
        model.enable_input_require_grads()
    for module in model.modules():
        fn = getattr(module, "_gradient_checkpointing_func", None)
        if fn is not None:
            module._gradient_checkpointing_func = _lifting_in_recompute(fn)


def _lifting_in_recompute(checkpoint: Callable[..., Any]) -> Callable[..., Any]:
    """``checkpoint`` whose recomputation makes tensors from Python data as the forward did.

    A fake tensor mode makes ``torch.tensor(data)`` (and indexing with a list, as Falcon's
    ``fused_qkv[..., [-2], :]``) build a CPU tensor and lift it into the mode; the switch for
    that (``torch._C._set_only_lift_cpu_tensors``) is thread-local, and the recomputation runs
    on the autograd engine's device thread, where it is off and such a tensor would be
    created on the (absent) CUDA device. The switch is set around the checkpointed function.
    """

    def run(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        def lifting(*a: Any, **k: Any) -> Any:
            previous = torch._C._only_lift_cpu_tensors()
            torch._C._set_only_lift_cpu_tensors(True)
            try:
                return function(*a, **k)
            finally:
                torch._C._set_only_lift_cpu_tensors(previous)

        return checkpoint(lifting, *args, **kwargs)

    return run


def _save_list() -> set[Any]:
    """The ops whose outputs torchtitan's per-op policy saves (every second ``mm`` excepted)."""
    aten = torch.ops.aten
    return {
        aten.mm.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
        aten.max.default,
    }


#: the per-op policy's decisions over one measurement: ``(op, mode, "save" | "recompute")``
#: -> calls (what a Hugging Face decoder layer emits; cleared by :func:`measure`)
POLICY_LOG: Counter[tuple[str, str, str]] = Counter()


def per_op_policy(counts: Counter[str]) -> Callable[..., Any]:
    """torchtitan's per-op selective checkpointing policy (``selective_ac_option: "op"``).

    Saves (``MUST_SAVE``) the outputs of the attention kernels and ``aten.max`` and of every
    odd-numbered ``aten.mm`` of the layer -- the 1st, 3rd, 5th... counted separately in the
    forward pass and in the recomputation -- and recomputes everything else
    (``PREFER_RECOMPUTE``). ``counts`` is one layer call's counter.
    """
    from torch.utils.checkpoint import CheckpointPolicy

    saved = _save_list()
    mm = torch.ops.aten.mm.default

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == mm:
            counts[mode] += 1
        save = func in saved and not (func == mm and counts[mode] % 2 == 0)
        POLICY_LOG[(str(func), mode, "save" if save else "recompute")] += 1
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def per_op_context() -> tuple[Any, Any]:
    """The checkpoint ``context_fn`` of one layer call: a fresh ``mm`` counter per call."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(per_op_policy(Counter()))


# ---------------------------------------------------------------------------- result
@dataclass
class StepMeasurement:
    peak_rounded: int = 0
    peak_raw: int = 0
    peak_phase: str = ""
    phase_peaks: dict[str, int] = field(default_factory=dict)
    phase_peaks_raw: dict[str, int] = field(default_factory=dict)
    breakdown: dict[str, int] = field(default_factory=dict)
    breakdown_raw: dict[str, int] = field(default_factory=dict)
    before_step: int = 0
    after_step: int = 0

    @classmethod
    def of(cls, tracker: Any, before: int) -> StepMeasurement:
        """What ``tracker`` recorded over one step that started with ``before`` bytes."""
        peaks = {k: v for k, v in tracker.phase_peaks.items() if k != "idle"}
        return cls(
            peak_rounded=tracker.peak.rounded,
            peak_raw=tracker.peak.raw,
            peak_phase=tracker.peak.phase,
            phase_peaks={k: v.rounded for k, v in peaks.items()},
            phase_peaks_raw={k: v.raw for k, v in peaks.items()},
            breakdown=dict(tracker.peak.breakdown),
            breakdown_raw=dict(tracker.peak.breakdown_raw),
            before_step=before,
            after_step=tracker.rounded,
        )


def optimizer_impl(opt: Any) -> str:
    """The implementation a torch optimizer was built with."""
    if opt.defaults.get("fused"):
        return "fused"
    return "foreach" if opt.defaults.get("foreach") else "for-loop"


@dataclass
class Measurement:
    first: StepMeasurement
    #: the reported step: the case's convention (held, where the scenario does not say)
    second: StepMeasurement
    #: the step whose model output is released before ``backward`` (HF Trainer style)
    released: StepMeasurement
    #: the step whose model output is held through ``backward`` and the optimizer step
    held: StepMeasurement
    attention_kernels: list[str]
    params_total: int
    params_trainable: int
    param_bytes: int
    optimizer_impl_used: str
    logits_bytes: int
    notes: list[str] = field(default_factory=list)


@contextlib.contextmanager
def _unpacked_inputs() -> Iterator[None]:
    """Answer Hugging Face's value-dependent "are these packed sequences?" check.

    With no attention mask, HF inspects ``position_ids`` to detect several sequences packed
    into one row; if it cannot read them (it treats fake tensors like tracing) it assumes
    packing and builds a full ``b x 1 x s x s`` mask instead of using ``is_causal``. The
    inputs here are one unpadded sequence per row, so the answer is "not packed", as a real
    run would find.
    """
    import transformers.masking_utils as mu

    saved = mu.find_packed_sequence_indices
    mu.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        mu.find_packed_sequence_indices = saved


@contextlib.contextmanager
def _fake_module_copies() -> Iterator[None]:
    """Let PEFT deep-copy a module of fake parameters (``modules_to_save``).

    ``copy.deepcopy`` of a FakeTensor makes one of a new fake mode, which the step's mode
    then refuses to mix with its own; the copy's parameters and buffers are cloned in the
    step's mode instead (each a new storage, as the real copy is) and the rest of the
    module deep-copied around them.
    """
    import copy

    from peft.utils import other

    original = other.copy.deepcopy

    def deepcopy(obj: Any, memo: dict[int, Any] | None = None) -> Any:
        if not isinstance(obj, torch.nn.Module):
            return original(obj, memo)
        memo = {} if memo is None else memo
        for p in obj.parameters():
            memo[id(p)] = torch.nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
        for b in obj.buffers():
            memo[id(b)] = b.clone()
        return original(obj, memo)

    namespace = type("copy_ns", (), {"deepcopy": staticmethod(deepcopy)})
    other.copy = namespace  # type: ignore[assignment]
    try:
        yield
    finally:
        other.copy = copy


@contextlib.contextmanager
def _swappable_fake_params(mode: FakeTensorMode) -> Iterator[None]:
    """Let ``nn.Module.to`` swap fake parameters that the fake mode's memo refers to.

    ``nn.Module._apply`` replaces a FakeTensor parameter with ``torch.utils.swap_tensors``,
    which refuses tensors that have weak references -- and the fake tensor converter's memo
    holds weak references to some of the tensors it produced. Dropping those memo entries
    changes nothing but the cache, so on that refusal they are dropped and the swap retried.
    """
    import torch.utils

    original = torch.utils.swap_tensors
    memo = mode.fake_tensor_converter.meta_converter.tensor_memo

    def swap(t1: torch.Tensor, t2: torch.Tensor) -> None:
        try:
            original(t1, t2)
        except RuntimeError as exc:
            if "weakref" not in str(exc):
                raise
            for key, value in list(memo.items()):
                if value is t1 or value is t2:
                    del memo[key]
            original(t1, t2)

    torch.utils.swap_tensors = swap
    try:
        yield
    finally:
        torch.utils.swap_tensors = original


@contextlib.contextmanager
def _grouped_mm_fallback_for_non_bf16() -> Iterator[None]:
    """Mixture-of-experts layers with fp32 (or fp16) expert weights.

    Hugging Face runs experts through ``torch.nn.functional.grouped_mm`` on CUDA whatever the
    dtype; PyTorch's CUDA ``_grouped_mm`` takes its fast path for bf16 only and loops over
    the experts with ``mm`` otherwise, while its fake-tensor (meta) implementation accepts
    bf16 only. For other dtypes :class:`_LoopedGroupedMM` stands in: the CUDA loop's output,
    ``(S, out)``, the input saved for a weight that trains and the weight for an input that
    needs a gradient (as for ``mm``), and in backward only the gradients autograd asks for --
    ``(S, in)`` and ``(experts, in, out)`` (transformers' own fallback operator saves and
    makes both every time).
    """
    try:
        import transformers.integrations.moe as moe
    except ImportError:  # older transformers: no grouped experts
        yield
        return
    original = moe._grouped_mm

    def grouped_mm(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        if weight.dtype == torch.bfloat16:
            return original(input, weight, offs)
        out: torch.Tensor = _LoopedGroupedMM.apply(input.to(weight.dtype), weight, offs)
        return out

    moe._grouped_mm = grouped_mm
    try:
        yield
    finally:
        moe._grouped_mm = original


class _LoopedGroupedMM(torch.autograd.Function):
    """``_grouped_mm`` as PyTorch's CUDA build runs it for non-bf16 weights: one ``mm`` per
    expert on its rows (``offs``: cumulative rows per expert)."""

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> Any:
        # as autograd's formulas for mm: the input for the weight's gradient, the weight for
        # the input's
        needs_input, needs_weight = ctx.needs_input_grad[:2]
        ctx.save_for_backward(input if needs_weight else None, weight if needs_input else None)
        ctx.offs, ctx.experts, ctx.rows = offs, weight.size(0), input.size(0)
        out = input.new_empty(input.size(0), weight.size(2))
        for e, (start, end) in enumerate(_expert_rows(offs, weight.size(0), input.size(0))):
            torch.mm(input[start:end], weight[e], out=out[start:end])
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        input, weight = ctx.saved_tensors
        rows = _expert_rows(ctx.offs, ctx.experts, ctx.rows)
        grad_input = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_input = grad.new_empty(ctx.rows, weight.size(1))
            for e, (start, end) in enumerate(rows):
                torch.mm(grad[start:end], weight[e].T, out=grad_input[start:end])
        if ctx.needs_input_grad[1]:
            grad_weight = input.new_empty(ctx.experts, input.size(1), grad.size(1))
            for e, (start, end) in enumerate(rows):
                torch.mm(input[start:end].T, grad[start:end], out=grad_weight[e])
        return grad_input, grad_weight, None


def _expert_rows(offs: torch.Tensor, experts: int, rows: int) -> list[tuple[int, int]]:
    """Each expert's rows: fake tensors have no values to read ``offs`` from, so the rows are
    shared evenly, as the balanced routing the measurement assumes (the sizes of the
    tensors allocated do not depend on the split)."""
    share, extra = divmod(rows, experts)
    out, start = [], 0
    for e in range(experts):
        end = start + share + (1 if e < extra else 0)
        out.append((start, end))
        start = end
    return out


def _eager_experts(
    self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """transformers' eager experts loop (``MixtralExperts.forward``) with a balanced router.

    The loop reads the routing's values: which experts were chosen at all (``nonzero`` of
    the one-hot mask) and which tokens each one got (``torch.where``) -- values fake tensors
    do not have. Here every expert takes the same share of the ``tokens x top_k``
    assignments (the first experts one more where they do not divide evenly), and the loop
    runs the same operations as transformers' on index tensors of those sizes: per expert,
    the gathered tokens (``hidden_states[token_idx]``), ``F.linear`` with that expert's
    slice of ``gate_up_proj``, the activation times ``up``, ``F.linear`` with its
    ``down_proj`` slice, the product with its routing weights and ``index_add_`` into the
    output. ``tests/validation/test_dataset_conventions.py`` checks it against
    transformers' loop on real CPU tensors routed that way.
    """
    tokens, experts = hidden_states.size(0), self.num_experts
    device = hidden_states.device
    final = torch.zeros_like(hidden_states)
    with torch.no_grad():
        expert_mask = F.one_hot(top_k_index, num_classes=experts + 1).permute(2, 1, 0)
        torch.greater(expert_mask.sum(dim=(-1, -2)), 0)  # its nonzero(): every expert
        expert_hit = torch.zeros((experts, 1), dtype=torch.long, device=device)
    share, extra = divmod(tokens * top_k_index.size(-1), experts)
    for e in range(experts):
        n = share + (1 if e < extra else 0)
        # torch.where(expert_mask[e]): the (n, 2) indices nonzero() returns, unbound
        top_k_pos, token_idx = torch.zeros((n, 2), dtype=torch.long, device=device).unbind(1)
        current = hidden_states[token_idx]
        gate, up = F.linear(current, self.gate_up_proj[e]).chunk(2, dim=-1)
        h = self.act_fn(gate) * up
        h = F.linear(h, self.down_proj[e])
        h = h * top_k_weights[token_idx, top_k_pos, None]
        final.index_add_(0, token_idx, h.to(final.dtype))
    del expert_mask, expert_hit  # live through the loop, as in transformers'
    return final


@contextlib.contextmanager
def _balanced_eager_experts() -> Iterator[None]:
    """Run ``experts_implementation="eager"`` MoE layers as :func:`_eager_experts`."""
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError:  # older transformers: no experts switch
        yield
        return
    ALL_EXPERTS_FUNCTIONS["eager"] = _eager_experts
    try:
        yield
    finally:
        del ALL_EXPERTS_FUNCTIONS["eager"]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    loggers = [logging.getLogger(n) for n in ("transformers", "peft")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            for lg, lvl in zip(loggers, levels, strict=True):
                lg.setLevel(lvl)


def _output_module(model: torch.nn.Module, family: str) -> torch.nn.Module:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if family == "bert":
        return base.cls
    return base.get_output_embeddings()


def _causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def forward_and_loss(
    model: torch.nn.Module, ids: torch.Tensor, spec: StepSpec, on_logits: Callable[[], None]
) -> tuple[torch.Tensor, list[Any]]:
    """The model call and the loss in the case's convention: ``(loss, what the forward
    returned)`` -- the second is what a loop that holds its outputs keeps through backward.
    ``on_logits`` is called once the (last) logits exist, where the loss phase begins."""
    kwargs: dict[str, Any] = {}
    if not spec.kv_cache_in_outputs and _family(spec.hf_config) != "bert":
        kwargs["use_cache"] = False
    if spec.loss == "standard":  # HF's own loss from labels: upcast, log-softmax, NLL
        out = model(input_ids=ids, labels=ids, **kwargs)
        return out.loss, [out]
    # labels shifted by padding, as HF's ForCausalLMLoss does (no copy of the logits)
    labels = F.pad(ids, (0, 1), value=-100)[..., 1:].contiguous()
    if spec.loss == "no-upcast":  # F.cross_entropy on the logits as the model returns them
        out = model(input_ids=ids, **kwargs)
        logits = out.logits
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))
        return loss, [out]
    # chunked-output: torchtune's CEWithChunkedOutputLoss over the LM head applied per chunk
    lm = _causal_lm(model)
    out = lm.base_model(input_ids=ids, **kwargs)
    head = lm.get_output_embeddings()
    chunks = [head(h) for h in out.last_hidden_state.chunk(spec.loss_chunks, dim=1)]
    on_logits()
    tokens = (labels != -100).sum()
    total: Any = 0.0
    for logit, label in zip(chunks, labels.chunk(spec.loss_chunks, dim=1), strict=True):
        part = logit.reshape(-1, logit.size(-1)).float()
        total = total + F.cross_entropy(part, label.reshape(-1), reduction="sum")
    return total / tokens, [out, chunks]


def measure(spec: StepSpec, gpu: GpuProfile | None = None) -> Measurement:
    """Run three steps of ``spec`` on fake CUDA tensors; return what the tracker saw.

    The first two follow the case's convention (the second is reported); the third holds
    or releases the model output the other way. Without a convention (the original
    dataset): held, held, released.
    """
    check_spec(spec)
    POLICY_LOG.clear()
    gpu = gpu or GpuProfile()
    log = KernelLog()
    mode = FakeTensorMode()
    with (
        _quiet(),
        _unpacked_inputs(),
        _grouped_mm_fallback_for_non_bf16(),
        _balanced_eager_experts(),
        fakecuda.installed((gpu.major, gpu.minor)),
        mode,
        cuda_sdpa(gpu, log),
    ):
        with (
            fakecuda.FakeInit(),
            torch.device("cuda"),
            _swappable_fake_params(mode),
            _fake_module_copies(),
        ):
            model, family = _build_model(spec)
            model = _apply_method(model, family, spec)
            if spec.checkpointing in ("full", "per-op"):
                _enable_checkpointing(
                    model, per_op=spec.checkpointing == "per-op",
                    reentrant=spec.checkpoint_reentrant,
                )  # fmt: skip
        model.train()
        trainable = [p for p in model.parameters() if p.requires_grad]
        opt = _make_optimizer(trainable, spec)
        ids = torch.zeros((spec.batch, spec.seq), dtype=torch.long, device="cuda")
        autocast = spec.precision == "bf16-mixed"

        tracker = StorageTracker(device_type="cuda")
        tracker.adopt([ids, *model.parameters(), *model.buffers()])
        tracker.watch(list(model.parameters()), [opt])

        logits_bytes = 0
        chunked = spec.loss == "chunked-output"

        def after_logits(_m: Any, _i: Any, out: Any) -> None:
            nonlocal logits_bytes
            t = out[0] if isinstance(out, tuple) else out
            logits_bytes += t.numel() * t.element_size()
            if not chunked:  # chunks: the loss phase begins after the last one
                tracker.set_phase("loss")

        hook = _output_module(model, family).register_forward_hook(after_logits)
        held = spec.outputs_held_through_backward
        order = (False, False, True) if held is None or held else (True, True, False)
        results: list[StepMeasurement] = []
        with tracker:
            # steps 1 and 2 in the case's convention; step 3 the other way: with the model
            # output released before backward (HF's Trainer) or held through the step
            for release_outputs in order:
                gc.collect()
                tracker.reset_peaks()
                before = tracker.rounded
                logits_bytes = 0
                tracker.set_phase("forward")
                ctx = (
                    torch.autocast("cuda", dtype=torch.bfloat16)
                    if autocast
                    else contextlib.nullcontext()
                )
                with ctx:
                    loss, outputs = forward_and_loss(
                        model, ids, spec, lambda: tracker.set_phase("loss")
                    )
                if release_outputs:
                    del outputs
                tracker.set_phase("backward")
                loss.backward()
                tracker.set_phase("optimizer")
                opt.step()
                opt.zero_grad(set_to_none=True)
                del loss
                if not release_outputs:
                    del outputs
                gc.collect()
                tracker.set_phase("idle")
                results.append(StepMeasurement.of(tracker, before))
                # optimizer states are created in the first step; count them from then on
                tracker.adopt(v for s in opt.state.values() for v in s.values())
        hook.remove()
        params = list(model.parameters())
        impl = optimizer_impl(opt)
        m = Measurement(
            first=results[0],
            second=results[1],
            released=results[1] if order[1] else results[2],
            held=results[2] if order[1] else results[1],
            attention_kernels=log.distinct() if spec.attention == "sdpa" else ["eager"],
            params_total=sum(p.numel() for p in params),
            params_trainable=sum(p.numel() for p in params if p.requires_grad),
            param_bytes=sum(p.numel() * p.element_size() for p in params),
            optimizer_impl_used=impl,
            logits_bytes=logits_bytes,
        )
        del model, opt, ids, params, trainable
    gc.collect()
    return m

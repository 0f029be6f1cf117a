"""One training step of a Hugging Face model, measured by the storage tracker.

The step mirrors MemFit's scenario semantics (see ``engine/model_state.py``):

* precision ``fp32``: model in fp32, no autocast; ``bf16-mixed``: model in fp32 (the
  master weights), ``torch.autocast("cuda", torch.bfloat16)`` around forward and loss;
  ``bf16``: model in bf16, no autocast;
* method ``full``: every parameter trains; ``lora``: the base model is built in bf16 (fp32
  under ``fp32``) and PEFT adds adapters -- in fp32 (PEFT's ``autocast_adapter_dtype``)
  except under pure bf16, where they stay bf16; ``freeze``: only the named parts and the
  last N blocks train, and under ``bf16-mixed`` the frozen weights are held in bf16;
* optimizer ``adamw`` (``foreach=True`` or ``fused=True``) or ``sgd`` without momentum;
* activation checkpointing ``full``: HF's non-reentrant checkpointing of every block;
* the step: ``out = model(input_ids=ids, labels=ids)``, ``out.loss.backward()``,
  ``opt.step()``, ``opt.zero_grad(set_to_none=True)``, with ``out`` released at the end of
  the step; run twice, the second is reported (AdamW creates its state lazily in the
  first). A third step releases ``out`` right after taking its loss, before ``backward``,
  as Hugging Face's ``Trainer`` does (its ``compute_loss`` returns only the loss): that peak
  lacks the logits (and, without checkpointing, the KV cache HF builds in training).

Everything runs on fake CUDA tensors (:mod:`validation.fakecuda`) with the CUDA kernel
choice of ``scaled_dot_product_attention`` emulated (:mod:`validation.sdpa`).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# isort: off
from validation import fakecuda  # first: registers the fake CUDA hooks before torch loads
import torch
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
    freeze_trainable: tuple[str, ...] = ("lm_head",)
    freeze_last_layers: int = 0


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
        freeze_trainable=tuple(freeze.get("trainable", ("lm_head",))),
        freeze_last_layers=freeze.get("last_layers", 0),
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


def _build_model(spec: StepSpec) -> tuple[torch.nn.Module, str]:
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    config = _hf_config(spec)
    family = _family(spec.hf_config)
    if spec.method == "lora":
        dtype = torch.float32 if spec.precision == "fp32" else torch.bfloat16
    else:
        dtype = torch.bfloat16 if spec.precision == "bf16" else torch.float32
    auto = AutoModelForMaskedLM if family == "bert" else AutoModelForCausalLM
    kwargs: dict[str, Any] = {"attn_implementation": spec.attention, "dtype": dtype}
    model = auto.from_config(config, **kwargs)
    model.train()
    return model, family


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
            if not keep and spec.precision == "bf16-mixed":
                p.data = p.data.to(torch.bfloat16)
        return model
    if spec.method == "lora":
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
        )
        return get_peft_model(model, lcfg, autocast_adapter_dtype=spec.precision != "bf16")
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


def _enable_checkpointing(model: torch.nn.Module) -> None:
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # older transformers
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        model.enable_input_require_grads()


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
    second: StepMeasurement
    #: a third step whose model output is released before ``backward`` (HF Trainer style)
    released: StepMeasurement
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
    bf16 only. For other dtypes HF's own looped fallback operator is used here instead: it
    allocates the same output and gradients, ``(S, out)``, ``(S, in)`` and
    ``(experts, in, out)``, and saves the same tensors for backward.
    """
    try:
        import transformers.integrations.moe as moe
    except ImportError:  # older transformers: no grouped experts
        yield
        return
    original = moe._can_use_grouped_mm

    def can_use(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> bool:
        if weight.dtype != torch.bfloat16:
            return False
        return bool(original(input, weight, offs))

    moe._can_use_grouped_mm = can_use
    try:
        yield
    finally:
        moe._can_use_grouped_mm = original


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


def measure(spec: StepSpec, gpu: GpuProfile | None = None) -> Measurement:
    """Run two steps of ``spec`` on fake CUDA tensors; return what the tracker saw."""
    gpu = gpu or GpuProfile()
    log = KernelLog()
    mode = FakeTensorMode()
    with (
        _quiet(),
        _unpacked_inputs(),
        _grouped_mm_fallback_for_non_bf16(),
        fakecuda.installed((gpu.major, gpu.minor)),
        mode,
        cuda_sdpa(gpu, log),
    ):
        with fakecuda.FakeInit(), torch.device("cuda"), _swappable_fake_params(mode):
            model, family = _build_model(spec)
            model = _apply_method(model, family, spec)
            if spec.checkpointing == "full":
                _enable_checkpointing(model)
        model.train()
        trainable = [p for p in model.parameters() if p.requires_grad]
        opt = _make_optimizer(trainable, spec)
        ids = torch.zeros((spec.batch, spec.seq), dtype=torch.long, device="cuda")
        autocast = spec.precision == "bf16-mixed"

        tracker = StorageTracker(device_type="cuda")
        tracker.adopt([ids, *model.parameters(), *model.buffers()])
        tracker.watch(list(model.parameters()), [opt])

        logits_bytes = 0

        def after_logits(_m: Any, _i: Any, out: Any) -> None:
            nonlocal logits_bytes
            t = out[0] if isinstance(out, tuple) else out
            logits_bytes = t.numel() * t.element_size()
            tracker.set_phase("loss")

        hook = _output_module(model, family).register_forward_hook(after_logits)
        results: list[StepMeasurement] = []
        with tracker:
            # steps 1 and 2 as written (the model output stays referenced through backward
            # and the optimizer step); step 3 drops it before backward, as HF's Trainer does
            for release_outputs in (False, False, True):
                gc.collect()
                tracker.reset_peaks()
                before = tracker.rounded
                tracker.set_phase("forward")
                ctx = (
                    torch.autocast("cuda", dtype=torch.bfloat16)
                    if autocast
                    else contextlib.nullcontext()
                )
                with ctx:
                    out = model(input_ids=ids, labels=ids)
                if release_outputs:
                    loss = out.loss
                    del out
                tracker.set_phase("backward")
                if release_outputs:
                    loss.backward()
                else:
                    out.loss.backward()
                tracker.set_phase("optimizer")
                opt.step()
                opt.zero_grad(set_to_none=True)
                if release_outputs:
                    del loss
                else:
                    del out
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
            released=results[2],
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

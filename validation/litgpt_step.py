"""Training steps of LitGPT's own ``GPT``, as LitGPT's finetune scripts run them.

MemFit's ``lightning`` stack runs LitGPT's model code (``model_implementation`` ``litgpt``),
not transformers'. This module builds ``litgpt.lora.GPT`` (or ``litgpt.model.GPT``) from
LitGPT's config of the same checkpoint, with fewer layers, and traces the loop of
``litgpt/finetune/lora.py`` on fake CUDA tensors (:mod:`validation.fakecuda`) with the
storage tracker:

    logits = model(input_ids, lm_head_chunk_size=128)
    logits[-1] = logits[-1][..., :-1, :]
    loss = chunked_cross_entropy(logits, targets[..., 1:])
    loss.backward(); optimizer.step(); optimizer.zero_grad()

``logits`` and ``loss`` are loop locals: each step's live on until the next step rebinds
them (``previous_step_held``). Three steps run; the third is reported (the optimizer's
states exist from the first, the previous step's graph from the second). With
``previous_step_held`` false the loop deletes both after ``zero_grad``.

* precision ``bf16`` is Lightning's ``bf16-true``: the model is built under a bf16 default
  dtype and converted with ``.to(torch.bfloat16)`` (``HalfPrecision.convert_module``), so
  RoPE's cos/sin buffers are bf16 too;
* method ``lora``: ``mark_only_lora_as_trainable``; ``full``: every parameter trains;
* method ``qlora``: Lightning's ``BitsandbytesPrecision`` replaces every ``nn.Linear`` --
  the LM head too -- and converts nothing else (cos/sin stay as built, fp32). The 4-bit
  layer here is :class:`FourBitLinear`, a stand-in with the storage and the memory
  behaviour of bitsandbytes' ``Linear4bit`` and ``MatMul4Bit`` as LitGPT's bitsandbytes
  (0.42) has them: a packed uint8 weight and fp32 absmax; forward dequantizes to the quant
  state's dtype (fp16: Lightning quantizes ``weight.to(torch.half)``), casts that to the
  input's dtype and runs the matmul; the function keeps ``ctx.tensors = (A, B)`` -- an
  attribute, not ``save_for_backward`` -- whenever either needs a gradient; backward
  dequantizes and casts again for the input's gradient. Nothing of bitsandbytes runs here
  (it has no fake-tensor support);
* optimizer: torch ``AdamW(foreach=True)`` over the trainable parameters (LitGPT's QLoRA
  uses bitsandbytes' ``PagedAdamW``, whose paged states the CUDA caching allocator never
  sees; the LoRA states are small, and the scenario says ``adamw``).

Attention runs SDPA as on an H100 (:mod:`validation.sdpa`).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any

# isort: off
from validation import fakecuda  # first: registers the fake CUDA hooks before torch loads
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
# isort: on

from validation.sdpa import GpuProfile, KernelLog, cuda_sdpa
from validation.step import _swappable_fake_params
from validation.tracker import StorageTracker

#: LitGPT's config name of each model the cases use (``litgpt/config.py``)
CONFIGS = {
    "llama-2-7b": "Llama-2-7b-hf",
    "llama-3-8b": "Llama-3-8B",
    "llama-3.2-1b": "Llama-3.2-1B",
    "mistral-7b-v0.1": "Mistral-7B-v0.1",
    "falcon-7b": "falcon-7b",
    "phi-1.5": "phi-1_5",
    "gemma-2b": "gemma-2b",
}
#: bitsandbytes' default block size of the 4-bit absmax (64 elements each)
BLOCK = 64


class _MatMul4Bit(torch.autograd.Function):
    """The memory of bitsandbytes' ``MatMul4Bit`` (see the module docstring)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, a: torch.Tensor, packed: torch.Tensor, shape: tuple[int, int], bias: Any
    ) -> torch.Tensor:
        half = torch.empty(shape, dtype=torch.float16, device=a.device)  # dequantize_4bit
        weight = half.to(a.dtype)
        del half
        out = F.linear(a, weight, bias)
        ctx.shape = shape
        ctx.tensors = (a, packed) if any(ctx.needs_input_grad[:2]) else (None, None)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        grad_a = None
        if ctx.needs_input_grad[0]:
            half = torch.empty(ctx.shape, dtype=torch.float16, device=grad.device)
            weight = half.to(grad.dtype)
            del half
            grad_a = grad @ weight
        return grad_a, None, None, None


class FourBitLinear(torch.nn.Module):
    """A frozen ``nn.Linear`` stored in 4 bits: ``out x in / 2`` bytes of codes and one
    fp32 absmax per block of 64 (no double quantization)."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        out_f, in_f = linear.weight.shape
        device = linear.weight.device
        self.shape = (out_f, in_f)
        self.in_features, self.out_features = in_f, out_f  # read by LitGPT's LoRA layers
        codes = torch.empty(out_f * in_f // 2, dtype=torch.uint8, device=device)
        self.weight = torch.nn.Parameter(codes, requires_grad=False)
        self.register_buffer("absmax", torch.empty(out_f * in_f // BLOCK, device=device))
        self.bias = linear.bias
        if self.bias is not None:
            self.bias.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _MatMul4Bit.apply(x, self.weight, self.shape, self.bias)  # type: ignore[no-any-return]


def quantize(model: torch.nn.Module) -> None:
    """Replace every ``nn.Linear`` of ``model`` (adapters are parameters, not modules, in
    LitGPT's LoRA layers) by a :class:`FourBitLinear`."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(module, name, FourBitLinear(child))


@dataclass(frozen=True)
class LitSpec:
    config: str
    layers: int
    method: str
    batch: int
    seq: int
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q_proj", "v_proj")
    previous_step_held: bool = True


def spec_from_case(case: dict[str, Any]) -> LitSpec:
    """The LitGPT step of a case of :mod:`validation.cases_litgpt`."""
    t = case["scenario"]["training"]
    lora = t.get("lora", {})
    return LitSpec(
        config=CONFIGS[case["model_name"]],
        layers=case["layers"],
        method=t["method"],
        batch=t["micro_batch_size"],
        seq=t["sequence_length"],
        rank=lora.get("rank", 8),
        alpha=lora.get("alpha", 16.0),
        dropout=lora.get("dropout", 0.0),
        targets=tuple(lora.get("targets", ("q_proj", "v_proj"))),
        previous_step_held=t["previous_step_held"],
    )


def _config(spec: LitSpec) -> Any:
    from litgpt.lora import Config

    if spec.method == "full":
        return Config.from_name(spec.config, n_layer=spec.layers)
    every = "all-linear" in spec.targets
    return Config.from_name(
        spec.config,
        n_layer=spec.layers,
        lora_r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        lora_query=every or "q_proj" in spec.targets,
        lora_key=every or "k_proj" in spec.targets,
        lora_value=every or "v_proj" in spec.targets,
        lora_projection=every or "o_proj" in spec.targets,
        lora_mlp=every,
        lora_head=False,
    )


@dataclass
class LitMeasurement:
    peak_allocated_bytes: int
    peak_phase: str
    phase_peaks: dict[str, int]
    params_total: int
    params_trainable: int
    attention_kernels: list[str]


def measure(spec: LitSpec, gpu: GpuProfile | None = None) -> LitMeasurement:
    """Run three steps of ``spec``'s loop on fake CUDA; the third step's peaks."""
    from litgpt.lora import GPT, mark_only_lora_as_trainable
    from litgpt.utils import chunked_cross_entropy

    gpu = gpu or GpuProfile()
    log = KernelLog()
    mode = FakeTensorMode()
    config = _config(spec)
    with fakecuda.installed((gpu.major, gpu.minor)), mode, cuda_sdpa(gpu, log):
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)  # Fabric's init_module under bf16
        try:
            with fakecuda.FakeInit(), torch.device("cuda"), _swappable_fake_params(mode):
                model = GPT(config)
                model.max_seq_length = spec.seq
                if spec.method == "qlora":
                    quantize(model)
                else:
                    model = model.to(torch.bfloat16)
        finally:
            torch.set_default_dtype(default)
        if spec.method == "full":
            for p in model.parameters():
                p.requires_grad_(True)
        else:
            mark_only_lora_as_trainable(model)
        model.train()
        trainable = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(trainable, lr=1e-4, foreach=True)
        ids = torch.zeros((spec.batch, spec.seq), dtype=torch.long, device="cuda")
        tracker = StorageTracker(device_type="cuda")
        tracker.adopt([ids, *model.parameters(), *model.buffers()])
        tracker.watch(list(model.parameters()), [opt])
        steps = []
        with tracker:
            logits = loss = None
            for _ in range(3):
                gc.collect()
                tracker.reset_peaks()
                tracker.set_phase("forward")
                logits = model(ids, lm_head_chunk_size=128)
                logits[-1] = logits[-1][..., :-1, :]
                tracker.set_phase("loss")
                loss = chunked_cross_entropy(logits, ids[..., 1:])
                tracker.set_phase("backward")
                loss.backward()
                tracker.set_phase("optimizer")
                opt.step()
                opt.zero_grad()
                if not spec.previous_step_held:
                    del logits, loss
                    logits = loss = None
                gc.collect()
                tracker.set_phase("idle")
                peaks = {k: v.rounded for k, v in tracker.phase_peaks.items() if k != "idle"}
                steps.append((tracker.peak.rounded, tracker.peak.phase, peaks))
                tracker.adopt(v for s in opt.state.values() for v in s.values())
            del logits, loss
        params = list(model.parameters())
        total = sum(p.numel() for p in params)
        if spec.method == "qlora":  # the stand-ins' codes are bytes, two weights each
            total += sum(m.weight.numel() for m in model.modules() if isinstance(m, FourBitLinear))
        result = LitMeasurement(
            peak_allocated_bytes=steps[2][0],
            peak_phase=steps[2][1],
            phase_peaks=steps[2][2],
            params_total=total,
            params_trainable=sum(p.numel() for p in params if p.requires_grad),
            attention_kernels=log.distinct(),
        )
        del model, opt, ids, params, trainable
    gc.collect()
    return result

"""What ``torch.compile`` keeps for backward, traced: each case's decoder layer, and its
final norm, LM head and loss, run compiled (inductor, PyTorch's defaults) and eager on the
CPU, with every tensor autograd saves counted.

    VENV/bin/python -m validation.measure_compiled    # -> tests/validation/dataset_compiled.json

A compiled region saves what AOTAutograd's min-cut partitioner chose
(``ctx.save_for_backward`` of its compiled function), so a
``torch.autograd.graph.saved_tensors_hooks`` pack hook sees exactly those tensors. Each
distinct storage is counted once (views share one), in bytes; the parameters and the
rotary position embeddings (computed once for every layer) are left out, the layer's input
is counted where it is kept. That is the quantity the engine's block keeps after its
forward (``engine.graph.simulate(...).kept``, :func:`engine.inductor.partition` under
``torch_compile``). Layers are compiled one by one, as torchtune and torchtitan compile
them; the head and the loss as one region, as a whole-model compile runs them.

The records keep the scenario (``validation.cases.scenario``) with ``torch_compile`` set,
and the bytes kept compiled and eager by the layer and by the head.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from typing import Any

from validation.cases import MODELS, model_config, scenario
from validation.cases_activations import OLMO_2_7B
from validation.measure import ROOT

DEFAULT_OUT = ROOT / "tests" / "validation" / "dataset_compiled.json"

#: (model, precision, batch, sequence length, method): families with different norms,
#: activations and attention layouts, pure bf16, autocast and fp32
CASES = [
    ("llama-3.2-1b", "bf16", 2, 256, "full"),
    ("llama-3.2-1b", "bf16-mixed", 2, 256, "full"),
    ("llama-3.2-1b", "fp32", 1, 256, "full"),
    ("llama-3.2-1b", "bf16", 2, 256, "lora"),
    ("llama-3.2-1b", "bf16-mixed", 2, 256, "lora"),
    ("qwen2.5-0.5b", "bf16", 2, 256, "full"),
    ("qwen2.5-0.5b", "bf16-mixed", 2, 256, "full"),
    ("mistral-7b-v0.1", "bf16", 1, 128, "full"),
    ("gpt2", "bf16", 2, 256, "full"),
    ("gpt2", "bf16-mixed", 2, 256, "full"),
    ("olmo-2-7b", "bf16", 1, 128, "full"),
]

#: models beyond ``validation.cases.MODELS``: OLMo-2's q/k norms and norms after each sublayer
EXTRA = {"olmo-2-7b": OLMO_2_7B}


def _config(model: str) -> dict[str, Any]:
    if model in MODELS:
        return model_config(model, 1)
    return {**EXTRA[model], "num_hidden_layers": 1, "_name_or_path": model}


@contextmanager
def _saved(into: dict[int, int], skip: set[int]) -> Any:
    """Count the storages autograd saves while open, apart from those in ``skip``."""
    import torch

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in skip and s.nbytes():
            into[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


def measure(model: str, precision: str, batch: int, seq: int, method: str) -> dict[str, Any]:
    import torch
    import transformers

    torch.manual_seed(0)
    torch._dynamo.reset()
    scen = scenario("gpt2", 1, precision=precision, method=method, batch=batch, seq=seq)
    scen["model"] = _config(model)
    scen["training"]["torch_compile"] = True
    cfg = dict(_config(model))
    cfg["attn_implementation"] = "sdpa"
    config = transformers.AutoConfig.for_model(**cfg)
    net = transformers.AutoModelForCausalLM.from_config(config)
    if precision == "bf16" or (method == "lora" and precision == "bf16-mixed"):
        # pure bf16; a LoRA base loaded in the compute dtype (frozen_weights_dtype auto)
        net = net.to(torch.bfloat16)
    if method == "lora":
        import peft

        lora = scen["training"]["lora"]
        # the adapters in fp32, except in bf16 under pure bf16 (the harness's "auto",
        # validation.step)
        net = peft.get_peft_model(
            net,
            peft.LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"],
                            target_modules=lora["targets"], lora_dropout=0.0),
            autocast_adapter_dtype=precision != "bf16",
        )  # fmt: skip
    base = net.get_base_model() if method == "lora" else net
    ids = torch.randint(0, cfg["vocab_size"], (batch, seq))
    out = {mode: _saved_by(net, base, cfg, ids, precision, mode) for mode in ("eager", "compiled")}
    return {
        "id": f"{model}_{precision}_{method}_b{batch}_s{seq}",
        "scenario": scen,
        "measured": out,
        "environment": {"torch": torch.__version__, "transformers": transformers.__version__},
    }


def _saved_by(
    net: Any, base: Any, cfg: dict[str, Any], ids: Any, precision: str, mode: str
) -> dict[str, int]:
    """The bytes the first layer and the head save, run ``mode`` ("eager", "compiled")."""
    import torch

    gpt2 = cfg["model_type"] == "gpt2"
    inner = base.transformer if gpt2 else base.model
    layer = (inner.h if gpt2 else inner.layers)[0]
    norm = inner.ln_f if gpt2 else inner.norm
    layer_saved: dict[int, int] = {}
    head_saved: dict[int, int] = {}
    skip = {p.untyped_storage().data_ptr() for p in net.parameters()}
    run = torch.compile(layer.forward) if mode == "compiled" else layer.forward

    def layer_forward(*args: Any, **kw: Any) -> Any:
        for v in [*args[1:], *kw.values()]:  # the position embeddings, masks
            for t in v if isinstance(v, tuple) else (v,):
                if isinstance(t, torch.Tensor):
                    skip.add(t.untyped_storage().data_ptr())
        with _saved(layer_saved, skip):
            return run(*args, **kw)

    def head(hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = base.lm_head(norm(hidden))
        return base.loss_function(logits, labels, vocab_size=cfg["vocab_size"])

    head_run = torch.compile(head) if mode == "compiled" else head
    layer.forward = layer_forward
    try:
        autocast = torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16-mixed")
        with autocast:
            hidden = inner(input_ids=ids).last_hidden_state
        # the head on the final norm's input: a fresh leaf, so that only the head's own
        # saves are counted (its input where kept)
        h = hidden.detach().requires_grad_(True)
        with autocast, _saved(head_saved, skip):
            loss = head_run(h, ids)
        loss.backward()
    finally:
        del layer.forward
    return {
        "layer_saved_bytes": sum(layer_saved.values()),
        "head_saved_bytes": sum(head_saved.values()),
    }


def main(argv: list[str]) -> None:
    records = [measure(*case) for case in CASES]
    for r in records:
        print(r["id"], json.dumps(r["measured"]))
    DEFAULT_OUT.write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])

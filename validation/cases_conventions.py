"""Validation cases for the conventions of training stacks.

The same kind of scenario as :mod:`validation.cases` (real widths, 2-4 layers), each with the
conventions a training stack follows written out in its ``training`` section, so that a
case says exactly which loop it emulates:

* ``stack``: a label, the stack whose conventions the case follows (``hf-trainer``,
  ``trl-sft``, ``accelerate-loop``, ``lightning``, ``torchtune``, ``axolotl``,
  ``torchtitan``, ``deepspeed``, ``megatron``) or ``custom``;
* ``outputs_held_through_backward``: the loop keeps the model output (logits, KV cache)
  referenced through backward and the optimizer step (a plain loop's ``out = model(...)``)
  or drops it after taking the loss (HF ``Trainer``, TRL, Lightning's ``training_step``,
  torchtune's ``del logits``);
* ``kv_cache_in_outputs``: transformers' default ``use_cache=True`` (the ``DynamicCache``
  is built in training too; HF turns it off itself under checkpointing) or
  ``use_cache=False``;
* ``frozen_weights_dtype``: the storage dtype of frozen weights (``auto``: bf16 under the
  16-bit precisions; ``fp32`` under ``bf16-mixed``: Lightning's ``bf16-mixed``, a base
  built with ``from_config`` in fp32); ``lora.adapter_dtype``: the adapters' dtype
  (``auto``: fp32 except under pure bf16; ``fp32``: PEFT's default
  ``autocast_adapter_dtype=True``);
* ``loss``: ``standard`` (HF's loss from labels: the whole logits upcast to fp32),
  ``no-upcast`` (``F.cross_entropy`` on the logits as they come: LitGPT, Lightning, plain
  loops) or ``chunked-output`` (torchtune's ``CEWithChunkedOutputLoss`` with
  ``loss_chunks`` pieces);
* ``activation_checkpointing`` ``per-op``: torchtitan's per-op selective checkpointing;
* ``moe_implementation`` (MoE models): transformers' ``grouped_mm`` experts or its eager
  per-expert loop;
* ``qlora.prepare_kbit`` (QLoRA on a bitsandbytes 4-bit base): PEFT's
  ``prepare_model_for_kbit_training`` run on the model (every unquantized weight fp32);
  ``qlora.matmul_keeps_input``: the 4-bit matmul keeps its input with the weight
  (bitsandbytes before 0.43.2);
* ``reentrant_checkpointing``: full checkpointing through torch's reentrant implementation
  (``use_reentrant=True``, the embedding output requiring a gradient) instead of the
  non-reentrant one.

Every case records both ways of holding the outputs (its own is ``peak_allocated_bytes``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from validation.cases import FAMILY, GQA, case_id, scenario

#: the built-in stacks, read as the files of ``resources/stacks``: the harness runs in an
#: environment of its own, where MemFit is not installed
STACKS = tuple(
    sorted(
        p.stem
        for p in (Path(__file__).resolve().parents[1] / "resources" / "stacks").glob("*.json")
    )
)

#: decoder families only; MQA is Falcon-7B (one K/V head)
MHA, MQA, MOE = "llama-2-7b", "falcon-7b", "mixtral-8x7b"


def conventions_case(
    model: str,
    layers: int,
    *,
    stack: str,
    held: bool,
    kv_cache: bool,
    frozen: str = "auto",
    loss: str = "standard",
    adapter: str | None = None,
    loss_chunks: int | None = None,
    moe: str | None = None,
    reentrant: bool = False,
    **kw: Any,
) -> dict[str, Any]:
    """One case: :func:`validation.cases.scenario` plus the conventions, all written out."""
    if stack not in STACKS:
        raise ValueError(f"unknown stack {stack!r}")
    method = kw.get("method", "full")
    if method in ("lora", "qlora"):
        kw["lora"] = {**kw.get("lora", {}), "adapter_dtype": adapter or "auto"}
    elif adapter is not None:
        raise ValueError("adapter_dtype is a LoRA setting")
    s = scenario(model, layers, **kw)
    t = s["training"]
    t["stack"] = stack
    t["outputs_held_through_backward"] = held
    t["kv_cache_in_outputs"] = kv_cache
    t["frozen_weights_dtype"] = frozen
    t["loss"] = loss
    if loss == "chunked-output":
        t["loss_chunks"] = loss_chunks or 8
    if reentrant:
        if t["activation_checkpointing"] != "full":
            raise ValueError("reentrant checkpointing is measured under full checkpointing")
        t["reentrant_checkpointing"] = True
    if FAMILY[model] == "mixtral":
        t["moe_implementation"] = moe or "grouped"
    elif moe is not None:
        raise ValueError("moe_implementation is a mixture-of-experts setting")
    return {"id": conventions_id(model, layers, s), "family": FAMILY[model],
            "model_name": model, "scenario": s}  # fmt: skip


def conventions_id(model: str, layers: int, s: dict[str, Any]) -> str:
    """:func:`validation.cases.case_id` plus the conventions:
    ``..._<stack>_<held|released>_<kv|nokv>[_frozen-D][_adapter-D][_loss-L][_moe-I]``."""
    t = s["training"]
    base = case_id(model, layers, s)
    if t["activation_checkpointing"] == "per-op":
        base = base.removesuffix("_ckpt") + "_ckpt-per-op"
    if t.get("reentrant_checkpointing"):
        base = base.removesuffix("_ckpt") + "_ckpt-reentrant"
    parts = [
        base,
        t["stack"],
        "held" if t["outputs_held_through_backward"] else "released",
        "kv" if t["kv_cache_in_outputs"] else "nokv",
    ]
    if t["method"] != "full":
        parts.append(f"frozen-{t['frozen_weights_dtype']}")
    if t["method"] in ("lora", "qlora"):
        parts.append(f"adapter-{t['lora']['adapter_dtype']}")
    if t["loss"] != "standard":
        chunks = f"{t['loss_chunks']}" if t["loss"] == "chunked-output" else ""
        parts.append(f"loss-{t['loss']}{chunks}")
    if "moe_implementation" in t:
        parts.append(f"moe-{t['moe_implementation']}")
    return "_".join(parts)


def _raw_cases() -> list[dict[str, Any]]:
    c: list[dict[str, Any]] = []

    def add(model: str, layers: int, **kw: Any) -> None:
        c.append(conventions_case(model, layers, **kw))

    lora = {"method": "lora"}
    # --- dense MHA (Llama-2-7B): held/released x frozen dtype x adapter dtype, cache on/off
    add(MHA, 2, stack="hf-trainer", held=False, kv_cache=True, adapter="auto", **lora,
        batch=4, seq=2048)  # fmt: skip
    add(MHA, 2, stack="accelerate-loop", held=True, kv_cache=True, adapter="fp32", **lora,
        batch=4, seq=2048)  # fmt: skip
    add(MHA, 2, stack="accelerate-loop", held=True, kv_cache=False, adapter="fp32", **lora,
        batch=4, seq=2048)  # fmt: skip
    add(MHA, 2, stack="lightning", held=False, kv_cache=True, frozen="fp32", adapter="fp32",
        **lora, batch=4, seq=2048)  # fmt: skip
    add(MHA, 2, stack="custom", held=True, kv_cache=True, frozen="fp32", adapter="bf16", **lora,
        batch=4, seq=2048)  # fmt: skip
    add(MHA, 2, stack="custom", held=False, kv_cache=False, frozen="auto", adapter="bf16",
        **lora, batch=4, seq=2048)  # fmt: skip
    add(MHA, 2, stack="custom", held=False, kv_cache=True, frozen="fp16", adapter="fp32",
        **lora, batch=4, seq=2048)  # fmt: skip
    add(MHA, 2, stack="custom", held=False, kv_cache=True, frozen="bf16", adapter="fp32",
        **lora, batch=4, seq=2048)  # fmt: skip
    # pure bf16: PEFT's default upcasts the adapters to fp32, or not
    add(MHA, 2, stack="custom", held=False, kv_cache=True, adapter="fp32", **lora,
        precision="bf16", batch=4, seq=2048)  # fmt: skip
    add(MHA, 2, stack="custom", held=True, kv_cache=True, adapter="bf16", **lora,
        precision="bf16", batch=4, seq=2048)  # fmt: skip
    add(MHA, 2, stack="hf-trainer", held=False, kv_cache=True, adapter="auto", **lora,
        precision="bf16", batch=4, seq=2048)  # fmt: skip
    # full checkpointing: HF drops the cache itself, so kv_cache true and false agree
    add(MHA, 4, stack="trl-sft", held=False, kv_cache=False, adapter="fp32", **lora,
        ckpt="full", batch=8, seq=2048)  # fmt: skip
    add(MHA, 4, stack="hf-trainer", held=False, kv_cache=True, adapter="fp32", **lora,
        ckpt="full", batch=8, seq=2048)  # fmt: skip
    add(MHA, 4, stack="lightning", held=False, kv_cache=False, frozen="fp32", adapter="fp32",
        **lora, ckpt="full", batch=8, seq=2048)  # fmt: skip
    # freeze and full
    add(MHA, 2, stack="hf-trainer", held=False, kv_cache=True, frozen="auto",
        method="freeze", freeze={"trainable": ["lm_head", "norms"]}, seq=2048)  # fmt: skip
    add(MHA, 2, stack="lightning", held=False, kv_cache=True, frozen="fp32",
        method="freeze", freeze={"trainable": ["lm_head", "norms"]}, seq=2048)  # fmt: skip
    add(MHA, 2, stack="accelerate-loop", held=True, kv_cache=True, seq=2048)
    add(MHA, 2, stack="accelerate-loop", held=True, kv_cache=False, seq=2048)
    add(MHA, 2, stack="hf-trainer", held=False, kv_cache=True, precision="bf16",
        optimizer="sgd", batch=2, seq=4096)  # fmt: skip
    # --- GQA (Llama-3-8B, 128k vocabulary)
    add("llama-3-8b", 2, stack="hf-trainer", held=False, kv_cache=True, adapter="auto", **lora,
        batch=2, seq=4096)  # fmt: skip
    add("llama-3-8b", 2, stack="accelerate-loop", held=True, kv_cache=True, frozen="fp32",
        adapter="fp32", **lora, batch=2, seq=4096)  # fmt: skip
    add("llama-3-8b", 2, stack="custom", held=True, kv_cache=False, adapter="bf16", **lora,
        precision="bf16", batch=2, seq=4096)  # fmt: skip
    # LoRA all-linear, full checkpointing, on an fp32 frozen base (Lightning bf16-mixed)
    add("llama-3-8b", 4, stack="lightning", held=False, kv_cache=False, frozen="fp32",
        adapter="fp32", method="lora", lora={"targets": ["all-linear"]}, ckpt="full",
        batch=2, seq=4096)  # fmt: skip
    add("llama-3-8b", 4, stack="hf-trainer", held=False, kv_cache=True, frozen="auto",
        adapter="fp32", method="lora", lora={"targets": ["all-linear"]}, ckpt="full",
        batch=2, seq=4096)  # fmt: skip
    add("llama-3-8b", 2, stack="lightning", held=False, kv_cache=True, frozen="fp32",
        method="freeze", freeze={"trainable": ["lm_head"]}, ckpt="full", batch=2,
        seq=4096)  # fmt: skip
    add("llama-3-8b", 2, stack="accelerate-loop", held=True, kv_cache=True, precision="bf16",
        optimizer="sgd", batch=1, seq=8192)  # fmt: skip
    # --- GQA (Mistral-7B, sliding window)
    add("mistral-7b-v0.1", 2, stack="hf-trainer", held=False, kv_cache=True, adapter="auto",
        **lora, batch=2, seq=4096)  # fmt: skip
    add("mistral-7b-v0.1", 2, stack="custom", held=True, kv_cache=False, frozen="fp32",
        adapter="bf16", **lora, batch=2, seq=4096)  # fmt: skip
    add("mistral-7b-v0.1", 2, stack="accelerate-loop", held=True, kv_cache=True,
        adapter="fp32", **lora, precision="bf16", batch=2, seq=4096)  # fmt: skip
    add("mistral-7b-v0.1", 3, stack="axolotl", held=False, kv_cache=False, adapter="fp32",
        **lora, ckpt="full", batch=4, seq=4096)  # fmt: skip
    add("mistral-7b-v0.1", 2, stack="accelerate-loop", held=True, kv_cache=True,
        frozen="auto", method="freeze", freeze={"trainable": ["attention"]}, seq=4096)  # fmt: skip
    add("mistral-7b-v0.1", 2, stack="hf-trainer", held=False, kv_cache=True, optimizer="sgd",
        ckpt="full", batch=2, seq=4096)  # fmt: skip
    # --- MQA (Falcon-7B: one K/V head, fused QKV, parallel attention)
    add(MQA, 2, stack="hf-trainer", held=False, kv_cache=True, adapter="auto", **lora,
        batch=2, seq=2048)  # fmt: skip
    add(MQA, 2, stack="accelerate-loop", held=True, kv_cache=True, frozen="fp32",
        adapter="fp32", **lora, batch=2, seq=2048)  # fmt: skip
    add(MQA, 2, stack="custom", held=True, kv_cache=False, adapter="bf16", **lora,
        precision="bf16", batch=2, seq=2048)  # fmt: skip
    add(MQA, 2, stack="trl-sft", held=False, kv_cache=False, adapter="fp32", **lora,
        ckpt="full", batch=4, seq=2048)  # fmt: skip
    add(MQA, 2, stack="lightning", held=False, kv_cache=True, frozen="fp32",
        method="freeze", freeze={"trainable": ["norms", "attention"]}, seq=2048)  # fmt: skip
    add(MQA, 2, stack="accelerate-loop", held=True, kv_cache=True, precision="bf16",
        optimizer="sgd", seq=2048)  # fmt: skip
    # --- MoE (Mixtral-8x7B shapes): grouped_mm and the eager per-expert loop
    for optimizer in ("sgd", "adamw"):
        for moe in ("grouped", "eager"):
            add(MOE, 2, stack="custom", held=False, kv_cache=True, precision="bf16",
                optimizer=optimizer, moe=moe, batch=1, seq=2048)  # fmt: skip
    add(MOE, 2, stack="hf-trainer", held=False, kv_cache=True, adapter="auto", **lora,
        moe="grouped", batch=2, seq=2048)  # fmt: skip
    add(MOE, 2, stack="hf-trainer", held=False, kv_cache=True, adapter="auto", **lora,
        moe="eager", batch=2, seq=2048)  # fmt: skip
    add(MOE, 2, stack="accelerate-loop", held=True, kv_cache=True, frozen="fp32",
        adapter="fp32", **lora, moe="grouped", batch=1, seq=2048)  # fmt: skip
    add(MOE, 2, stack="trl-sft", held=False, kv_cache=False, adapter="fp32", **lora,
        ckpt="full", moe="eager", batch=2, seq=4096)  # fmt: skip
    add(MOE, 2, stack="custom", held=True, kv_cache=False, frozen="auto", method="freeze",
        freeze={"trainable": ["router", "norms"]}, moe="eager", batch=2, seq=2048)  # fmt: skip
    add(MOE, 2, stack="custom", held=False, kv_cache=True, precision="bf16", optimizer="sgd",
        ckpt="full", moe="eager", batch=2, seq=2048)  # fmt: skip
    # --- torchtitan's per-op selective checkpointing (8B widths at 8k; 7B widths at 4k)
    titan = {"stack": "torchtitan", "held": False, "kv_cache": False}
    for precision in ("bf16", "bf16-mixed"):
        add("llama-3-8b", 2, **titan, precision=precision, ckpt="per-op", batch=1, seq=8192)
    add("llama-3-8b", 2, **titan, precision="bf16", ckpt="full", batch=1, seq=8192)
    add("llama-3-8b", 2, **titan, precision="bf16", batch=1, seq=8192)
    add(MHA, 2, **titan, precision="bf16", ckpt="per-op", batch=1, seq=4096)
    add(MHA, 2, **titan, ckpt="per-op", batch=2, seq=4096)
    # --- the loss without the upcast, and torchtune's chunked output, against HF's loss;
    # pure bf16 with bf16 adapters (Lightning's bf16-true and torchtune cast the whole model),
    # bf16-mixed with PEFT's fp32 adapters on a bf16 base
    for model, batch, seq in (("llama-3-8b", 1, 8192), ("qwen2-7b", 1, 4096)):
        for precision, adapter, stacks in (
            ("bf16", "bf16", ("custom", "lightning", "torchtune")),
            ("bf16-mixed", "fp32", ("hf-trainer", "lightning", "custom")),
        ):
            like = {"adapter": adapter, **lora, "precision": precision, "batch": batch,
                    "seq": seq}  # fmt: skip
            add(model, 2, stack=stacks[0], held=False, kv_cache=True, **like)
            add(model, 2, stack=stacks[1], held=False, kv_cache=True, loss="no-upcast", **like)
            add(model, 2, stack="custom", held=True, kv_cache=True, loss="no-upcast", **like)
            add(model, 2, stack=stacks[2], held=False, kv_cache=False, loss="chunked-output",
                **like)  # fmt: skip
            add(model, 2, stack="custom", held=True, kv_cache=False, loss="chunked-output",
                **like)  # fmt: skip
    # --- QLoRA on transformers' bitsandbytes 4-bit base (the harness's stand-in of
    # Linear4bit), with and without PEFT's prepare_model_for_kbit_training: its fp32 norms,
    # embeddings and head make the residual stream, the norms' outputs and the 4-bit
    # linears they feed fp32
    for kbit in (False, True):
        q = {"method": "qlora", "adapter": "fp32", "qlora": {"prepare_kbit": kbit}}
        add("llama-3.2-1b", 2, stack="hf-trainer", held=False, kv_cache=True,
            lora={"targets": ["all-linear"]}, **q, batch=4, seq=2048)  # fmt: skip
        add(MHA, 2, stack="hf-trainer", held=False, kv_cache=True, **q, batch=4,
            seq=2048)  # fmt: skip
        add(MHA, 2, stack="accelerate-loop", held=True, kv_cache=False,
            lora={"targets": ["all-linear"]}, **q, ckpt="full", batch=4, seq=2048)  # fmt: skip
        add("qwen2.5-0.5b", 2, stack="custom", held=False, kv_cache=True,
            lora={"targets": ["all-linear"]}, **q, batch=4, seq=2048)  # fmt: skip
    # --- the 4-bit matmul keeping its input (bitsandbytes before 0.43.2) under full
    # checkpointing, non-reentrant (the kept inputs outlive the checkpoint's hooks) and
    # reentrant (the forward runs without autograd: nothing is kept there)
    for keep, reentrant in ((True, False), (True, True), (False, True)):
        q = {"method": "qlora", "adapter": "fp32",
             "qlora": {"prepare_kbit": False, "matmul_keeps_input": keep}}  # fmt: skip
        add(MHA, 2, stack="accelerate-loop", held=True, kv_cache=False, reentrant=reentrant,
            lora={"targets": ["all-linear"]}, **q, ckpt="full", batch=4, seq=2048)  # fmt: skip
    full = {"precision": "bf16", "optimizer": "sgd", "batch": 1, "seq": 8192}
    add("llama-3-8b", 2, stack="custom", held=False, kv_cache=False, **full)
    add("llama-3-8b", 2, stack="torchtune", held=False, kv_cache=False, loss="chunked-output",
        **full)  # fmt: skip
    add("llama-3-8b", 2, stack="lightning", held=False, kv_cache=False, loss="no-upcast", **full)
    add("qwen2-7b", 2, stack="torchtune", held=False, kv_cache=False, loss="chunked-output",
        loss_chunks=16, adapter="bf16", **lora, precision="bf16", batch=2, seq=2048)  # fmt: skip
    return c


def all_cases() -> list[dict[str, Any]]:
    """Every case: ``{"id", "family", "model_name", "scenario"}``."""
    out = _raw_cases()
    seen: set[str] = set()
    for case in out:
        t = case["scenario"]["training"]
        if t["precision"] == "fp32" and t["attention"] == "sdpa" and case["model_name"] in GQA:
            raise ValueError(f"{case['id']}: fp32 + sdpa on a GQA model is out of scope")
        if case["id"] in seen:
            raise ValueError(f"duplicate case {case['id']}")
        seen.add(case["id"])
    return out


if __name__ == "__main__":
    for case in all_cases():
        print(case["id"])
    print(len(all_cases()), "cases")

"""Multi-GPU validation cases: FSDP2 and tensor parallelism, traced as one rank.

Each case is a MemFit scenario (:func:`validation.cases.scenario` with
``training.parallelism`` and ``hardware.gpus_per_node``) plus a ``setup`` that says what the
scenario cannot: how the run is parallelized in PyTorch. :mod:`validation.measure_multi`
measures them with :mod:`validation.distributed`.

* **FSDP2** (``framework="pytorch"``): ``fully_shard`` on every decoder layer, then on the
  root model; ``zero_stage`` 3 is ``reshard_after_forward=True``, 2 is ``False``. With
  ``dp_replicate`` > 1 (HSDP), on a 2-D device mesh of replicate x shard: every group of
  ranks holds one whole set of shards.
  ``bf16-mixed`` is ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` on fp32
  parameters (no autocast); ``fp32`` has no policy; ``bf16`` is a bf16 model without policy.
  The data-parallel size is the world size (``tp = 1``).
* **Tensor parallelism** with DTensor (``framework="pytorch"``: the model state is laid out
  as PyTorch keeps it, fp32 weights and gradients under autocast, not Megatron-LM's 16-bit
  weights with fp32 ``main_grad``), Megatron-style split: column-
  parallel q/k/v/gate/up, row-parallel o/down. ``tp_plan`` ``"layers"`` leaves the
  embedding and LM head whole on every rank (full logits; Hugging Face's own TP plan
  gathers the logits too); ``"vocab"`` splits both over the vocabulary (logits sharded,
  ``loss_parallel``), as Megatron-LM does; ``sequence_parallel`` adds sequence parallelism
  on the norms (``"vocab"`` only). ``bf16-mixed`` is autocast on fp32 parameters, as in the
  single-GPU cases. World size = ``tp``, ``zero_stage`` 0.

Ground rules as in :mod:`validation.cases` (no fp32 + SDPA on grouped-query models), full
training only, no activation checkpointing.
"""

from __future__ import annotations

from typing import Any

from validation.cases import FAMILY, GQA, scenario

TP_PLANS = ("layers", "vocab")


def _parallelism(
    *,
    tp: int = 1,
    zero_stage: int = 0,
    framework: str = "pytorch",
    sequence_parallel: bool = False,
    dp_replicate: int = 1,
) -> dict[str, Any]:
    replicas = {"dp_replicate": dp_replicate} if dp_replicate > 1 else {}
    return {
        **replicas,
        "tp": tp,
        "pp": 1,
        "cp": 1,
        "ep": 1,
        "zero_stage": zero_stage,
        "framework": framework,
        "hybrid_shard": False,
        "sequence_parallel": sequence_parallel,
        "vpp": 1,
        "pp_schedule": "1f1b",
    }


def fsdp_case(
    model: str,
    layers: int,
    world: int,
    *,
    reshard_after_forward: bool,
    precision: str = "bf16-mixed",
    replicate: int = 1,
    policy: tuple[str, str] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    """``policy``: the (param, reduce) dtypes of FSDP2's MixedPrecisionPolicy under
    bf16-mixed, set in the scenario too (None: bf16 and fp32, the scenario's stack's)."""
    s = scenario(model, layers, precision=precision, **kw)
    s["hardware"]["gpus_per_node"] = world
    s["training"]["parallelism"] = _parallelism(
        zero_stage=3 if reshard_after_forward else 2, dp_replicate=replicate
    )
    setup = {
        "strategy": "fsdp2",
        "reshard_after_forward": reshard_after_forward,
        "fsdp_mixed_precision": precision == "bf16-mixed",
        "wrap": "every decoder layer, then the root model",
    }
    if policy is not None:
        setup["fsdp_param_dtype"], setup["fsdp_reduce_dtype"] = policy
        p = s["training"]["parallelism"]
        p["fsdp_param_dtype"], p["fsdp_reduce_dtype"] = policy
    if replicate > 1:
        setup["mesh"] = f"2-D: {replicate} replicas x {world // replicate} shards (HSDP)"
    return _case(model, layers, s, setup)


def tp_case(
    model: str,
    layers: int,
    tp: int,
    *,
    plan: str = "layers",
    sequence_parallel: bool = False,
    precision: str = "bf16-mixed",
    **kw: Any,
) -> dict[str, Any]:
    if plan not in TP_PLANS:
        raise ValueError(f"tp plan {plan!r}")
    s = scenario(model, layers, precision=precision, **kw)
    s["hardware"]["gpus_per_node"] = tp
    s["training"]["parallelism"] = _parallelism(
        tp=tp, framework="pytorch", sequence_parallel=sequence_parallel
    )
    setup = {
        "strategy": "tp",
        "tp_plan": plan,
        "tp_vocab_parallel": plan == "vocab",
    }
    return _case(model, layers, s, setup)


def _case(model: str, layers: int, s: dict[str, Any], setup: dict[str, Any]) -> dict[str, Any]:
    t, p = s["training"], s["training"]["parallelism"]
    if t["precision"] == "fp32" and t["attention"] == "sdpa" and model in GQA:
        raise ValueError(f"{model}: fp32 + sdpa on a GQA model is out of scope")
    opt = t["optimizer"] + ("-" + t["optimizer_impl"] if t["optimizer"] == "adamw" else "")
    if setup["strategy"] == "fsdp2":
        par = f"fsdp2-z{p['zero_stage']}-w{s['hardware']['gpus_per_node']}"
        par += f"-r{p['dp_replicate']}" if p.get("dp_replicate", 1) > 1 else ""
        if "fsdp_param_dtype" in setup:
            par += f"-mp-{setup['fsdp_param_dtype']}-{setup['fsdp_reduce_dtype']}"
    else:
        par = f"tp{p['tp']}-{setup['tp_plan']}" + ("-sp" if p["sequence_parallel"] else "")
    cid = "_".join(
        [
            model,
            f"L{layers}",
            par,
            t["precision"],
            opt,
            t["attention"],
            f"b{t['micro_batch_size']}",
            f"s{t['sequence_length']}",
        ]
    )
    return {
        "id": cid,
        "family": FAMILY[model],
        "model_name": model,
        "scenario": s,
        "setup": setup,
    }


def all_cases() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    # --- FSDP2: world 2/4/8 x ZeRO-3/ZeRO-2
    for world in (2, 4, 8):
        for raf in (True, False):
            # Llama-3.2-1B (tied 128k embedding: a large root unit), MixedPrecisionPolicy
            out.append(fsdp_case("llama-3.2-1b", 4, world, reshard_after_forward=raf,
                                 batch=2, seq=1024))  # fmt: skip
            # Llama-2-7B widths, MixedPrecisionPolicy, fused AdamW
            out.append(fsdp_case("llama-2-7b", 2, world, reshard_after_forward=raf,
                                 impl="fused", batch=1, seq=2048))  # fmt: skip
            # Llama-2-7B widths in fp32, no policy
            out.append(fsdp_case("llama-2-7b", 2, world, reshard_after_forward=raf,
                                 precision="fp32", batch=1, seq=1024))  # fmt: skip
    # HSDP: FSDP2 on a 2-D mesh, 2 or 4 groups of ranks each holding a whole set of shards
    for world, replicate in ((4, 2), (8, 2), (8, 4)):
        for raf in (True, False):
            out.append(fsdp_case("llama-3.2-1b", 4, world, reshard_after_forward=raf,
                                 replicate=replicate, batch=2, seq=1024))  # fmt: skip
            out.append(fsdp_case("llama-2-7b", 2, world, reshard_after_forward=raf,
                                 replicate=replicate, impl="fused", batch=1, seq=2048))  # fmt: skip
    # the other mixed-precision policies: a 16-bit reduce (accelerate's), fp32 gathered
    # under autocast with a 16-bit reduce (Lightning's bf16-mixed)
    for policy in (("compute", "compute"), ("fp32", "compute")):
        for raf in (True, False):
            out.append(fsdp_case("llama-3.2-1b", 4, 4, reshard_after_forward=raf,
                                 policy=policy, batch=2, seq=1024))  # fmt: skip
            out.append(fsdp_case("llama-2-7b", 2, 4, reshard_after_forward=raf, policy=policy,
                                 impl="fused", batch=1, seq=2048))  # fmt: skip
    # pure bf16 model without a policy
    out.append(fsdp_case("llama-3.2-1b", 4, 4, reshard_after_forward=True, precision="bf16",
                         batch=2, seq=1024))  # fmt: skip
    # --- tensor parallelism: tp 2/4, plans
    for tp in (2, 4):
        for plan, sp in (("layers", False), ("vocab", False), ("vocab", True)):
            out.append(tp_case("llama-2-7b", 2, tp, plan=plan, sequence_parallel=sp,
                               batch=1, seq=2048))  # fmt: skip
        for plan, sp in (("layers", False), ("vocab", True)):
            out.append(tp_case("llama-3.2-1b", 4, tp, plan=plan, sequence_parallel=sp,
                               precision="bf16", impl="fused", batch=2, seq=1024))  # fmt: skip
    out.append(tp_case("llama-2-7b", 2, 2, plan="vocab", precision="fp32", batch=1, seq=512))
    ids = [c["id"] for c in out]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate case ids")
    return out


if __name__ == "__main__":
    for case in all_cases():
        print(case["id"])
    print(len(all_cases()), "cases")

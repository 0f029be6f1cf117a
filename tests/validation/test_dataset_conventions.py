"""The conventions dataset (``dataset_conventions.json``, written by ``python -m
validation.measure_conventions``): its schema, its coverage, relations its numbers must keep,
and that every scenario is one MemFit reads. Needs no PyTorch; where PyTorch is installed,
two cases are measured again and the harness's eager experts loop is checked against
transformers' own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from memfit.engine.scenario_io import scenario_from_dict

DATASET = Path(__file__).with_name("dataset_conventions.json")
ROOT = Path(__file__).resolve().parents[2]

STACKS = {
    "hf-trainer", "trl-sft", "accelerate-loop", "lightning", "torchtune", "axolotl",
    "torchtitan", "deepspeed", "megatron", "custom",
}  # fmt: skip
FAMILIES = {"llama", "mistral", "qwen2", "falcon", "mixtral"}
PRECISIONS = {"bf16-mixed", "bf16"}
METHODS = {"full", "lora", "qlora", "freeze"}
FROZEN = {"auto", "fp32", "bf16", "fp16"}
ADAPTER = {"auto", "fp32", "bf16"}
LOSSES = {"standard", "no-upcast", "chunked-output"}
CHECKPOINTING = {"none", "full", "per-op"}
MOE = {"grouped", "eager"}
PHASES = {"forward", "backward", "optimizer"}
DETAIL_PHASES = {"forward", "loss", "backward", "optimizer"}
CATEGORIES = {"parameters", "gradients", "optimizer_states", "other"}
GRANULARITY = 512
#: the fields every case writes out, whatever their defaults
REQUIRED = ("stack", "outputs_held_through_backward", "kv_cache_in_outputs",
            "frozen_weights_dtype", "loss")  # fmt: skip

#: re-measured by the torch test: two quick cases (a chunked loss; eager experts)
REMEASURED = (
    "qwen2-7b_L2_bf16_lora_r16-q_proj+v_proj_adamw-foreach_sdpa_b2_s2048_torchtune_released_"
    "nokv_frozen-auto_adapter-bf16_loss-chunked-output16",
    "mixtral-8x7b_L2_bf16_full_sgd_sdpa_b1_s2048_custom_released_kv_moe-eager",
)


@cache
def _load() -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads(DATASET.read_text(encoding="utf-8"))
    return data


def _by_id() -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in _load()}


def _training(case: dict[str, Any]) -> dict[str, Any]:
    t: dict[str, Any] = case["scenario"]["training"]
    return t


def test_at_least_fifty_cases_with_unique_ids() -> None:
    ids = [c["id"] for c in _load()]
    assert len(ids) >= 50
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("case", _load(), ids=lambda c: c["id"])
def test_case_schema(case: dict[str, Any]) -> None:
    assert set(case) >= {"id", "family", "scenario", "measured", "env"}
    assert case["family"] in FAMILIES
    s = case["scenario"]
    assert s["memfit_scenario"] == 1
    assert s["hardware"] == {"gpu": "h100-sxm-80gb"}
    t = s["training"]
    for key in REQUIRED:
        assert key in t, key
    assert t["stack"] in STACKS
    assert isinstance(t["outputs_held_through_backward"], bool)
    assert isinstance(t["kv_cache_in_outputs"], bool)
    assert t["frozen_weights_dtype"] in FROZEN
    assert t["loss"] in LOSSES
    assert t["precision"] in PRECISIONS
    assert t["method"] in METHODS
    assert t["activation_checkpointing"] in CHECKPOINTING
    if t["method"] in ("lora", "qlora"):
        assert t["lora"]["adapter_dtype"] in ADAPTER
    if t["method"] == "qlora":  # the harness's 4-bit stand-in: bf16 base, no double quant
        assert t["qlora"]["double_quant"] is False and t["qlora"]["compute_dtype"] == "bf16"
        assert isinstance(t["qlora"]["prepare_kbit"], bool)
        assert t["precision"] == "bf16-mixed" and t["frozen_weights_dtype"] == "auto"
    if t["loss"] == "chunked-output":
        assert isinstance(t["loss_chunks"], int) and t["loss_chunks"] >= 1
    else:
        assert "loss_chunks" not in t
    if case["family"] == "mixtral":
        assert t["moe_implementation"] in MOE
    else:
        assert "moe_implementation" not in t
    assert 128 <= t["sequence_length"] <= 8192

    m = case["measured"]
    for key in ("peak_allocated_bytes", "peak_allocated_raw_bytes", "first_step_peak_bytes",
                "before_step_bytes", "logits_bytes"):  # fmt: skip
        assert isinstance(m[key], int) and m[key] > 0, key
    assert m["peak_allocated_bytes"] % GRANULARITY == 0
    assert m["peak_allocated_raw_bytes"] <= m["peak_allocated_bytes"]
    assert m["before_step_bytes"] <= m["peak_allocated_bytes"]
    assert m["after_step_bytes"] == m["before_step_bytes"]  # the step ends where it began
    assert m["peak_phase"] in PHASES
    assert set(m["phase_peaks"]) == DETAIL_PHASES
    assert max(m["phase_peaks"].values()) == m["peak_allocated_bytes"]
    assert set(m["breakdown_at_peak"]) == CATEGORIES
    assert sum(m["breakdown_at_peak"].values()) == m["peak_allocated_bytes"]
    assert m["breakdown_at_peak"]["parameters"] >= m["param_bytes"]  # rounded per tensor

    # both ways of holding the output; the reported step is the case's own
    held = m["outputs_held_through_backward"]
    released = m["outputs_released_before_backward"]
    for variant in (held, released):
        assert set(variant) == {"peak_allocated_bytes", "peak_phase", "phase_peaks"}
        assert variant["peak_phase"] in PHASES
        assert max(variant["phase_peaks"].values()) == variant["peak_allocated_bytes"]
    own = held if t["outputs_held_through_backward"] else released
    assert own["peak_allocated_bytes"] == m["peak_allocated_bytes"]
    assert own["phase_peaks"] == m["phase_peaks"]
    assert released["peak_allocated_bytes"] <= held["peak_allocated_bytes"]
    # what the loop releases early can only lower the phases from the loss on
    assert released["phase_peaks"]["forward"] == held["phase_peaks"]["forward"]

    if t["activation_checkpointing"] == "per-op":
        ops = m["per_op_policy"]["ops_per_layer_call"]
        assert ops["aten.mm.default"] == {"save": 4, "recompute": 3}  # q, v, gate, down saved
        attention = [op for op in ops if "scaled_dot_product" in op]
        assert attention and all(ops[op] == {"save": 1, "recompute": 0} for op in attention)
        assert "aten.addmm.default" not in ops and "aten.linear.default" not in ops

    env = case["env"]
    assert env["mode"] == "fake-cuda"
    assert all(isinstance(env[k], str) and env[k] for k in ("torch", "transformers", "peft"))


def test_every_convention_value_is_covered() -> None:
    seen: dict[str, set[Any]] = {}

    def add(key: str, value: Any) -> None:
        seen.setdefault(key, set()).add(value)

    for c in _load():
        t = _training(c)
        add("family", c["family"])
        add("precision", t["precision"])
        add("method", t["method"])
        add("held", t["outputs_held_through_backward"])
        add("kv", t["kv_cache_in_outputs"])
        add("frozen", t["frozen_weights_dtype"])
        add("loss", t["loss"])
        add("ckpt", t["activation_checkpointing"])
        if t["method"] == "lora":
            add("adapter", t["lora"]["adapter_dtype"])
        if "moe_implementation" in t:
            add("moe", t["moe_implementation"])
        add("stack", t["stack"])
    assert seen["family"] >= FAMILIES
    assert seen["precision"] >= PRECISIONS
    assert seen["method"] >= METHODS
    assert seen["held"] == {True, False}
    assert seen["kv"] == {True, False}
    assert seen["frozen"] >= FROZEN
    assert seen["adapter"] >= ADAPTER
    assert seen["loss"] >= LOSSES
    assert seen["ckpt"] >= CHECKPOINTING
    assert seen["moe"] >= MOE
    assert len(seen["stack"]) >= 6


def _has(**want: Any) -> list[dict[str, Any]]:
    """Cases whose model name / training fields have the given values (a set: any of them)."""
    out = []
    for c in _load():
        t = _training(c)
        values = {**t, "model": c["scenario"]["model"]["_name_or_path"],
                  "adapter": t.get("lora", {}).get("adapter_dtype"),
                  "targets": tuple(t.get("lora", {}).get("targets", ()))}  # fmt: skip
        if all(values[k] in v if isinstance(v, set) else values[k] == v for k, v in want.items()):
            out.append(c)
    return out


def test_the_required_classes_are_present() -> None:
    attention = {"llama-2-7b": "MHA", "llama-3-8b": "GQA", "mistral-7b-v0.1": "GQA",
                 "falcon-7b": "MQA", "mixtral-8x7b": "MoE"}  # fmt: skip
    for model in attention:
        for held in (True, False):
            assert _has(model=model, outputs_held_through_backward=held), (model, held)
        for ckpt in ("none", "full"):
            assert _has(model=model, activation_checkpointing=ckpt), (model, ckpt)
        for kv in (True, False):
            assert _has(model=model, kv_cache_in_outputs=kv), (model, kv)
        for method in ("lora", "freeze", "full"):
            assert _has(model=model, method=method), (model, method)
        assert _has(model=model, frozen_weights_dtype="fp32")
        assert _has(model=model, precision="bf16")
    # LoRA all-linear, full checkpointing, fp32 frozen base and fp32 adapters, bf16-mixed
    assert _has(targets=("all-linear",), activation_checkpointing="full",
                frozen_weights_dtype="fp32", adapter="fp32", precision="bf16-mixed")  # fmt: skip
    # Mixtral in pure bf16: SGD and AdamW, grouped and eager experts
    for optimizer in ("sgd", "adamw"):
        for moe in ("grouped", "eager"):
            assert _has(model="mixtral-8x7b", precision="bf16", method="full",
                        optimizer=optimizer, moe_implementation=moe), (optimizer, moe)  # fmt: skip
    # torchtitan's per-op checkpointing: 8B at 8k in bf16 and bf16-mixed, 7B at 4k
    for precision in ("bf16", "bf16-mixed"):
        assert _has(model="llama-3-8b", activation_checkpointing="per-op", sequence_length=8192,
                    precision=precision), precision  # fmt: skip
    assert _has(model="llama-2-7b", activation_checkpointing="per-op", sequence_length=4096)
    # the two losses on a 128k and a 152k vocabulary, both precisions, held and released
    for model in ("llama-3-8b", "qwen2-7b"):
        for loss in ("no-upcast", "chunked-output"):
            for precision in ("bf16", "bf16-mixed"):
                for held in (True, False):
                    found = _has(model=model, loss=loss, precision=precision,
                                 outputs_held_through_backward=held)  # fmt: skip
                    assert found, (model, loss, precision, held)


def _pairs(field: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Pairs of cases whose scenarios differ in ``field`` (and the stack label) only."""

    def key(c: dict[str, Any]) -> str:
        s = json.loads(json.dumps(c["scenario"]))
        t = s["training"]
        t.pop("stack")
        for name in (field, "outputs_held_through_backward"):
            t.pop(name, None)
            t.get("lora", {}).pop(name, None)
        return json.dumps(s, sort_keys=True)

    def value(c: dict[str, Any]) -> Any:
        t = _training(c)
        return t[field] if field in t else t.get("lora", {}).get(field)

    groups: dict[str, list[dict[str, Any]]] = {}
    for c in _load():
        groups.setdefault(key(c), []).append(c)
    return [
        (a, b)
        for g in groups.values()
        for i, a in enumerate(g)
        for b in g[i + 1 :]
        if value(a) != value(b)
    ]


def _peak(case: dict[str, Any], held: bool) -> int:
    m = case["measured"]
    v = m["outputs_held_through_backward" if held else "outputs_released_before_backward"]
    return int(v["peak_allocated_bytes"])


def test_an_fp32_frozen_base_costs_more_than_a_bf16_one() -> None:
    pairs = _pairs("frozen_weights_dtype")
    assert len(pairs) >= 3
    for a, b in pairs:
        da, db = (_training(c)["frozen_weights_dtype"] for c in (a, b))
        if {da, db} == {"auto", "bf16"}:  # auto is bf16 under the 16-bit precisions
            assert _peak(a, False) == _peak(b, False), (a["id"], b["id"])
        elif "fp32" in (da, db) and {da, db} <= {"auto", "bf16", "fp32"}:
            fp32, bf16 = (a, b) if da == "fp32" else (b, a)
            assert _peak(fp32, False) > _peak(bf16, False), fp32["id"]


def test_the_cache_is_gone_under_checkpointing_and_costs_memory_without() -> None:
    """Under checkpointing HF builds no cache: both agree to the byte. Without, a loop that
    holds its output keeps the cache's copies of every layer's keys and values into the
    optimizer step (before that they mostly stand in for what attention saved anyway)."""
    pairs = _pairs("kv_cache_in_outputs")
    assert len(pairs) >= 3
    for a, b in pairs:
        kv, nokv = (a, b) if _training(a)["kv_cache_in_outputs"] else (b, a)
        if _training(a)["activation_checkpointing"] != "none":  # HF turns the cache off
            assert a["measured"]["phase_peaks"] == b["measured"]["phase_peaks"]
            continue
        held = [c["measured"]["outputs_held_through_backward"] for c in (kv, nokv)]
        assert held[0]["peak_allocated_bytes"] >= held[1]["peak_allocated_bytes"], kv["id"]
        assert held[0]["phase_peaks"]["optimizer"] > held[1]["phase_peaks"]["optimizer"]


def test_released_outputs_save_at_least_the_logits_after_the_forward() -> None:
    """Holding the output keeps the logits (and the cache) alive into the optimizer step."""
    for c in _load():
        t, m = _training(c), c["measured"]
        held, released = (m[k]["phase_peaks"]["optimizer"] for k in (
            "outputs_held_through_backward", "outputs_released_before_backward"))  # fmt: skip
        if t["loss"] != "chunked-output":
            assert held - released >= m["logits_bytes"], c["id"]


def test_per_op_checkpointing_lies_between_none_and_full() -> None:
    base = {
        "model": "llama-3-8b",
        "precision": "bf16",
        "sequence_length": 8192,
        "stack": "torchtitan",
    }
    peaks = {ck: _has(**base, activation_checkpointing=ck) for ck in CHECKPOINTING}
    assert all(len(v) == 1 for v in peaks.values())
    none, full, per_op = (peaks[k][0]["measured"]["phase_peaks"]["backward"]
                          for k in ("none", "full", "per-op"))  # fmt: skip
    assert full < per_op < none


def test_a_4_bit_matmul_keeping_its_input_costs_only_under_non_reentrant_checkpoints() -> None:
    """bitsandbytes' 4-bit matmul before 0.43.2 keeps its input on its ctx: non-reentrant
    checkpointing cannot drop it, reentrant checkpointing keeps nothing of the forward."""
    peaks: dict[tuple[bool, bool], int] = {}
    for case in _load():
        t = _training(case)
        if t["method"] == "qlora" and t["activation_checkpointing"] == "full":
            keeps = bool(t["qlora"].get("matmul_keeps_input"))
            reentrant = bool(t.get("reentrant_checkpointing"))
            if keeps or reentrant:
                peaks[keeps, reentrant] = case["measured"]["peak_allocated_bytes"]
    assert set(peaks) == {(True, False), (True, True), (False, True)}
    assert peaks[True, True] == peaks[False, True] < peaks[True, False]


def test_the_eager_experts_loop_peaks_higher_in_backward() -> None:
    pairs = _pairs("moe_implementation")
    assert len(pairs) >= 3
    for a, b in pairs:
        eager, grouped = (a, b) if _training(a)["moe_implementation"] == "eager" else (b, a)
        e, g = (c["measured"]["phase_peaks"]["backward"] for c in (eager, grouped))
        assert e > g, eager["id"]


def test_the_loss_variants_never_cost_more_than_hf_loss() -> None:
    pairs = _pairs("loss")
    assert len(pairs) >= 6
    for a, b in pairs:
        la, lb = _training(a)["loss"], _training(b)["loss"]
        if "standard" in (la, lb):
            standard, other = (a, b) if la == "standard" else (b, a)
            for held in (True, False):
                assert _peak(other, held) <= _peak(standard, held), other["id"]


@pytest.mark.parametrize("case", _load(), ids=lambda c: c["id"])
def test_scenario_loads_in_the_engine(case: dict[str, Any]) -> None:
    from tests.validation.test_engine_vs_dataset import REFUSED

    if case["id"] in REFUSED:
        pytest.skip("refused by the engine, naming its field (test_engine_vs_dataset.py)")
    scenario = scenario_from_dict(case["scenario"])
    t = _training(case)
    assert scenario.training.micro_batch_size == t["micro_batch_size"]
    assert scenario.training.sequence_length == t["sequence_length"]
    assert scenario.model.num_layers <= 4


def test_dataset_matches_the_case_list() -> None:
    """The checked-in measurements are those of ``validation/cases_conventions.py`` now."""
    cases = pytest.importorskip("validation.cases_conventions")
    listed = {c["id"]: c["scenario"] for c in cases.all_cases()}
    measured = {c["id"]: c["scenario"] for c in _load()}
    assert set(listed) == set(measured)
    for cid, scenario in listed.items():
        assert measured[cid] == json.loads(json.dumps(scenario)), cid


def _run_with_torch(code: str) -> Any:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler")
def test_remeasuring_reproduces_the_stored_figures() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    fresh = _run_with_torch(
        f"""
        import json
        from validation.cases_conventions import all_cases
        from validation.measure_conventions import measure_case
        cases = {{c["id"]: c for c in all_cases()}}
        print(json.dumps([measure_case(cases[i])["measured"] for i in {list(REMEASURED)!r}]))
        """
    )
    stored = [_by_id()[cid]["measured"] for cid in REMEASURED]
    assert len(fresh) == len(stored)
    for new, old in zip(fresh, stored, strict=True):
        for key in ("peak_allocated_bytes", "peak_allocated_raw_bytes", "phase_peaks",
                    "breakdown_at_peak", "outputs_held_through_backward",
                    "outputs_released_before_backward"):  # fmt: skip
            assert new[key] == old[key], key


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler")
def test_the_eager_experts_loop_allocates_what_transformers_loop_does() -> None:
    """On real CPU tensors routed evenly (token t's k-th choice is expert (t*k + j) % E), the
    harness's loop (:func:`validation.step._eager_experts`) allocates and frees exactly what
    transformers' ``MixtralExperts`` eager loop does, forward and backward."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    result = _run_with_torch(
        """
        import json
        from validation import fakecuda  # noqa: F401
        import torch
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralExperts
        from validation.step import _eager_experts
        from validation.tracker import StorageTracker

        def trace(forward, tokens, k, experts, dtype):
            cfg = MixtralConfig(hidden_size=32, intermediate_size=64,
                                num_local_experts=experts, num_experts_per_tok=k)
            cfg._experts_implementation = "eager"
            module = MixtralExperts(cfg).to(dtype)
            x = torch.randn(tokens, 32, dtype=dtype, requires_grad=True)
            index = (torch.arange(tokens * k) % experts).view(tokens, k)
            weights = torch.rand(tokens, k, dtype=dtype, requires_grad=True)
            tracker = StorageTracker(device_type="cpu")
            tracker.adopt([x, index, weights, *module.parameters()])
            with tracker:
                tracker.set_phase("forward")
                out = forward(module, x, index, weights)
                after_forward = tracker.raw
                tracker.set_phase("backward")
                out.sum().backward()
                del out
            peaks = {p: v.raw for p, v in tracker.phase_peaks.items()}
            return [peaks, after_forward, tracker.raw, tracker.peak.rounded]

        rows = []
        for tokens, k, experts, dtype in ((48, 2, 4, torch.float32), (45, 2, 4, torch.float32),
                                          (1000, 2, 8, torch.bfloat16)):
            rows.append([trace(MixtralExperts.forward, tokens, k, experts, dtype),
                         trace(_eager_experts, tokens, k, experts, dtype)])
        print(json.dumps(rows))
        """
    )
    for hf, harness in result:
        assert hf == harness

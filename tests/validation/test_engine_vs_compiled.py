"""MemFit against what ``torch.compile`` keeps for backward, traced.

``dataset_compiled.json`` (``validation/measure_compiled.py``): each case's decoder layer
compiled alone (as torchtune and torchtitan compile them) and its final norm, LM head and
loss compiled as one region (as a whole-model compile runs them), on the CPU with PyTorch's
defaults; every storage autograd saves is counted (parameters and the shared rotary tables
left out). The same layer and head run eager are recorded beside them.

The engine's compiled block (:func:`memfit.engine.inductor.partition`) keeps the tensors
AOTAutograd's min-cut partitioner keeps: before it was modelled, a compiled step was costed
as eager, 30 % over on a Llama layer and twice the head.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from memfit.engine.graph import Block
from memfit.engine.scenario_io import scenario_from_dict
from memfit.engine.timeline.context import _build, make_ctx
from tests.validation.traced import as_traced

CASES = json.loads((Path(__file__).parent / "dataset_compiled.json").read_text())
KINDS = (("dense", "layer_saved_bytes"), ("head", "head_saved_bytes"))


def saved_bytes(block: Block) -> int:
    """Bytes of the distinct tensors the block's ops save for backward (and custom
    functions keep): what a pack hook of ``saved_tensors_hooks`` counts, a view as the storage
    it shares."""
    saved = {block.views.get(t, t) for op in block.ops for t in op.saves}
    saved |= block.kept_by_functions
    return sum(int(block.sizes[t]) for t in saved)


def engine_saved(case: dict, compiled: bool, kind: str) -> int:
    s = scenario_from_dict(as_traced(case["scenario"]))
    training = dataclasses.replace(s.training, torch_compile=compiled)
    # the first layer's input needs a gradient where the embedding trains
    x_grad = kind == "head" or training.method == "full"
    block, _ = _build(s.model, make_ctx(s.model, training), kind, x_grad, False)
    return saved_bytes(block)


def test_the_cases_cover_families_precisions_and_lora() -> None:
    scenarios = [scenario_from_dict(c["scenario"]) for c in CASES]
    assert all(s.training.torch_compile for s in scenarios)
    assert {s.training.precision for s in scenarios} == {"bf16", "bf16-mixed", "fp32"}
    assert {s.model.norm for s in scenarios} >= {"rmsnorm", "layernorm"}
    assert {s.training.method for s in scenarios} == {"full", "lora"}


#: the CPU's autocast casts other ops than CUDA's (the engine's): eager steps under it are
#: compared compiled only, where every cast is the graph's own
CPU_AUTOCAST = {c["id"] for c in CASES if c["scenario"]["training"]["precision"] == "bf16-mixed"}


def _cases(leave_out: set[str]) -> list:
    return [pytest.param(c, id=c["id"]) for c in CASES if c["id"] not in leave_out]


@pytest.mark.parametrize("case", _cases(set()))
@pytest.mark.parametrize(("kind", "key"), KINDS, ids=["layer", "head"])
def test_compiled_block_keeps_what_the_partitioner_keeps(case: dict, kind: str, key: str) -> None:
    traced = case["measured"]["compiled"][key]
    assert engine_saved(case, True, kind) == pytest.approx(traced, rel=0.01)


@pytest.mark.parametrize("case", _cases(CPU_AUTOCAST))
@pytest.mark.parametrize(("kind", "key"), KINDS, ids=["layer", "head"])
def test_eager_block_keeps_what_autograd_keeps(case: dict, kind: str, key: str) -> None:
    """The harness counts what the engine's eager blocks were validated on."""
    traced = case["measured"]["eager"][key]
    assert engine_saved(case, False, kind) == pytest.approx(traced, rel=0.01)


@pytest.mark.parametrize("case", _cases(CPU_AUTOCAST))
@pytest.mark.parametrize(("kind", "key"), KINDS, ids=["layer", "head"])
def test_what_compiling_saves(case: dict, kind: str, key: str) -> None:
    """The bytes compiling saves against eager, within 1 % of the eager bytes."""
    m = case["measured"]
    traced = m["eager"][key] - m["compiled"][key]
    saved = engine_saved(case, False, kind) - engine_saved(case, True, kind)
    assert saved == pytest.approx(traced, abs=0.01 * m["eager"][key])


def test_compiling_keeps_less_than_eager_in_every_case() -> None:
    """The traces' own finding, which the engine must reproduce: the partitioner keeps
    less than eager autograd does, on every layer and head traced."""
    for case in CASES:
        for kind, key in KINDS:
            m = case["measured"]
            assert m["compiled"][key] < m["eager"][key]
            assert engine_saved(case, True, kind) < engine_saved(case, False, kind)

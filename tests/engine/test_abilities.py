"""Stack abilities: what each training stack can run, as data, and plans that stay inside it.

The map's fastest 70B layout on 64 H100s was offered on the Hugging Face Trainer with
pipeline stages the Trainer cannot build; what-ifs and make-it-fit offered selective
checkpointing it has no policy for.
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import pytest

from memfit.engine import sweep
from memfit.engine.abilities import ABILITIES, BY_KEY, parse, refused
from memfit.engine.changes import BY_ID, CHANGES
from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.solve import make_it_fit
from memfit.engine.specs import (
    STACKS,
    HardwareSpec,
    OffloadSpec,
    ParallelismSpec,
    Scenario,
    TrainingSpec,
)
from memfit.engine.stacks import load_stack, new_refusal, refusals, stacks_that_can
from memfit.engine.whatif import WHATIFS, assess

ROOT = Path(__file__).resolve().parents[2]


def cluster(stack: str = "hf-trainer", **training: Any) -> Scenario:
    """Llama 3 70B, full fine-tuning at 8k on 64 H100s (8 nodes)."""
    return Scenario(
        load_model("llama-3-70b"),
        HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8, nodes=8),
        TrainingSpec(method="full", sequence_length=8192, stack=stack, **training),
    )


@pytest.mark.parametrize("name", STACKS)
def test_every_stack_states_its_abilities_each_with_its_source(name: str) -> None:
    stack = load_stack(name)
    data = json.loads((ROOT / "resources" / "stacks" / f"{name}.json").read_text())
    assert set(stack.abilities) == set(data.get("abilities", {}))
    for key, allowed in stack.abilities.items():
        assert key in BY_KEY
        assert allowed is False or isinstance(allowed, tuple)
        assert len(stack.abilities_why[key]) > 30, (name, key)  # a reason, with its source
    if name != "custom":  # a loop of one's own can run anything PyTorch can
        assert stack.abilities


def test_no_trainer_runs_pipeline_stages_and_torchtitan_and_megatron_do() -> None:
    piped = cluster(parallelism=ParallelismSpec(pp=4, zero_stage=3))
    for name in ("hf-trainer", "trl-sft", "accelerate-loop", "axolotl", "lightning", "torchtune"):
        s = dataclasses.replace(piped, training=dataclasses.replace(piped.training, stack=name))
        assert "pp" in {r.ability for r in refusals(s)}, name
    titan = dataclasses.replace(
        piped, training=dataclasses.replace(piped.training, stack="torchtitan")
    )
    assert refusals(titan) == ()
    megatron = cluster(
        "megatron", parallelism=ParallelismSpec(pp=4, zero_stage=1, framework="megatron")
    )
    assert refusals(megatron) == ()
    assert "torchtitan" in stacks_that_can(piped)
    assert "hf-trainer" not in stacks_that_can(piped)


def test_an_estimate_says_what_its_stack_cannot_run() -> None:
    est = estimate(cluster(parallelism=ParallelismSpec(pp=4, zero_stage=1)))
    assert any(w.startswith("Hugging Face Trainer cannot run pipeline parallelism (pp 4)")
               for w in est.warnings)  # fmt: skip
    assert not any("cannot run" in w for w in estimate(cluster()).warnings)


def test_changes_stay_inside_the_stack() -> None:
    s = cluster()
    reason = BY_ID["pp-x2"].why_not(s)
    assert reason is not None and reason.startswith("Hugging Face Trainer cannot run pipeline")
    assert BY_ID["selective-checkpointing"].why_not(s) is not None
    assert BY_ID["tp-x2"].why_not(s) is None  # accelerate's ParallelismConfig has tp
    titan = cluster("torchtitan")
    assert BY_ID["pp-x2"].why_not(titan) is None
    assert "cannot run" in (BY_ID["8bit-optimizer"].why_not(titan) or "")  # AdamW only
    assert "cannot run" in (BY_ID["lora"].why_not(titan) or "")  # no adapters


def test_what_the_user_set_up_already_does_not_stop_other_changes() -> None:
    """A scenario the stack cannot run (pp on the Trainer, set by the user) still takes a
    change that adds nothing new beyond the stack."""
    s = cluster(parallelism=ParallelismSpec(pp=4, zero_stage=1))
    assert refusals(s)
    assert BY_ID["checkpointing"].why_not(s) is None
    assert new_refusal(s, BY_ID["checkpointing"].apply(s)) is None
    # a wider pipeline is the same refusal the user made: theirs to keep
    assert BY_ID["pp-x2"].why_not(s) is None


def test_what_ifs_and_make_it_fit_offer_only_what_the_stack_runs() -> None:
    s = cluster()
    current = estimate(s)
    for whatif in WHATIFS:
        result = assess(s, current, whatif.key)
        if not isinstance(result, str):
            assert not refusals(result.scenario), whatif.key
    for fix in make_it_fit(s, top=20):
        assert not refusals(fix.scenario), fix.changes


def test_the_sweep_leaves_out_and_names_what_the_stack_cannot_run() -> None:
    """The map's fastest layout for 70B on 64 H100s had pp 4 on the Trainer."""
    trainer, titan = cluster(), cluster("torchtitan")
    left: list[Scenario] = []
    points = sweep.sweep(trainer, beyond=left)
    assert points and all(not refusals(p.scenario) for p in points)
    assert all(p.scenario.training.parallelism.pp == 1 for p in points)
    assert all(p.scenario.training.activation_checkpointing != "selective" for p in points)
    beyond = sweep.beyond_stack(trainer, None, left)
    assert beyond.strategies == len(left) > 0
    assert "pipeline parallelism" in beyond.needs
    assert "torchtitan" in beyond.stacks
    assert beyond.sentence().startswith(f"{len(left):,} strategies left out: Hugging Face")
    assert beyond == sweep.beyond_stack(trainer)  # found alone, the same
    titan_points = sweep.sweep(titan)
    assert any(p.scenario.training.parallelism.pp > 1 for p in titan_points)
    assert all(not refusals(p.scenario) for p in titan_points)


@pytest.mark.parametrize(
    ("abilities", "why", "field"),
    [
        ({"warp": False}, {"warp": "no"}, "abilities.warp"),
        ({"pp": [2]}, {"pp": "no"}, "abilities.pp"),
        ({"zero_stage": [4]}, {"zero_stage": "no"}, "abilities.zero_stage"),
        ({"precision": "bf16"}, {"precision": "x"}, "abilities.precision"),
        ({"pp": False}, {}, "abilities_why.pp"),
    ],
)
def test_a_stack_file_s_abilities_are_checked(
    abilities: dict[str, Any], why: dict[str, str], field: str
) -> None:
    with pytest.raises(EstimateError) as info:
        parse("stacks/mine.json", abilities, why)
    assert info.value.field == f"stacks/mine.json: {field}"


def test_each_ability_reads_a_training_and_names_it() -> None:
    t = TrainingSpec(
        method="lora",
        offload=OffloadSpec(activations="cpu"),
        activation_checkpointing="full",
        parallelism=ParallelismSpec(tp=2, zero_stage=3),
    )
    limits = {a.key: False for a in ABILITIES}
    words = {r.ability: r.words for r in refused(limits, dict.fromkeys(limits, "x"), t)}
    assert words["tp"] == "tensor parallelism (tp 2)"
    assert words["offload.activations"] == "activation offload to cpu"
    assert words["method"] == "lora training"
    assert "pp" not in words and "offload.optimizer" not in words  # not used: no refusal
    assert all(c.id for c in CHANGES)


def test_plans_mark_what_trains_differently_and_locks_keep_it() -> None:
    """Pure bf16, 8-bit optimizers and a fused loss change what is trained: the plans mark
    them, and a lock keeps the scenario's own."""
    from memfit.engine.cli import main

    s = Scenario(
        load_model("llama-3-8b"),
        HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8),
        TrainingSpec(micro_batch_size=2, gradient_accumulation_steps=4, sequence_length=4096,
                     parallelism=ParallelismSpec(zero_stage=3)),
    )  # fmt: skip
    eight = BY_ID["8bit-optimizer"].apply(s)
    assert sweep.numerics_changed(s, eight) == (BY_ID["8bit-optimizer"].numerics,)
    assert sweep.numerics_changed(eight, eight) == ()
    assert sweep.numerics_changed(s, BY_ID["checkpointing"].apply(s)) == ()  # the same
    space = sweep.locked(sweep.default_space(s), s, ("precision", "optimizer"))
    points = sweep.sweep(s, space)
    assert points and all(sweep.numerics_changed(s, p.scenario) == () for p in points)
    locked_fixes = make_it_fit(s, leave_out=[c for k in sweep.LOCKS for c in sweep.LOCKS[k]])
    assert all(sweep.numerics_changed(s, f.scenario) == () for f in locked_fixes)
    with pytest.raises(EstimateError, match="--lock"):
        sweep.check_locks(["speed"])
    out = io.StringIO()
    argv = ["fit", "--model", "llama-3-8b", "--gpu", "h100-sxm-80gb", "--gpus", "8", "--batch",
            "2", "--grad-accum", "4", "--seq", "4096", "--zero", "3", "--top", "5"]  # fmt: skip
    assert main(argv, out) == 0
    text = out.getvalue()
    assert f" {sweep.NUMERICS_MARK}\n" in text and "trains differently: " in text
    assert "strategies left out: Hugging Face Trainer cannot run pipeline" in text
    out = io.StringIO()
    assert main([*argv, "--lock", "precision,optimizer,loss"], out) == 0
    assert sweep.NUMERICS_MARK not in out.getvalue()


def test_the_fastest_configurations_can_be_filtered_by_any_setting() -> None:
    s = cluster()
    points = sweep.sweep(s)
    kept = sweep.only(points, {"zero_stage": "3", "precision": "bf16-mixed"})
    assert kept and len(kept) < len(points)
    assert all(
        p.scenario.training.parallelism.zero_stage == 3
        and p.scenario.training.precision == "bf16-mixed"
        for p in kept
    )
    assert sweep.only(points, {}) == points
    from memfit.engine.cli import main

    out = io.StringIO()
    argv = ["fit", "--model", "llama-3-8b", "--gpu", "h100-sxm-80gb", "--gpus", "8", "--top", "3",
            "--only", "zero_stage=3,tp=2"]  # fmt: skip
    assert main(argv, out) == 0
    table = out.getvalue().split("configuration\n", 1)[1]
    assert all(
        "ZeRO-3 tp 2" in line for line in table.splitlines()[:3] if line.strip()[:1].isdigit()
    )
    assert main([*argv[:-1], "speed=1"], io.StringIO()) == 2

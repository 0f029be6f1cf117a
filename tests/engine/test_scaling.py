"""A family's size axis (``engine/scaling.py``): its points against the presets they lie
between, the largest of them that fits against an estimate of every point, and what
``memfit largest`` says of it."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest

from memfit.engine import scaling
from memfit.engine.cli import main
from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.params import count_parameters
from memfit.engine.presets import load_gpu, load_model, model_names
from memfit.engine.scenario_io import model_from_dict
from memfit.engine.solve import fits, largest_model
from memfit.engine.specs import HardwareSpec, ParallelismSpec, Scenario, TrainingSpec

FAMILIES = ["qwen3", "llama", "gpt2", "gemma3_text", "qwen2", "gpt_neox", "phi3"]


def qwen3_on_8_h100s(**parallel: object) -> Scenario:
    """Qwen3 full training, bf16 mixed, ZeRO-3 on 8 H100s at 4,096 tokens: Qwen3 8B fits
    and Qwen3 14B does not, so the answer lies between them."""
    return Scenario(
        load_model("qwen3-8b"),
        HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8),
        TrainingSpec(
            sequence_length=4096,
            parallelism=ParallelismSpec(zero_stage=3, **parallel),  # type: ignore[arg-type]
        ),
    )


def fitting(s: Scenario, model: object) -> bool:
    e = estimate(dataclasses.replace(s, model=model))
    return e.device_bytes <= e.budget_bytes


@pytest.mark.parametrize("family", FAMILIES)
def test_axis_points_are_valid_models_growing_between_their_presets(family: str) -> None:
    axis = scaling.size_axis(family)
    sizes = [p.params for p in axis.points]
    assert sizes == sorted(set(sizes))  # strictly growing
    assert len({p.model.name for p in axis.points}) == len(axis.points)
    for p in axis.points:
        m = p.model
        # a valid spec: rebuilding it runs ModelSpec's checks
        assert dataclasses.replace(m) == m
        assert m.family == family and not m.is_moe
        assert count_parameters(m).total == p.params
        if p.preset:
            assert m == load_model(p.preset)
            continue
        a, b = load_model(p.below), load_model(p.above)
        assert count_parameters(a).total < p.params < count_parameters(b).total
        for field in ("hidden_size", "num_layers", "intermediate_size"):
            lo, hi = sorted((getattr(a, field), getattr(b, field)))
            assert lo <= getattr(m, field) <= hi, (m.name, field)
        assert m.num_attention_heads % m.num_key_value_heads == 0
        assert m.head_dim == a.head_dim and m.vocab_size == a.vocab_size
        assert m.name.startswith(f"{family} axis ") and "not a released model" in m.source


@pytest.mark.parametrize("family", FAMILIES)
def test_the_axis_runs_through_each_preset_from_the_smallest_to_the_largest(family: str) -> None:
    axis = scaling.size_axis(family)
    presets = [p.preset for p in axis.points if p.preset]
    assert presets == list(axis.presets)
    left = {name for name, _ in axis.left_out}
    mine = [n for n in model_names() if load_model(n).family == family]
    assert set(presets) | left == set(mine) and not set(presets) & left
    # no extrapolation: the ends are the smallest and the largest preset it runs through
    sizes = {n: count_parameters(load_model(n)).total for n in presets}
    assert axis.points[0].preset == min(presets, key=sizes.__getitem__)
    assert axis.points[-1].preset == max(presets, key=sizes.__getitem__)
    # every point between two presets names those two, the ones around it on the axis
    stop = ""
    for p in axis.points:
        if p.preset:
            stop = p.preset
        else:
            assert p.below == stop and p.above == presets[presets.index(stop) + 1]


def test_presets_of_the_same_model_or_another_kind_are_left_out_and_said() -> None:
    llama = dict(scaling.size_axis("llama").left_out)
    assert llama["llama-3.1-8b"] == "as many parameters as llama-3-8b"
    with pytest.raises(EstimateError) as falcon:
        scaling.size_axis("falcon")  # Falcon 40B's block is not Falcon 7B's
    assert falcon.value.field == "--family" and "falcon-7b" in falcon.value.detail


@pytest.mark.parametrize(
    ("family", "names"),
    [
        ("mistral", None),  # one preset
        ("mixtral", None),  # mixtures of experts only
        ("qwen3", ["qwen3-8b", "qwen3-30b-a3b"]),  # one dense preset among those given
        ("no-such-family", None),
    ],
)
def test_a_family_without_two_usable_presets_has_no_axis(family: str, names: object) -> None:
    with pytest.raises(EstimateError) as exc:
        scaling.size_axis(family, names)  # type: ignore[arg-type]
    assert exc.value.field == "--family" and repr(family) in exc.value.detail
    assert family not in scaling.families_with_axis(names)  # type: ignore[arg-type]


def test_the_largest_on_the_axis_fits_and_the_next_point_does_not() -> None:
    s = qwen3_on_8_h100s()
    axis = scaling.size_axis("qwen3")
    fit = scaling.largest_on_axis(s, axis)
    assert fit is not None
    # strictly between two presets: the largest preset that fits, the next that does not
    best = largest_model(s, family="qwen3")
    assert best is not None and not fit.point.preset
    assert fit.point.below == best.name and best.params < fit.point.params
    assert not fits(dataclasses.replace(s, model=load_model(fit.point.above)))
    # the estimate says so, and the next point up does not fit
    e = estimate(dataclasses.replace(s, model=fit.point.model))
    assert (fit.device_bytes, fit.budget_bytes) == (e.device_bytes, e.budget_bytes)
    assert fit.device_bytes <= fit.budget_bytes
    assert fit.above is not None and not fitting(s, fit.above.model)
    # the bisection's answer is a scan's: no larger point fits
    i = axis.points.index(fit.point)
    assert axis.points[i + 1] == fit.above
    assert not any(fitting(s, p.model) for p in axis.points[i + 1 :])


def test_points_the_layout_refuses_are_searched_past() -> None:
    # four pipeline stages split only layer counts that are multiples of 4
    s = qwen3_on_8_h100s(pp=4)
    axis = scaling.size_axis("qwen3")
    fit = scaling.largest_on_axis(s, axis)
    assert fit is not None and fit.point.model.num_layers % 4 == 0
    ok = [p for p in axis.points if fits(dataclasses.replace(s, model=p.model))]
    assert fit.point == ok[-1]


def test_none_fits_or_the_largest_preset_ends_the_axis() -> None:
    t4 = Scenario(load_model("gpt2"), HardwareSpec(load_gpu("t4")),
                  TrainingSpec(sequence_length=2048))  # fmt: skip
    llama = scaling.size_axis("llama")
    assert not fits(dataclasses.replace(t4, model=llama.points[0].model))
    assert scaling.largest_on_axis(t4, llama) is None
    h100 = Scenario(load_model("gpt2"), HardwareSpec(load_gpu("h100-sxm-80gb")),
                    TrainingSpec(sequence_length=1024))  # fmt: skip
    gpt2 = scaling.size_axis("gpt2")
    assert fits(dataclasses.replace(h100, model=gpt2.points[-1].model))
    fit = scaling.largest_on_axis(h100, gpt2)
    assert fit is not None and fit.point == gpt2.points[-1] and fit.above is None


QWEN3_ARGS = ["largest", "--gpu", "h100-sxm-80gb", "--gpus", "8", "--zero", "3",
              "--seq", "4096", "--family", "qwen3"]  # fmt: skip


def test_memfit_largest_reports_the_largest_along_the_family_axis() -> None:
    fit = scaling.largest_on_axis(qwen3_on_8_h100s(), scaling.size_axis("qwen3"))
    assert fit is not None
    m = fit.point.model
    out = io.StringIO()
    assert main(QWEN3_ARGS, out) == 0
    last = out.getvalue().rstrip("\n").splitlines()[-1]
    assert last.startswith(f"largest along the qwen3 size axis: {m.name} ")
    for shown in (f"hidden {m.hidden_size:,}", f"{m.num_layers} layers",
                  f"{m.num_attention_heads} heads", f"intermediate {m.intermediate_size:,}",
                  f"{fit.tokens_per_s:,.0f} tokens/s", "not a released model"):  # fmt: skip
        assert shown in last
    out = io.StringIO()
    assert main([*QWEN3_ARGS, "--json"], out) == 0
    axis = json.loads(out.getvalue())["axis"]
    assert axis["name"] == m.name and axis["parameters"] == fit.point.params
    assert (axis["hidden_size"], axis["num_layers"], axis["num_attention_heads"]) == (
        m.hidden_size, m.num_layers, m.num_attention_heads,
    )  # fmt: skip
    assert axis["intermediate_size"] == m.intermediate_size
    assert axis["device_bytes"] == fit.device_bytes and axis["budget_bytes"] == fit.budget_bytes
    assert axis["between"] == [fit.point.below, fit.point.above]
    assert model_from_dict(axis["model"]) == m


def test_memfit_largest_without_a_family_takes_the_largest_fitting_presets() -> None:
    argv = ["largest", "--gpu", "rtx-4090", "--gpus", "2", "--method", "lora", "--seq", "2048"]
    out = io.StringIO()
    assert main([*argv, "--json"], out) == 0
    data = json.loads(out.getvalue())
    family = load_model(data["largest"]).family
    if family in scaling.families_with_axis():
        assert data["axis"]["family"] == family and not data["axis_problem"]
    else:
        assert data["axis"] is None and "--family picks one of" in data["axis_problem"]
    # a family without an axis still lists its presets, and says why there is no axis
    out = io.StringIO()
    assert main([*argv, "--family", "mistral"], out) == 0
    assert "mistral-7b-v0.1" in out.getvalue()
    assert out.getvalue().rstrip("\n").splitlines()[-1].startswith("size axis: none (")

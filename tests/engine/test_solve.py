"""The solvers against brute force on the engine's own estimate, the sweep, and the
``memfit fit`` / ``memfit sweep`` commands."""

from __future__ import annotations

import csv
import dataclasses
import io
import json

import pytest

from memfit.engine import solve, sweep
from memfit.engine.batch import totals
from memfit.engine.cli import main
from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.solve import CHANGES, combine, search
from memfit.engine.specs import HardwareSpec, LoraSpec, ParallelismSpec, Scenario, TrainingSpec
from memfit.engine.steptime import step_time


def scenario(model: str, gpu: str, gpus: int = 1, **training: object) -> Scenario:
    return Scenario(
        load_model(model),
        HardwareSpec(load_gpu(gpu), gpus_per_node=gpus),
        TrainingSpec(**training),  # type: ignore[arg-type]
    )


def fits(s: Scenario) -> bool:
    e = estimate(s)
    return e.device_bytes <= e.budget_bytes


def first_failure(values, make) -> int | None:
    """Brute force: the last value before the first one that does not fit."""
    last = None
    for v in values:
        if not fits(make(v)):
            return last
        last = v
    return last


CASES = [
    scenario("gpt2", "l4", sequence_length=1024),
    scenario("qwen2.5-0.5b", "rtx-4090", method="lora", sequence_length=2048),
    scenario("llama-3.2-1b", "a10g", method="qlora", activation_checkpointing="full"),
    scenario("pythia-160m", "t4", precision="fp32", attention="eager", sequence_length=512),
]


@pytest.mark.parametrize("s", CASES, ids=lambda s: s.model.name)
def test_max_micro_batch_equals_brute_force(s: Scenario) -> None:
    t = s.training
    brute = first_failure(
        range(1, 600),
        lambda b: dataclasses.replace(s, training=dataclasses.replace(t, micro_batch_size=b)),
    )
    assert solve.max_micro_batch(s, limit=599) == brute
    assert brute is not None and brute > 1


@pytest.mark.parametrize("s", CASES[:3], ids=lambda s: s.model.name)
def test_max_sequence_length_equals_brute_force(s: Scenario) -> None:
    t = s.training
    found = solve.max_sequence_length(s)
    assert found is not None
    # brute force around the answer, and from the start on a coarse grid
    make = lambda n: dataclasses.replace(s, training=dataclasses.replace(t, sequence_length=n))  # noqa: E731
    assert fits(make(found)) and not fits(make(found + 1))
    assert all(fits(make(n)) for n in range(1, found + 1, max(1, found // 300)))


def test_max_sequence_length_keeps_the_context_parallel_multiple() -> None:
    s = scenario("llama-3-8b", "h100-sxm-80gb", 8, method="lora",
                 parallelism=ParallelismSpec(cp=4, tp=2, sequence_parallel=True))  # fmt: skip
    found = solve.max_sequence_length(s)
    assert found is not None and found % 8 == 0

    def step(n: int) -> Scenario:
        return dataclasses.replace(s, training=dataclasses.replace(s.training, sequence_length=n))

    assert fits(step(found)) and not fits(step(found + 8))


def test_max_lora_rank_equals_brute_force() -> None:
    s = scenario("llama-3-8b", "rtx-4090", method="qlora", micro_batch_size=1,
                 sequence_length=2048, activation_checkpointing="full")  # fmt: skip
    found = solve.max_lora_rank(s)
    assert found is not None
    make = lambda r: dataclasses.replace(  # noqa: E731
        s, training=dataclasses.replace(s.training, lora=LoraSpec(rank=r))
    )
    assert fits(make(found)) and (found == s.model.hidden_size or not fits(make(found + 1)))
    assert all(fits(make(r)) for r in range(1, found + 1, max(1, found // 200)))
    assert solve.max_lora_rank(scenario("gpt2", "l4")) is None  # full fine-tuning


def test_min_gpus_equals_brute_force() -> None:
    s = scenario("llama-3-8b", "a100-sxm-40gb", parallelism=ParallelismSpec(zero_stage=3),
                 precision="bf16-mixed")  # fmt: skip
    found = solve.min_gpus(s, limit=256)
    assert found is not None
    brute = next(
        solve.with_gpus(s, n, k)
        for n, k in solve.gpu_counts(s, 256)
        if fits(solve.with_gpus(s, n, k))
    )
    assert found.hardware.world_size == brute.hardware.world_size > 1
    # without sharding more GPUs do not help: none fits if one does not
    ddp = scenario("llama-3-8b", "a100-sxm-40gb")
    assert solve.min_gpus(ddp, limit=64) is None
    # another GPU type
    h200 = solve.min_gpus(s, gpu="h200-sxm-141gb", limit=256)
    assert h200 is not None and h200.hardware.gpu.name == "h200-sxm-141gb"
    assert h200.hardware.world_size <= found.hardware.world_size


def test_make_it_fit_returns_fitting_minimal_changes_fastest_first() -> None:
    s = scenario("llama-3-8b", "h100-sxm-80gb", micro_batch_size=8, sequence_length=4096)
    assert not fits(s)
    fixes = solve.make_it_fit(s, top=10)
    assert fixes
    speeds = [f.time.tokens_per_s for f in fixes]
    assert speeds == sorted(speeds, reverse=True)
    for f in fixes:
        assert fits(f.scenario) and f.device_bytes <= f.budget_bytes
        assert solve.combine(s, f.changes) == f.scenario
        # every change is needed: no proper subset fits
        for k in range(1, len(f.changes)):
            import itertools

            for sub in itertools.combinations(f.changes, k):
                sub_s = solve.combine(s, sub)
                assert sub_s is None or not fits(sub_s)
    fitting = scenario("gpt2", "h100-sxm-80gb")
    assert fits(fitting)


def test_sweep_points_equal_single_estimates_and_keep_the_global_batch() -> None:
    s = scenario("qwen2.5-0.5b", "l4", 4, micro_batch_size=2, gradient_accumulation_steps=4)
    space = sweep.Space(
        checkpointing=("none", "full"),
        zero_stages=(0, 3),
        parallel=(("tp", (1, 2)),),
        micro_batches=(1, 2, 4, 8),
    )
    points = sweep.sweep(s, space)
    assert len(points) >= 8
    batch = sweep.global_batch(s)
    for p in points:
        e = estimate(p.scenario)
        assert (p.device_bytes, p.budget_bytes, p.verdict) == (
            e.device_bytes,
            e.budget_bytes,
            e.verdict,
        )
        assert p.time == step_time(p.scenario)
        assert sweep.global_batch(p.scenario) == batch
        t = p.scenario.training
        again = dataclasses.replace(
            p.scenario,
            training=dataclasses.replace(
                t,
                micro_batch_size=t.micro_batch_size,
                gradient_accumulation_steps=t.gradient_accumulation_steps,
            ),
        )
        assert again == p.scenario and hash(again) == hash(p.scenario)
    front = sweep.pareto(points)
    assert front and all(
        not any(
            q.device_bytes <= p.device_bytes
            and q.time.tokens_per_s > p.time.tokens_per_s
            and q.device_bytes < p.device_bytes
            for q in points
        )
        for p in front
    )
    assert [p.device_bytes for p in front] == sorted(p.device_bytes for p in front)


def test_sweep_progress_can_cancel() -> None:
    s = scenario("gpt2", "l4", 8, micro_batch_size=8)
    seen = []

    def progress(done: int, total: int) -> bool:
        seen.append((done, total))
        return done < 200

    points = sweep.sweep(s, None, progress)
    total = len(list(sweep.configs(s)))
    stopped = seen[-1][0]
    assert total > 400 and 200 <= stopped < 200 + 16 + 8  # within one report and one strategy
    assert len(points) <= stopped


def test_a_sweep_here_evaluates_strategies_alike_together_in_its_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In one process, the first strategy reached of a layout and shapes is evaluated with
    every other of them (they differ in their share of the model state), each strategy
    once; the points come in the order of the strategies, as evaluating each alone
    gives them."""
    s = scenario("gpt2", "l4", 8, micro_batch_size=8)
    todo = list(sweep.strategies(s))
    runs: list[list[sweep.Strategy]] = []
    real = sweep._evaluate_each

    def counted(strategies: list[sweep.Strategy], times: str = "all") -> list[object]:
        runs.append(strategies)
        return real(strategies, times)  # type: ignore[return-value]

    monkeypatch.setattr(sweep, "_evaluate_each", counted)
    points = sweep.sweep(s)
    evaluated = [strategy for run in runs for strategy in run]

    def key(strategy: sweep.Strategy) -> tuple[object, ...]:
        return (strategy[0], *strategy[1])

    assert sorted(map(key, evaluated), key=repr) == sorted(map(key, todo), key=repr)  # once
    assert len(runs) < len(todo) / 4
    for run in runs:
        assert len({sweep._batch_key(strategy) for strategy in run}) == 1
    monkeypatch.setattr(sweep, "_evaluate_each", real)
    alone = [r for strategy in todo for r in real([strategy])]
    expected = [
        (base.training, shapes[i], t.device_bytes, time)
        for (base, shapes), results in zip(todo, alone, strict=True)
        for i, t, time in results
    ]
    assert [
        (
            p.scenario.training.parallelism,
            p.scenario.training.micro_batch_size,
            p.device_bytes,
            p.time,
        )
        for p in points
    ] == [(t.parallelism, shape[0], device, time) for t, shape, device, time in expected]


def test_curve() -> None:
    s = scenario("gpt2", "l4")
    pts = sweep.curve(s, "micro_batch_size", [1, 2, 4])
    assert all(p is not None for p in pts)
    assert pts[0].device_bytes < pts[1].device_bytes < pts[2].device_bytes  # type: ignore[union-attr]
    with pytest.raises(Exception, match="field"):
        sweep.curve(s, "rank", [1])


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


def test_cli_fit_json_shape() -> None:
    code, text = run("fit", "--model", "gpt2", "--gpu", "l4", "--gpus", "2", "--batch", "4",
                     "--top", "3", "--json")  # fmt: skip
    assert code == 0
    d = json.loads(text)
    assert {"max_micro_batch_size", "max_sequence_length", "min_gpus", "configs"} <= set(d)
    assert d["fixes"] == []  # the scenario fits already
    assert 1 <= len(d["configs"]) <= 3
    for c in d["configs"]:
        assert {"scenario", "device_bytes", "verdict", "time"} <= set(c)
        assert c["verdict"] == "fits" and c["time"]["bound"]
    speeds = [c["time"]["tokens_per_s"] for c in d["configs"]]
    assert speeds == sorted(speeds, reverse=True)


def test_cli_fit_lists_the_fixes_of_a_scenario_that_does_not_fit() -> None:
    argv = ["fit", "--model", "llama-3-8b", "--gpu", "h100-sxm-80gb", "--batch", "8",
            "--seq", "4096", "--top", "3"]  # fmt: skip
    code, text = run(*argv, "--json")
    assert code == 0
    fixes = json.loads(text)["fixes"]
    assert fixes and all(f["changes"] and f["device_bytes"] > 0 for f in fixes)
    speeds = [f["time"]["tokens_per_s"] for f in fixes]
    assert speeds == sorted(speeds, reverse=True)
    code, text = run(*argv)
    assert code == 0 and "make it fit" in text


def test_cli_fit_table_and_bad_input() -> None:
    code, text = run("fit", "--model", "gpt2", "--gpu", "l4", "--top", "2")
    assert code == 0 and "tokens/s" in text and "max micro batch size" in text
    assert run("fit", "--model", "gpt2", "--gpu", "l4", "--gpus", "12")[0] == 2
    assert run("fit", "--model", "gpt2", "--gpu", "l4", "--top", "0")[0] == 2


def test_cli_sweep_json_and_csv(tmp_path) -> None:
    target = tmp_path / "points.csv"
    code, text = run("sweep", "--model", "gpt2", "--gpu", "l4", "--gpus", "2", "--json",
                     "--csv", str(target))  # fmt: skip
    assert code == 0
    d = json.loads(text)
    assert d["configs"] == len(d["points"]) > 10
    rows = list(csv.DictReader(io.StringIO(target.read_text(encoding="utf-8"))))
    assert len(rows) == d["configs"]
    # compact: the base scenario once, then each point's settings and results by field
    assert d["fields"] == list(sweep.ROW_FIELDS)
    assert d["base"]["model"] == {"preset": "gpt2"}
    for point, row in zip(d["points"], rows, strict=True):
        assert [str(v) for v in point] == [row[f] for f in sweep.ROW_FIELDS]
    assert {"device_bytes", "tokens_per_s", "bound", "verdict"} <= set(rows[0])


def test_another_gpu_drops_the_scenario_devices_own_price_and_efficiency() -> None:
    s = scenario("gpt2", "h100-sxm-80gb")
    own = dataclasses.replace(
        s, hardware=dataclasses.replace(s.hardware, price_per_gpu_hour=3.0, matmul_efficiency=0.5)
    )
    other = solve.hardware_with(own, "l40s")
    assert other.hardware.gpu.name == "l40s"
    assert other.hardware.price_per_gpu_hour is None and other.hardware.matmul_efficiency is None
    assert solve.hardware_with(own, "h100-sxm-80gb") == own


def test_a_default_sweep_equals_one_estimate_per_configuration() -> None:
    """The batched sweep against estimate() and step_time() of each configuration, to the
    byte, on a sample of the default space (pipeline, tensor and context parallel, every
    ZeRO stage, offload) and the configurations it leaves out are the invalid ones."""
    import random

    from memfit.engine.errors import EstimateError

    s = scenario("llama-3-8b", "h100-sxm-80gb", 8, micro_batch_size=2,
                 gradient_accumulation_steps=4, sequence_length=8192)  # fmt: skip
    points = sweep.sweep(s)
    by_scenario = {p.scenario: p for p in points}
    every = list(sweep.configs(s))
    assert len(every) > 2000 and len(by_scenario) == len(points)
    for c in random.Random(11).sample(every, 120):
        try:
            e = estimate(c)
        except EstimateError:
            assert c not in by_scenario
            continue
        p = by_scenario[c]
        assert (p.device_bytes, p.verdict) == (e.device_bytes, e.verdict)
        assert p.time == step_time(c)


def test_a_sweep_that_times_the_fitting_points_answers_as_one_that_times_all() -> None:
    """``memfit fit`` reads the times of the points that fit: its sweep times those as it
    goes and the rest when asked, with the same points, figures and times as a sweep that
    times every point. Where no point of a strategy fits, the strategy is still planned:
    a step time that rejects it leaves it out either way."""
    s = scenario("llama-3-8b", "h100-sxm-80gb", 8, micro_batch_size=2,
                 gradient_accumulation_steps=4, sequence_length=8192)  # fmt: skip
    every = sweep.sweep(s)
    fitting = sweep.sweep(s, times="fitting")
    assert len(fitting) == len(every) > 1000
    fit = [p.fits for p in every]
    assert 100 < sum(fit) < len(fit) - 100  # both kinds, many of each
    for a, b in zip(every, fitting, strict=True):
        assert (a.scenario, a.device_bytes, a.verdict) == (b.scenario, b.device_bytes, b.verdict)
        assert a.timed is not None
        assert (b.timed is not None) == b.fits  # timed as it went only where it fits
        assert b.time == a.time  # the rest timed when asked, the same
    with pytest.raises(EstimateError, match="times"):
        sweep.sweep(s, times="some")


def test_make_it_fit_and_the_what_ifs_offer_zero_by_one_rule() -> None:
    # all eight GPUs in tensor parallelism leave a shard group of one: the what-if says
    # why ZeRO-3 does not apply, and make-it-fit does not offer a stage that shards nothing
    from memfit.engine.changes import nothing_to_shard
    from memfit.engine.solve import CHANGES
    from memfit.engine.whatif import WHATIFS_BY_KEY
    from tests.engine.helpers import preset_scenario

    s = preset_scenario("llama-3-8b", "h100-sxm-80gb", {"parallelism": {"tp": 8}}, gpus_per_node=8)
    reason = nothing_to_shard(s, 3)
    assert reason is not None and "shard group is one GPU" in reason
    assert WHATIFS_BY_KEY["zero3"].why_not(s) == reason
    assert not any(c.applies(s) for c in CHANGES if c.id.startswith("zero"))
    spread = preset_scenario("llama-3-8b", "h100-sxm-80gb", {}, gpus_per_node=8)
    assert nothing_to_shard(spread, 3) is None
    assert all(c.applies(spread) for c in CHANGES if c.id.startswith("zero"))


# -- make-it-fit's whole search ------------------------------------------------------------


def qlora_70b_on_two_4090s() -> Scenario:
    """The new user's task: Llama 3 70B QLoRA on 2 x RTX 4090 (micro-batch 4, 2k tokens)."""
    return Scenario(
        load_model("llama-3-70b"),
        HardwareSpec(load_gpu("rtx-4090"), gpus_per_node=2),
        TrainingSpec(method="qlora", micro_batch_size=4, sequence_length=2048),
    )


def test_make_it_fit_finds_fits_of_four_changes_the_three_change_search_missed() -> None:
    """It said 70B QLoRA on 2 x RTX 4090 cannot fit, while ZeRO-3, parameter offload, full
    checkpointing and micro-batch 1 give 11.8 GiB."""
    s = qlora_70b_on_two_4090s()
    assert not fits(s)
    four = combine(s, ("checkpointing", "micro-batch-1", "zero3", "offload-parameters"))
    assert four is not None and fits(four)
    found = search(s)
    assert found.fixes and found.complete
    for fix in found.fixes:
        assert fits(fix.scenario) and fix.device_bytes <= fix.budget_bytes
        assert combine(s, fix.changes) == fix.scenario
        others = [set(f.changes) for f in found.fixes if f is not fix]
        assert not any(o < set(fix.changes) for o in others)  # every change needed
    assert any("offload-parameters" in f.changes for f in found.fixes)
    per_gpu = [f.time.tokens_per_s_per_gpu for f in found.fixes]
    assert per_gpu == sorted(per_gpu, reverse=True)
    assert found.floor is not None and found.floor.device_bytes <= min(
        f.device_bytes for f in found.fixes
    )


def test_where_nothing_fits_the_floor_is_said() -> None:
    s = Scenario(load_model("llama-3.1-405b"), HardwareSpec(load_gpu("rtx-4090")),
                 TrainingSpec(method="full"))  # fmt: skip
    found = search(s)
    assert found.fixes == () and found.floor is not None
    floor = found.floor
    assert floor.device_bytes > floor.budget_bytes
    assert combine(s, floor.changes) == floor.scenario
    assert totals(floor.scenario).device_bytes == floor.device_bytes
    # no single change of the search goes under it
    for change in CHANGES:
        made = combine(s, (change.id,))
        if made is not None:
            assert totals(made).device_bytes >= floor.device_bytes


def test_the_search_reports_progress_and_stops_when_told() -> None:
    s = qlora_70b_on_two_4090s()
    seen: list[tuple[int, int]] = []

    def stop_soon(done: int, total: int) -> bool:
        seen.append((done, total))
        return done < 100

    found = search(s, progress=stop_soon)
    assert seen and not found.complete and found.tries <= 150
    assert search(s, max_tries=40).complete is False


# -- the largest model that fits, and the shapes a run can take ------------------------------


def test_the_largest_model_that_fits_is_the_first_fitting_preset_by_size() -> None:
    s = Scenario(
        load_model("gpt2"),
        HardwareSpec(load_gpu("rtx-4090"), gpus_per_node=2),
        TrainingSpec(
            method="lora", sequence_length=2048, parallelism=ParallelismSpec(zero_stage=3)
        ),
    )
    rows = solve.models_that_fit(s)
    assert [r.params for r in rows] == sorted((r.params for r in rows), reverse=True)
    best = solve.largest_model(s)
    assert best is not None and best.fits
    assert all(not r.fits for r in rows if r.params > best.params)
    # each row is the estimate of the preset under the scenario's hardware and training
    row = next(r for r in rows if r.name == best.name)
    est = estimate(dataclasses.replace(s, model=load_model(best.name)))
    assert row.device_bytes == est.device_bytes and row.budget_bytes == est.budget_bytes
    qwen3 = solve.models_that_fit(s, family="qwen3")
    assert qwen3 and {load_model(r.name).family for r in qwen3} == {"qwen3"}
    out = io.StringIO()
    argv = ["largest", "--gpu", "rtx-4090", "--gpus", "2", "--method", "lora", "--seq", "2048",
            "--zero", "3", "--json"]  # fmt: skip
    assert main(argv, out) == 0
    assert json.loads(out.getvalue())["largest"] == best.name


def test_the_shape_grid_is_one_estimate_per_cell() -> None:
    s = Scenario(load_model("llama-3.2-1b"), HardwareSpec(load_gpu("l4")),
                 TrainingSpec(method="lora"))  # fmt: skip
    grid = solve.shape_grid(s, (1, 4), (512, 4096))
    assert [[(c.micro_batch_size, c.sequence_length) for c in row] for row in grid] == [
        [(1, 512), (1, 4096)],
        [(4, 512), (4, 4096)],
    ]
    for row in grid:
        for c in row:
            shaped = solve.with_training(s, micro_batch_size=c.micro_batch_size,
                                         sequence_length=c.sequence_length)  # fmt: skip
            assert c.device_bytes == estimate(shaped).device_bytes
    assert grid[0][0].device_bytes < grid[1][1].device_bytes  # more tokens, more memory
    out = io.StringIO()
    assert main(["grid", "--model", "llama-3.2-1b", "--gpu", "l4", "--batches", "1,4",
                 "--seqs", "512,4096"], out) == 0  # fmt: skip
    text = out.getvalue()
    assert "micro-batch down, sequence length across" in text and "4,096" in text
    assert main(["grid", "--model", "gpt2", "--gpu", "l4", "--batches", "0"], io.StringIO()) == 2

"""A sweep spread over processes gives the points of one in the calling process: the same
configurations, figures and step times, in the same order; and the command line's
``--jobs`` is checked and changes nothing of the answer."""

from __future__ import annotations

import io
import json
import os
import pickle
from pathlib import Path

import pytest

from memfit.engine import memo, sweep
from memfit.engine.cli import main
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.specs import HardwareSpec, Scenario, TrainingSpec

pytestmark = pytest.mark.skipif(not sweep.can_fork(), reason="sweeps fork on Linux only")


def scenario() -> Scenario:
    training = TrainingSpec(micro_batch_size=2, gradient_accumulation_steps=4)
    return Scenario(load_model("gpt2"), HardwareSpec(load_gpu("h100-sxm-80gb"), 8), training)


def test_a_sweep_over_processes_equals_one_in_this_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = scenario()
    strategies = list(sweep.strategies(s))
    assert len(strategies) >= sweep.PARALLEL_FROM
    memo.clear()
    here = sweep.sweep(s, workers=1)
    memo.clear()  # the workers build everything themselves
    spread_over: list[int] = []
    real = sweep.in_processes

    def counted(todo: list[sweep.Strategy], workers: int, *rest: object) -> list[object]:
        spread_over.append(workers)
        return real(todo, workers, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(sweep, "in_processes", counted)
    spread = sweep.sweep(s, workers=3)
    assert spread_over == [3]  # spread, not run here
    assert len(here) == len(spread) > 500
    for a, b in zip(here, spread, strict=True):
        assert a.scenario == b.scenario
        assert (a.device_bytes, a.budget_bytes, a.capacity_bytes, a.verdict) == (
            b.device_bytes,
            b.budget_bytes,
            b.capacity_bytes,
            b.verdict,
        )
        assert a.time == b.time


def run(*args: str) -> str:
    out = io.StringIO()
    assert main(list(args), out=out) == 0
    return out.getvalue()


def test_jobs_change_nothing_of_the_answer() -> None:
    flags = ["--model", "gpt2", "--gpu", "h100-sxm-80gb", "--gpus-per-node", "8", "--json"]
    one = json.loads(run("sweep", *flags, "--jobs", "1"))
    two = json.loads(run("sweep", *flags, "--jobs", "2"))
    assert one == two and one["configs"] > 100


def test_fit_over_processes_answers_as_in_this_process() -> None:
    """``fit`` works out its limits and make-it-fit while the sweep's processes run: the
    same answer as one process gives."""
    flags = ["--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--gpus-per-node", "8"]
    flags += ["--stack", "custom", "--seq", "4096", "--batch", "8", "--json"]
    one = json.loads(run("fit", *flags, "--jobs", "1"))
    memo.clear()
    two = json.loads(run("fit", *flags, "--jobs", "2"))
    assert one == two
    assert one["configs"] and "min_gpus" in one
    assert one["fixes"]  # micro-batch 8 at 4,096 tokens does not fit a 4090 as it is


@pytest.mark.parametrize("jobs", ["-1", "65", "x"])
def test_jobs_out_of_range_name_the_flag(jobs: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    args = ["fit", "--model", "gpt2", "--gpu", "h100-sxm-80gb", "--jobs", jobs]
    try:
        code = main(args, out=out)
    except SystemExit as stop:  # argparse's own: not an integer
        code = stop.code
    assert code == 2
    assert "--jobs" in capsys.readouterr().err + out.getvalue()


def test_a_sweep_runs_here_where_processes_cannot_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine where no process can be forked (a process limit): the sweep runs in the
    calling process, with the same points."""
    s = scenario()
    here = sweep.sweep(s, workers=1)

    tried: list[bool] = []

    def no_fork() -> int:
        tried.append(True)
        raise OSError("Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    called: list[bool] = []
    fallback = sweep.sweep(s, workers=3, meanwhile=lambda: called.append(True))
    assert tried == [True] and called == [True]  # one try, then the parts stay here
    assert [(p.scenario, p.device_bytes, p.time) for p in fallback] == [
        (p.scenario, p.device_bytes, p.time) for p in here
    ]


def test_what_a_process_did_not_answer_is_evaluated_here(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A forked process that ends without its answer (killed, or out of memory) loses no
    point: this process evaluates the parts it took, and the points are those of one
    process, in order."""
    s = scenario()
    here = sweep.sweep(s, workers=1)

    def killed(queue: int, answers: sweep._Answers, parts: list[list[int]], times: str) -> None:
        taken = sweep._next_part(queue)  # takes a part, then ends without a word
        (tmp_path / "taken").write_text(str(taken))
        os._exit(9)

    monkeypatch.setattr(sweep, "_work_in_child", killed)
    lost = sweep.sweep(s, workers=2)
    assert (tmp_path / "taken").read_text().isdigit()  # a part was lost with it
    assert [(p.scenario, p.device_bytes, p.time) for p in lost] == [
        (p.scenario, p.device_bytes, p.time) for p in here
    ]


def test_a_part_written_in_half_is_evaluated_here(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A forked process answers each part as it finishes it: where it ends in the middle
    of writing one, the parts it wrote whole are read, the one it wrote in half is
    evaluated here, and the points are those of one process."""
    s = scenario()
    here = sweep.sweep(s, workers=1)

    def cut_short(queue: int, answers: sweep._Answers, parts: list[list[int]], times: str) -> None:
        first, second = sweep._next_part(queue), sweep._next_part(queue)
        assert first is not None and second is not None
        answers.write(first, sweep._run_part(parts[first], times))
        data = pickle.dumps((second, sweep._run_part(parts[second], times)))
        os.write(answers.fd, len(data).to_bytes(sweep._LENGTH_BYTES, "little") + data[:10])
        (tmp_path / "taken").write_text(f"{first} {second}")
        os._exit(9)

    read: list[int] = []
    real = sweep._Answers.collect

    def collect(self: sweep._Answers) -> dict[int, sweep._PartResults]:
        got = real(self)
        read.extend(got)
        return got

    monkeypatch.setattr(sweep, "_work_in_child", cut_short)
    monkeypatch.setattr(sweep._Answers, "collect", collect)
    spread = sweep.sweep(s, workers=2)
    first, second = (int(k) for k in (tmp_path / "taken").read_text().split())
    assert first in read and second not in read  # the whole part read, the half not
    assert [(p.scenario, p.device_bytes, p.time) for p in spread] == [
        (p.scenario, p.device_bytes, p.time) for p in here
    ]


def test_more_parts_than_the_queue_holds_run_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The queue of parts is written whole before any process reads it: where the parts
    would not fit it, nothing is forked and the sweep runs here, with the same points."""
    s = scenario()
    here = sweep.sweep(s, workers=1)

    def no_fork() -> int:
        raise AssertionError("forked with more parts than the queue holds")

    monkeypatch.setattr(sweep, "_MOST_PARTS", 1)
    monkeypatch.setattr(os, "fork", no_fork)
    called: list[bool] = []
    alone = sweep.sweep(s, workers=2, meanwhile=lambda: called.append(True))
    assert called == [True]
    assert [(p.scenario, p.device_bytes, p.time) for p in alone] == [
        (p.scenario, p.device_bytes, p.time) for p in here
    ]


@pytest.mark.parametrize("workers", [2, 3, 8])
def test_the_parts_keep_what_strategies_share_in_one_process(workers: int) -> None:
    """Every strategy in one part; a part holds strategies of one split of the model and
    the sequence over the ranks (which share block profiles and compiled steps), in as
    few parts as the share of one allows; the largest parts first."""
    model = load_model("llama-3-8b")
    training = TrainingSpec(micro_batch_size=1, gradient_accumulation_steps=8)
    s = Scenario(model, HardwareSpec(load_gpu("h100-sxm-80gb"), 8), training)
    todo = list(sweep.strategies(s))
    parts = sweep._parts(todo, workers)
    assert sorted(i for p in parts for i in p) == list(range(len(todo)))
    share = -(-len(todo) // (2 * workers))
    assert all(0 < len(p) <= share for p in parts)
    assert [len(p) for p in parts] == sorted((len(p) for p in parts), reverse=True)
    splits = {sweep._split(todo[i]) for i in range(len(todo))}
    assert len(splits) > 1
    for split in splits:
        holding = [p for p in parts if any(sweep._split(todo[i]) == split for i in p)]
        assert all(sweep._split(todo[i]) == split for p in holding for i in p)
        members = sum(len(p) for p in holding)
        assert len(holding) == -(-members // share)

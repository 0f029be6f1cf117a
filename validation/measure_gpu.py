"""Real training steps on a CUDA GPU: what the allocator and the driver report.

    python -m validation.measure_gpu --out DIR [--jobs 8] [--budget 420] [--only TEXT]

The traced datasets (:mod:`validation.measure`, :mod:`validation.measure_conventions`) count
the storages of a step run on fake tensors. This runner takes the same cases -- the same
scenario files, built and stepped by the same functions of :mod:`validation.step` -- and runs
them on a real GPU, recording beside each case:

* ``torch.cuda.max_memory_allocated()`` and ``max_memory_reserved()`` over the reported step
  (the second; the first creates AdamW's state), with the allocated bytes before it;
* the first step's peaks and the other output convention's (as the traced records do);
* what ``nvidia-smi`` shows for the process after the step (the CUDA context, the allocator's
  reserved segments and the libraries' workspaces), where the driver lists the process;
* the allocator's retries and the step's wall time (noisy when cases share the GPU).

Part 1 runs the traced cases (2-4 layers at real widths) ``--jobs`` at a time, each in a
fresh process. Part 2 adds gradient accumulation variants (1, 2, 4 micro-batches per step).
Part 3 runs whole models one at a time, alone on the GPU, and times their steps (median of
five after two warm-up steps); their device total is also read as the GPU's used memory
minus what it used before the process started.

Every record is appended to ``DIR/gpu_steps.jsonl`` as it finishes, so a run cut short keeps
what it measured. Inputs are random token ids (a mixture of experts then routes about evenly,
as the traced steps assume); weights are randomly initialized, which changes no size.

:mod:`validation.fakecuda` must not load on a CUDA build: the builders used here do not use it,
so a placeholder module stands in for it before :mod:`validation.step` is imported.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: whole models of the traced cases' configs: (model, method, keyword arguments of
#: :func:`validation.cases.scenario`)
WHOLE: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("gpt2", "full", {"impl": "fused", "batch": 16, "seq": 1024}),
    ("qwen2.5-0.5b", "full", {"impl": "fused", "batch": 8, "seq": 2048}),
    ("llama-3.2-1b", "full", {"impl": "fused", "batch": 4, "seq": 2048}),
    ("llama-3.2-1b", "full", {"impl": "fused", "batch": 8, "seq": 2048, "ckpt": "full"}),
    ("bert-large-uncased", "full", {"precision": "fp32", "impl": "fused", "batch": 32,
                                    "seq": 512}),
    ("llama-3-8b", "lora", {"batch": 4, "seq": 2048}),
    ("llama-3-8b", "lora", {"batch": 8, "seq": 4096, "ckpt": "full"}),
    ("mistral-7b-v0.1", "full", {"precision": "bf16", "impl": "fused", "batch": 2, "seq": 2048,
                                 "ckpt": "full"}),
    # the second run: LoRA on small models, long sequences, pure bf16, larger batches
    ("qwen2.5-0.5b", "lora", {"batch": 8, "seq": 2048}),
    ("llama-2-7b", "lora", {"batch": 8, "seq": 2048}),
    ("qwen2-7b", "lora", {"batch": 4, "seq": 4096, "ckpt": "full"}),
    ("llama-3.2-1b", "full", {"impl": "fused", "batch": 1, "seq": 16384, "ckpt": "full"}),
    ("llama-3.2-1b", "full", {"precision": "bf16", "impl": "fused", "batch": 8, "seq": 2048}),
    ("gpt2", "full", {"impl": "fused", "batch": 32, "seq": 1024}),
    ("gpt2-xl", "full", {"impl": "fused", "batch": 8, "seq": 1024, "ckpt": "full"}),
    ("bert-base-uncased", "full", {"impl": "fused", "batch": 64, "seq": 512}),
)  # fmt: skip

#: where the steps run (a smoke test of this runner may set ``"cpu"`` in its own process)
DEVICE = "cuda"

#: traced cases run again with 2 and 4 micro-batches per optimizer step
ACCUMULATED = ("llama-3.2-1b", "bert-base-uncased", "qwen2.5-0.5b")


def _placeholder_fakecuda() -> None:
    if "validation.fakecuda" not in sys.modules:
        stub = types.ModuleType("validation.fakecuda")
        stub.__doc__ = "placeholder: real CUDA is present"
        sys.modules["validation.fakecuda"] = stub


def _smi(*query: str) -> str | None:
    """What ``nvidia-smi`` answers to ``query`` (CSV, no header, no units); None without it."""
    try:
        return subprocess.run(
            ["nvidia-smi", *query, "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None


def _smi_gpu_mib(field: str) -> int | None:
    """The GPU's ``memory.used`` or ``memory.total`` (MiB) as ``nvidia-smi`` shows it."""
    out = _smi(f"--query-gpu={field}")
    words = out.split() if out else []
    return int(words[0]) if words and words[0].isdigit() else None


def _smi_process_mib(pid: int) -> int | None:
    """This process's used memory (MiB) as ``nvidia-smi`` lists it (None: not listed)."""
    for line in (_smi("--query-compute-apps=pid,used_memory") or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid) and parts[1].isdigit():
            return int(parts[1])
    return None


def _env() -> dict[str, Any]:
    import peft
    import torch
    import transformers

    props = torch.cuda.get_device_properties(0)
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "gpu": props.name,
        "gpu_total_bytes": props.total_memory,
        "capability": f"{props.major}.{props.minor}",
    }


def _build(spec: Any) -> tuple[Any, str]:
    """The model of ``spec`` on the GPU, its method applied and checkpointing enabled."""
    import torch

    from validation import step

    with step._quiet(), torch.device(DEVICE):
        try:
            model, family = step._build_model(spec)
        except TypeError:  # a transformers release before ``dtype=`` / experts switch
            model, family = _build_older(spec)
        model = step._apply_method(model, family, spec)
        if spec.checkpointing in ("full", "per-op"):
            step._enable_checkpointing(model, per_op=spec.checkpointing == "per-op")
    model.train()
    return model, family


def _build_older(spec: Any) -> tuple[Any, str]:
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    from validation import step

    family = step._family(spec.hf_config)
    if spec.method == "lora":
        dtype = step.frozen_dtype(spec)
    else:
        dtype = torch.bfloat16 if spec.precision == "bf16" else torch.float32
    auto = AutoModelForMaskedLM if family == "bert" else AutoModelForCausalLM
    model = auto.from_config(
        step._hf_config(spec), attn_implementation=spec.attention, torch_dtype=dtype
    )
    model.train()
    return model, family


def _vocab(model: Any) -> int:
    from validation import step

    config = step._causal_lm(model).config
    return int(config.vocab_size)


def _one_step(model: Any, opt: Any, ids: Any, spec: Any, release: bool, accumulate: int) -> None:
    import torch

    from validation import step

    for _ in range(accumulate):
        ctx = (
            torch.autocast(DEVICE, dtype=torch.bfloat16)
            if spec.precision == "bf16-mixed"
            else contextlib.nullcontext()
        )
        with ctx:
            loss, outputs = step.forward_and_loss(model, ids, spec, lambda: None)
        if release:
            del outputs
        (loss / accumulate if accumulate > 1 else loss).backward()
        del loss
        if not release:
            del outputs
    opt.step()
    opt.zero_grad(set_to_none=True)


def _measured_step(
    model: Any, opt: Any, ids: Any, spec: Any, release: bool, accumulate: int
) -> dict[str, Any]:
    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    started = time.perf_counter()
    _one_step(model, opt, ids, spec, release, accumulate)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    gc.collect()
    stats = torch.cuda.memory_stats()
    return {
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "before_step_bytes": before,
        "after_step_bytes": torch.cuda.memory_allocated(),
        "reserved_after_bytes": torch.cuda.memory_reserved(),
        "alloc_retries": int(stats.get("num_alloc_retries", 0)),
        "seconds": round(seconds, 4),
        "released_outputs": release,
    }


def run_case(case: dict[str, Any], timed: bool = False) -> dict[str, Any]:
    """Measure one case in this process (a fresh one: the allocator starts empty)."""
    _placeholder_fakecuda()
    started = time.perf_counter()
    import torch

    from validation import step

    sys.setrecursionlimit(10_000)
    torch.manual_seed(0)
    spec = step.spec_from_scenario(case["scenario"])
    step.check_spec(spec)
    accumulate = int(case["scenario"]["training"].get("gradient_accumulation_steps", 1))
    torch.cuda.init()
    gc.collect()
    torch.cuda.empty_cache()  # a reused worker: start from an empty allocator
    context_used = torch.cuda.mem_get_info()
    model, _family = _build(spec)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = step._make_optimizer(trainable, spec)
    ids = torch.randint(0, _vocab(model), (spec.batch, spec.seq), device=DEVICE)
    held = spec.outputs_held_through_backward
    order = (False, False, True) if held is None or held else (True, True, False)
    steps = [_measured_step(model, opt, ids, spec, r, accumulate) for r in order]
    smi_process = _smi_process_mib(os.getpid())
    free, total = torch.cuda.mem_get_info()
    record: dict[str, Any] = {
        "id": case["id"],
        "accumulate": accumulate,
        "gpu": {
            **steps[1],
            "first_step_peak_bytes": steps[0]["peak_allocated_bytes"],
            "other_convention": {
                k: steps[2][k] for k in ("peak_allocated_bytes", "peak_reserved_bytes")
            },
            "nvidia_smi_process_mib": smi_process,
            "device_used_after_bytes": total - free,
            "device_used_at_start_bytes": context_used[1] - context_used[0],
            "params_total": sum(p.numel() for p in model.parameters()),
            "params_trainable": sum(p.numel() for p in trainable),
            "optimizer_impl_used": step.optimizer_impl(opt),
        },
    }
    if timed:
        times = [
            _measured_step(model, opt, ids, spec, order[1], accumulate)["seconds"] for _ in range(5)
        ]
        record["gpu"]["step_seconds_median"] = statistics.median(times)
        record["gpu"]["step_seconds"] = times
        record["gpu"]["nvidia_smi_process_mib_after_timing"] = _smi_process_mib(os.getpid())
        record["gpu"]["nvidia_smi_gpu_used_mib"] = _smi_gpu_mib("memory.used")  # alone on the GPU
    record["env"] = {**_env(), "seconds": round(time.perf_counter() - started, 2)}
    del model, opt, ids, trainable
    return record


def _worker(args: tuple[dict[str, Any], bool]) -> dict[str, Any]:
    case, timed = args
    try:
        return run_case(case, timed)
    except Exception:  # report and go on with the other cases
        return {"id": case["id"], "error": traceback.format_exc(limit=8)[-4000:]}


def _accumulated(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For a few traced cases: the same step with 2 and 4 micro-batches per optimizer step."""
    out = []
    for name in ACCUMULATED:
        base = next(
            (c for c in cases if c.get("model_name") == name
             and c["scenario"]["training"]["method"] == "full"
             and c["scenario"]["training"]["activation_checkpointing"] == "none"
             and "stack" not in c["scenario"]["training"]),
            None,
        )  # fmt: skip
        if base is None:
            continue
        for k in (1, 2, 4):
            s = json.loads(json.dumps(base["scenario"]))
            s["training"]["gradient_accumulation_steps"] = k
            out.append({**base, "id": f"{base['id']}_accum{k}", "scenario": s})
    return out


def _whole() -> list[dict[str, Any]]:
    from validation.cases import FAMILY, MODELS, case_id, scenario

    out = []
    for name, method, kw in WHOLE:
        cfg = MODELS[name]
        layers = int(cfg.get("num_hidden_layers", cfg.get("n_layer", 0)))
        s = scenario(name, layers, method=method, **kw)
        out.append({"id": case_id(name, layers, s), "family": FAMILY[name], "model_name": name,
                    "scenario": s})  # fmt: skip
    return out


def _traced_peaks() -> dict[str, int]:
    """Each traced case's peak (bytes), to keep the cases that share the GPU inside it."""
    peaks: dict[str, int] = {}
    for name in ("dataset.json", "dataset_conventions.json"):
        path = ROOT / "tests" / "validation" / name
        if path.exists():
            for rec in json.loads(path.read_text()):
                peaks[rec["id"]] = int(rec["measured"]["peak_allocated_bytes"])
    return peaks


def _need(case: dict[str, Any], peaks: dict[str, int]) -> float:
    """GiB a case is given: its traced peak with room for workspaces and rounding, plus the
    CUDA context; 24 GiB when it was never traced."""
    base = case["id"].split("_accum")[0]
    if base not in peaks:
        return 24.0
    k = int(case["scenario"]["training"].get("gradient_accumulation_steps", 1))
    return peaks[base] / 2**30 * (1.35 if k == 1 else 1.6) + 2.0


def _report(rec: dict[str, Any], started: float) -> None:
    if "error" in rec:
        print(f"FAILED {rec['id']}\n{rec['error']}", flush=True)
        return
    g = rec["gpu"]
    print(
        f"{time.perf_counter() - started:6.0f}s {g['peak_allocated_bytes'] / 2**30:8.3f} "
        f"{g['peak_reserved_bytes'] / 2**30:8.3f} GiB smi {g['nvidia_smi_process_mib']} "
        f"{rec['id']}",
        flush=True,
    )


def _run_part(
    cases: list[dict[str, Any]],
    jobs: int,
    timed: bool,
    cap_gib: float,
    deadline: float,
    sink: Any,
    part: str,
    started: float,
) -> tuple[int, bool]:
    """Run ``cases`` at most ``jobs`` at a time and inside ``cap_gib``; largest first."""
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    peaks = _traced_peaks()
    queue = sorted(cases, key=lambda c: -_need(c, peaks))
    ctx = multiprocessing.get_context("spawn")
    try:
        pool = ProcessPoolExecutor(jobs, mp_context=ctx, max_tasks_per_child=1)
    except TypeError:  # Python before 3.11: workers are reused (the case empties the cache)
        pool = ProcessPoolExecutor(jobs, mp_context=ctx)
    running: dict[Any, tuple[dict[str, Any], float]] = {}
    failed = 0
    with pool:
        while queue or running:
            in_use = sum(need for _, need in running.values())
            for case in list(queue):
                if len(running) >= jobs or time.perf_counter() > deadline:
                    break
                need = min(_need(case, peaks), cap_gib)
                if running and in_use + need > cap_gib:
                    continue
                queue.remove(case)
                running[pool.submit(_worker, (case, timed))] = (case, need)
                in_use += need
            if not running:
                break
            done, _ = wait(running, timeout=max(1.0, deadline - time.perf_counter()),
                           return_when=FIRST_COMPLETED)  # fmt: skip
            if not done:
                print(f"budget spent; {len(running)} running, {len(queue)} not started",
                      flush=True)  # fmt: skip
                for proc in list(getattr(pool, "_processes", {}).values()):
                    proc.kill()
                pool.shutdown(wait=False, cancel_futures=True)
                return failed, False
            for fut in done:
                case, _need_gib = running.pop(fut)
                rec = fut.result()
                rec["part"] = part
                failed += "error" in rec
                _report(rec, started)
                sink.write(json.dumps(rec) + "\n")
                sink.flush()
    return failed, not queue


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--budget", type=float, default=420.0, help="seconds; no case starts after")
    parser.add_argument("--cap", type=float, default=0.0, help="GiB the cases may share "
                        "(default: 85 %% of the GPU)")  # fmt: skip
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--parts", default="1,2,3")
    parser.add_argument("--skip", type=Path, help="a gpu_steps.jsonl whose cases not to run again")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from validation.cases import all_cases
    from validation.cases_conventions import all_cases as conventions_cases

    started = time.perf_counter()
    deadline = started + args.budget
    args.out.mkdir(parents=True, exist_ok=True)
    baseline = _smi_gpu_mib("memory.used")
    total = _smi_gpu_mib("memory.total")
    cap = args.cap or (0.85 * total / 1024 if total else 64.0)
    print(f"nvidia-smi: {baseline} MiB used of {total} MiB before any case; cap {cap:.0f} GiB",
          flush=True)  # fmt: skip
    parts = {p.strip() for p in args.parts.split(",")}
    plan: list[tuple[str, list[dict[str, Any]], int, bool]] = []
    if "3" in parts:  # whole models first, alone: their step times need the GPU to themselves
        plan.append(("whole", _whole(), 1, True))
    if "1" in parts:
        plan.append(("traced", all_cases() + conventions_cases(), args.jobs, False))
    if "2" in parts:
        plan.append(("accumulated", _accumulated(all_cases()), args.jobs, False))
    done: set[str] = set()
    if args.skip and args.skip.exists():
        for line in args.skip.read_text().splitlines():
            rec = json.loads(line)
            if "id" in rec and "error" not in rec:
                done.add(rec["id"])
    failed = 0
    with (args.out / "gpu_steps.jsonl").open("a") as sink:
        meta = {"baseline_used_mib": baseline, "total_mib": total, "started": time.time()}
        sink.write(json.dumps({"meta": meta}) + "\n")
        for part, cases, jobs, timed in plan:
            cases = [c for c in cases if not args.only or any(o in c["id"] for o in args.only)]
            cases = [c for c in cases if c["id"] not in done]
            bad, finished = _run_part(cases, jobs, timed, cap, deadline, sink, part, started)
            failed += bad
            if not finished:
                return 2
    print(f"done in {time.perf_counter() - started:.0f} s; {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

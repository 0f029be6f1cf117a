"""The rates a GPU's kernels really reach, for the step time's cost model.

    python -m validation.measure_kernels --out DIR [--budget 240] [--device cuda]

The step time (:mod:`memfit.engine.steptime`) prices each op of a step from a rate: a
GEMM's share of the matrix peak, the attention kernel's, an element-wise kernel's share of
the memory bandwidth, an FP8 GEMM's and its casts. This runner measures those rates on the
GPU at hand, over the shapes the models in the presets give, and appends one JSON record per
measurement to ``DIR/kernels.jsonl`` as it finishes (a run cut short keeps what it has):

* ``gemm``: a linear layer's three GEMMs (forward ``x W^T``, input gradient ``dy W``,
  weight gradient ``dy^T x``) in bf16 for token counts from 16 to 32,768 and the weight
  shapes of Llama 3 8B, Qwen3-30B-A3B's experts, DeepSeek-V3's experts and others;
* ``grouped_gemm``: ``torch._grouped_mm`` over E experts with the same rows each (the
  MoE expert GEMM of torchtitan and transformers' grouped path), beside E separate GEMMs;
* ``attention``: ``scaled_dot_product_attention`` forward and backward for each backend
  (the default choice, flash, cuDNN, memory-efficient), causal or not, head size 64 or 128,
  sequence 512 to 65,536 at about 64k tokens per call; with the extra memory each call
  allocates beyond its inputs and outputs;
* ``fp8``: ``torch._scaled_mm`` (e4m3) with one scale per tensor and one per row, beside
  bf16 at the same shape, and the casts that feed it (amax, scale, convert);
* ``elementwise``: copies, sums, activations, norms, softmax and the cross-entropy loss,
  forward and backward, with the bytes each moves as counted here;
* ``clocks``: the SM clock, power draw and limit and temperature as ``nvidia-smi`` reads
  them idle and under load.

Each timing is the median of repeated runs between CUDA events after warm-up runs, the
repeats bounded by time. FLOPs count a multiply-add as 2; causal attention counts half the
score matrix; an attention backward counts 2.5 times its forward (Dao 2023).
"""

from __future__ import annotations

# ruff: noqa: B023 -- every closure below is timed at once, inside the iteration it reads
import argparse
import contextlib
import json
import statistics
import subprocess
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

#: (name, K, N): a linear layer's input and output widths
LINEARS: tuple[tuple[str, int, int], ...] = (
    ("llama3-8b qkv", 4096, 6144),
    ("llama3-8b o", 4096, 4096),
    ("llama3-8b gate_up", 4096, 28672),
    ("llama3-8b down", 14336, 4096),
    ("llama3-8b lm_head", 4096, 128256),
    ("qwen3-30b-a3b expert up", 2048, 768),
    ("qwen3-30b-a3b expert down", 768, 2048),
    ("deepseek-v3 expert up", 7168, 2048),
    ("deepseek-v3 expert down", 2048, 7168),
    ("gpt2 mlp", 768, 3072),
    ("llama-3.2-1b o", 2048, 2048),
    ("lora A r16", 4096, 16),
    ("lora B r16", 16, 4096),
    ("tp8 70b qkv shard", 8192, 1280),
    ("tp8 70b down shard", 3584, 8192),
)
TOKENS = (16, 64, 256, 1024, 4096, 16384, 32768)
#: (name, experts, K, N) of the grouped expert GEMMs
EXPERTS: tuple[tuple[str, int, int, int], ...] = (
    ("qwen3-30b-a3b up", 128, 2048, 768),
    ("qwen3-30b-a3b down", 128, 768, 2048),
    ("deepseek-v3 up (ep8)", 32, 7168, 2048),
    ("mixtral-8x7b up", 8, 4096, 14336),
)
ROWS_PER_EXPERT = (16, 64, 256, 1024, 4096)
SEQS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
ATTN_TOKENS = 65536


class Budget:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


class Recorder:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.count = 0

    def __call__(self, kind: str, **fields: Any) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"kind": kind, **fields}) + "\n")
        self.count += 1


def timed(
    fn: Callable[[], Any],
    device: str,
    *,
    warmup: int = 2,
    seconds: float = 0.05,
    max_reps: int = 20,
) -> float:
    """Median seconds of ``fn`` over repeats bounded by ``seconds`` (at least 3)."""
    for _ in range(warmup):
        fn()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    times: list[float] = []
    spent = 0.0
    while len(times) < 3 or (spent < seconds and len(times) < max_reps):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            t = a.elapsed_time(b) / 1e3
        else:
            t0 = time.perf_counter()
            fn()
            t = time.perf_counter() - t0
        times.append(t)
        spent += t
    return statistics.median(times)


def smi(query: str) -> list[str]:
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [w.strip() for w in out.strip().split(",")]


CLOCK_QUERY = "clocks.sm,clocks.mem,clocks.max.sm,power.draw,power.limit,temperature.gpu"


def clocks(rec: Recorder, when: str) -> None:
    values = smi(CLOCK_QUERY)
    rec("clocks", when=when, **dict(zip(CLOCK_QUERY.split(","), values, strict=False)))


def env(rec: Recorder, device: str) -> None:
    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        info |= {
            "gpu": p.name,
            "capability": f"{p.major}.{p.minor}",
            "sms": p.multi_processor_count,
            "total_bytes": p.total_memory,
            "cudnn": torch.backends.cudnn.version(),
        }
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            info["smi"] = subprocess.run(
                ["nvidia-smi", "-q", "-d", "CLOCK,POWER,PERFORMANCE"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout
    rec("env", **info)


def gemms(rec: Recorder, device: str, budget: Budget, scale: int) -> None:
    dt = torch.bfloat16
    for name, k, n in LINEARS:
        k, n = max(1, k // scale), max(1, n // scale)
        w = torch.randn(n, k, device=device, dtype=dt)
        for m in TOKENS:
            m = max(1, m // scale)
            if budget.left() < 0:
                return
            x = torch.randn(m, k, device=device, dtype=dt)
            dy = torch.randn(m, n, device=device, dtype=dt)
            times = {
                "forward": timed(lambda: F.linear(x, w), device),
                "input_grad": timed(lambda: dy @ w, device),
                "weight_grad": timed(lambda: dy.t() @ x, device),
            }
            flops = 2.0 * m * k * n
            rec(
                "gemm",
                name=name,
                m=m,
                k=k,
                n=n,
                flops=flops,
                seconds=times,
                tflops={key: flops / t / 1e12 for key, t in times.items()},
            )


def grouped(rec: Recorder, device: str, budget: Budget, scale: int) -> None:
    dt = torch.bfloat16
    gm = getattr(torch, "_grouped_mm", None)
    for name, e, k, n in EXPERTS:
        k, n = max(8, k // scale), max(8, n // scale)
        w = torch.randn(e, k, n, device=device, dtype=dt)
        for rows in ROWS_PER_EXPERT:
            if budget.left() < 0:
                return
            total = e * rows
            if total * max(k, n) * 2 > 8 << 30:
                continue
            x = torch.randn(total, k, device=device, dtype=dt)
            offs = torch.arange(rows, total + 1, rows, device=device, dtype=torch.int32)
            flops = 2.0 * total * k * n
            out: dict[str, Any] = {}
            if gm is not None and device == "cuda":
                try:
                    out["grouped"] = timed(lambda: gm(x, w, offs=offs), device)
                except Exception as exc:  # a build without the kernel
                    out["grouped_error"] = repr(exc)[:200]
            xs = x.split(rows)

            def loop() -> None:
                for i in range(e):
                    xs[i] @ w[i]

            out["loop"] = timed(loop, device, warmup=1, max_reps=5)
            rec(
                "grouped_gemm",
                name=name,
                experts=e,
                rows_per_expert=rows,
                k=k,
                n=n,
                flops=flops,
                seconds=out,
                tflops={key: flops / t / 1e12 for key, t in out.items() if isinstance(t, float)},
            )


def attention(rec: Recorder, device: str, budget: Budget, scale: int) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends: dict[str, Any] = {
        "default": None,
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    hidden = 4096 // scale
    for d in (128, 64):
        d = max(8, d // scale)
        heads = max(1, hidden // d)
        for causal in (True, False):
            for backend, choice in backends.items():
                if backend == "efficient" and (d != 128 // scale or not causal):
                    continue
                for s in SEQS:
                    s = max(8, s // scale)
                    if budget.left() < 0:
                        return
                    b = max(1, ATTN_TOKENS // scale // s)
                    case = {"backend": backend, "head_dim": d, "heads": heads, "seq": s,
                            "batch": b, "causal": causal}  # fmt: skip
                    q, k, v = (
                        torch.randn(b, heads, s, d, device=device, dtype=dt, requires_grad=True)
                        for _ in range(3)
                    )
                    ctx = sdpa_kernel(choice) if choice is not None else _null()
                    try:
                        with ctx:
                            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            g = torch.randn_like(o)
                            fwd = timed(
                                lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                device,
                                warmup=1,
                                seconds=0.2,
                            )
                            extra = None
                            if device == "cuda":
                                torch.cuda.synchronize()
                                base = torch.cuda.memory_allocated()
                                torch.cuda.reset_peak_memory_stats()
                                o2 = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                                o2.backward(g)
                                torch.cuda.synchronize()
                                extra = torch.cuda.max_memory_allocated() - base
                            bwd_plus = timed(
                                lambda: F.scaled_dot_product_attention(
                                    q, k, v, is_causal=causal
                                ).backward(g),
                                device,
                                warmup=1,
                                seconds=0.3,
                            )
                    except Exception as exc:  # a backend refusing the shape
                        rec("attention", **case, error=repr(exc)[:300])
                        continue
                    finally:
                        q.grad = k.grad = v.grad = None
                    flops = 4.0 * b * heads * s * s * d * (0.5 if causal else 1.0)
                    bwd = max(bwd_plus - fwd, 1e-9)
                    rec(
                        "attention",
                        **case,
                        forward_flops=flops,
                        seconds={"forward": fwd, "backward": bwd, "forward_backward": bwd_plus},
                        tflops={
                            "forward": flops / fwd / 1e12,
                            "backward": 2.5 * flops / bwd / 1e12,
                        },
                        extra_bytes=extra,
                    )


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def fp8(rec: Recorder, device: str, budget: Budget) -> None:
    if device != "cuda":
        return
    e4 = torch.float8_e4m3fn
    for m, k, n in (
        (8192, 8192, 8192),
        (16384, 4096, 14336),
        (16384, 14336, 4096),
        (4096, 4096, 4096),
        (16384, 4096, 4096),
        (1024, 4096, 4096),
    ):
        if budget.left() < 0:
            return
        a16 = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b16 = torch.randn(n, k, device=device, dtype=torch.bfloat16)
        a8, b8 = a16.to(e4), b16.to(e4)
        flops = 2.0 * m * k * n
        out: dict[str, Any] = {"bf16": timed(lambda: a16 @ b16.t(), device)}
        one = torch.ones((), device=device, dtype=torch.float32)
        try:
            out["tensorwise"] = timed(
                lambda: torch._scaled_mm(
                    a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16
                ),
                device,
            )
        except Exception as exc:
            out["tensorwise_error"] = repr(exc)[:300]
        try:
            sa = torch.ones(m, 1, device=device, dtype=torch.float32)
            sb = torch.ones(1, n, device=device, dtype=torch.float32)
            out["rowwise"] = timed(
                lambda: torch._scaled_mm(
                    a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16
                ),
                device,
            )
        except Exception as exc:
            out["rowwise_error"] = repr(exc)[:300]

        def cast_tensorwise() -> None:
            s = 448.0 / a16.abs().amax().float().clamp(min=1e-12)
            (a16.float() * s).to(e4)

        def cast_rowwise() -> None:
            s = 448.0 / a16.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
            (a16.float() * s).to(e4)

        out["cast_tensorwise"] = timed(cast_tensorwise, device)
        out["cast_rowwise"] = timed(cast_rowwise, device)
        rec(
            "fp8",
            m=m,
            k=k,
            n=n,
            flops=flops,
            seconds=out,
            cast_elements=m * k,
            tflops={
                key: flops / t / 1e12
                for key, t in out.items()
                if isinstance(t, float) and not key.startswith("cast")
            },
        )


def elementwise(rec: Recorder, device: str, budget: Budget, scale: int) -> None:
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    size = dt.itemsize if hasattr(dt, "itemsize") else 2
    for tokens, width in ((16384, 4096), (16384, 14336), (4096, 4096), (65536, 2048)):
        tokens, width = max(1, tokens // scale), max(8, width // scale)
        if budget.left() < 0:
            return
        el = tokens * width
        x = torch.randn(tokens, width, device=device, dtype=dt)
        y = torch.randn(tokens, width, device=device, dtype=dt)
        w = torch.randn(width, device=device, dtype=dt)
        xg = x.clone().requires_grad_(True)
        g = torch.randn_like(x)
        cases: dict[str, tuple[Callable[[], Any], float]] = {
            "copy": (lambda: x.clone(), 2 * el * size),
            "add": (lambda: x + y, 3 * el * size),
            "silu_mul": (lambda: F.silu(x) * y, 4 * el * size),
            "gelu_tanh": (lambda: F.gelu(x, approximate="tanh"), 2 * el * size),
            "to_fp32": (lambda: x.float(), el * (size + 4)),
            "rms_norm": (lambda: F.rms_norm(x, (width,), w), 2 * el * size),
            "layer_norm": (lambda: F.layer_norm(x, (width,), w), 2 * el * size),
            "softmax": (lambda: torch.softmax(x, -1), 2 * el * size),
            "rms_norm_fwd_bwd": (lambda: F.rms_norm(xg, (width,), w).backward(g), 5 * el * size),
            "silu_fwd_bwd": (lambda: F.silu(xg).backward(g), 5 * el * size),
            "dropout": (lambda: F.dropout(x, 0.1), 2 * el * size + el),
        }
        for name, (fn, nbytes) in cases.items():
            try:
                t = timed(fn, device)
            except Exception as exc:
                rec("elementwise", op=name, tokens=tokens, width=width, error=repr(exc)[:200])
                continue
            finally:
                xg.grad = None
            rec(
                "elementwise",
                op=name,
                tokens=tokens,
                width=width,
                bytes=nbytes,
                seconds=t,
                gb_s=nbytes / t / 1e9,
            )
    for tokens, vocab in ((8192, 128256), (16384, 32000), (4096, 151936)):
        tokens, vocab = max(1, tokens // scale), max(8, vocab // scale)
        if budget.left() < 0:
            return
        logits = torch.randn(tokens, vocab, device=device, dtype=dt, requires_grad=True)
        labels = torch.randint(0, vocab, (tokens,), device=device)
        for name, fn in {
            "cross_entropy_upcast": lambda: F.cross_entropy(logits.float(), labels).backward(),
            "cross_entropy": lambda: F.cross_entropy(logits, labels).backward(),
        }.items():
            t = timed(fn, device)
            logits.grad = None
            rec(
                "loss",
                op=name,
                tokens=tokens,
                vocab=vocab,
                seconds=t,
                logits_bytes=tokens * vocab * size,
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget", type=float, default=240.0, help="seconds for all sections")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--scale", type=int, default=1, help="divide every size (a smoke test)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rec = Recorder(args.out / "kernels.jsonl")
    env(rec, args.device)
    if args.device == "cuda":
        clocks(rec, "idle")
    # each section gets a share of what is left, so a slow one cannot starve the rest
    sections: list[tuple[str, Callable[[Budget], None], float]] = [
        ("gemm", lambda b: gemms(rec, args.device, b, args.scale), 0.2),
        ("grouped_gemm", lambda b: grouped(rec, args.device, b, args.scale), 0.15),
        ("fp8", lambda b: fp8(rec, args.device, b), 0.1),
        ("elementwise", lambda b: elementwise(rec, args.device, b, args.scale), 0.1),
        ("attention", lambda b: attention(rec, args.device, b, args.scale), 0.45),
    ]
    total = Budget(args.budget)
    for name, run, share in sections:
        t0 = time.monotonic()
        try:
            run(Budget(max(5.0, share * args.budget, 0.0)))
        except Exception:  # keep the other sections' figures
            rec("section_error", section=name, error=traceback.format_exc()[-2000:])
        rec("section", section=name, seconds=time.monotonic() - t0)
        if args.device == "cuda":
            clocks(rec, f"after {name}")
            torch.cuda.empty_cache()
        if total.left() < -30:
            break
    print(f"{rec.count} records in {args.out / 'kernels.jsonl'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How much a weight's gradient takes in backward when the weight is used several times:
a bf16 weight (FSDP's parameter dtype) and an fp32 weight under autocast (its bf16 cast
copy cached and used by every use), used once, twice and eight times, as the LM head of a
loss over chunks of the output uses it. Real CPU tensors, counted by
:class:`validation.tracker.StorageTracker`.

Prints each backward's peak above what the forward left, in units of the weight's bf16
size. With torch 2.13: the bf16 weight used once 0.9 (its gradient), two or eight times
2.9-3.0 (the sum so far, the new part and their sum: autograd sums out of place); the
fp32 weight under autocast 2.9-3.0 however many times (the cast copy's bf16 gradient and
the fp32 one it becomes). ``engine.layers`` models both
(``Net._regrade``; ``Net.linear``'s autocast copy, whose gradient every use sums into),
which the sharding invariant's bound relies on (``tests/engine/invariants.py``).

Run: ``VENV/bin/python -m validation.summed_gradients`` (see README.md for VENV).
"""

from __future__ import annotations

import contextlib

import torch

from validation.tracker import StorageTracker

VOCAB, HIDDEN, TOKENS = 4096, 1024, 64


def backward_over(mode: str, uses: int) -> float:
    """The backward's peak above the forward's end, in units of the weight's bf16 size."""
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    x = torch.randn(TOKENS, HIDDEN, dtype=dtype)
    w = torch.randn(VOCAB, HIDDEN, dtype=dtype, requires_grad=True)
    y = torch.randint(0, VOCAB, (TOKENS,))
    tracker = StorageTracker("cpu", 1)
    region = torch.autocast("cpu", dtype=torch.bfloat16) if mode == "autocast" else None
    with tracker:
        tracker.adopt([x, w, y])
        with region or contextlib.nullcontext():
            loss = sum(
                torch.nn.functional.cross_entropy(
                    torch.nn.functional.linear(xc, w).float(), yc, reduction="sum"
                )
                for xc, yc in zip(x.chunk(uses), y.chunk(uses), strict=True)
            )
        before = tracker.raw
        tracker.reset_peaks()
        loss.backward()
        peak = tracker.peak.raw
    return (peak - before) / (VOCAB * HIDDEN * 2)


def main() -> None:
    torch.manual_seed(0)
    for mode in ("bf16", "autocast"):
        for uses in (1, 2, 8):
            over = backward_over(mode, uses)
            print(f"{mode:>9} weight, used {uses}x: backward {over:.2f} x its bf16 size")


if __name__ == "__main__":
    main()

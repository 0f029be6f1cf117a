"""``scaled_dot_product_attention`` as it dispatches on a CUDA GPU, for fake CUDA tensors.

On a real GPU, ``aten::scaled_dot_product_attention`` asks ``_fused_sdp_choice`` (the CUDA
``select_sdp_backend`` in ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``) which
kernel to run and then calls that kernel's operator. A CPU-only build has no CUDA entry for
that choice, so fake CUDA tensors would always take the math fallback, which materializes
the ``s x s`` scores. :func:`scaled_dot_product_attention` re-implements the choice for one
GPU (an H100, sm90, by default) and calls the chosen operator --
``_scaled_dot_product_cudnn_attention``, ``_scaled_dot_product_flash_attention`` or
``_scaled_dot_product_efficient_attention`` -- whose autograd formula then saves exactly
what the real kernel saves:

* cuDNN and flash: ``q, k, v``, the output and the log-sum-exp (fp32, ``b x h x s``;
  cuDNN's has a trailing 1), plus CPU-side RNG seed/offset;
* memory-efficient: the same, with the log-sum-exp padded to a multiple of 32 along the
  sequence, and the (padded, expanded) mask when there is one;
* math: every intermediate (scores, softmax in fp32 for 16-bit inputs, ...).

The checks follow ``sdp_utils.cpp``: cuDNN and flash need fp16/bf16; flash refuses any
``attn_mask`` and ``head_dim > 256``; cuDNN accepts a mask, needs ``head_dim <= 128`` (256
with cuDNN > 9.22 on sm90) and a multiple of 8; memory-efficient takes fp32 too and needs
``head_dim`` divisible by 4 (fp32) or 8 (16-bit). Under CUDA autocast the function casts
its floating inputs to the autocast dtype first, as the autocast kernel registered for
``scaled_dot_product_attention`` does.

Kernel-internal scratch memory (flash's fp32 ``dq`` accumulator, cuDNN's workspace) is
allocated inside the CUDA kernels and is not visible here; see the README.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

BACKENDS = ("cudnn", "flash", "efficient", "math")


@dataclass
class GpuProfile:
    """What the kernel choice depends on: compute capability and cuDNN version."""

    name: str = "h100-sxm"
    major: int = 9
    minor: int = 0
    #: cuDNN runtime version as PyTorch encodes it (9.20.0 -> 92000). The torch 2.13.0
    #: CUDA 13 wheels require nvidia-cudnn-cu13 9.20.
    cudnn_version: int = 92000
    cudnn_frontend_supports_d256: bool = True
    #: ``check_prefer_cudnn_attention``: cuDNN > 9.15 on sm90/sm100 puts cuDNN first
    order: tuple[str, ...] = field(default=())

    def priority(self) -> tuple[str, ...]:
        if self.order:
            return self.order
        if self.cudnn_version > 91500 and self.major in (9, 10):
            return ("cudnn", "flash", "efficient", "math")
        return ("flash", "efficient", "math", "cudnn")


@dataclass
class KernelLog:
    calls: list[str] = field(default_factory=list)

    def distinct(self) -> list[str]:
        return sorted(set(self.calls))


_ACTIVE: dict[str, Any] = {"profile": None, "log": None}
_original_sdpa = F.scaled_dot_product_attention


def _dense_common(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return False
    if q.size(0) != k.size(0) or q.size(0) != v.size(0):
        return False
    return not (q.size(2) == 0 or k.size(2) == 0)


def _heads_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enable_gqa: bool) -> bool:
    hq, hk, hv = q.size(1), k.size(1), v.size(1)
    if enable_gqa:
        return hk == hv and hq % hk == 0
    return hq == hk == hv


def _last_dim_stride_one(*ts: torch.Tensor, ignore_singleton: bool) -> bool:
    return all(t.stride(-1) == 1 or (ignore_singleton and t.size(-1) == 1) for t in ts)


def can_use_cudnn(p: GpuProfile, q, k, v, mask, dropout_p, is_causal, enable_gqa) -> bool:  # type: ignore[no-untyped-def]
    if q.dtype not in (torch.float16, torch.bfloat16) or not _dense_common(q, k, v):
        return False
    if dropout_p * 16.0 != math.floor(dropout_p * 16.0):
        return False
    if not ((8, 0) <= (p.major, p.minor) <= (12, 1)):
        return False
    if not _last_dim_stride_one(q, k, v, ignore_singleton=True):
        return False
    hq, hk, hv = q.size(1), k.size(1), v.size(1)
    if enable_gqa:
        if hq % hk or hq % hv:
            return False
    elif not hq == hk == hv:
        return False
    if q.size(0) > 65535 or hq > 65535:
        return False
    d_qk, d_v = q.size(3), v.size(3)
    sm90_or_10x = (p.major == 9 and p.minor == 0) or p.major == 10
    supports_d256 = sm90_or_10x and p.cudnn_version > 92200 and p.cudnn_frontend_supports_d256
    limit = 256 if supports_d256 else 128
    if not supports_d256 and sm90_or_10x and p.cudnn_version >= 91100 and d_qk == 192:
        limit = 192 if d_v == 128 else 128
    if d_qk > limit or d_v > limit or d_qk % 8 or d_v % 8:
        return False
    if k.size(2) == 1:
        return False
    return not (
        supports_d256
        and q.requires_grad | k.requires_grad | v.requires_grad
        and not ((d_qk <= 128 and d_v <= 128) or (d_qk, d_v) in ((192, 128), (256, 256)))
    )


def can_use_flash(p: GpuProfile, q, k, v, mask, dropout_p, is_causal, enable_gqa) -> bool:  # type: ignore[no-untyped-def]
    if mask is not None or not _dense_common(q, k, v):
        return False
    if q.dtype not in (torch.float16, torch.bfloat16):
        return False
    d = q.size(-1)
    if not (d == k.size(-1) == v.size(-1)) or d > 256:
        return False
    if not ((8, 0) <= (p.major, p.minor) <= (12, 1)):
        return False
    if is_causal and q.size(2) != k.size(2):
        return False
    if not _heads_ok(q, k, v, enable_gqa):
        return False
    return _last_dim_stride_one(q, k, v, ignore_singleton=True)


def can_use_efficient(p: GpuProfile, q, k, v, mask, dropout_p, is_causal, enable_gqa) -> bool:  # type: ignore[no-untyped-def]
    if not _dense_common(q, k, v):
        return False
    allowed = (
        (torch.float16, torch.float32, torch.bfloat16)
        if p.major >= 8
        else (
            torch.float16,
            torch.float32,
        )
    )
    if q.dtype not in allowed:
        return False
    half = q.dtype in (torch.float16, torch.bfloat16)
    align = max(4, 8 if half else 4) if p.major >= 8 else (8 if half else 1)
    if q.size(-1) != k.size(-1) or q.size(-1) % align or v.size(-1) % align:
        return False
    nbytes = q.element_size() * align
    for t in (q, k, v):
        if (t.storage_offset() * t.element_size()) % nbytes:
            return False
    if not _heads_ok(q, k, v, enable_gqa):
        return False
    return _last_dim_stride_one(q, k, v, ignore_singleton=False)


_CHECKS = {"cudnn": can_use_cudnn, "flash": can_use_flash, "efficient": can_use_efficient}


def choose(p: GpuProfile, q, k, v, mask, dropout_p, is_causal, enable_gqa) -> str:  # type: ignore[no-untyped-def]
    for backend in p.priority():
        if backend == "math":
            return "math"
        if _CHECKS[backend](p, q, k, v, mask, dropout_p, is_causal, enable_gqa):
            return backend
    return "math"


def _bool_mask_to_float(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """``convert_boolean_attn_mask``: True keeps a position, False adds -inf."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    zero = torch.scalar_tensor(0.0, dtype=dtype, device=mask.device)
    ninf = torch.scalar_tensor(-math.inf, dtype=dtype, device=mask.device)
    return torch.where(mask.logical_not(), ninf, zero)


def _pad_mask_for_efficient(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``preprocess_mask``: pad the last dim to a multiple of 16, expand to b x h x L x S."""
    target = (q.size(0), q.size(1), q.size(2), k.size(2))
    last = mask.size(-1)
    if last % 16:
        pad = 16 - last % 16
        mask = F.pad(mask, (0, pad))[..., :last]
    return mask.expand(target)


def scaled_dot_product_attention(  # type: ignore[no-untyped-def]
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
):
    profile: GpuProfile | None = _ACTIVE["profile"]
    if profile is None or query.device.type != "cuda":
        return _original_sdpa(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )
    autocast = torch.is_autocast_enabled("cuda")
    if autocast:
        low = torch.get_autocast_dtype("cuda")

        def cast(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None or not t.is_floating_point() or t.dtype == low:
                return t
            return t.to(low)

        query, key, value, attn_mask = cast(query), cast(key), cast(value), cast(attn_mask)
    ctx = torch.autocast("cuda", enabled=False) if autocast else contextlib.nullcontext()
    with ctx:
        backend = choose(profile, query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
        log: KernelLog | None = _ACTIVE["log"]
        if log is not None:
            tags = ("+mask" if attn_mask is not None else "") + ("+gqa" if enable_gqa else "")
            log.calls.append(backend + tags)
        grad = torch.is_grad_enabled() and (
            query.requires_grad or key.requires_grad or value.requires_grad
        )
        if backend == "cudnn":
            mask = _bool_mask_to_float(attn_mask, query.dtype)
            return torch.ops.aten._scaled_dot_product_cudnn_attention(
                query, key, value, mask, grad, dropout_p, is_causal, False, scale=scale
            )[0]
        if backend == "flash":
            d = query.size(-1)
            og_scale = scale if scale is not None else 1.0 / math.sqrt(d)
            if d % 8:
                pad = 8 - d % 8
                query, key, value = (F.pad(t, (0, pad)) for t in (query, key, value))
            out = torch.ops.aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=og_scale
            )[0]
            return out[..., :d] if d % 8 else out
        if backend == "efficient":
            mask = _bool_mask_to_float(attn_mask, query.dtype)
            if mask is not None:
                mask = _pad_mask_for_efficient(mask, query, key)
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                query, key, value, mask, grad, dropout_p, is_causal, scale=scale
            )[0]
        return _original_sdpa(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )


@contextlib.contextmanager
def cuda_sdpa(profile: GpuProfile | None = None, log: KernelLog | None = None) -> Iterator[None]:
    """Route ``F.scaled_dot_product_attention`` on CUDA tensors through :func:`choose`."""
    saved = dict(_ACTIVE)
    _ACTIVE["profile"] = profile or GpuProfile()
    _ACTIVE["log"] = log
    F.scaled_dot_product_attention = scaled_dot_product_attention
    try:
        yield
    finally:
        F.scaled_dot_product_attention = _original_sdpa
        _ACTIVE.update(saved)


def parse_order(text: str) -> tuple[str, ...]:
    order: Sequence[str] = [s.strip() for s in text.split(",") if s.strip()]
    for name in order:
        if name not in BACKENDS:
            raise ValueError(f"unknown SDPA backend {name!r}; expected {', '.join(BACKENDS)}")
    return tuple(order)

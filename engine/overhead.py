"""From allocated to reserved to device bytes: the caching allocator and the CUDA context.

* **allocated** is what live tensors take (``torch.cuda.max_memory_allocated``);
* **reserved** adds what PyTorch's caching allocator holds but no tensor uses
  (``max_memory_reserved``). Requests are rounded up to 512 bytes; blocks over 1 MiB come
  from segments rounded up to 2 MiB (requests of 1-10 MiB share 20 MiB segments); and
  freed blocks are reused only by requests that fit them, so a step that allocates and
  frees activations of many sizes leaves free gaps (fragmentation)
  (``c10/cuda/CUDACachingAllocator.cpp``: ``kRoundLarge``, ``kLargeBuffer``);
* **device** adds what ``nvidia-smi`` shows beyond PyTorch's pool: the CUDA context
  (driver state and the loaded kernels; CUDA 12's lazy module loading keeps it to a few
  hundred MiB) and the cuBLAS/cuBLASLt workspace.

The figures below are documented estimates, not measurements of your machine: the
context ranges from about 250 MiB to about 600 MiB by GPU generation, driver and the
libraries a program loads; fragmentation grows with the number of distinct activation
sizes. The classic advice to plan for 80-85 % of the card and to expect 10-20 % above a
floor estimate comes out of these terms plus the transient peaks of :mod:`memfit.engine.timeline`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

MIB = 1 << 20

#: CUDA context of a PyTorch process by GPU architecture, MiB (CUDA 12, lazy loading).
CONTEXT_MIB = {
    "volta": 310,
    "turing": 310,
    "ampere": 430,
    "ada": 430,
    "hopper": 520,
    "blackwell": 560,
    "cdna2": 300,
    "cdna3": 300,
    "cdna4": 300,
}
DEFAULT_CONTEXT_MIB = 450
#: what eager module loading adds to the context, MiB: every kernel of PyTorch's CUDA
#: libraries is loaded at start instead of on first use. CUDA's lazy loading (opt-in from
#: 11.7, the default from 12.2: ``CUDA_MODULE_LOADING``) exists for this saving; nvidia-smi
#: tables of CUDA 11 stacks show contexts of 1-1.5 GiB where lazy ones show 0.3-0.6 GiB
#: (CUDA C++ Programming Guide, "Lazy Loading"). An estimate of the middle of that range.
EAGER_MODULES_MIB = {"cuda12-lazy": 0, "cuda12-eager": 600, "cuda11-eager": 800}
#: cuBLAS workspace: CUBLAS_WORKSPACE_CONFIG's default ":4096:8" is 8 x 4 MiB per handle;
#: Hopper's cuBLASLt takes 32 MiB more.
CUBLAS_MIB = {"hopper": 64, "blackwell": 64}
DEFAULT_CUBLAS_MIB = 32
#: share of the step's peak activations lost to fragmentation (free gaps in the pool)
FRAGMENTATION = 0.05
#: average rounding of one live block over 1 MiB to a 2 MiB multiple
ROUNDING_PER_LARGE_BLOCK = MIB


#: GPU memory of one NCCL collective communicator by architecture, MiB (see nccl_bytes)
NCCL_COMMUNICATOR_MIB = {"hopper": 1024, "blackwell": 1024}
DEFAULT_NCCL_COMMUNICATOR_MIB = 640
#: a point-to-point communicator (one pipeline send/receive pair): one shared buffer set
NCCL_P2P_MIB = 256


@dataclass(frozen=True, slots=True)
class Communicator:
    """One NCCL communicator a rank belongs to: its process group and how many ranks it
    spans; ``point_to_point`` for a pipeline send/receive pair."""

    name: str
    ranks: int
    point_to_point: bool = False


def nccl_bytes(communicators: Iterable[Communicator], architecture: str) -> int:
    """GPU memory NCCL takes for the communicators of one rank (outside PyTorch's pool:
    it counts towards nvidia-smi, not ``max_memory_reserved``).

    PyTorch creates one communicator per process group, lazily at its first collective,
    and one more per pipeline send/receive pair (``ProcessGroupNCCL::pointToPoint``).
    NCCL gives every channel of a ring or tree its own buffer per protocol -- Simple
    ``NCCL_BUFFSIZE`` = 4 MiB, LL128 4.69 MiB, LL 512 KiB (``src/include/device.h``) --
    and opens 16-32 channels on NVLink; send/receive share one buffer set. Measured:
    544-688 MB per communicator on 4 x A100 (NVIDIA/nccl issue 964); on H100/H200 NVLink
    SHARP adds 256 MiB to 2.25 GiB per GPU (``nvls.cc``; vllm issue 9699), vLLM reports
    about 1 GiB per rank at tp 4 and Megatron tp2 pp2 dp2 frees about 7 GB per rank when
    its communicators are suspended (verl PR 6408). The figures here are typical values
    from those reports, not a measurement of your fabric; ``NCCL_BUFFSIZE``,
    ``NCCL_MAX_NCHANNELS`` and ``NCCL_NVLS_ENABLE`` move them.
    """
    collective = NCCL_COMMUNICATOR_MIB.get(architecture, DEFAULT_NCCL_COMMUNICATOR_MIB)
    total = 0
    for comm in communicators:
        if comm.ranks > 1:
            total += (NCCL_P2P_MIB if comm.point_to_point else collective) * MIB
    return total


def fragmentation(peak_activations: Any) -> Any:
    """The allocator's free gaps at the step's peak: :data:`FRAGMENTATION` of the peak
    activations, in whole bytes -- of one peak (an int), or of many at once (an int64 array:
    the batched path), to the same bytes."""
    if isinstance(peak_activations, np.ndarray):
        return (peak_activations.astype(np.float64) * FRAGMENTATION).astype(np.int64)
    return int(peak_activations * FRAGMENTATION)


@dataclass(frozen=True, slots=True)
class Overhead:
    rounding: int
    fragmentation: int
    context: int
    workspace: int

    @property
    def reserved_extra(self) -> int:
        return self.rounding + self.fragmentation

    @property
    def device_extra(self) -> int:
        return self.context + self.workspace


def overhead(
    architecture: str, large_blocks: int, peak_activations: int, runtime: str = "cuda12-lazy"
) -> Overhead:
    """The terms that lift allocated to reserved and reserved to device bytes; ``runtime``
    is the CUDA runtime's module loading (:data:`memfit.engine.specs.CUDA_RUNTIMES`)."""
    context = CONTEXT_MIB.get(architecture, DEFAULT_CONTEXT_MIB) + EAGER_MODULES_MIB[runtime]
    return Overhead(
        rounding=large_blocks * ROUNDING_PER_LARGE_BLOCK,
        fragmentation=fragmentation(peak_activations),
        context=context * MIB,
        workspace=CUBLAS_MIB.get(architecture, DEFAULT_CUBLAS_MIB) * MIB,
    )

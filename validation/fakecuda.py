"""Fake CUDA on a CPU-only PyTorch build: tensors that say ``device="cuda"`` and cost nothing.

``FakeTensorMode`` already creates tensors whose device reads ``cuda:0`` while their data is
``meta`` (shape, dtype and strides only), and composite operators, autocast and the
optimizers branch on that device exactly as on a GPU. On a CPU-only build four things still
stop a training step on them:

1. autograd asks the CUDA *device guard* for the current stream of every CUDA tensor that
   gets a gradient edge; a CPU-only build registers no CUDA guard, and the process aborts
   (``torch._C._ensureCUDADeviceGuardSet``, which ``FakeTensorMode`` calls, fills the slot
   only on CUDA builds without devices);
2. the autograd engine asks ``at::accelerator::getCurrentStream`` for the stream of every
   gradient on an accelerator device, which needs ``at::hasCUDA()`` to be true;
3. ``Tensor.to(...)``/``Tensor.cuda()`` initialize CUDA in the Python binding before
   dispatch;
4. ``torch.autocast("cuda")`` disables itself when no CUDA device is present.

For 1 and 2 a small C++ library is compiled against the installed torch headers (once,
cached in the temp folder): a device guard with one device and one stream whose events are
no-ops, and a ``CUDAHooks`` entry in ATen's hooks registry whose ``hasCUDA()`` answers yes
only while :func:`installed` is active. ATen creates its hooks object on first use, during
``import torch``, so this module must be imported *before* torch (it raises otherwise).
For 3, ``Tensor.to``/``Tensor.cuda`` are replaced by the same argument parsing followed by
``aten._to_copy``, which is what the binding calls. For 4, the two availability checks
``torch.autocast`` consults answer yes, so the real ``torch.autocast`` -- the CUDA autocast
dispatch key, its op lists and its weight-cast cache -- is used, also when activation
checkpointing re-enters autocast during recomputation.

A fifth difference changes the count, not whether the step runs: an operator that has a
CUDA kernel *and* a CompositeImplicitAutograd formula is decomposed into that formula on
a CPU-only build (there is no CUDA kernel to take precedence), so its intermediate tensors,
which a GPU never allocates, would pass the tracker. :data:`FUSED_ON_CUDA` lists those met
in a training step; from the first :func:`installed` on, each has a stand-in CUDA kernel
registered for the process, which fake tensors never run (``FakeTensorMode`` handles the
call, below the tracker), so the operator reaches the tracker whole and only its output is
counted, as on a GPU. ``silu_backward``'s formula keeps five temporaries the size of its input.

Activation checkpointing stashes the CUDA RNG state (a small CPU tensor on a real run);
without a CUDA runtime that call fails, so the stash is left empty, which changes no device
memory. Random initialization on fake CUDA tensors is decomposed through a CUDA generator
that does not exist; :class:`FakeInit` turns it into a no-op (fake tensors have no values).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_SOURCE = r"""
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <atomic>
namespace {
using namespace c10;
std::atomic<bool> g_on{false};

// One CUDA device with one stream; events are no-ops. Enough for autograd's bookkeeping
// on fake tensors, which never launch a kernel.
struct FakeCudaGuard final : public c10::impl::DeviceGuardImplInterface {
  DeviceType type() const override { return DeviceType::CUDA; }
  Device exchangeDevice(Device d) const override {
    Device old = getDevice(); cur_ = d.index(); return old; }
  Device getDevice() const override { return Device(DeviceType::CUDA, cur_); }
  void setDevice(Device d) const override { cur_ = d.index(); }
  void uncheckedSetDevice(Device d) const noexcept override { cur_ = d.index(); }
  Stream getStream(Device d) const noexcept override { return Stream(Stream::UNSAFE, d, 0); }
  Stream exchangeStream(Stream s) const noexcept override {
    return Stream(Stream::UNSAFE, s.device(), 0); }
  DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void**, const Stream&, const DeviceIndex, const EventFlag) const override {}
  void block(void*, const Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const DeviceIndex) const noexcept override {}
  static thread_local DeviceIndex cur_;
};
thread_local DeviceIndex FakeCudaGuard::cur_ = 0;

// "CUDA is there" while switched on; nothing in it touches a device.
struct FakeCUDAHooks final : public at::CUDAHooksInterface {
  explicit FakeCUDAHooks(at::CUDAHooksArgs) {}
  bool hasCUDA() const override { return g_on.load(); }
  bool isBuilt() const override { return g_on.load(); }
  bool isAvailable() const override { return g_on.load(); }
  bool hasPrimaryContext(DeviceIndex) const override { return false; }
  void init() const override {}
  DeviceIndex deviceCount() const override { return g_on.load() ? 1 : 0; }
  int getNumGPUs() const override { return g_on.load() ? 1 : 0; }
  DeviceIndex current_device() const override { return 0; }
  DeviceIndex getCurrentDevice() const override { return 0; }
};
}  // namespace
namespace at {
C10_REGISTER_TYPED_CLASS(CUDAHooksRegistry, "CUDAHooks", FakeCUDAHooks)
}
extern "C" void memfit_fake_cuda_set(int on) {
  static FakeCudaGuard guard;
  static bool registered = false;
  if (on && !registered) {
    c10::impl::DeviceGuardImplRegistrar registrar(c10::DeviceType::CUDA, &guard);
    registered = true;
  }
  g_on.store(on != 0);
}
"""

_STATE: dict[str, Any] = {"lib": None, "depth": 0, "saved": None}


def _torch_dir() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("torch is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def _build() -> Path:
    """Compile the library once per torch installation; return its path."""
    torch_dir = _torch_dir()
    version = (torch_dir / "version.py").read_text(errors="replace")
    key = hashlib.sha256((_SOURCE + version + str(torch_dir) + sys.version).encode()).hexdigest()
    out = Path(tempfile.gettempdir()) / f"memfit-fake-cuda-{key[:16]}.so"
    if out.exists():
        return out
    src = out.with_suffix(".cpp")
    src.write_text(_SOURCE)
    # the C++ ABI torch was built with shows in its mangled names
    abi = int(b"St7__cxx11" in (torch_dir / "lib" / "libc10.so").read_bytes())
    cxx = (os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "g++").split()[0]
    tmp = f"{out}.{os.getpid()}.tmp"
    cmd = [
        cxx, "-O1", "-shared", "-fPIC", "-std=c++20", "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-I{torch_dir / 'include'}",
        str(src),
        f"-L{torch_dir / 'lib'}", "-lc10", "-ltorch_cpu",
        f"-Wl,-rpath,{torch_dir / 'lib'}",
        "-o", tmp,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"building the fake CUDA library failed:\n{done.stderr[-4000:]}")
    os.replace(tmp, out)
    return out


def _preload() -> None:
    if "torch" in sys.modules:
        return  # too late for the hooks; installed() explains
    _STATE["lib"] = ctypes.CDLL(str(_build()), mode=ctypes.RTLD_GLOBAL)


_preload()

import torch  # noqa: E402  (after the hooks are registered)
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

_orig_to = torch.Tensor.to
_orig_cuda = torch.Tensor.cuda


def _to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    copy = bool(kwargs.pop("copy", False))
    device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    involves_cuda = self.device.type == "cuda" or (device is not None and device.type == "cuda")
    if not involves_cuda:
        return _orig_to(self, *args, copy=copy, **kwargs)
    if device is not None and device.index is None:
        device = torch.device(device.type, 0)
    unchanged = (
        (device is None or device == self.device)
        and (dtype is None or dtype == self.dtype)
        and memory_format is None
    )
    if unchanged and not copy:
        return self
    return torch.ops.aten._to_copy(
        self,
        dtype=dtype,
        device=device,
        non_blocking=non_blocking,
        memory_format=memory_format,
    )


def _cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False, **_: Any) -> Any:
    target = torch.device("cuda", 0) if device is None else torch.device(device)
    if target.type != "cuda":
        target = torch.device("cuda", int(device))
    return _to(self, target, non_blocking=non_blocking)


#: operators a CUDA build runs as one kernel that a CPU-only build decomposes
FUSED_ON_CUDA = ("silu_backward",)


def _unreachable(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a stand-in CUDA kernel ran: fake tensors are handled before it")


def _register_fused() -> None:
    """Give each :data:`FUSED_ON_CUDA` operator a CUDA kernel, once per process."""
    if _STATE.get("fused") is None:
        library = torch.library.Library("aten", "IMPL")
        for name in FUSED_ON_CUDA:
            library.impl(name, _unreachable, "CUDA")
        _STATE["fused"] = library


@contextlib.contextmanager
def installed(capability: tuple[int, int] = (9, 0)) -> Iterator[None]:
    """Make fake CUDA tensors usable for a training step while inside this block.

    ``torch.cuda.get_device_capability`` answers ``capability`` (an H100 by default), for
    library code that picks kernels by it (Hugging Face's grouped-GEMM experts).
    """
    lib = _STATE["lib"]
    if lib is None:
        raise RuntimeError(
            "validation.fakecuda must be imported before torch (ATen creates its CUDA hooks "
            "object while torch is imported)"
        )
    if torch.cuda.is_available():
        raise RuntimeError("a real CUDA device is present: measure on it instead")
    import torch.cuda.amp.common as amp_common
    import torch.utils.checkpoint as ckpt

    _register_fused()
    if _STATE["depth"] == 0:
        _STATE["saved"] = (
            amp_common.amp_definitely_not_available,
            torch.cuda.is_bf16_supported,
            ckpt.get_device_states,
            ckpt.set_device_states,
            torch.cuda.get_device_capability,
        )
        torch.cuda.get_device_capability = lambda *a, **k: capability
        amp_common.amp_definitely_not_available = lambda: False
        torch.cuda.is_bf16_supported = lambda *a, **k: True
        ckpt.get_device_states = lambda *args: ([], [])
        ckpt.set_device_states = lambda *args, **kwargs: None
        torch.Tensor.to = _to  # type: ignore[method-assign]
        torch.Tensor.cuda = _cuda  # type: ignore[method-assign]
        lib.memfit_fake_cuda_set(1)
    _STATE["depth"] += 1
    try:
        yield
    finally:
        _STATE["depth"] -= 1
        if _STATE["depth"] == 0:
            lib.memfit_fake_cuda_set(0)
            (
                amp_common.amp_definitely_not_available,
                torch.cuda.is_bf16_supported,
                ckpt.get_device_states,
                ckpt.set_device_states,
                torch.cuda.get_device_capability,
            ) = _STATE["saved"]
            torch.Tensor.to = _orig_to  # type: ignore[method-assign]
            torch.Tensor.cuda = _orig_cuda  # type: ignore[method-assign]


class FakeInit(TorchDispatchMode):
    """Random initialization on fake CUDA tensors becomes a no-op (fake data has no values)."""

    _SKIP = frozenset(
        {
            torch.ops.aten.uniform_.default,
            torch.ops.aten.normal_.default,
            torch.ops.aten.bernoulli_.float,
            torch.ops.aten.random_.default,
            torch.ops.aten.exponential_.default,
        }
    )

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        first = args[0] if args else None
        if func in self._SKIP and isinstance(first, torch.Tensor) and first.device.type == "cuda":
            return first
        return func(*args, **(kwargs or {}))

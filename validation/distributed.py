"""One multi-GPU training step, traced for one rank in one process with a fake process group.

``torch.distributed`` has a ``"fake"`` backend (``FakeProcessGroup``, with ``FakeStore`` from
``torch.testing._internal.distributed.fake_pg``): this process is rank 0 of a world of ``W``
ranks, and every collective returns at once without communicating. Collectives still take
and return tensors of their real shapes -- an all-gather fills a ``W``-times-larger output,
a reduce-scatter a ``1/W`` one -- so on fake CUDA tensors (:mod:`validation.fakecuda`) the
storage tracker sees exactly the buffers rank 0 would allocate. Two parallelisms are run:

* **FSDP2** (``torch.distributed.fsdp.fully_shard``) on every decoder layer and then on the
  root model, with ``reshard_after_forward`` True (ZeRO-3 like) or False (ZeRO-2 like), with
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` or without a policy (fp32);
* **tensor parallelism** with DTensor (``parallelize_module``), Megatron style: column-
  parallel q/k/v/gate/up, row-parallel o/down; optionally a vocabulary-parallel embedding and
  LM head (logits sharded over the vocabulary, ``loss_parallel``) and sequence parallelism on
  the norms (hidden-size activations between the blocks sharded over the sequence).

What a one-process trace needs beyond :mod:`validation.fakecuda`:

* **CUDA streams and events.** FSDP2 overlaps communication on side streams
  (``torch.cuda.Stream``/``Event``/``stream``/``current_stream``); on a CPU-only build those
  raise. :func:`fake_streams` answers them with no-op streams and events. What memory is live
  is decided by Python references (FSDP2 keeps the previous all-gather and reduce-scatter
  buffers referenced until the next one is waited on, precisely so that the caching allocator
  never needs ``record_stream``), so no-op streams change no allocation.
* **Storage resizes.** FSDP2 frees and re-allocates the unsharded parameters by resizing
  their storages (``UntypedStorage.resize_``), which is no operator; :func:`resize_tracking`
  reports every resize to the tracker.
* **DTensor.** A ``TorchDispatchMode`` sees a DTensor operator before the DTensor runs it on
  its local shards. :class:`DistTracker` declines DTensor operators (``NotImplemented``), so
  that DTensor dispatch runs and the tracker sees the local operators -- including the
  temporaries of any redistribution inside. DTensor's sharding propagation runs each new
  operator once on fake global-shape tensors to learn its output shape; those never exist
  on a GPU and are not counted.
* **The device mesh** is made outside the fake tensor mode (it reads its rank tensor).

Rank 0 is traced; every rank holds the same sizes (FSDP2 pads every shard to the same size;
the tensor-parallel splits here are even).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

# isort: off
from validation import fakecuda  # first: registers the fake CUDA hooks before torch loads
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
# isort: on

from validation.sdpa import GpuProfile, KernelLog, cuda_sdpa
from validation.step import (
    StepMeasurement,
    StepSpec,
    _build_model,
    _make_optimizer,
    _output_module,
    _quiet,
    _swappable_fake_params,
    _unpacked_inputs,
    optimizer_impl,
    spec_from_scenario,
)
from validation.tracker import CATEGORIES, StorageTracker

#: breakdown categories beyond the tracker's four (FSDP2 only)
FSDP_CATEGORIES = (
    "unsharded_parameters",
    "unsharded_gradients",
    "all_gather_buffers",
    "reduce_scatter_buffers",
)


# ---------------------------------------------------------------------------- the spec
@dataclass
class MultiSpec:
    """One multi-GPU measurement: a MemFit scenario plus what the scenario cannot say."""

    step: StepSpec
    strategy: str  # "fsdp2" | "tp"
    world_size: int
    #: FSDP2: reshard the unsharded parameters after forward (ZeRO-3) or keep them (ZeRO-2)
    reshard_after_forward: bool = True
    #: FSDP2: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) on fp32 parameters
    fsdp_mixed_precision: bool = False
    #: FSDP2's policy: the dtypes it gathers and reduces in ("compute": bf16, or "fp32");
    #: fp32 gathered, the forward runs under torch.autocast(bf16) (Lightning's bf16-mixed)
    fsdp_param_dtype: str = "compute"
    fsdp_reduce_dtype: str = "fp32"
    #: TP: also shard the embedding (row-wise) and the LM head (column-wise, sharded logits)
    tp_vocab_parallel: bool = False
    #: TP: sequence parallelism on the norms (needs tp_vocab_parallel)
    sequence_parallel: bool = False
    #: FSDP2: groups of ranks that each hold one whole set of shards (HSDP: a 2-D mesh of
    #: replicate x shard; 1: plain FSDP over every rank)
    replicate: int = 1


def multi_spec_from_case(case: dict[str, Any]) -> MultiSpec:
    setup = case["setup"]
    p = case["scenario"]["training"]["parallelism"]
    return MultiSpec(
        step=spec_from_scenario(case["scenario"]),
        strategy=setup["strategy"],
        world_size=int(case["scenario"]["hardware"]["gpus_per_node"]),
        reshard_after_forward=bool(setup.get("reshard_after_forward", True)),
        fsdp_mixed_precision=bool(setup.get("fsdp_mixed_precision", False)),
        fsdp_param_dtype=str(setup.get("fsdp_param_dtype", "compute")),
        fsdp_reduce_dtype=str(setup.get("fsdp_reduce_dtype", "fp32")),
        tp_vocab_parallel=bool(setup.get("tp_vocab_parallel", False)),
        sequence_parallel=bool(p.get("sequence_parallel", False)),
        replicate=int(p.get("dp_replicate", 1)),
    )


# ---------------------------------------------------------------------------- fake streams
class _Event:
    """A CUDA event that has always completed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> _Event:
        return self

    def wait(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _Stream:
    """A CUDA stream whose work is always done; hashable (FSDP2 keys dicts by stream)."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = torch.device("cuda", 0)
        self.priority = priority

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        return event if event is not None else _Event()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


_DEFAULT_STREAM = _Stream()


@contextlib.contextmanager
def fake_streams() -> Iterator[None]:
    """``torch.cuda``'s device, stream and event calls answered for one fake device."""
    fakes: dict[str, Any] = {
        "current_device": lambda: 0,
        "set_device": lambda device: None,
        "device_count": lambda: 1,
        "synchronize": lambda device=None: None,
        "Stream": _Stream,
        "Event": _Event,
        "current_stream": lambda device=None: _DEFAULT_STREAM,
        "default_stream": lambda device=None: _DEFAULT_STREAM,
        "stream": lambda stream=None: contextlib.nullcontext(),
    }
    saved = {name: getattr(torch.cuda, name) for name in fakes}
    for name, value in fakes.items():
        setattr(torch.cuda, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(torch.cuda, name, value)


# ---------------------------------------------------------------------------- the tracker
def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        return None
    return DTensor


class DistTracker(StorageTracker):
    """:class:`StorageTracker` for sharded models.

    DTensors count by their local shard; DTensor operators are left to DTensor (which runs
    them on the local shards, where this mode counts them); storage resizes are reported by
    :func:`resize_tracking`; ``groups`` names extra breakdown categories (storage sets
    computed at the moment of a new peak).
    """

    def __init__(self, device_type: str = "cuda") -> None:
        super().__init__(device_type=device_type)
        self._dtensor = _dtensor_type()
        self.paused = 0
        self.groups: Callable[[], dict[str, set[int]]] | None = None
        self.group_names: tuple[str, ...] = ()

    def _unwrap(self, t: Any) -> Any:
        if self._dtensor is not None and isinstance(t, self._dtensor):
            return t._local_tensor
        return t

    def _tensors_storages(self, tensors: Any) -> Iterator[torch.UntypedStorage]:
        return super()._tensors_storages(self._unwrap(t) for t in tensors)

    def keys_of(self, tensors: Any) -> set[int]:
        return {self.storage_key(st) for st in self._tensors_storages(tensors)}

    def resized(self, storage: torch.UntypedStorage) -> None:
        # a fake tensor's storage reports the meta device; storages that no operator has
        # returned yet are counted when one does
        with self._lock:
            if self.storage_key(storage) in self._live and self._add_storage(storage):
                self._update_peak()

    def breakdown(self) -> tuple[dict[str, int], dict[str, int]]:
        rounded, raw = super().breakdown()
        if self.groups is None:
            return rounded, raw
        groups = self.groups()
        for name in self.group_names:
            rounded.setdefault(name, 0)
            raw.setdefault(name, 0)
        # re-file storages out of "other" into the named groups (first group that has it)
        for key, (nbytes, rbytes, _) in self._live.items():
            if key in self._param_keys:
                continue
            for name in self.group_names:
                if key in groups.get(name, ()):
                    # gradients of sharded parameters stay "gradients"
                    if name != "reduce_scatter_buffers" or not self._is_grad(key):
                        rounded["other"] -= rbytes
                        raw["other"] -= nbytes
                        rounded[name] += rbytes
                        raw[name] += nbytes
                    break
        return rounded, raw

    def _is_grad(self, key: int) -> bool:
        grads = (p.grad for p in self._params if p.grad is not None)
        return key in self.keys_of(grads)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if self._dtensor is not None and any(issubclass(t, self._dtensor) for t in types):
            return NotImplemented  # DTensor runs it on its shards, which pass through here
        if self.paused:
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


@contextlib.contextmanager
def resize_tracking(tracker: DistTracker) -> Iterator[None]:
    """Report ``UntypedStorage.resize_`` (FSDP2's free and re-allocation) to ``tracker``."""
    original = torch.UntypedStorage.resize_

    def resize_(self: torch.UntypedStorage, size: int) -> Any:
        out = original(self, size)
        tracker.resized(self)
        return out

    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = original  # type: ignore[method-assign]


@contextlib.contextmanager
def uncounted_sharding_propagation(tracker: DistTracker) -> Iterator[None]:
    """DTensor learns an operator's output shape by running it once on fake global tensors;
    on a GPU that happens on fake tensors too, so it is not counted."""
    try:
        from torch.distributed.tensor._sharding_prop import ShardingPropagator
    except ImportError:  # pragma: no cover
        yield
        return
    original = ShardingPropagator._propagate_tensor_meta_non_cached

    def propagate(self: Any, *args: Any, **kwargs: Any) -> Any:
        tracker.paused += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            tracker.paused -= 1

    ShardingPropagator._propagate_tensor_meta_non_cached = propagate  # type: ignore[method-assign]
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = original  # type: ignore[method-assign]


# ---------------------------------------------------------------------------- process group
@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int = 0) -> Iterator[None]:
    """This process as ``rank`` of ``world_size``; collectives do not communicate."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized")
    dist.init_process_group(backend="fake", rank=rank, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------- parallelize
def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = getattr(base, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError("only decoder models with model.layers are parallelized here")
    return list(layers)


def apply_fsdp2(model: torch.nn.Module, spec: MultiSpec, mesh: Any) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": spec.reshard_after_forward}
    if spec.fsdp_mixed_precision:
        dtype = {"compute": torch.bfloat16, "fp32": torch.float32}
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=dtype[spec.fsdp_param_dtype], reduce_dtype=dtype[spec.fsdp_reduce_dtype]
        )
    for layer in _decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)


def apply_tp(model: torch.nn.Module, spec: MultiSpec, mesh: Any) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    sp = spec.sequence_parallel
    if sp and not spec.tp_vocab_parallel:
        raise ValueError("sequence parallelism is set up together with the vocabulary split")
    if spec.tp_vocab_parallel:
        top: dict[str, Any] = {
            "model.embed_tokens": RowwiseParallel(
                input_layouts=Replicate(),
                output_layouts=Shard(1) if sp else Replicate(),
                use_local_output=not sp,
            ),
            "lm_head": ColwiseParallel(
                input_layouts=Shard(1) if sp else Replicate(),
                output_layouts=Shard(-1),
                use_local_output=False,
            ),
        }
        if sp:
            top["model.norm"] = SequenceParallel()
        tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
        parallelize_module(model, mesh, top)
        if tied:  # each style made a DTensor of its own; both are Shard(0) over the vocabulary
            model.get_output_embeddings().weight = model.get_input_embeddings().weight
    for layer in _decoder_layers(model):
        plan: dict[str, Any] = {
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(
                output_layouts=Shard(1) if sp else Replicate(), use_local_output=not sp
            ),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(
                output_layouts=Shard(1) if sp else Replicate(), use_local_output=not sp
            ),
        }
        if sp:
            plan["input_layernorm"] = SequenceParallel()
            plan["post_attention_layernorm"] = SequenceParallel()
            plan["self_attn"] = PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": Shard(1)},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
            )
            plan["mlp"] = PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
            )
        parallelize_module(layer, mesh, plan)


def _fsdp_groups(model: torch.nn.Module, tracker: DistTracker) -> Callable[[], dict[str, set[int]]]:
    """Storage sets of FSDP2's buffers, read from its state at the moment asked."""
    from torch.distributed.fsdp import FSDPModule

    states = [m._get_fsdp_state() for m in model.modules() if isinstance(m, FSDPModule)]

    def groups() -> dict[str, set[int]]:
        unsharded: list[Any] = []
        unsharded_grads: list[Any] = []
        ag: list[Any] = []
        rs: list[Any] = []
        seen_ctx: set[int] = set()
        for state in states:
            group = state._fsdp_param_group
            if group is not None:
                for fp in group.fsdp_params:
                    unsharded.extend(fp.all_gather_outputs)
                    up = getattr(fp, "_unsharded_param", None)
                    if up is not None and up.grad is not None:
                        unsharded_grads.append(up.grad)
                if group._all_gather_result is not None:
                    ag.append(group._all_gather_result.all_gather_output)
            ctx = state._comm_ctx
            if id(ctx) in seen_ctx:
                continue
            seen_ctx.add(id(ctx))
            if getattr(ctx, "all_gather_state", None) is not None:
                ag.append(ctx.all_gather_state.all_gather_result.all_gather_output)
            for rss in getattr(ctx, "reduce_scatter_states", []) or []:
                rs.append(rss.reduce_scatter_input)
        return {
            "unsharded_parameters": tracker.keys_of(unsharded),
            "unsharded_gradients": tracker.keys_of(unsharded_grads),
            "all_gather_buffers": tracker.keys_of(ag),
            "reduce_scatter_buffers": tracker.keys_of(rs),
        }

    return groups


# ---------------------------------------------------------------------------- measuring
@dataclass
class MultiMeasurement:
    first: StepMeasurement
    second: StepMeasurement
    released: StepMeasurement
    attention_kernels: list[str]
    params_total: int  # global numel
    params_local: int  # numel held by this rank
    param_bytes_full: int  # global parameter bytes (the unsharded model)
    param_bytes_local: int  # bytes of this rank's parameters (shards)
    optimizer_impl_used: str
    logits_bytes: int  # this rank's logits
    breakdown_before_step: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def measure_multi(spec: MultiSpec, gpu: GpuProfile | None = None) -> MultiMeasurement:
    """Run three steps of ``spec`` as rank 0 of ``spec.world_size``; return what was seen."""
    from torch.distributed.device_mesh import init_device_mesh

    s = spec.step
    if s.method != "full":
        raise ValueError("only full training is set up for multi-GPU measurements")
    if s.checkpointing != "none":
        raise ValueError("activation checkpointing is not set up for multi-GPU measurements")
    gpu = gpu or GpuProfile()
    log = KernelLog()
    mode = FakeTensorMode()
    tracker = DistTracker(device_type="cuda")
    with (
        _quiet(),
        _unpacked_inputs(),
        fakecuda.installed((gpu.major, gpu.minor)),
        fake_streams(),
        fake_process_group(spec.world_size),
    ):
        if spec.replicate > 1:  # HSDP: fully_shard on a 2-D mesh shards over its last dim
            shape = (spec.replicate, spec.world_size // spec.replicate)
            mesh = init_device_mesh("cuda", shape, mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh("cuda", (spec.world_size,))
        with (
            mode,
            cuda_sdpa(gpu, log),
            resize_tracking(tracker),
            uncounted_sharding_propagation(tracker),
        ):
            with fakecuda.FakeInit(), torch.device("cuda"), _swappable_fake_params(mode):
                model, family = _build_model(s)
                full_numel = sum(p.numel() for p in model.parameters())
                full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
                if spec.strategy == "fsdp2":
                    apply_fsdp2(model, spec, mesh)
                elif spec.strategy == "tp":
                    apply_tp(model, spec, mesh)
                else:
                    raise ValueError(f"unknown strategy {spec.strategy!r}")
            gc.collect()
            model.train()
            params = list(model.parameters())
            opt = _make_optimizer(params, s)
            ids = torch.zeros((s.batch, s.seq), dtype=torch.long, device="cuda")
            # FSDP2's policy computes in bf16 itself, but where it gathers fp32
            autocast = s.precision == "bf16-mixed" and (
                spec.strategy != "fsdp2" or spec.fsdp_param_dtype == "fp32"
            )
            mixed = s.precision == "bf16-mixed"
            if spec.strategy == "fsdp2" and mixed and not spec.fsdp_mixed_precision:
                raise ValueError("FSDP2 bf16-mixed is measured with its MixedPrecisionPolicy")

            tracker.adopt([ids, *params, *model.buffers()])
            tracker.watch(params, [opt])
            if spec.strategy == "fsdp2":
                tracker.groups = _fsdp_groups(model, tracker)
                tracker.group_names = FSDP_CATEGORIES

            logits_bytes = 0

            def after_logits(_m: Any, _i: Any, out: Any) -> None:
                nonlocal logits_bytes
                t = _local(out[0] if isinstance(out, tuple) else out)
                logits_bytes = t.numel() * t.element_size()
                tracker.set_phase("loss")

            loss_ctx: Callable[[], Any] = contextlib.nullcontext
            if spec.strategy == "tp" and spec.tp_vocab_parallel:
                from torch.distributed.tensor.parallel import loss_parallel

                loss_ctx = loss_parallel

            # the optimizer's foreach/fused kernels take the parameters left whole (plain
            # tensors) together with DTensors: they count as replicated
            step_ctx: Callable[[], Any] = contextlib.nullcontext
            if spec.strategy == "tp":
                from torch.distributed.tensor.experimental import implicit_replication

                step_ctx = implicit_replication

            hook = _output_module(model, family).register_forward_hook(after_logits)
            results: list[StepMeasurement] = []
            before_breakdown: dict[str, int] = {}
            with tracker:
                for i, release_outputs in enumerate((False, False, True)):
                    gc.collect()
                    tracker.reset_peaks()
                    before = tracker.rounded
                    if i == 1:
                        before_breakdown = tracker.breakdown()[0]
                    tracker.set_phase("forward")
                    ctx = (
                        torch.autocast("cuda", dtype=torch.bfloat16)
                        if autocast
                        else contextlib.nullcontext()
                    )
                    with loss_ctx():
                        with ctx:
                            out = model(input_ids=ids, labels=ids)
                        loss = out.loss
                        if release_outputs:
                            del out
                        tracker.set_phase("backward")
                        loss.backward()
                    tracker.set_phase("optimizer")
                    with step_ctx():
                        opt.step()
                    opt.zero_grad(set_to_none=True)
                    del loss
                    if not release_outputs:
                        del out
                    gc.collect()
                    tracker.set_phase("idle")
                    results.append(StepMeasurement.of(tracker, before))
                    tracker.adopt(v for st in opt.state.values() for v in st.values())
            hook.remove()
            impl = optimizer_impl(opt)
            locals_ = [_local(p) for p in model.parameters()]
            m = MultiMeasurement(
                first=results[0],
                second=results[1],
                released=results[2],
                attention_kernels=log.distinct() if s.attention == "sdpa" else ["eager"],
                params_total=full_numel,
                params_local=sum(t.numel() for t in locals_),
                param_bytes_full=full_bytes,
                param_bytes_local=sum(t.untyped_storage().nbytes() for t in locals_),
                optimizer_impl_used=impl,
                logits_bytes=logits_bytes,
                breakdown_before_step=before_breakdown,
            )
            del model, opt, ids, params, locals_
        del mesh
    gc.collect()
    assert set(CATEGORIES) <= set(m.second.breakdown)
    return m

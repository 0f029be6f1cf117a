"""The ops of each block, written from the Hugging Face modules, for :mod:`memfit.engine.graph`.

Every tensor below is one that PyTorch really allocates in the module's forward, with its
dtype under the precision in use, and every ``saves=`` is what autograd keeps for that op's
backward (``derivatives.yaml``: ``mm`` keeps its input only when the weight needs a
gradient and the weight only when the input does; ``silu``/``gelu`` keep their input;
``softmax`` and ``rsqrt`` their output; ``mul`` each operand the other one's gradient
needs). Dtypes follow autocast (``torch.amp``): matmuls and SDPA run in the compute dtype
on cast copies of their inputs -- one copy *per call*, since only leaf weights are cached --
while norms, softmax, the loss and elementwise type promotion stay in fp32.

The activation formulas are therefore derived term by term from the modules, not a
coefficient: Korthikanti et al. 2022 (section 4.1) count ``34 s b h + 5 a s^2 b`` bytes per
layer for a GPT layer with 16-bit activations and dropout; the same bookkeeping done here
for a Llama layer under bf16 autocast gives fp32 residuals and norms, three bf16 copies of
the attention input (q, k, v are separate calls) and no s^2 term with flash attention.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memfit.engine import memo
from memfit.engine.graph import TERMS, Block, Lin, Size, concrete, larger
from memfit.engine.specs import ModelSpec

F32 = 4
#: rows of logits a chunked cross-entropy materializes at a time
CHUNK_ROWS = 1024


@dataclass(frozen=True, slots=True)
class Shape:
    """The shape quantities every tensor size of a block is made of (see
    :data:`memfit.engine.graph.TERMS`): integers, or symbolic :class:`~memfit.engine.graph.Lin`
    forms."""

    #: b s, the rows of every per-token tensor
    tokens: Size
    #: b s^2: the elements of one head's attention scores over the batch
    pairs: Size
    #: b ceil32(s): memory-efficient attention pads each row of its log-sum-exp to 32
    padded: Size
    #: rows the expert layers of this rank run: ``tokens x k``, or under expert
    #: parallelism the busiest rank's share, ``ceil(tokens k capacity)``
    routed: Size
    #: rows of logits a chunked cross-entropy holds at once: ``min(tokens, CHUNK_ROWS)``
    chunk: Size


@dataclass(frozen=True, slots=True)
class Ctx:
    """What the blocks need to know about a step."""

    batch: int
    seq: int
    #: "fp32", "amp" (bf16/fp16/fp8 autocast over fp32 weights) or "half" (pure bf16)
    mode: str
    attention: str  # eager | sdpa | flash | mem-efficient
    #: LoRA rank and the linear roles that carry adapters (empty: no LoRA)
    lora_rank: int
    lora_roles: frozenset[str]
    #: which parts train: "all" | "lora" | a set of components for freeze
    trainable: frozenset[str]
    #: bytes of a stored frozen weight element (2 for 16-bit, 4 fp32; 0.5-ish for NF4 is
    #: irrelevant here: the dequantized copy is what the matmul reads)
    frozen_bytes: int
    #: QLoRA: the base is dequantized to the compute dtype for every matmul
    quantized: bool
    #: LoRA's dropout on the adapter input
    dropout: float
    #: the model's dropout on attention probabilities
    attention_dropout: float = 0.0
    #: selective recomputation (Korthikanti et al. 2022, section 5): the s x s attention
    #: core is recomputed in backward instead of kept
    selective: bool = False
    #: the attention needs an explicit mask (a sliding window shorter than the sequence):
    #: SDPA then cannot run plain causal and converts the boolean mask to a float bias
    masked: bool = False
    #: sequence parallelism (Korthikanti et al. 2022, section 4.2.2): the hidden-size
    #: tensors between the tensor-parallel regions hold ``tokens / sp`` rows
    sp: int = 1
    #: context parallelism (ring attention): ``seq`` is already this rank's chunk; the
    #: key/value blocks of the other chunks pass through while attention runs
    cp: int = 1
    #: expert parallelism: routed tokens go to other ranks and back (all-to-all), and the
    #: busiest rank receives ``capacity`` times the balanced share
    ep: int = 1
    capacity: float = 1.0
    #: experts each token is routed to (MoE models)
    topk: int = 0
    #: the training stack's conventions (:func:`memfit.engine.stacks.conventions`): the model
    #: output (the logits, with ``kv_cache`` the KV cache) held through backward, the
    #: adapters' bytes per element, and the loss
    outputs_held: bool = True
    kv_cache: bool = False
    #: SDPA runs its math fallback (see ``ModelSpec.sdpa_math``)
    sdpa_math: bool = False
    #: the routed experts run transformers' eager loop (:func:`_moe_eager`)
    moe_eager: bool = False
    #: the 16-bit compute dtype is fp16 (fp16-mixed), not bf16
    fp16: bool = False
    #: bytes per element of the stored embedding weight (the residual stream's dtype
    #: under autocast follows it)
    embedding_bytes: int = 4
    adapter_bytes: int = 4
    #: components trained as PEFT's ``modules_to_save`` copies: they train, their weights
    #: in the frozen weights' dtype (``model_state.saved_copies``)
    copies: frozenset[str] = frozenset()
    #: the routed experts' and router's roles PEFT adapts as parameters (``ParamWrapper``:
    #: ``gate_up``, ``down_proj``, ``router``; ``model_state.expert_lora_roles``)
    expert_lora: frozenset[str] = frozenset()
    loss: str = "standard"
    loss_chunks: int = 8
    #: the model is LitGPT's own ``GPT`` (:func:`_litgpt_attention`, :meth:`Net._lora_qkv`)
    litgpt: bool = False
    #: QLoRA: bitsandbytes' 4-bit matmul keeps its input (before 0.43.2; the convention
    #: ``qlora.matmul_keeps_input``)
    matmul_keeps_input: bool = False
    #: the model is Megatron-core's ``GPTModel`` with Transformer Engine's modules
    #: (:func:`_megatron_layer`): Megatron-LM and NeMo build their own, never transformers'
    megatron: bool = False
    #: LitGPT's fused q/k/v LoRA: which of q, k, v carry an adapter
    qkv_enabled: tuple[bool, bool, bool] = (True, True, True)
    #: QLoRA quantizes the LM head too (Lightning's plugin: every ``nn.Linear``)
    quantized_head: bool = False
    #: QLoRA's dequantization returns another dtype than the compute dtype (the quant
    #: state's, fp16 where Lightning quantized ``weight.to(torch.half)``), of these bytes:
    #: 0 when it returns the compute dtype itself
    dequant_other: int = 0
    #: what runs under ``torch.compile`` (``""``: nothing; else the scope,
    #: :data:`memfit.engine.specs.COMPILE_SCOPES`): each compiled block as inductor fuses it
    #: and AOTAutograd's partitioner keeps it for backward
    #: (:func:`memfit.engine.inductor.partition`)
    compiled: str = ""
    #: the model returns the fp32 copy of its logits (torchtune), not the loss making it
    upcast_in_model: bool = False
    #: build blocks with symbolic sizes (:class:`~memfit.engine.graph.Lin`) instead of at
    #: ``batch`` x ``seq``: one build then serves every shape (:func:`memfit.engine.graph.profile`)
    symbolic: bool = False

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    def quantizes(self, component: str) -> bool:
        """Whether QLoRA stores ``component``'s matrices in 4 bits: every linear but the
        embedding, and the LM head where the stack quantizes it; not transformers' fused
        experts and router, which are parameters, not linears
        (:func:`memfit.engine.model_state.quantizable`)."""
        if component == "lm_head":
            return self.quantized_head
        if component in ("experts", "router"):
            return self.litgpt
        return component != "embeddings"

    def for_layers(self) -> Ctx:
        """This context as a layer's ops read it: without the shape, and with what only
        the head and the model output read (the loss, a quantized head, what the output
        holds) and selective recomputation where no eager attention reads it set to their
        defaults -- so that layers alike in their ops share one key."""
        eager = attention_kernel(self.attention, self.mode == "fp32", self.sdpa_math) == "eager"
        return self.replaced(
            batch=1, seq=1, selective=self.selective and eager, outputs_held=True,
            kv_cache=False, loss="standard", loss_chunks=8, quantized_head=False,
            compiled="layers" if self.compiled else "",
        )  # fmt: skip

    def for_head(self) -> Ctx:
        """This context as the head's and the loss's ops read it: without the shape, and
        with what only the layers or the model output's lifetime read (selective
        recomputation, the KV cache, whether the output is held) set to their defaults."""
        return self.replaced(batch=1, seq=1, selective=False, outputs_held=True, kv_cache=False)

    def replaced(self, **changes: object) -> Ctx:
        """``dataclasses.replace(self, **changes)``, kept: the steps of many strategies
        (a sweep's that differ only in their share of the model state) make equal
        contexts, and replacing one field of 45 costs what building them all does."""
        return _replaced(self, **changes)

    def terms(self) -> tuple[int, ...]:
        """The values of the shape terms (:data:`memfit.engine.graph.TERMS`) at this step."""
        return self.terms_at(self.batch, self.seq)

    def terms_at(self, b: int, s: int) -> tuple[int, ...]:
        """The values of the shape terms at micro-batch ``b`` and sequence length ``s`` (the
        rank's chunk under context parallelism)."""
        tokens = b * s
        routed = tokens * self.topk
        if self.ep > 1:
            # the busiest rank receives ``capacity`` times the balanced share, whole rows
            routed = -(-routed * round(self.capacity * 1000) // 1000)
        return (tokens, b * s * s, b * (-(-s // 32) * 32), routed, min(tokens, CHUNK_ROWS), 1)

    def shape(self) -> Shape:
        """The sizes the blocks are built from: concrete, or symbolic for a profile."""
        if self.symbolic:
            terms = [Lin.unit(t) for t in TERMS[:5]]
            if self.ep == 1:
                terms[3] = terms[0] * self.topk
            return Shape(*terms)
        return Shape(*self.terms()[:5])

    @property
    def act(self) -> int:
        """Bytes of a matmul output (the compute dtype)."""
        return 4 if self.mode == "fp32" else 2

    @property
    def res(self) -> int:
        """Bytes of the residual stream: fp32 weights make fp32 hidden states under AMP;
        a frozen 16-bit embedding starts a 16-bit stream, which 16-bit norms and autocast's
        16-bit matmuls keep (``embedding_bytes``)."""
        if self.mode == "half":
            return 2
        if self.mode == "amp" and self.embedding_bytes == 2:
            return 2
        return 4

    def hidden_bytes(self, hidden_size: int) -> int:
        """A hidden-size tensor between blocks (residual dtype; a sequence shard under SP)."""
        return self.tokens * hidden_size * self.res // self.sp

    def trains(self, component: str) -> bool:
        return "all" in self.trainable or component in self.trainable or component in self.copies

    def weight_bytes(self, component: str) -> int:
        if component in self.copies:
            return self.frozen_bytes
        if self.trains(component):
            return 2 if self.mode == "half" else 4
        return self.frozen_bytes


@memo.cached(maxsize=4096)
def _replaced(ctx: Ctx, **changes: object) -> Ctx:
    return dataclasses.replace(ctx, **changes)  # type: ignore[arg-type]


def attention_run(model: ModelSpec, attention: str) -> str:
    """The attention ``attention`` asks for, as ``model``'s code runs it. SDPA cannot
    soft-cap the scores: transformers' Gemma-2 declares no SDPA support
    (``_supports_sdpa = False``, 5.24 ``modeling_gemma2.py``) and its default falls back to
    eager attention, which caps them (``ModelSpec.attn_logit_softcapping``); flash
    attention caps them inside its kernel.

    Attention sinks (``ModelSpec.attention_sinks``) train only in eager attention, whatever
    is asked: SDPA has no argument for them, so transformers' gpt-oss declares no SDPA
    support (``_supports_sdpa = False``, ``modeling_gpt_oss.py``) and falls back to eager;
    the flash kernels it accepts instead (``_compatible_flash_implementations``:
    ``kernels-community/vllm-flash-attn3``) take the sinks in forward only, with no
    backward for them (Dao-AILab/flash-attention issue 1797, nvidia-cosmos/cosmos-rl
    issue 219), which is why the fine-tuning recipes for gpt-oss load it with
    ``attn_implementation="eager"``."""
    if model.attention_sinks:
        return "eager"
    if model.attn_logit_softcapping and attention in ("sdpa", "mem-efficient"):
        return "eager"
    return attention


def returns_attention_weights(model: ModelSpec, ctx: Ctx) -> bool:
    """Whether a layer of ``model`` returns its attention weights to the model's loop,
    which keeps them until the next layer returns: Falcon's own eager attention
    (``return attn_output, attention_scores``; ``FalconModel`` holds each layer's outputs
    tuple), run eager (a compiled graph frees them)."""
    return (
        model.eager_attention == "falcon"
        and not model.attention_sinks
        and not ctx.compiled
        and attention_kernel(ctx.attention, ctx.mode == "fp32", ctx.sdpa_math) == "eager"
    )


def attention_kernel(attention: str, fp32: bool, sdpa_math: bool = False) -> str:
    """The kernel a step's attention runs: ``eager``; or what SDPA picks on CUDA --
    ``math`` (its unfused fallback) for a module that calls it with multi-query keys and
    values it does not repeat and a mask (``ModelSpec.sdpa_math``), ``flash`` for 16-bit
    inputs, ``efficient`` (memory-efficient) for fp32 ones -- or the kernel asked for by
    name. Memory (:meth:`Net.attention`) and time (:mod:`memfit.engine.steptime`) both ask here."""
    if attention == "eager":
        return "eager"
    if attention == "sdpa" and sdpa_math:
        return "math"
    if attention == "flash" or (attention == "sdpa" and not fp32):
        return "flash"
    return "efficient"


class Net:
    """Builds a :class:`Block`, tracking each tensor's bytes per element and requires_grad."""

    def __init__(self, name: str, ctx: Ctx, x_elems: Size, x_dtype: int, x_grad: bool) -> None:
        self.ctx = ctx
        #: the sizes every tensor is made of (concrete, or symbolic for a profile)
        self.s = ctx.shape()
        self.block = Block(name, x_elems * x_dtype)
        self.dtype = {"x": x_dtype}
        self.elems: dict[str, Size] = {"x": x_elems}
        self.rg = {"x": x_grad}
        self.n = 0
        #: sequence parallelism: gathered tensor -> the shard it was gathered from
        self.shard_of: dict[str, str] = {}
        #: autocast's cache: weight -> its cast copy
        self.cached: dict[tuple[str, str | None, int, int, int], str] = {}
        #: weights whose gradient an op of the block produces: the op's index
        self.graded: dict[tuple[str, str | None, int, int, int], int] = {}
        #: ``W + scaling B A`` of each parameter PEFT wraps, made at its first use
        self.deltas: dict[tuple[str, str | None], str] = {}

    def needs(self, *tensors: str) -> bool:
        """Whether a result of ``tensors`` requires grad: whether any of them does."""
        return any(self.rg[t] for t in tensors)

    def new(self, prefix: str, elems: Size, dtype: int, rg: bool) -> str:
        self.n += 1
        name = f"{prefix}{self.n}"
        self.dtype[name], self.elems[name], self.rg[name] = dtype, elems, rg
        return name

    def _op(
        self,
        name: str,
        inputs: list[str],
        out: list[str],
        saves: list[str] | tuple[str, ...] = (),
        weight_grad: Size = 0,
        transient: Size = 0,
        trains: bool = False,
        gemm: tuple[Size, int, int, int] | None = None,
        reads: Size | None = None,
        holds: Sequence[str] = (),
    ) -> None:
        """Append an op; ``trains``: a weight it reads needs a gradient (recorded even
        when this op's own share of that gradient is 0); ``gemm``: it is a matrix product
        (:attr:`memfit.engine.graph.Op.gemm`); ``holds``: tensors its Python statement
        keeps alive until it has run (:attr:`memfit.engine.graph.Op.holds`) -- run eager;
        a compiled graph frees each buffer after its last use."""
        grads = [t for t in inputs if self.rg.get(t)]
        # autograd records an op only when an input or its weight needs a gradient: an op
        # of a frozen layer whose input needs none saves nothing
        recorded = bool(grads) or bool(weight_grad) or trains
        outputs = [(t, self.elems[t] * self.dtype[t]) for t in out]
        self.block.op(
            name,
            inputs,
            outputs,
            saves=[t for t in saves if t] if recorded else [],
            grads=grads,
            weight_grad=weight_grad,
            transient_backward=transient if recorded else 0,
            gemm=gemm,
            trains=trains,
            out_grad=sum((b for t, b in outputs if self.rg[t]), 0) if recorded else 0,
            reads=reads,
            holds=() if self.ctx.compiled else [t for t in holds if t],
        )

    def _dequantize(self, n: Size) -> tuple[str, Size]:
        """QLoRA's dequantization of ``n`` 4-bit weights for one matmul: the 16-bit weight,
        and the bytes its backward's second dequantization has alive where the quant
        state's dtype is not the compute dtype (``.to`` makes a second copy)."""
        deq = self.new("deq", n, 2, False)
        if not self.ctx.dequant_other:
            self._op("dequantize", [], [deq])
            return deq, 0
        raw = self.new("deq", n, self.ctx.dequant_other, False)
        self._op("dequantize", [], [raw])
        self._op("to", [raw], [deq])
        return deq, (self.ctx.dequant_other + 2) * n

    # -- elementwise ---------------------------------------------------------------------
    def view(self, name: str, x: str, elems: Size) -> str:
        """A view of ``x`` (a split of a fused projection): no storage of its own; whoever
        keeps it keeps ``x`` (:attr:`memfit.engine.graph.Block.views`)."""
        y = self.new(name, elems, self.dtype[x], self.rg[x])
        self.block.views[y] = self.block.views.get(x, x)
        self._op(name, [x], [y])
        return y

    def cast(self, x: str, dtype: int, holds: Sequence[str] = ()) -> str:
        if self.dtype[x] == dtype:
            return x
        y = self.new("cast", self.elems[x], dtype, self.rg[x])
        self._op("to", [x], [y], holds=holds)
        return y

    def unary(
        self,
        name: str,
        x: str,
        save_in: bool = False,
        save_out: bool = False,
        elems: Size | None = None,
        dtype: int | None = None,
        reads: Size | None = None,
    ) -> str:
        y = self.new(name, elems or self.elems[x], dtype or self.dtype[x], self.rg[x])
        self._op(name, [x], [y], saves=[x if save_in else "", y if save_out else ""], reads=reads)
        return y

    def nll_loss(self, logp: str, vocab: int) -> str:
        """``nll_loss``: one log-probability a row read (and the target's), a scalar out;
        backward writes the whole gradient of the log-probabilities."""
        rows = self.elems[logp] // vocab
        return self.unary("nll_loss", logp, elems=1, reads=rows * (self.dtype[logp] + 8))

    def binary(self, name: str, a: str, b: str, saves: str = "", elems: Size | None = None) -> str:
        """``saves``: "" (add), "both" (mul: each keeps the other), "a", "b"."""
        dtype = max(self.dtype[a], self.dtype[b])  # type promotion
        e = elems or larger(self.elems[a], self.elems[b])  # broadcast
        y = self.new(name, e, dtype, self.rg[a] or self.rg[b])
        keep = []
        if saves == "both":
            keep = [a if self.rg[b] else "", b if self.rg[a] else ""]
        elif saves:
            keep = [a if saves == "a" else b]
        self._op(name, [a, b], [y], saves=keep)
        return y

    def dropout(self, x: str, p: float) -> str:
        """``nn.Dropout``: nothing at p = 0; else a new output and a 1-byte mask kept
        (CUDA's ``native_dropout`` returns a bool mask; Korthikanti et al.'s "1 byte")."""
        if p <= 0.0:
            return x
        mask = self.new("mask", self.elems[x], 1, False)
        y = self.new("drop", self.elems[x], self.dtype[x], self.rg[x])
        self._op("dropout", [x], [y, mask], saves=[mask])
        return y

    # -- sequence parallelism ------------------------------------------------------------
    def gather_seq(self, x: str) -> str:
        """All-gather the sequence shards before a column-parallel linear (``g`` in
        Korthikanti et al. 2022, figure 5). Megatron saves the shard, not the gathered
        tensor, for the weight gradient and gathers it again in backward."""
        if self.ctx.sp == 1:
            return x
        y = self.new("gathered", self.elems[x] * self.ctx.sp, self.dtype[x], self.rg[x])
        self._op("all_gather", [x], [y])
        self.shard_of[y] = x
        return y

    def scatter_seq(self, x: str) -> str:
        """Reduce-scatter a row-parallel linear's output back to sequence shards."""
        if self.ctx.sp == 1:
            return x
        y = self.new("scattered", self.elems[x] // self.ctx.sp, self.dtype[x], self.rg[x])
        self._op("reduce_scatter", [x], [y])
        return y

    # -- layers --------------------------------------------------------------------------
    def linear(
        self,
        x: str,
        in_f: int,
        out_f: int,
        component: str,
        role: str | None,
        bias: bool = False,
        tokens: Size | None = None,
        weights: int = 1,
        slice_of: int = 1,
        slice_grad: bool = False,
        qkv: tuple[int, int, int] | None = None,
    ) -> str:
        """``nn.Linear`` (or GPT-2's ``Conv1D``), with autocast casts and a LoRA adapter.

        ``qkv``: the widths of q, k and v of a fused projection, for LitGPT's adapter of it
        (:meth:`_lora_qkv`).

        ``weights`` > 1 stands for the routed experts: ``tokens`` rows in all go through
        ``weights`` matrices of ``in_f x out_f`` (grouped GEMM), so weight-sized terms --
        casts, gradients, dequantization -- count every expert's matrix.
        ``slice_of`` > 1: the weight is one matrix of a 3-D parameter of that many
        (transformers' eager experts loop, :func:`_moe_eager`); ``slice_grad``: this call's
        backward, the first to run, makes the gradient the later ones are summed into.
        """
        ctx = self.ctx
        wrapped = (component == "router" and "router" in ctx.expert_lora) or (
            component == "experts" and role in ctx.expert_lora
        )
        if wrapped:
            return self._wrapped_linear(x, in_f, out_f, component, role, tokens, weights, slice_of)
        if slice_of > 1:
            return self._sliced_linear(x, in_f, out_f, component, tokens, slice_of, slice_grad)
        tokens = tokens if tokens is not None else self.s.tokens
        trainable = ctx.trains(component)
        w_dtype = ctx.weight_bytes(component)
        # transformers' grouped experts are not on autocast's lists: the input is cast to
        # the weights' dtype, so frozen fp32 experts compute in fp32, their weights uncast
        # (trainable ones are taken as cast once, as autocast would)
        fp32_experts = ctx.mode == "amp" and weights > 1 and w_dtype == 4 and not trainable
        xin = self.cast(x, F32 if fp32_experts else 2) if ctx.mode == "amp" else x
        weight = ""
        redo: Size = 0
        keeps_input = False
        dequant_again: Size = 0
        quantized = ctx.quantized and not trainable and ctx.quantizes(component)
        if quantized:
            # QLoRA: bitsandbytes' MatMul4Bit dequantizes the 4-bit weight
            # (``F.dequantize_4bit(B, quant_state).to(A.dtype)``) for the matmul and
            # dequantizes it again in backward. Before 0.43.2 (LitGPT's 0.42) it kept its
            # input with the 4-bit weight (``ctx.tensors = (A, B)``) whenever either needs
            # a gradient, though the input's gradient needs only the weight; 0.43.2 and
            # later keep the weight only (``(None, B)``). Dequantization returns the quant
            # state's dtype: where that is not the compute dtype, ``.to`` makes a second
            # copy, both alive for the cast
            n = in_f * out_f * weights
            _, dequant_again = self._dequantize(n)
            redo = 2 * n
            keeps_input = ctx.matmul_keeps_input
        elif ctx.mode == "amp" and w_dtype == 4 and trainable:
            # autocast's cast of an fp32 weight, held by its cache through the forward and
            # kept for backward where the matmul saves it (its input needs a gradient); a
            # second call on the same weight (a chunked LM head) finds it in the cache
            key = (component, role, in_f, out_f, weights)
            weight = self.cached.get(key, "")
            if not weight:
                weight = self.cached[key] = self.new("wcast", in_f * out_f * weights, 2, True)
                self.block.cached.add(weight)
                self._op(
                    "cast_weight", [], [weight], weight_grad=4 * in_f * out_f * weights,
                    trains=True,
                )  # fmt: skip
        elif ctx.mode == "amp" and w_dtype == 4 and not fp32_experts:
            # a frozen fp32 weight (Lightning's bf16-mixed keeps the base in fp32): autocast
            # caches casts only of leaf tensors that require grad, so every call casts it
            # again; the copy lives while the matmul runs, and on through backward only
            # where the matmul saves it (its input needs a gradient)
            weight = self.new("wcast", in_f * out_f * weights, 2, False)
            self._op("cast_weight", [], [weight])
        out_dtype = F32 if fp32_experts else ctx.act
        y = self.new("lin", tokens * out_f, out_dtype, self.rg[xin] or trainable)
        saved_in = xin
        if x in self.shard_of:  # sequence parallel: keep the shard, gather again later
            saved_in = self.shard_of[x]
            redo += self.elems[x] * self.dtype[xin] if trainable else 0
        saves = [
            saved_in if trainable or (keeps_input and self.rg[xin]) else "",
            weight if self.rg[xin] else "",
        ]
        w_grad: Size = 0
        if trainable and not weight:  # fp32 or pure 16-bit: the gradient lands directly
            w_grad = w_dtype * in_f * out_f * weights
        if bias and trainable:
            w_grad += w_dtype * out_f * weights
        key = (component, role, in_f, out_f, weights)
        if w_grad:
            # a weight used again (a chunked LM head): backward runs the last use first,
            # whose gradient becomes .grad; each earlier use's part is a transient while
            # it is summed in
            self._regrade(key)
        inputs = [xin] + ([weight] if weight else [])
        # routed experts run as grouped GEMMs, not as ``aten.mm``
        op = "grouped_mm" if weights > 1 else "mm"
        self._op(
            op, inputs, [y], saves=saves, weight_grad=w_grad, transient=redo, trains=trainable,
            gemm=(tokens, in_f, out_f, weights),
        )  # fmt: skip
        if keeps_input and self.rg[xin]:
            self.block.kept_by_functions.add(saved_in)
        if dequant_again and self.rg[xin]:
            # backward dequantizes before it computes the input's gradient: the two copies
            # of the cast are alive together, the gradient not yet (this op runs just
            # before the matmul's backward)
            self.block.op("dequantize_backward", [], [], transient_backward=dequant_again)
        if quantized and self.dtype[x] == F32 and self.dtype[y] != F32:
            # bitsandbytes' ``Linear4bit.forward`` casts its input to the compute dtype and
            # returns ``out.to(inp_dtype)``: an fp32 input (an fp32 residual stream and
            # norms, PEFT's ``prepare_model_for_kbit_training``) gets an fp32 copy of the
            # output, which the ops after it read
            y = self.cast(y, F32)
        if role and role in ctx.lora_roles:
            if qkv is not None and ctx.litgpt:
                return self._lora_qkv(x, y, in_f, qkv, tokens)
            y = self._lora(x, y, in_f, out_f, tokens, key)
        return y

    def _regrade(self, key: tuple[str, str | None, int, int, int]) -> None:
        """The next op appended produces the gradient of the weight ``key``: it becomes
        the weight's one ``.grad`` (backward reaches it first); an earlier op that made
        it keeps it only as a transient, the part summed in. Autograd sums out of place
        (traced on real tensors: a weight used n times peaks at three gradients' worth,
        the sum so far, the new part and their sum)."""
        prev = self.graded.get(key)
        if prev is not None:
            # autograd sums a gradient from several uses out of place: the sum so far, the
            # new part and their sum are live at once
            op = self.block.ops[prev]
            self.block.ops[prev] = dataclasses.replace(
                op, weight_grad=0, transient_backward=op.transient_backward + 2 * op.weight_grad
            )
        self.graded[key] = len(self.block.ops)

    def _wrapped_linear(
        self,
        x: str,
        in_f: int,
        out_f: int,
        component: str,
        role: str | None,
        tokens: Size | None,
        weights: int,
        slice_of: int,
    ) -> str:
        """A linear of a parameter PEFT adapts through a ``ParamWrapper`` (peft 0.21.2
        ``tuners/lora/layer.py``): the routed experts' 3-D ``gate_up_proj`` and
        ``down_proj`` and the router's weight. While the module runs, a parametrization
        replaces the parameter by ``W + scaling B A`` (:meth:`_param_delta`), a new tensor
        of the whole parameter that needs a gradient; the matmuls read it as their weight,
        so they keep it and their input for backward, and its gradient, the size of the
        whole parameter, flows back to the adapters. No adapter product of the tokens is
        made. The eager experts loop reads one expert's matrix of it per call
        (``slice_of``)."""
        ctx = self.ctx
        experts = slice_of if slice_of > 1 else weights
        weight = self._param_delta(component, role, in_f, out_f, experts)
        rows = tokens if tokens is not None else self.s.tokens
        xin = self.cast(x, 2) if ctx.mode == "amp" else x
        y = self.new("lin", rows * out_f, ctx.act, True)
        op = "grouped_mm" if weights > 1 else "mm"
        self._op(
            op, [xin, weight], [y], saves=[xin, weight], trains=True,
            gemm=(rows, in_f, out_f, 1 if slice_of > 1 else weights),
        )  # fmt: skip
        return y

    def _param_delta(
        self, component: str, role: str | None, in_f: int, out_f: int, experts: int
    ) -> str:
        """``W + scaling B A`` of a parameter PEFT wraps (:meth:`_wrapped_linear`), made
        once per module call. For 3-D experts ``_LoraFactorsProxy``: A and B cast to the
        parameter's dtype (``get_delta_factors``; fp32 adapters get 16-bit copies) and
        ``torch.baddbmm(W, B, A)`` with autocast off, which keeps both factors for their
        gradients; for the router ``_LoraParameterProxy``: ``W + (B @ A * scaling)``, the
        product cast to the parameter's dtype. The fused ``gate_up_proj`` has twice the
        rank (PEFT's conversion of the gate and up targets)."""
        key = (component, role)
        cached = self.deltas.get(key)
        if cached:
            return cached
        ctx = self.ctx
        r = ctx.lora_rank * (2 if role == "gate_up" else 1)
        a_elems, b_elems = r * experts * in_f, out_f * r * experts
        adapter, w_bytes = ctx.adapter_bytes, ctx.frozen_bytes
        factors = []
        for name, elems in (("lora_A", a_elems), ("lora_B", b_elems)):
            # B is read as a permuted view (E x out x r): its gradient comes back through
            # the permute and the reshape, which copies it whole before it lands
            copy = adapter * elems if name == "lora_B" and experts > 1 else 0
            if adapter != w_bytes:  # ``.to(param.dtype)``: a copy whose backward lands the grad
                t = self.new("wcast", elems, w_bytes, True)
                self._op(
                    "cast_adapter", [], [t], weight_grad=adapter * elems, transient=copy,
                    trains=True,
                )  # fmt: skip
                factors.append((t, 0, 0))
            else:
                factors.append(("", adapter * elems, copy))
        delta = self.new("wdelta", experts * in_f * out_f, w_bytes, True)
        inputs = [t for t, _, _ in factors if t]
        self._op(
            "lora_delta", inputs, [delta], saves=inputs,
            weight_grad=sum(g for _, g, _ in factors), transient=sum(c for _, _, c in factors),
            trains=True, gemm=(out_f, r, in_f, experts),
        )  # fmt: skip
        self.deltas[key] = delta
        return delta

    def _sliced_linear(
        self,
        x: str,
        in_f: int,
        out_f: int,
        component: str,
        tokens: Size | None,
        count: int,
        first: bool,
    ) -> str:
        """``F.linear`` on ``param[e]``, one matrix of a 3-D parameter of ``count``. The
        slice is no leaf, so autocast casts it at every call; its gradient goes back
        through the indexing, whose backward makes a zero-filled gradient of the whole
        parameter: autograd keeps the first (``first``: the last call, whose backward
        runs first) and sums each later one into it, a transient while it is added."""
        ctx = self.ctx
        rows = tokens if tokens is not None else self.s.tokens
        trainable = ctx.trains(component)
        w_dtype = ctx.weight_bytes(component)
        xin = self.cast(x, 2) if ctx.mode == "amp" else x
        whole = w_dtype * count * in_f * out_f if trainable else 0
        weight = ""
        # the later slices' gradients are summed into it out of place (see _regrade)
        w_grad, redo = (whole, 0) if first else (0, 2 * whole)
        if ctx.mode == "amp" and w_dtype == 4:
            weight = self.new("wcast", in_f * out_f, 2, trainable)
            self._op(
                "cast_weight", [], [weight], weight_grad=w_grad, transient=redo, trains=trainable
            )
            w_grad = redo = 0
        y = self.new("lin", rows * out_f, ctx.act, self.rg[xin] or trainable)
        saves = [xin if trainable else "", weight if self.rg[xin] else ""]
        inputs = [xin] + ([weight] if weight else [])
        self._op(
            "mm", inputs, [y], saves=saves, weight_grad=w_grad, transient=redo, trains=trainable,
            gemm=(rows, in_f, out_f, 1),
        )  # fmt: skip
        return y

    def _lora(
        self,
        x: str,
        base: str,
        in_f: int,
        out_f: int,
        tokens: Size,
        key: tuple[str, str | None, int, int, int],
    ) -> str:
        """PEFT ``lora.Linear``: ``base(x) + B(A(dropout(x))) * scaling``. A and B, and so
        their gradients, are in the adapter dtype (``Ctx.adapter_bytes``: PEFT's default
        keeps them fp32 on a 16-bit base). Outside autocast PEFT casts the input to the
        adapters' dtype, the adapter path computes in it, and the sum is cast back to the
        base output's dtype; under autocast the matmuls run in the compute dtype, on
        autocast's cached 16-bit copies of fp32 adapters (trainable leaves), which each
        matmul keeps for its input's gradient -- the LM head's B is vocab x r. ``key``: the
        base linear's (its component, role and shape), which names its adapter."""
        ctx, r = self.ctx, self.ctx.lora_rank
        adapter_dtype = ctx.adapter_bytes
        xin = self.cast(x, adapter_dtype) if ctx.mode != "amp" else x
        xin = self.dropout(xin, ctx.dropout)
        if ctx.mode == "amp":
            xin = self.cast(xin, 2)
        out_dtype = ctx.act if ctx.mode == "amp" else adapter_dtype
        cast = ctx.mode == "amp" and adapter_dtype == 4
        component, role, _, _, weights = key
        key_a = (component, f"{role}.lora_A", r, in_f, weights)
        key_b = (component, f"{role}.lora_B", r, out_f, weights)
        wa = self._adapter_cast(key_a) if cast else ""
        if not cast:  # a head run in chunks uses its adapter again (see _regrade)
            self._regrade(key_a)
        a = self.new("loraA", tokens * r, out_dtype, True)
        self._op(
            "lora_A", [xin, *filter(None, [wa])], [a], saves=[xin, wa if self.rg[xin] else ""],
            weight_grad=0 if cast else adapter_dtype * r * in_f, trains=True,
            gemm=(tokens, in_f, r, 1),
        )  # fmt: skip
        wb = self._adapter_cast(key_b) if cast else ""
        if not cast:
            self._regrade(key_b)
        b = self.new("loraB", tokens * out_f, out_dtype, True)
        self._op(
            "lora_B", [a, *filter(None, [wb])], [b], saves=[a, wb],
            weight_grad=0 if cast else adapter_dtype * r * out_f, trains=True,
            gemm=(tokens, r, out_f, 1),
        )  # fmt: skip
        scaled = self.unary("scale", b)
        return self.cast(self.binary("add", base, scaled), self.dtype[base])

    def _adapter_cast(self, key: tuple[str, str | None, int, int, int]) -> str:
        """Autocast's 16-bit copy of an fp32 adapter matrix (``key``: its component, name,
        rank and width), made at its first use and cached while the autocast region is
        open; its backward lands the fp32 gradient on the adapter."""
        _, _, r, width, _ = key
        weight = self.cached.get(key, "")
        if not weight:
            weight = self.cached[key] = self.new("wcast", r * width, 2, True)
            self.block.cached.add(weight)
            self._op("cast_weight", [], [weight], weight_grad=4 * r * width, trains=True)
        return weight

    def _lora_qkv(
        self, x: str, base: str, in_f: int, widths: tuple[int, int, int], tokens: Size
    ) -> str:
        """LitGPT's ``LoRAQKVLinear``: one dropout and one ``A`` (``r`` rows per adapted
        part) for the fused projection, a grouped ``conv1d`` for the ``B`` of each adapted
        part, and -- unless q, k and v all carry one -- ``zero_pad``: zeros of the whole
        width with the parts' outputs copied in by ``index_copy_``, which keeps its source
        for backward; then ``* scaling`` and the sum with the base output."""
        ctx, r = self.ctx, self.ctx.lora_rank
        adapter_dtype = ctx.adapter_bytes
        parts = [w for w, on in zip(widths, ctx.qkv_enabled, strict=True) if on]
        xin = self.dropout(x, ctx.dropout)
        if ctx.mode == "amp":
            xin = self.cast(xin, 2)
        out_dtype = ctx.act if ctx.mode == "amp" else adapter_dtype
        a = self.new("loraA", tokens * r * len(parts), out_dtype, True)
        self._op(
            "lora_A", [xin], [a], saves=[xin], weight_grad=adapter_dtype * r * len(parts) * in_f,
            trains=True, gemm=(tokens, in_f, r * len(parts), 1),
        )  # fmt: skip
        b = self.new("loraB", tokens * sum(parts), out_dtype, True)
        # a grouped conv1d: each adapted part's B on its own r rows
        self._op(
            "lora_B", [a], [b], saves=[a], weight_grad=adapter_dtype * r * sum(parts),
            trains=True, gemm=(tokens * len(parts), r, sum(parts) // len(parts), len(parts)),
        )  # fmt: skip
        if len(parts) < len(widths):
            padded = self.new("zero_pad", tokens * sum(widths), out_dtype, True)
            self._op("index_copy", [b], [padded], saves=[b])
            b = padded
        scaled = self.unary("scale", b)
        return self.binary("add", base, scaled)

    def rms_norm(self, x: str, h: int, component: str = "norms", fp32_weight: bool = False) -> str:
        """HF ``LlamaRMSNorm``: fp32 variance, ``weight * (x * rsqrt(mean(x^2) + eps))``.
        ``fp32_weight``: the weight multiplies the fp32 normalized input before the cast
        back (``rmsnorm-fp32``)."""
        if self.ctx.litgpt or fp32_weight:
            return self._litgpt_rms_norm(x, h, component)
        rows = self.elems[x] // h
        xf = self.cast(x, F32)
        sq = self.unary("pow", xf, save_in=True)
        var = self.unary("mean", sq, elems=rows)
        var2 = self.unary("add_eps", var)
        rs = self.unary("rsqrt", var2, save_out=True)
        hn = self.binary("mul", xf, rs, saves="both")
        hc = self.cast(hn, self.dtype[x])
        trains = self.ctx.trains(component)
        w_dtype = self.ctx.weight_bytes(component)
        y = self.new("norm", self.elems[x], max(w_dtype, self.dtype[hc]), self.rg[hc] or trains)
        self._op(
            "mul_weight",
            [hc],
            [y],
            saves=[hc if trains else ""],
            weight_grad=w_dtype * h if trains else 0,
        )
        return y

    def _litgpt_rms_norm(self, x: str, h: int, component: str) -> str:
        """LitGPT's ``RMSNorm``: ``x = x.float()``, ``x * rsqrt(mean(x * x) + eps)``, and
        the product with ``weight.float()`` in fp32 before the cast back: a trainable
        weight's gradient needs the fp32 normalized input (Llama's in transformers keeps
        it cast). transformers' Gemma and OLMo-2 norms (``rmsnorm-fp32``) multiply in
        fp32 too, squaring with ``pow`` (which keeps its input, as ``x * x`` does)."""
        rows = self.elems[x] // h
        xf = self.cast(x, F32)
        sq = self.binary("mul", xf, xf, saves="both")
        var = self.unary("mean", sq, elems=rows)
        var2 = self.unary("add_eps", var)
        rs = self.unary("rsqrt", var2, save_out=True)
        hn = self.binary("mul", xf, rs, saves="both")
        trains = self.ctx.trains(component)
        w_dtype = self.ctx.weight_bytes(component)
        y = self.new("norm", self.elems[x], F32, self.rg[hn] or trains)
        self._op(
            "mul_weight",
            [hn],
            [y],
            saves=[hn if trains else ""],
            weight_grad=w_dtype * h if trains else 0,
        )
        return self.cast(y, self.dtype[x])

    def fused_norm(self, x: str, h: int, norm: str, component: str = "norms") -> str:
        """Transformer Engine's LayerNorm or RMSNorm: one kernel, the output in the input's
        dtype; it keeps its input and per row the fp32 ``rsigma`` (LayerNorm also ``mu``)."""
        rows = self.elems[x] // h
        layernorm = norm.startswith("layernorm")
        trains = self.ctx.trains(component)
        stats = self.new("norm_stats", (2 if layernorm else 1) * rows, F32, False)
        y = self.new("norm", self.elems[x], self.dtype[x], self.rg[x] or trains)
        params = {"layernorm": 2, "layernorm-nobias": 1, "layernorm-nonparam": 0}.get(norm, 1)
        w_grad = params * self.ctx.weight_bytes(component) * h if trains else 0
        self._op("te_norm", [x], [y, stats], saves=[x, stats], weight_grad=w_grad)
        return y

    def megatron_core_attention(
        self, q: str, k: str, v: str, heads: int, kv_heads: int, head_dim: int
    ) -> str:
        """Megatron-core's unfused ``DotProductAttention``: ``baddbmm`` scores in the
        compute dtype, the fused scale-mask-softmax (kept: 2 bytes an element), dropout
        on the probabilities (its 1-byte mask and output kept) and the product with v; a
        grouped k and v are repeated to every head first. The block's attention core."""
        first = len(self.block.ops)
        dt = self.ctx.act
        tokens, pairs = self.s.tokens, self.s.pairs
        if kv_heads != heads:
            k = self.unary("repeat_kv", k, elems=tokens * heads * head_dim, dtype=dt)
            v = self.unary("repeat_kv", v, elems=tokens * heads * head_dim, dtype=dt)
        rg = self.rg[q] or self.rg[k]
        scores = self.new("scores", heads * pairs, dt, rg)
        self._op("matmul_qk", [q, k], [scores], saves=[q, k])
        probs = self.unary("fused_softmax", scores, save_out=True)
        probs = self.dropout(probs, self.ctx.attention_dropout)
        out = self.new("attn", tokens * heads * head_dim, dt, rg or self.rg[v])
        self._op("matmul_pv", [probs, v], [out], saves=[probs, v])
        self.block.core = (first, len(self.block.ops))
        return out

    def layer_norm(self, x: str, h: int, component: str = "norms") -> str:
        """``F.layer_norm`` (fp32 under autocast): keeps its input, mean and rstd."""
        ctx = self.ctx
        rows = self.elems[x] // h
        xin = self.cast(x, F32) if ctx.mode == "amp" else x
        trains = ctx.trains(component)
        stats = self.new("ln_stats", 2 * rows, F32, False)
        y = self.new("ln", self.elems[x], self.dtype[xin], self.rg[xin] or trains)
        w_dtype = ctx.weight_bytes(component)
        self._op(
            "layer_norm",
            [xin],
            [y, stats],
            saves=[xin, stats],
            weight_grad=2 * w_dtype * h if trains else 0,
        )
        return y

    def activation(self, x: str, kind: str) -> str:
        """``gelu_new`` and ``gelu_fast`` are composed of Python ops; every other kind is
        one fused op."""
        if kind == "gelu_fast":
            # transformers' FastGELUActivation, in Python ops:
            # 0.5 x (1 + tanh(x 0.7978845608 (1 + 0.044715 x x))). No op of it is on
            # autocast's lists: it runs in the input's dtype. Each product of two tensors
            # keeps both, tanh its output; a product or sum with a number keeps nothing.
            half = self.unary("half_x", x)
            scaled = self.unary("mul_c", x)
            square = self.binary("mul", self.unary("mul_c", x), x, saves="both")
            inner = self.binary("mul", scaled, self.unary("add_1", square), saves="both")
            t = self.unary("tanh", inner, save_out=True)
            return self.binary("mul", half, self.unary("add_1", t), saves="both")
        if kind == "quick_gelu":
            # transformers' QuickGELUActivation: x * sigmoid(1.702 x), in the input's dtype
            # (neither op is on autocast's lists); sigmoid keeps its output, the product both
            sig = self.unary("sigmoid", self.unary("mul_c", x), save_out=True)
            return self.binary("mul", x, sig, saves="both")
        if kind == "gelu_new":
            # transformers' NewGELUActivation (GPT-2 "gelu_new"), written in Python ops:
            # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). ``pow`` is on autocast's
            # fp32 list, so under autocast x is copied to fp32 (kept by pow) and type
            # promotion carries fp32 through the rest of the formula.
            xp = self.cast(x, F32) if self.ctx.mode == "amp" else x
            cube = self.unary("pow3", xp, save_in=True)
            inner = self.binary("add", x, self.unary("mul_c", cube))
            t = self.unary("tanh", self.unary("mul_c", inner), save_out=True)
            half = self.unary("half_x", x)
            return self.binary("mul", half, self.unary("add_1", t), saves="both")
        return self.unary(kind, x, save_in=True)

    def attention(
        self,
        q: str,
        k: str,
        v: str,
        heads: int,
        kv_heads: int,
        head_dim: int,
        eager: str = "hf",
        softcap: float = 0.0,
        sinks: bool = False,
        given: str = "",
    ) -> str:
        """Scaled dot-product attention by kernel; returns (b, s, heads * head_dim). Its ops
        are the block's attention core (:attr:`memfit.engine.graph.Block.core`). ``eager``,
        ``softcap`` and ``sinks``: the model's own attention without SDPA
        (``ModelSpec.eager_attention``), its soft-capping of the scores and its attention
        sinks (``ModelSpec.attention_sinks``); ``given``: the tensor the attention was
        given (the norm's output), whose dtype Falcon's softmax takes."""
        first = len(self.block.ops)
        if self.kernel() == "eager":
            if sinks:
                out = self._sink_eager(q, k, v, heads, kv_heads, head_dim)
            elif eager == "falcon":
                dtype = self.dtype[given] if given else self.ctx.res
                out = self._falcon_eager(q, k, v, heads, kv_heads, head_dim, dtype)
            else:
                out = self._eager(q, k, v, heads, kv_heads, head_dim, softcap, eager == "plain")
        else:
            out = self._attention(q, k, v, heads, kv_heads, head_dim)
        self.block.core = (first, len(self.block.ops))
        return out

    def _attention(self, q: str, k: str, v: str, heads: int, kv_heads: int, head_dim: int) -> str:
        ctx = self.ctx
        kernel = self.kernel()
        if kernel == "math":
            return self._math(q, k, v, heads, kv_heads, head_dim)
        if ctx.mode == "amp":
            q, k, v = self.cast(q, 2), self.cast(k, 2), self.cast(v, 2)
        tokens = self.s.tokens
        out = self.new(
            "attn", tokens * heads * head_dim, self.dtype[q], self.rg[q] or self.rg[k] or self.rg[v]
        )
        rows = heads * (tokens if kernel == "flash" else self.s.padded)
        lse = self.new("lse", rows, F32, False)
        bias = ""
        if ctx.masked:
            # convert_boolean_attn_mask: zeros of the query dtype with -inf where masked,
            # (b, 1, s, s), kept by the kernel for its backward
            bias = self.new("attn_bias", self.s.pairs, self.dtype[q], False)
            self._op("mask_to_bias", [], [bias])
        # backward: dq, dk, dv come from the graph; flash also accumulates dq in fp32
        workspace = F32 * rows + (F32 * tokens * heads * head_dim if kernel == "flash" else 0)
        ring = []
        if ctx.cp > 1:
            # ring attention (Liu et al. 2023; Megatron/TE context parallelism): while the
            # kernel works on one key/value block the next one arrives, so two blocks of
            # the other ranks' k and v are live; backward also sends dk and dv (fp32)
            # around the ring with them
            kv_bytes = self.elems[k] * self.dtype[k] + self.elems[v] * self.dtype[v]
            kv_elems = self.elems[k] + self.elems[v]
            ring = [self.new("kv_ring", 2 * kv_elems, self.dtype[k], False)]
            self._op("ring_recv", [], ring)
            workspace += 2 * kv_bytes + 2 * F32 * kv_elems
        self._op(
            f"sdpa_{kernel}",
            [q, k, v, *ring],
            [out, lse],
            saves=[q, k, v, out, lse, bias],
            transient=workspace,
        )
        return out

    def kernel(self) -> str:
        ctx = self.ctx
        return attention_kernel(ctx.attention, fp32=ctx.mode == "fp32", sdpa_math=ctx.sdpa_math)

    def _eager(
        self,
        q: str,
        k: str,
        v: str,
        heads: int,
        kv_heads: int,
        head_dim: int,
        softcap: float,
        plain: bool = False,
    ) -> str:
        """transformers' ``eager_attention_forward``: scores, mask, fp32 softmax, dropout.
        ``plain``: GPT-2's and BERT's own, whose softmax runs in the scores' dtype
        (``softmax(attn_weights, dim=-1)``; autocast makes it fp32), cast to the values'
        dtype by a statement of its own.

        ``softcap``: Gemma-2's soft-capping of the scaled scores (transformers 5.24
        ``modeling_gemma2.py``, ``scores / cap``, ``tanh``, ``* cap``, each out of place,
        before the mask): two more score-sized tensors while the forward runs, and tanh's
        output kept for its backward."""
        ctx = self.ctx
        pairs = self.s.pairs
        query_dtype = self.dtype[q]
        scaled, v = self._scaled_scores(q, k, v, heads, kv_heads)
        if softcap:
            capped = self.unary("tanh", self.unary("div_c", scaled), save_out=True)
            scaled = self.unary("mul_c", capped)
        masked = self._masked(scaled)
        # ``attn_weights = softmax(attn_weights, dtype=float32).to(query.dtype)``: the
        # masked scores stay alive until the statement is done
        statement = masked
        if plain:
            # autocast runs softmax in fp32: a 16-bit input is copied to fp32 first
            if ctx.mode == "amp" and self.dtype[masked] == 2:
                masked = self.cast(masked, F32)
        elif self.dtype[masked] == 2 and not ctx.fp16:
            # softmax(x, dtype=float32) converts a bf16 input to fp32 first (only fp16 has
            # CUDA's half-to-float kernel): an fp32 copy of the scores, and in backward an
            # fp32 gradient of it before the cast back
            masked = self.cast(masked, F32)
        soft = self.dtype[masked] if plain else F32
        probs = self.new("softmax", heads * pairs, soft, self.rg[masked])
        self._op(
            "softmax", [masked], [probs], saves=[] if ctx.selective else [probs],
            holds=[statement],
        )  # fmt: skip
        # the plain softmax's cast to the values' dtype is a statement of its own
        probs = self.cast(probs, query_dtype, holds=[] if plain else [statement])
        probs = self.dropout(probs, ctx.attention_dropout)
        if ctx.mode == "amp":
            probs, v = self.cast(probs, 2), self.cast(v, 2)
        # selective recomputation rebuilds the scores and probabilities in backward
        redo = (soft + self.dtype[probs]) * heads * pairs if ctx.selective else 0
        out = self._times_values(probs, v, heads, head_dim, redo)
        return self.unary("transpose", out)  # .transpose(1, 2).contiguous()

    def _masked(self, scores: str, holds: Sequence[str] = ()) -> str:
        """``scores + mask``: the mask in the residual stream's dtype (the embedding
        output's), the sum in the wider of the two."""
        dtype = max(self.dtype[scores], self.ctx.res)
        masked = self.new("masked", self.elems[scores], dtype, self.rg[scores])
        self._op("add_mask", [scores], [masked], holds=holds)
        return masked

    def _times_values(self, probs: str, v: str, heads: int, head_dim: int, redo: Size) -> str:
        """``probs @ v``, the attention's output in the probabilities' dtype: it keeps both,
        or under selective recomputation the values alone, the probabilities rebuilt in
        backward (``redo`` bytes)."""
        rows = self.s.tokens * heads * head_dim
        out = self.new("attn", rows, self.dtype[probs], self.needs(probs, v))
        saves = [v] if self.ctx.selective else [probs, v]
        self._op("matmul_pv", [probs, v], [out], saves=saves, transient=redo)
        return out

    def _scaled_scores(self, q: str, k: str, v: str, heads: int, kv_heads: int) -> tuple[str, str]:
        """The start of transformers' eager attention, its own or gpt-oss's: grouped keys
        and values repeated for every query head, q and k cast under autocast, ``q @
        k^T`` (keeping both) and its scaling; the scaled scores and the values as the
        product with the probabilities reads them."""
        if kv_heads != heads:
            k = self.unary("repeat_kv", k, elems=self.elems[q])
            v = self.unary("repeat_kv", v, elems=self.elems[q])
        if self.ctx.mode == "amp":
            q, k = self.cast(q, 2), self.cast(k, 2)
        scores = self.new("scores", heads * self.s.pairs, self.dtype[q], self.needs(q, k))
        self._op("matmul_qk", [q, k], [scores], saves=[q, k])
        return self.unary("scale", scores), v

    def _sink_eager(self, q: str, k: str, v: str, heads: int, kv_heads: int, head_dim: int) -> str:
        """gpt-oss's ``eager_attention_forward`` (transformers 5 ``modeling_gpt_oss.py``):
        scores, mask, then each head's sink logit joined as one more column --
        ``torch.cat([scores, sinks], -1)``, b x h x s x (s + 1), in the wider of the masked
        scores' and the sinks' dtype (``cat`` promotes, under autocast too) --, its row
        maximum subtracted (``max`` keeps its int64 indices for backward), a softmax in
        that same dtype (``dtype=combined_logits.dtype``, not fp32) keeping its output, the
        sink's column dropped by a view, and the probabilities cast to the values' dtype
        for the product with them. Each of the three score-sized tensors has one column
        more than the scores: ``heads (b s^2 + b s)`` elements."""
        ctx = self.ctx
        pairs, tokens = self.s.pairs, self.s.tokens
        scaled, v = self._scaled_scores(q, k, v, heads, kv_heads)
        masked = self._masked(scaled)
        # the sinks are a parameter of the attention (heads elements): their gradient is
        # the cat's backward's, summed over the batch and the query rows
        trains = ctx.trains("attention")
        sink_bytes = ctx.weight_bytes("attention")
        wide = heads * (pairs + tokens)
        combined = self.new(
            "cat", wide, max(self.dtype[masked], sink_bytes), self.rg[masked] or trains
        )
        self._op(
            "cat", [masked], [combined], weight_grad=sink_bytes * heads if trains else 0,
            trains=trains,
        )  # fmt: skip
        dtype = self.dtype[combined]
        row_max = self.new("amax", heads * tokens, dtype, self.rg[combined])
        argmax = self.new("argmax", heads * tokens, 8, False)
        self._op("amax", [combined], [row_max, argmax], saves=[] if ctx.selective else [argmax])
        shifted = self.binary("sub_max", combined, row_max, elems=wide)
        probs = self.new("softmax", wide, dtype, self.rg[shifted])
        self._op("softmax", [shifted], [probs], saves=[] if ctx.selective else [probs])
        kept = self.view("drop_sink", probs, heads * pairs)  # probs[..., :-1]
        kept = self.dropout(kept, ctx.attention_dropout)
        kept = self.cast(kept, self.dtype[v])  # .to(value_states.dtype)
        # selective recomputation rebuilds the probabilities (and their cast) in backward
        redo = (dtype * wide + self.dtype[kept] * heads * pairs) if ctx.selective else 0
        out = self._times_values(kept, v, heads, head_dim, redo)
        return self.unary("transpose", out)  # .transpose(1, 2).contiguous()

    def _falcon_eager(
        self, q: str, k: str, v: str, heads: int, kv_heads: int, head_dim: int, dtype: int
    ) -> str:
        """``FalconAttention``'s own attention without SDPA (transformers 5.24
        ``modeling_falcon.py``, rotary positions): ``scores = q @ k^T``, ``scores /=
        sqrt(head_dim)`` in place, ``softmax(scores + mask, dtype=hidden_states.dtype)``,
        ``probs @ v``. The softmax runs in ``dtype``, the dtype of the attention's input
        (the norm's output: fp32 under autocast, whatever the residual stream's; the
        model's dtype otherwise), a 16-bit input made fp32 first as ``softmax(x,
        dtype=float32)`` does (but for fp16's own kernel); so under pure 16-bit
        training its output is the one score matrix the layer keeps, read by the product
        with the values as it is; under autocast that product keeps a 16-bit copy beside
        the fp32 probabilities. ``matmul`` broadcasts a single key/value head: its expand
        and reshape copy it to every query head, after autocast's cast."""
        ctx = self.ctx
        pairs = self.s.pairs
        if ctx.mode == "amp":
            q, k = self.cast(q, 2), self.cast(k, 2)
        if kv_heads != heads:
            k = self.unary("expand_kv", k, elems=self.elems[q])
        scores = self.new("scores", heads * pairs, self.dtype[q], self.needs(q, k))
        self._op("matmul_qk", [q, k], [scores], saves=[q, k])
        # the in-place division allocates nothing in forward; its backward divides the
        # gradient into a new tensor of the scores' size
        scaled = self.new("scale_", 0, self.dtype[scores], self.rg[scores])
        self._op("scale_", [scores], [scaled])
        self.elems[scaled] = self.elems[scores]
        # ``scores = softmax(scores + mask, dtype=...)``: the scaled scores stay alive
        # until the statement is done, the masked ones through the softmax
        masked = self._masked(scaled, holds=[scores])
        statement = [scores, masked]
        if self.dtype[masked] == 2 and dtype == F32 and not ctx.fp16:
            masked = self.cast(masked, F32, holds=statement)
        probs = self.new("softmax", heads * pairs, dtype, self.rg[masked])
        self._op(
            "softmax", [masked], [probs], saves=[] if ctx.selective else [probs],
            holds=statement,
        )  # fmt: skip
        if not ctx.compiled:  # returned as the attention weights, to the model's loop
            self.block.returned.add(probs)
        probs = self.dropout(probs, ctx.attention_dropout)
        if ctx.mode == "amp":
            probs, v = self.cast(probs, 2), self.cast(v, 2)
        if kv_heads != heads:
            v = self.unary("expand_kv", v, elems=self.elems[q])
        # selective recomputation rebuilds the probabilities (and their 16-bit copy)
        redo = (dtype + (2 if ctx.mode == "amp" else 0)) * heads * pairs if ctx.selective else 0
        out = self._times_values(probs, v, heads, head_dim, redo)
        return self.unary("merge_heads", out)  # .permute(0, 2, 1, 3).reshape(...)

    def _math(self, q: str, k: str, v: str, heads: int, kv_heads: int, head_dim: int) -> str:
        """SDPA's math fallback (``_scaled_dot_product_attention_math``), recorded op by op
        by autograd. It computes 16-bit inputs in fp32: q, k and v are upcast, q and k
        scaled by the square root of the scale, the fp32 scores get the mask as a bias,
        softmax keeps its fp32 output, and the product with v is cast back. Autograd keeps
        the scaled q, k (a single key/value head stays one head: ``matmul`` broadcasts it
        as a view), the probabilities and v."""
        ctx = self.ctx
        pairs = self.s.pairs
        dtype = self.dtype[q] if ctx.mode != "amp" else 2
        q, k, v = self.cast(q, F32), self.cast(k, F32), self.cast(v, F32)
        qs, ks = self.unary("scale_q", q), self.unary("scale_k", k)
        scores = self.new("scores", heads * pairs, F32, self.needs(qs, ks))
        self._op("matmul_qk", [qs, ks], [scores], saves=[qs, ks])
        bias = self.new("attn_bias", pairs, dtype, False)
        self._op("mask_to_bias", [], [bias])
        masked = self.binary("add_mask", scores, bias)
        probs = self.unary("softmax", masked, save_out=True)
        probs = self.dropout(probs, ctx.attention_dropout)
        out = self.new("attn", self.s.tokens * heads * head_dim, F32, self.needs(probs, v))
        self._op("matmul_pv", [probs, v], [out], saves=[probs, v])
        out = self.cast(out, dtype)
        return self.unary("transpose", out)  # .permute(0, 2, 1, 3).reshape(...)


def decoder_layer(m: ModelSpec, ctx: Ctx, x_grad: bool, moe: bool) -> tuple[Block, str]:
    """A decoder layer of any family, as transformers writes it, from the spec's fields:

    * a pre-norm (``norm``: RMSNorm or LayerNorm) before attention and before the MLP;
    * attention with separate or fused (``fused_qkv``: GPT-2, GPT-NeoX, Falcon, Phi-3)
      q/k/v projections, grouped key/value heads, rotary positions or none here (learned
      positions are added to the embedding), or multi-head latent attention (``is_mla``);
    * a gated, plain or mixture-of-experts MLP (``mlp``, ``moe``);
    * the two branches in sequence, or in parallel on the layer input
      (``parallel_attention``: GPT-NeoX, Falcon), with a shared norm when the layer has one
      (``norms_per_layer`` 1, Falcon-7B);
    * dropout on each branch's output where the config asks for it (``hidden_dropout``,
      GPT-2's ``resid_pdrop``).
    """
    h, tokens = m.hidden_size, ctx.shape().tokens
    net = Net("decoder_layer", ctx, tokens * h // ctx.sp, ctx.res, x_grad)
    if ctx.megatron and megatron_builds(m):
        return net.block, _megatron_layer(net, m, moe)
    norm = _norm_of(net, m)
    # the norms before each sublayer (pre, sandwich) and after it (post, sandwich)
    before, after = m.norm_placement != "post", m.norm_placement != "pre"
    n1 = net.gather_seq(norm("x", h) if before else "x")
    q_out, kv_out = m.num_attention_heads * m.head_dim, m.num_key_value_heads * m.head_dim
    if m.is_mla:
        attn, q_out = _mla(net, m, n1, norm)
    elif ctx.litgpt:
        attn = _litgpt_attention(net, m, n1)
    elif m.fused_qkv:
        qkv = net.linear(n1, h, q_out + 2 * kv_out, "attention", "qkv", m.attention_bias)
        # views of the fused output (transformers' split / view / transpose): SDPA keeping
        # q keeps the whole projection. FalconAttention's _split_heads indexes k and v with
        # a list (``[..., [-2], :]``): copies
        q = net.view("split_q", qkv, tokens * q_out)
        if m.eager_attention == "falcon":
            k = net.unary("split_k", qkv, elems=tokens * kv_out)
            v = net.unary("split_v", qkv, elems=tokens * kv_out)
        else:
            k = net.view("split_k", qkv, tokens * kv_out)
            v = net.view("split_v", qkv, tokens * kv_out)
    else:
        q = net.linear(n1, h, q_out, "attention", "q_proj", m.attention_bias)
        k = net.linear(n1, h, kv_out, "attention", "k_proj", m.attention_bias)
        v = net.linear(n1, h, kv_out, "attention", "v_proj", m.attention_bias)
    if not m.is_mla and not ctx.litgpt:
        if m.qk_norm == "full" and not m.fused_qkv:
            # OLMo-2 (transformers 5.24 modeling_olmo2.py): q_norm and k_norm, RMSNorms over
            # the whole q and k projections (every head at once), before RoPE
            q, k = norm(q, q_out), norm(k, kv_out)
        elif m.qk_norm == "head" and not m.fused_qkv:
            # Qwen3, Gemma-3 (transformers 5.24 modeling_qwen3.py, modeling_gemma3.py): q_norm
            # and k_norm over each head's head_dim, on q and k viewed as heads, before RoPE
            q, k = norm(q, m.head_dim), norm(k, m.head_dim)
        if m.position_embedding == "rotary":
            q, k = _rope(net, q, m.rope_keeps_dtype), _rope(net, k, m.rope_keeps_dtype)
        if ctx.kv_cache:
            # transformers' DynamicCache keeps each layer's keys (after RoPE) and values
            # in the model output: alive until the output is released -- after the step,
            # or, released before backward, once the loss is computed. It concatenates
            # them onto its empty cache: copies, which attention then reads (a view of a
            # fused projection is copied out of it)
            k, v = (net.unary("cache_cat", t) if t in net.block.views else t for t in (k, v))
            net.block.held.update((k, v))
        attn = net.attention(
            q, k, v, m.num_attention_heads, m.num_key_value_heads, m.head_dim,
            m.eager_attention, m.attn_logit_softcapping, m.attention_sinks, n1,
        )  # fmt: skip
    o = net.linear(attn, q_out, h, "attention", "o_proj", m.attention_out_bias)
    o = net.dropout(net.scatter_seq(o), m.hidden_dropout)
    if after:  # OLMo-2's and Gemma-2's post_attention_layernorm, on the sublayer's output
        o = norm(o, h)

    def mlp(x: str) -> str:
        if moe:
            y = _moe_eager(net, m, x) if ctx.moe_eager else _moe(net, m, x)
        else:
            y = _gated_mlp(net, m, x, m.intermediate_size, "mlp", tokens)
        y = net.dropout(net.scatter_seq(y), m.hidden_dropout)
        return norm(y, h) if after else y  # post_feedforward_layernorm

    if m.parallel_attention:
        n2 = net.gather_seq(norm("x", h)) if m.norms_per_layer > 1 else n1
        y = mlp(n2)
        out = net.binary("residual", net.binary("residual", "x", o), y)
    else:
        r1 = net.binary("residual", "x", o)
        y = mlp(net.gather_seq(norm(r1, h) if before else r1))
        out = net.binary("residual", r1, y)
    if not ctx.outputs_held:
        # a cache released before backward frees only what no op saved: what the
        # attention saves (its keys and values, where it reads them as they are) lives on
        # as a saved tensor until the layer's backward
        net.block.held -= {t for op in net.block.ops for t in op.saves}
    return net.block, out


def megatron_builds(m: ModelSpec) -> bool:
    """Whether :func:`_megatron_layer` builds this family's layer as Megatron-core does:
    pre-norm GPT-style layers with multi-head or grouped attention; other layouts (latent
    attention, attention sinks, parallel branches, post- or sandwich norms, q/k norms) are
    built as transformers writes them."""
    return (
        not m.is_mla
        and not m.attention_sinks
        and not m.parallel_attention
        and m.norm_placement == "pre"
        and m.qk_norm == "none"
        and m.eager_attention == "hf"
        and not m.attn_logit_softcapping
    )


def _megatron_layer(net: Net, m: ModelSpec, moe: bool) -> str:
    """A ``TransformerLayer`` of Megatron-core built from Transformer Engine's modules (the
    ``get_gpt_layer_with_transformer_engine_spec`` layer, with the fusions the training
    recipes turn on: ``apply_rope_fusion``, ``bias_activation_fusion``,
    ``bias_dropout_fusion``, ``masked_softmax_fusion``):

    * each norm is one kernel (``TELayerNormColumnParallelLinear``, ``TENorm``) keeping
      its input and its per-row statistics in fp32;
    * ``linear_qkv`` is one GEMM whose q, k and v are views of its output; fused RoPE
      writes new q and k, and v stays a view, keeping the fused output alive;
    * the core attention is the fused kernel, or without it (``attention: eager``)
      ``baddbmm`` scores, the fused scale-mask-softmax keeping its 16-bit output, dropout
      and the product with v (Korthikanti et al. 2022, section 4.1: ``5 a s^2 b``);
    * ``linear_fc1`` is one GEMM for gate and up, the fused SwiGLU (or bias-GeLU) keeps its
      input; ``linear_fc2``; bias-dropout-add keeps the dropout's mask.

    Per layer without recomputation this keeps ``s b h (34 + 5 a s / h)`` bytes for a
    GPT-3 layer (LayerNorm, GeLU, dropout, unfused attention), Korthikanti et al.'s
    equation (1), plus the norms' statistics; the time prices these few fused kernels
    instead of transformers' many element-wise ops."""
    ctx = net.ctx
    h, tokens = m.hidden_size, net.s.tokens
    heads, kv_heads, head_dim = m.num_attention_heads, m.num_key_value_heads, m.head_dim
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    n1 = net.gather_seq(net.fused_norm("x", h, m.norm))
    if {"q_proj", "k_proj", "v_proj"} & ctx.lora_roles:
        # adapters on q, k or v: PEFT-style per-projection linears keep their adapters
        q = net.linear(n1, h, q_out, "attention", "q_proj", m.attention_bias)
        k = net.linear(n1, h, kv_out, "attention", "k_proj", m.attention_bias)
        v = net.linear(n1, h, kv_out, "attention", "v_proj", m.attention_bias)
    else:
        qkv = net.linear(n1, h, q_out + 2 * kv_out, "attention", "qkv", m.attention_bias)
        q = k = v = qkv  # views of the fused output
    if m.position_embedding == "rotary":
        # TE's fused RoPE reads the view and writes a new tensor; it keeps nothing
        q = net.unary("fused_rope", q, elems=tokens * q_out, reads=tokens * q_out * ctx.act)
        k = net.unary("fused_rope", k, elems=tokens * kv_out, reads=tokens * kv_out * ctx.act)
    if net.kernel() == "eager":
        attn = net.megatron_core_attention(q, k, v, heads, kv_heads, head_dim)
    else:
        attn = net.attention(q, k, v, heads, kv_heads, head_dim)
    o = net.linear(attn, q_out, h, "attention", "o_proj", m.attention_out_bias)
    r1 = net.binary("residual", "x", net.dropout(net.scatter_seq(o), m.hidden_dropout))
    n2 = net.gather_seq(net.fused_norm(r1, h, m.norm))
    if moe:
        y = _moe(net, m, n2)
    else:
        f = m.intermediate_size
        if m.mlp == "plain":
            up = net.linear(n2, h, f, "mlp", "up_proj", m.mlp_bias)
            act = net.unary("bias_" + m.activation, up, save_in=True)
        elif {"gate_proj", "up_proj"} & ctx.lora_roles:
            gate = net.linear(n2, h, f, "mlp", "gate_proj", m.mlp_bias)
            up = net.linear(n2, h, f, "mlp", "up_proj", m.mlp_bias)
            act = net.binary("fused_swiglu", gate, up, saves="both")
        else:
            gu = net.linear(n2, h, 2 * f, "mlp", "gate_up", m.mlp_bias)
            act = net.unary("fused_swiglu", gu, save_in=True, elems=tokens * f)
        y = net.linear(act, f, h, "mlp", "down_proj", m.mlp_bias)
    y = net.dropout(net.scatter_seq(y), m.hidden_dropout)
    return net.binary("residual", r1, y)


def _norm_of(net: Net, m: ModelSpec) -> Callable[[str, int], str]:
    """The model's norm, applied by ``norm(x, width)``."""
    if m.norm.startswith("layernorm"):
        return net.layer_norm
    if m.norm == "rmsnorm-fp32":
        return lambda x, h: net.rms_norm(x, h, fp32_weight=True)
    return net.rms_norm


def _litgpt_attention(net: Net, m: ModelSpec, x: str) -> str:
    """LitGPT's ``CausalSelfAttention`` (litgpt/model.py): one fused ``qkv`` linear whose
    q, k and v are views; RoPE's ``torch.cat`` makes new q and k; grouped or multi-query
    keys and values are ``repeat_interleave``-d to every head before the kernel (so it
    needs no GQA support, and Falcon's single head runs the fused kernels); with as many
    key/value heads as queries, the kernel keeps v, a view, and so the whole fused output."""
    tokens, h = net.s.tokens, m.hidden_size
    heads, kv_heads, head_dim = m.num_attention_heads, m.num_key_value_heads, m.head_dim
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    widths = (q_out, kv_out, kv_out)
    qkv = net.linear(x, h, sum(widths), "attention", "qkv", m.attention_bias, qkv=widths)
    if m.position_embedding == "rotary":
        q, k = _litgpt_rope(net, qkv, tokens * q_out), _litgpt_rope(net, qkv, tokens * kv_out)
    else:
        q = net.unary("split_q", qkv, elems=tokens * q_out)
        k = net.unary("split_k", qkv, elems=tokens * kv_out)
    v = qkv
    if kv_heads != heads:
        k = net.unary("repeat_interleave", k, elems=tokens * q_out)
        v = net.unary("repeat_interleave", qkv, elems=tokens * q_out)
    # LitGPT soft-caps the scores in its own attention (tanh(scores / cap) * cap)
    return net.attention(q, k, v, heads, heads, head_dim, softcap=m.attn_logit_softcapping)


def _litgpt_rope(net: Net, qkv: str, elems: Size) -> str:
    """LitGPT's ``apply_rope`` on a view of the fused projection: ``cat((-x2, x1))``,
    ``x * cos + rotated * sin`` in the cos/sin buffers' dtype (fp32 where nothing cast
    the model's buffers: autocast's fp32 model, the bitsandbytes plugin), cast back, and
    ``cat`` with the part RoPE leaves (a copy even when it is empty)."""
    ctx = net.ctx
    act = net.dtype[qkv]
    buffers = F32 if ctx.mode != "half" or ctx.quantized else act
    wide = max(act, buffers)
    rg = net.rg[qkv]
    half = net.unary("neg", qkv, elems=elems // 2)
    rotated = net.binary("cat", half, qkv, elems=elems)
    cos_term = net.new("rope_cos", elems, wide, rg)
    net._op("mul_cos", [qkv], [cos_term])
    sin_term = net.new("rope_sin", elems, wide, rg)
    net._op("mul_sin", [rotated], [sin_term])
    roped = net.cast(net.binary("add", cos_term, sin_term), act)
    return net.unary("cat", roped)


def _mla(net: Net, m: ModelSpec, x: str, norm: object) -> tuple[str, int]:
    """DeepSeek-V2/V3 multi-head latent attention as transformers writes it.

    Queries through ``q_a_proj -> q_a_layernorm -> q_b_proj`` (or ``q_proj``); keys and
    values from the shared latent ``kv_a_proj_with_mqa`` (``kv_lora_rank`` + the decoupled
    RoPE key), normalized and expanded by ``kv_b_proj`` to every head; the RoPE part of the
    key is shared by all heads and expanded; ``cat`` builds the full query and key of
    ``qk_nope + qk_rope`` per head. Returns the attention output and its width.
    """
    tokens, h, heads = net.s.tokens, m.hidden_size, m.num_attention_heads
    nope, rope, vdim = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
    norm_fn = norm  # rms_norm or layer_norm of the layer
    if m.q_lora_rank:
        qa = net.linear(x, h, m.q_lora_rank, "attention", "q_a_proj")
        qa = norm_fn(qa, m.q_lora_rank)  # type: ignore[operator]
        q = net.linear(qa, m.q_lora_rank, heads * (nope + rope), "attention", "q_b_proj")
    else:
        q = net.linear(x, h, heads * (nope + rope), "attention", "q_proj")
    kv = net.linear(x, h, m.kv_lora_rank + rope, "attention", "kv_a_proj")
    latent = net.unary("split_latent", kv, elems=tokens * m.kv_lora_rank)
    k_rot = net.unary("split_rope", kv, elems=tokens * rope)
    latent = norm_fn(latent, m.kv_lora_rank)  # type: ignore[operator]
    kvb = net.linear(latent, m.kv_lora_rank, heads * (nope + vdim), "attention", "kv_b_proj")
    v = net.unary("split_v", kvb, elems=tokens * heads * vdim)
    q_rot = _rope(net, net.unary("split_q_rope", q, elems=tokens * heads * rope))
    k_rot = _rope(net, k_rot)
    query = net.binary("cat", q, q_rot, elems=tokens * heads * (nope + rope))
    key = net.binary("cat", kvb, k_rot, elems=tokens * heads * (nope + rope))
    attn = net.attention(query, key, v, heads, heads, vdim)
    return attn, heads * vdim


def _rope(net: Net, t: str, keeps_dtype: bool = False) -> str:
    """``q * cos + rotate_half(q) * sin`` with cos/sin in the residual dtype (promotion);
    ``keeps_dtype``: the sum cast back to the dtype of ``t`` (``ModelSpec.rope_keeps_dtype``)."""
    cos_term = net.new("rope_cos", net.elems[t], max(net.dtype[t], net.ctx.res), net.rg[t])
    net._op("mul_cos", [t], [cos_term])
    rotated = net.unary("rotate_half", t)
    sin_term = net.new("rope_sin", net.elems[t], max(net.dtype[t], net.ctx.res), net.rg[t])
    net._op("mul_sin", [rotated], [sin_term])
    out = net.binary("add", cos_term, sin_term)
    return net.cast(out, net.dtype[t]) if keeps_dtype else out


def _gated_mlp(
    net: Net,
    m: ModelSpec,
    x: str,
    inter: int,
    component: str,
    tokens: Size,
    weights: int = 1,
    fused: bool | None = None,
) -> str:
    h = m.hidden_size
    if m.mlp == "plain":
        up = net.linear(x, h, inter, component, "up_proj", m.mlp_bias, tokens, weights)
        act = net.activation(up, m.activation)
        return net.linear(act, inter, h, component, "down_proj", m.mlp_bias, tokens, weights)
    if m.fused_gate_up if fused is None else fused:
        gu = net.linear(x, h, 2 * inter, component, "gate_up", m.mlp_bias, tokens, weights)
        gate = net.unary("chunk", gu, elems=tokens * inter)
        up = net.unary("chunk", gu, elems=tokens * inter)
    else:
        gate = net.linear(x, h, inter, component, "gate_proj", m.mlp_bias, tokens, weights)
        up = net.linear(x, h, inter, component, "up_proj", m.mlp_bias, tokens, weights)
    act = net.activation(gate, m.activation)
    prod = net.binary("mul", act, up, saves="both")
    return net.linear(prod, inter, h, component, "down_proj", m.mlp_bias, tokens, weights)


def _moe(net: Net, m: ModelSpec, x: str) -> str:
    """Top-k routing (Mixtral/Qwen-MoE style): router, fp32 softmax, gather, experts, scatter.

    Tokens per expert are taken as the balanced ``tokens * k / experts``; the experts' work
    adds up to the dense MLP of ``tokens * k`` tokens.
    """
    ctx, h = net.ctx, m.hidden_size
    tokens, k, experts = net.s.tokens, m.num_experts_per_tok, m.local_experts
    logits = net.linear(x, h, m.num_experts, "router", None, m.mlp_bias)
    probs = net.unary("router_softmax", net.cast(logits, F32), save_out=True)
    weights = net.unary("topk", probs, elems=tokens * k)
    xs = net.cast(x, net.ctx.act) if ctx.mode != "amp" else x
    gathered = net.unary("gather", xs, elems=tokens * k * h)
    routed = net.s.routed
    if ctx.ep > 1:
        # expert parallelism (GShard, Lepikhin et al. 2020; Megatron's all-to-all token
        # dispatcher): the permuted tokens go to the ranks that hold their experts; the
        # busiest rank receives ``capacity`` times the balanced share (Shape.routed)
        gathered = net.unary("all_to_all", gathered, elems=routed * h)
    # transformers keeps the experts as 3-D parameters with gate and up fused
    # (``gate_up_proj``), run as grouped GEMMs on the tokens sorted by expert
    if m.mlp_bias or m.swiglu_limit:
        y = _gpt_oss_experts(net, m, gathered, routed, experts)
    else:
        y = _gated_mlp(
            net, m, gathered, m.moe_intermediate_size, "experts", routed, experts, fused=True
        )
    if ctx.ep > 1:  # and back to the ranks the tokens came from
        y = net.unary("all_to_all", y, elems=tokens * k * h)
    weighted = net.binary("mul_weight", y, weights, saves="both", elems=tokens * k * h)
    out = net.new("moe_out", tokens * h, net.dtype[x], True)
    net._op("index_add", [weighted], [out])
    if m.num_shared_experts:
        inter = m.shared_expert_intermediate_size or m.moe_intermediate_size * m.num_shared_experts
        out = net.binary("add", out, _gated_mlp(net, m, x, inter, "mlp", tokens))
    return out


def _gpt_oss_experts(net: Net, m: ModelSpec, x: str, rows: Size, experts: int) -> str:
    """The routed experts with biases and gpt-oss's clamped SwiGLU, as transformers'
    grouped experts run them (``grouped_mm_experts_forward``, ``integrations/moe.py``):
    the grouped GEMM takes no bias, so each projection's bias is added after it
    (:func:`_expert_bias`), and the activation is the experts' ``_apply_gate``
    (:func:`_clamped_swiglu`)."""
    h, inter = m.hidden_size, m.moe_intermediate_size
    gu = net.linear(x, h, 2 * inter, "experts", "gate_up", False, rows, experts)
    if m.mlp_bias:
        gu = _expert_bias(net, gu, 2 * inter, experts)
    if m.swiglu_limit:
        act = _clamped_swiglu(net, gu, inter, rows)
    else:
        gate = net.unary("chunk", gu, elems=rows * inter)
        up = net.unary("chunk", gu, elems=rows * inter)
        act = net.binary("mul", net.activation(gate, m.activation), up, saves="both")
    y = net.linear(act, inter, h, "experts", "down_proj", False, rows, experts)
    return _expert_bias(net, y, h, experts) if m.mlp_bias else y


def _expert_bias(
    net: Net, y: str, out_f: int, experts: int, gathered: bool = True, grad: bool = True
) -> str:
    """``y`` plus its experts' bias, out of place (type promotion: an fp32 bias makes the
    sum fp32). ``gathered``: ``bias[expert_ids]``, one bias row per row of ``y`` gathered
    into a tensor of their own (the grouped experts); else one expert's row, a view
    broadcast over ``y`` (the eager loop's ``gate_up_proj_bias[expert_idx]``). The bias
    of all ``experts`` gets its gradient where ``grad``: once in the eager loop, at its
    first backward (the last expert's)."""
    ctx = net.ctx
    trains = ctx.trains("experts")
    w_bytes = ctx.weight_bytes("experts")
    rows = net.elems[y] // out_f if gathered else 1
    bias = net.new("bias_rows", rows * out_f, w_bytes, trains)
    w_grad = w_bytes * out_f * experts if trains and grad else 0
    net._op("index_bias", [], [bias], weight_grad=w_grad, trains=trains)
    return net.binary("add_bias", y, bias, elems=net.elems[y])


def _clamped_swiglu(net: Net, gu: str, inter: int, rows: Size) -> str:
    """gpt-oss's ``GptOssExperts._apply_gate`` (transformers 5 ``modeling_gpt_oss.py``):
    ``gate, up = gate_up[..., ::2], gate_up[..., 1::2]`` (views), ``gate.clamp(max=limit)``
    and ``up.clamp(-limit, limit)`` (each keeps its input, a view of ``gate_up``, so the
    whole projection stays), ``glu = gate * sigmoid(gate * alpha)`` (sigmoid keeps its
    output, the product both factors) and ``(up + 1) * glu`` (both factors kept): five
    tensors of ``rows x inter`` and the projection kept, where a plain SwiGLU keeps three."""
    gate = net.view("gate", gu, rows * inter)
    up = net.view("up", gu, rows * inter)
    gate = net.unary("clamp", gate, save_in=True)
    up = net.unary("clamp", up, save_in=True)
    sig = net.unary("sigmoid", net.unary("mul_c", gate), save_out=True)
    glu = net.binary("mul", gate, sig, saves="both")
    return net.binary("mul", net.unary("add_1", up), glu, saves="both")


def _moe_eager(net: Net, m: ModelSpec, x: str) -> str:
    """transformers' eager experts loop (``experts_implementation="eager"``): the router as
    in :func:`_moe`, then expert by expert the tokens routed to it gathered
    (``hidden_states[token_idx]``), ``F.linear`` with its slice of ``gate_up_proj``, the
    activation times ``up`` (both halves views of one output, which their saves keep
    whole), ``F.linear`` with its slice of ``down_proj``, the product with its routing
    weights and ``index_add_`` into the output. Tokens per expert are balanced: the
    ``tokens x k`` assignments shared evenly, the first experts one more where they do
    not divide."""
    ctx, h, inter = net.ctx, m.hidden_size, m.moe_intermediate_size
    if ctx.symbolic:  # floors of the share per expert: not linear forms of the shape
        raise TypeError("the eager experts loop builds at concrete shapes only")
    if ctx.ep > 1:
        raise TypeError("the eager experts loop does not run under expert parallelism")
    tokens, k, experts = ctx.tokens, m.num_experts_per_tok, m.local_experts
    logits = net.linear(x, h, m.num_experts, "router", None, m.mlp_bias)
    probs = net.unary("router_softmax", net.cast(logits, F32), save_out=True)
    weights = net.unary("topk", probs, elems=tokens * k)
    out = net.new("moe_out", tokens * h, net.dtype[x], True)
    net._op("zeros_like", [], [out])
    share, extra = divmod(tokens * k, experts)
    for e in range(experts):
        n = share + (1 if e < extra else 0)
        if n == 0:
            continue
        current = net.unary("gather", x, elems=n * h)
        last = e == (experts - 1 if share else extra - 1)  # the last expert with tokens
        gu = net.linear(
            current, h, 2 * inter, "experts", "gate_up", tokens=n, slice_of=experts,
            slice_grad=last,
        )  # fmt: skip
        if m.mlp_bias:  # gpt-oss: ``@ gate_up_proj[e] + gate_up_proj_bias[e]``
            gu = _expert_bias(net, gu, 2 * inter, experts, gathered=False, grad=last)
        if m.swiglu_limit:
            prod = _clamped_swiglu(net, gu, inter, n)
        else:
            act = net.unary("silu", gu, save_in=True, elems=n * inter)
            prod = net.binary("mul", act, gu, saves="both", elems=n * inter)
        down = net.linear(
            prod, inter, h, "experts", "down_proj", tokens=n, slice_of=experts, slice_grad=last
        )
        if m.mlp_bias:
            down = _expert_bias(net, down, h, experts, gathered=False, grad=last)
        routed_w = net.unary("index_weights", weights, elems=n)
        weighted = net.binary("mul_weight", down, routed_w, saves="both", elems=n * h)
        net._op("index_add", [weighted, out], [])
    if m.num_shared_experts:
        inter = m.shared_expert_intermediate_size or m.moe_intermediate_size * m.num_shared_experts
        out = net.binary("add", out, _gated_mlp(net, m, x, inter, "mlp", net.s.tokens))
    return out


def bert_layer(m: ModelSpec, ctx: Ctx, x_grad: bool) -> tuple[Block, str]:
    """BERT encoder layer: post-norm, biases everywhere, bidirectional attention."""
    h, tokens = m.hidden_size, ctx.shape().tokens
    net = Net("bert_layer", ctx, tokens * h, ctx.res, x_grad)
    q_out = m.num_attention_heads * m.head_dim
    q = net.linear("x", h, q_out, "attention", "q_proj", True)
    k = net.linear("x", h, q_out, "attention", "k_proj", True)
    v = net.linear("x", h, q_out, "attention", "v_proj", True)
    attn = net.attention(
        q, k, v, m.num_attention_heads, m.num_attention_heads, m.head_dim, m.eager_attention
    )
    o = net.dropout(net.linear(attn, q_out, h, "attention", "o_proj", True), m.hidden_dropout)
    n1 = net.layer_norm(net.binary("residual", o, "x"), h)
    up = net.linear(n1, h, m.intermediate_size, "mlp", "up_proj", True)
    act = net.activation(up, m.activation)
    down = net.dropout(
        net.linear(act, m.intermediate_size, h, "mlp", "down_proj", True), m.hidden_dropout
    )
    out = net.layer_norm(net.binary("residual", down, n1), h)
    return net.block, out


def traffic(block: Block) -> tuple[int, int]:
    """The bytes the forward ops of ``block`` read and write (:meth:`Block.moved`) and how
    many kernels they are."""
    return sum(concrete(block.moved(op)[0]) for op in block.ops), len(block.ops)


#: bytes of the packed 4-bit codes a dequantization reads per weight (NF4/FP4: 4 bits)
CODE_BYTES = 0.5


@memo.cached(maxsize=8)
def dequant_traffic(dequant_other: int) -> float:
    """What QLoRA's dequantization of one weight moves: the 4-bit code read, and the
    bytes the ops :meth:`Net._dequantize` builds for the memory walk read and write -- 2.5
    where it returns the compute dtype, 10.5 where it returns fp32 and ``.to`` casts it."""
    ctx = Ctx(1, 1, "amp", "sdpa", 0, frozenset(), frozenset(), 2, True, 0.0,
              dequant_other=dequant_other)  # fmt: skip
    net = Net("dequantize", ctx, 1, 2, False)
    net._dequantize(1)
    return CODE_BYTES + traffic(net.block)[0]


#: positions per piece of LitGPT's LM head and loss (``lm_head_chunk_size=128`` in
#: litgpt/finetune/*.py; ``chunked_cross_entropy``'s ``chunk_size=128``)
LITGPT_HEAD_CHUNK = 128


def upcasts_logits(m: ModelSpec, loss: str) -> bool:
    """Whether the loss copies the logits to fp32 before ``log_softmax`` (``.float()``:
    transformers' ``ForCausalLMLoss`` and torchtune's chunks; a copy only where the logits
    are 16-bit). BERT's masked-LM loss and ``no-upcast`` read them as they are; a fused
    loss (``chunked``) never materializes them. Memory (:func:`head_and_loss`) and time
    (:mod:`memfit.engine.steptime`) both ask here."""
    return loss in ("standard", "chunked-output") and m.architecture == "decoder"


def head_and_loss(
    m: ModelSpec, ctx: Ctx, x_grad: bool, chunked: bool, logits_only: bool = False
) -> tuple[Block, str]:
    """Final norm, LM head and the cross-entropy loss, as ``ctx.loss`` computes it.

    * ``standard`` -- transformers' ``ForCausalLMLoss``: the logits (``b s V`` in the
      compute dtype) are upcast to fp32 and ``log_softmax`` keeps its fp32 output, so just
      after the forward ``2 + 4`` bytes per logit are live (``4 + 4`` when the weights are
      fp32 without autocast) and the backward adds the fp32 gradient of the
      log-probabilities;
    * ``no-upcast`` -- ``F.cross_entropy`` on the logits as they are (LitGPT, plain
      loops): ``log_softmax`` reads them and writes fp32 under autocast (it is on
      autocast's fp32 list), the logits' dtype otherwise. On LitGPT's model the head and
      the loss run in pieces of :data:`LITGPT_HEAD_CHUNK` positions (its finetune scripts:
      ``model(x, lm_head_chunk_size=128)``, ``chunked_cross_entropy``), as torchtune's
      chunked output does, without the upcast;
    * ``chunked-output`` -- torchtune's ``CEWithChunkedOutputLoss``: the LM head runs on
      ``loss_chunks`` chunks of the sequence (``torch.chunk``) and each chunk of logits is
      upcast and reduced on its own: every chunk's fp32 log-probabilities are kept, but
      only one chunk's upcast copy and gradients are live at a time;
    * ``chunked`` (``chunked`` is True) -- a fused linear cross-entropy (Liger, Unsloth)
      that never materializes them: only a chunk of rows at a time.

    With ``ctx.outputs_held`` the model output keeps the logits alive until it is released
    after the step; released before backward, they die with their last use.
    ``logits_only``: the block up to the model's output, the logits (the moment the model
    returns), without the loss.
    """
    h, tokens, vocab = m.hidden_size, ctx.shape().tokens, m.vocab_size
    net = Net("lm_head_loss", ctx, tokens * h // ctx.sp, ctx.res, x_grad)
    x = "x"
    if m.final_norm:
        x = _norm_of(net, m)(x, h)
    x = net.gather_seq(x)
    if m.lm_head_transform:  # BERT's MLM transform
        x = net.layer_norm(
            net.activation(net.linear(x, h, h, "lm_head", None, True), m.activation), h, "lm_head"
        )
    if chunked:
        rows = net.s.chunk  # min(tokens, CHUNK_ROWS)
        first = len(net.block.ops)
        logits = net.linear(x, h, vocab, "lm_head", None, m.lm_head_bias, tokens=rows)
        loss = net.unary("chunk_loss", net.cast(logits, F32), save_in=True, elems=1)
        net.block.repeated = (first, len(net.block.ops))  # every chunk of rows in turn
        net.block.loss_from = first  # the fused loss computes the logits itself
        return net.block, loss
    fp32_out = F32 if ctx.mode == "amp" else 0
    litgpt = ctx.litgpt and ctx.loss == "no-upcast"
    if (ctx.loss == "chunked-output" or litgpt) and m.architecture == "decoder":
        if ctx.symbolic:  # torch.chunk's sizes are ceilings: not linear forms of the shape
            raise TypeError("chunked-output builds at concrete shapes only")
        seq = ctx.seq * ctx.sp  # the whole sequence after the gather
        size = LITGPT_HEAD_CHUNK if litgpt else -(-seq // ctx.loss_chunks)
        # each chunk's matmul casts its slice of the hidden states under autocast: one
        # cast in all, saved for the head's weight gradient
        x = net.cast(x, 2) if ctx.mode == "amp" else x
        # the model returns the list of chunks; the loss then upcasts and reduces each
        chunks = [
            net.linear(x, h, vocab, "lm_head", "lm_head", m.lm_head_bias, tokens=ctx.batch * rows)
            for rows in (min(size, seq - start) for start in range(0, seq, size))
        ]
        net.block.loss_from = len(net.block.ops)
        if logits_only:  # the model returns the list
            net.block.held.update(chunks)
            return net.block, chunks[-1]
        losses = []
        for chunk in chunks:
            if litgpt:
                out = fp32_out or net.dtype[chunk]
                logp = net.unary("log_softmax", chunk, save_out=True, dtype=out)
            else:
                logp = net.unary("log_softmax", net.cast(chunk, F32), save_out=True)
            losses.append(net.nll_loss(logp, vocab))
        loss = losses[0]
        for other in losses[1:]:
            loss = net.binary("add_loss", loss, other)
        if ctx.outputs_held:
            net.block.held.update(chunks)
        else:  # the list of chunks lives until the loss is computed (torchtune's `del`)
            net.block.op("release_logits", chunks, [])
        return net.block, loss
    # a LoRA adapter on the output layer (a target named ``lm_head``): its B makes a
    # logits-sized product, scaled and summed with the head's output
    logits = net.linear(x, h, vocab, "lm_head", "lm_head", m.lm_head_bias)
    if m.final_logit_softcapping:
        # Gemma-2: logits / cap, tanh (which keeps its output), * cap; each a new tensor
        # of the logits' size, the last the model's output
        scaled = net.unary("scale", logits)
        logits = net.unary("mul_c", net.unary("tanh", scaled, save_out=True))
    net.block.loss_from = len(net.block.ops)
    if logits_only:
        return net.block, logits
    if ctx.loss == "no-upcast":
        upcast = logits
    else:
        # ForCausalLMLoss calls logits.float(), a full fp32 copy. BERT's masked-LM loss
        # does not: under autocast, log_softmax (on the fp32 list with an output dtype)
        # reads the 16-bit logits and writes fp32 without a copy of its input; in pure
        # bf16 it stays bf16
        upcast = net.cast(logits, F32) if upcasts_logits(m, ctx.loss) else logits
        if ctx.upcast_in_model:  # the model returns the copy: the loss starts after it
            net.block.loss_from = len(net.block.ops)
    logp = net.unary("log_softmax", upcast, save_out=True, dtype=fp32_out or net.dtype[upcast])
    loss = net.nll_loss(logp, vocab)
    # the model's output: the logits, or the fp32 copy where the model makes it
    output = upcast if ctx.upcast_in_model else logits
    if ctx.outputs_held:  # the model output holds the logits until it is dropped
        net.block.held.add(output)
    if not ctx.megatron:
        # the loss is computed while the model output is referenced -- inside the model's
        # forward from labels, or by the loop from the output it holds -- so the logits
        # live until it is computed; transformers' loss from labels runs inside the
        # causal-LM forward, where the inner model's output, the last hidden state, is
        # referenced too (traced: both live through log_softmax)
        alive = [output] + ([x] if ctx.loss == "standard" and m.architecture == "decoder" else [])
        net.block.op("release_logits", alive, [])
    return net.block, loss

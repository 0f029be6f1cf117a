"""Where a point's activations come from (:class:`Source`): the inputs, the layers' kept
tensors by kind, the previous step, the micro-batches in flight -- the ledger the
reference walk keeps for ``memfit explain``."""

from __future__ import annotations

from dataclasses import dataclass

from memfit.engine.timeline.context import FULL, TRAINED

#: the kind of a :class:`Source`: what a user can change to remove it
SOURCE_KINDS = (
    "saved",  # what autograd saves for backward, per layer kind
    "checkpointed",  # the inputs of checkpointed layers
    "kv-cache",  # keys and values handed to the model output
    "logits",  # the LM head and the loss, the model output the loop holds
    "working",  # the layer in flight: its input, output and transients
    "recompute",  # a checkpointed layer's forward, played again before its backward
    "gradient",  # the activation gradient flowing back between layers
    "inputs",  # the batch, RoPE's tables, attention masks
    "previous",  # the previous step, kept by the loop's variables
    "in-flight",  # other micro-batches of a pipeline stage
)
_PREVIOUS_OUTPUT = "previous step's model output, until this forward returns"


@dataclass(frozen=True, slots=True)
class Source:
    """One part of the activations at a moment of the step: what it is, its bytes, its
    formula and where the formula comes from (:func:`step_sources`)."""

    name: str
    kind: str  # one of SOURCE_KINDS
    bytes: int
    formula: str
    source: str


_LIVENESS = "engine.graph.simulate (op by op liveness walk of engine.layers)"
_KEPT = {
    "embedding": (
        "saved tensors: the embedding (its LayerNorm input, dropout mask)",
        "b x s x hidden x dtype + 8 b s (norm statistics) + b s hidden (mask)",
        "engine.timeline (embedding_norm, hidden_dropout)",
    ),
    "dense": (
        "saved tensors: {n} layers",
        "per layer: what autograd saves for backward (projections' inputs, attention "
        "output and statistics, MLP inputs, norms' inputs), term by term",
        "engine.layers.decoder_layer / bert_layer",
    ),
    "moe": (
        "saved tensors: {n} MoE layers",
        "per layer: attention's saved tensors, the router, every expert's share of the tokens",
        "engine.layers.decoder_layer (moe)",
    ),
    "checkpointed": (
        "inputs of {n} checkpointed layers",
        "per layer: its input, b x s x hidden x dtype (+ the outputs a per-op policy keeps)",
        "torch.utils.checkpoint; engine.timeline.checkpointed",
    ),
    "kv-cache": (
        "KV cache in the model output ({n} layers)",
        "per layer: 2 x b x s x kv heads x head dim x dtype",
        "engine.stacks: kv_cache_in_outputs (use_cache)",
    ),
}


class _Kept:
    """What the layers so far keep, by the embedding, layer kind, checkpointed input and
    KV cache: the ledger's running count of :func:`_layer_by_layer`'s ``kept_act``."""

    def __init__(self) -> None:
        self.bytes: dict[str, int] = {}
        self.layers: dict[str, int] = {}

    def add(self, key: str, n_bytes: int, layers: int) -> None:
        """``n_bytes`` more under ``key`` from ``layers`` more layers (negative: fewer)."""
        if n_bytes:
            self.bytes[key] = self.bytes.get(key, 0) + n_bytes
            self.layers[key] = self.layers.get(key, 0) + layers

    def only(self, key: str) -> None:
        """Forget every part but ``key``'s."""
        for other in [k for k in self.bytes if k != key]:
            del self.bytes[other], self.layers[other]

    def sources(self) -> list[Source]:
        out = []
        for key, n_bytes in self.bytes.items():
            base = key.removesuffix(TRAINED)
            name, formula, source = _KEPT.get(base.removesuffix(FULL), _KEPT["dense"])
            if key != base:
                name = name.replace("layers", "fully trained layers")
            if base.endswith(FULL):
                name = name.replace("layers", "global-attention layers")
            kind = base if base in ("checkpointed", "kv-cache") else "saved"
            out.append(Source(name.format(n=self.layers[key]), kind, n_bytes, formula, source))
        return out


def _work_source(moment: str, n_bytes: int, layer: int | None) -> Source:
    """The block in flight at ``moment``: its working set beyond what earlier layers keep."""
    where = "the embedding" if layer is None else f"layer {layer}"
    if moment == "embedding":
        return Source("embedding output", "working", n_bytes, "b x s x hidden x dtype", _LIVENESS)
    if moment == "forward":
        return Source(
            f"{where} in flight: its input, what it has saved so far, the op's transients",
            "working",
            n_bytes,
            "the highest live bytes of the layer's forward",
            _LIVENESS,
        )
    if moment == "recompute":
        return Source(
            f"recomputing {where}'s forward (checkpointing)",
            "recompute",
            n_bytes,
            "the layer's forward working set, played again before its backward",
            "torch.utils.checkpoint; " + _LIVENESS,
        )
    if moment == "tied gradient":
        return Source(
            "the tied embedding's gradient, summed into the head's",
            "working",
            n_bytes,
            "vocab x hidden x gradient dtype",
            "engine.timeline (tie_word_embeddings)",
        )
    return Source(
        f"{where} in backward: its saved tensors, the output gradient, gradients in flight",
        "working",
        n_bytes,
        "the highest live bytes of the layer's backward",
        _LIVENESS,
    )


def _returned_source(n_bytes: int, layer: int) -> Source:
    """What layer ``layer`` returned beside its output, held while the next one runs."""
    return Source(
        f"the attention weights layer {layer} returned, held by the model's loop",
        "working",
        n_bytes,
        "b x heads x s x s x the softmax's dtype",
        "FalconModel keeps each layer's outputs until the next layer returns",
    )


def _grad_source(n_bytes: int, layer: int | None) -> Source:
    where = "the embedding output" if layer is None else f"layer {layer}'s output"
    return Source(
        f"gradient flowing back into {where}",
        "gradient",
        n_bytes,
        "b x s x hidden x compute dtype",
        _LIVENESS,
    )


def _head_source(moment: str, n_bytes: int, chunked: bool, last: bool = True) -> Source:
    """The LM head and the loss at ``moment``: ``logits`` (the model has just returned),
    ``forward`` (the loss computed), ``backward``."""
    source = "engine.layers.head_and_loss"
    if not last:
        what = "output sent to the next stage" if moment == "forward" else "gradient received"
        return Source(what, "working", n_bytes, "b x s x hidden x dtype", source)
    formula = (
        "a chunk of rows of b x s x vocab at a time (fused linear cross-entropy)"
        if chunked
        else "b x s x vocab logits in the compute dtype, their fp32 upcast and log-softmax"
    )
    name = {
        "logits": "LM head output: the logits, before the loss",
        "forward": "LM head and loss: the logits and the loss's buffers",
        "backward": "loss and LM head backward: the logits' gradient",
    }[moment]
    return Source(name, "logits", n_bytes, formula, source)


def _output_source(n_bytes: int) -> Source:
    return Source(
        "model output held by the loop (the logits)",
        "logits",
        n_bytes,
        "b x s x vocab in the compute dtype (more with an fp32 upcast)",
        "engine.stacks: outputs_held_through_backward",
    )


def _input_sources(batch: int, rope: int, bool_mask: int, mask: int) -> list[Source]:
    return [
        Source("input ids and labels (int64)", "inputs", batch, "2 x 8 bytes x b x s", "the batch"),
        Source("RoPE's cos and sin", "inputs", rope, "2 x b x s x head dim x dtype", "rotary"),
        Source(
            "sliding-window mask (bool)",
            "inputs",
            bool_mask,
            "b x s x s bytes",
            "engine.specs.window_masks",
        ),
        Source(
            "attention mask (eager attention)",
            "inputs",
            mask,
            "b x s x s x dtype",
            "eager attention's 4-D mask",
        ),
    ]


def _previous_sources(graph: int, output: int) -> list[Source]:
    return [
        Source(
            "previous step's graph: inputs kept by custom autograd functions",
            "previous",
            graph,
            "the inputs 4-bit matmuls keep on their ctx, until this step's loss",
            "engine.timeline.function_kept (previous_step_held)",
        ),
        Source(
            _PREVIOUS_OUTPUT,
            "previous",
            output,
            "the logits (and KV cache) of the previous step",
            "engine.stacks: previous_step_held",
        ),
    ]


def _in_flight_source(n_bytes: int) -> Source:
    return Source(
        "other micro-batches in flight (pipeline schedule) and the receive buffer",
        "in-flight",
        n_bytes,
        "(in flight - 1) x what one micro-batch keeps + b x s x hidden x dtype",
        "engine.estimate.inflight",
    )

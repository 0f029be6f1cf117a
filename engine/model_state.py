"""Model-state memory: parameters, gradients and optimizer states, tensor by tensor.

The memory of the *model state* depends on three choices:

* **precision** decides the storage dtype of trainable weights and their gradients.
  ``fp32``, ``bf16-mixed``, ``fp16-mixed`` and ``fp8-mixed`` keep trainable weights and
  gradients in fp32 -- PyTorch's automatic mixed precision keeps the model in fp32 (those
  fp32 weights *are* the master weights) and casts to 16 or 8 bits inside the forward;
  pure ``bf16`` keeps weights, gradients and optimizer states in bf16;
* **optimizer** decides the state kept per trainable element (see :func:`optimizer_state`);
* **method** decides what is trainable: everything (``full``), LoRA adapters on a frozen
  base (``lora``), adapters on a 4-bit NF4 base (``qlora``), or named parts (``freeze``).
  Frozen weights need no gradient, no state and no master copy, so under the mixed
  precisions they are held in the 16-bit compute dtype.

Where "16 bytes per parameter" comes from for mixed-precision Adam
-------------------------------------------------------------------
ZeRO (Rajbhandari et al. 2020, section 3.1) counts ``2 + 2 + 12 = 16`` bytes: fp16
weights (2), fp16 gradients (2), and an fp32 master copy, momentum and variance (4+4+4).
PyTorch AMP arrives at the same 16 by another road: fp32 weights (4, serving as the master
copy), fp32 gradients (4) and Adam's two fp32 moments (8). On top of that, autocast caches a
16-bit copy of every weight it casts during the forward (2 more -- **18**; also the figure
for Megatron-style training, which keeps 16-bit weights, fp32 "main" gradients and the 12
bytes of fp32 optimizer state: 2 + 4 + 12). That cache lives for the forward and backward
of a step only and is part of the step timeline, not of the model state counted here.
When the 16-bit gradients are freed as soon as the optimizer consumes them, or sharded
away, 2 + 12 = **14** remain. Pure bf16 with bf16 Adam states is 2 + 2 + 4 = 8; 8-bit Adam
stores its two moments in one byte each plus a float32 scale per 256-element block.

>>> from memfit.engine.presets import load_model
>>> from memfit.engine.specs import TrainingSpec
>>> state = model_state(load_model("llama-3-8b"), TrainingSpec(method="full"))
>>> state.bytes_per_trainable_param
16.0
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from math import ceil

from memfit.engine import memo
from memfit.engine.errors import EstimateError
from memfit.engine.params import TensorGroup, model_tensors
from memfit.engine.specs import ModelSpec, TrainingSpec, keeps_its_hash, target_names
from memfit.engine.stacks import conventions

CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations", "overhead")

#: :attr:`MemoryItem.role` values: the trainable weights in their storage dtype, frozen
#: weights, the 4-bit base of QLoRA, the gradients of the trainable weights as backward
#: produces them, and gradient memory that lives through the whole step (a framework's
#: buffer: Megatron's ``main_grad``, DeepSpeed's partitions and reduce bucket)
ROLES = (
    "trainable-weights",
    "frozen-weights",
    "quantized-weights",
    "gradients",
    "gradient-buffer",
    "reduce-bucket",
)
#: the roles of gradient memory that lives through the whole step; ``reduce-bucket`` is
#: DeepSpeed's contiguous reduce buffer of ZeRO-2/3, ``min(reduce_bucket_size, n)``
#: elements whatever the number of GPUs
BUFFERS = ("gradient-buffer", "reduce-bucket")

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

#: bitsandbytes keeps 8-bit state only for tensors with at least this many elements
#: (``Optimizer8bit``'s ``min_8bit_size``); smaller tensors get fp32 state.
BNB_MIN_8BIT_SIZE = 4096
#: bitsandbytes' block-wise 8-bit optimizers keep one fp32 absmax per 256 elements.
BNB_OPTIMIZER_BLOCK = 256
#: bitsandbytes' double quantization quantizes the 4-bit absmax in blocks of 256.
BNB_DQ_BLOCK = 256
#: Transformer Engine's DelayedScaling default amax history length.
FP8_AMAX_HISTORY = 1024

#: The roles each LoRA target name selects; fused modules answer to any of their parts.
_TARGET_ROLES = {
    "q_proj": ("q_proj", "qkv"),
    "k_proj": ("k_proj", "qkv"),
    "v_proj": ("v_proj", "qkv"),
    "o_proj": ("o_proj",),
    "gate_proj": ("gate_proj", "gate_up"),
    "up_proj": ("up_proj", "gate_up"),
    "down_proj": ("down_proj",),
    "q_a_proj": ("q_a_proj",),
    "q_b_proj": ("q_b_proj",),
    "kv_a_proj": ("kv_a_proj",),
    "kv_b_proj": ("kv_b_proj",),
}
#: ``all-linear``: every linear layer of the blocks, not the output layer (as PEFT)
_ALL_ROLES = frozenset(r for roles in _TARGET_ROLES.values() for r in roles)
#: the output layer, adapted only where a target names it (PEFT's ``lm_head``)
_TARGET_ROLES["lm_head"] = ("lm_head",)

#: Components that ``FreezeSpec.trainable`` names map onto.
FREEZE_COMPONENTS = {
    "embeddings": ("embeddings",),
    "attention": ("attention",),
    "mlp": ("mlp", "experts"),
    "norms": ("norms",),
    "router": ("router",),
    "lm_head": ("lm_head", "pooler"),
}


@dataclass(frozen=True, slots=True)
class MemoryItem:
    """One named block of memory in a category, with the formula that gives its size."""

    name: str
    category: str
    bytes: int
    formula: str = ""
    source: str = ""
    #: what the bytes are, for code that treats kinds of memory differently (the name is
    #: for people): one of :data:`ROLES`, or "" for anything else
    role: str = ""


@dataclass(frozen=True, slots=True)
class ModelState:
    """Parameters, gradients and optimizer states of one configuration."""

    items: tuple[MemoryItem, ...]
    total_params: int
    trainable_params: int
    frozen_param_bytes: int
    #: bytes per trainable element: weight + gradient + optimizer state
    bytes_per_trainable_param: float
    #: bytes per frozen element (0.0 when nothing is frozen)
    bytes_per_frozen_param: float
    #: how ``bytes_per_trainable_param`` adds up, in words
    bytes_per_param_formula: str
    #: things the user asked for that do not apply to this model
    warnings: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(i.bytes for i in self.items)

    def category_bytes(self, category: str) -> int:
        return sum(i.bytes for i in self.items if i.category == category)

    @property
    def bytes_per_param(self) -> float:
        """Model-state bytes over all parameters of the base model (adapters included)."""
        return self.total_bytes / self.total_params if self.total_params else 0.0


keeps_its_hash(ModelState)


def weights_label(method: str) -> str:
    """What the trainable weights are called in the breakdown."""
    return "adapter weights" if method in ("lora", "qlora") else "trainable weights"


def trainable_dtype(precision: str) -> str:
    """Storage dtype of trainable weights and their gradients."""
    return "bf16" if precision == "bf16" else "fp32"


def frozen_dtype(precision: str) -> str:
    """Storage dtype of frozen (non-quantized) weights by default: the compute dtype."""
    return {"fp32": "fp32", "fp16-mixed": "fp16"}.get(precision, "bf16")


def weight_dtypes(training: TrainingSpec) -> tuple[str, str]:
    """The storage dtypes of the trainable and of the frozen (not quantized) weights under
    ``training``'s conventions (:func:`memfit.engine.stacks.conventions`): LoRA adapters in the
    adapter dtype (PEFT keeps them fp32 by default), frozen weights in the frozen dtype
    (Lightning's bf16-mixed keeps them fp32; QLoRA's default is its compute dtype)."""
    conv = conventions(training)
    lora = training.method in ("lora", "qlora")
    trained = conv.adapter_dtype if lora else trainable_dtype(training.precision)
    return trained, conv.frozen_dtype


def storage_bytes(training: TrainingSpec) -> tuple[int, int]:
    """Bytes per element of the trainable and of the frozen (not quantized) weights."""
    trained, frozen = weight_dtypes(training)
    return DTYPE_BYTES[trained], DTYPE_BYTES[frozen]


def optimizer_state(optimizer: str, shape: tuple[int, ...], param_bytes: int) -> tuple[int, str]:
    """Bytes of optimizer state for one trainable tensor of ``shape``, and the formula.

    * ``adamw`` -- ``exp_avg`` and ``exp_avg_sq`` like the parameter: ``2 n p``
      (``torch.optim.AdamW``; Loshchilov & Hutter 2019);
    * ``adamw-8bit`` / ``paged-adamw-8bit`` -- two uint8 moments and one fp32 absmax per
      256-element block each: ``2 n + 8 ceil(n/256)``; tensors under 4,096 elements keep
      fp32 moments, ``8 n`` (Dettmers et al. 2022, "8-bit optimizers via block-wise
      quantization"; bitsandbytes ``Optimizer8bit``). The paged variant allocates the same
      bytes in unified memory, which the driver may evict to the host under pressure;
    * ``sgd`` -- none; ``sgd-momentum`` -- one ``momentum_buffer`` like the parameter;
    * ``adafactor`` -- factored second moment for matrices, a row and a column vector:
      ``(rows + cols) p``; a full second moment for vectors; no first moment
      (Shazeer & Stern 2018; ``torch.optim.Adafactor``, whose state follows the param dtype);
    * ``lion`` -- one momentum like the parameter (Chen et al. 2023).
    """
    n = 1
    for d in shape:
        n *= d
    if optimizer == "adamw":
        return 2 * n * param_bytes, f"2 moments x {param_bytes} B"
    if optimizer in ("adamw-8bit", "paged-adamw-8bit"):
        if n < BNB_MIN_8BIT_SIZE:
            return 8 * n, "2 fp32 moments (tensor under 4096 elements)"
        return 2 * n + 8 * ceil(n / BNB_OPTIMIZER_BLOCK), "2 uint8 moments + fp32 absmax/256"
    if optimizer == "sgd":
        return 0, "none"
    if optimizer in ("sgd-momentum", "lion"):
        return n * param_bytes, f"1 momentum x {param_bytes} B"
    if optimizer == "adafactor":
        if len(shape) >= 2:
            rows = n // shape[-1]
            return (rows + shape[-1]) * param_bytes, "factored second moment (rows + cols)"
        return n * param_bytes, "second moment (vector)"
    raise EstimateError("training.optimizer", f"unknown optimizer {optimizer!r}")


def nf4_bytes(numel: int, block_size: int, double_quant: bool) -> int:
    """Storage of one 4-bit quantized weight of ``numel`` elements (QLoRA, section 3).

    Two 4-bit codes per byte, plus one absmax per block of ``block_size``: fp32 without
    double quantization (``32/64 = 0.5`` bit per parameter at block 64); with it, an 8-bit
    absmax per block, an fp32 scale per 256 blocks and one fp32 offset
    (``8/64 + 32/(64*256) = 0.127`` bit per parameter; Dettmers et al. 2023, section 3).
    """
    blocks = ceil(numel / block_size)
    packed = ceil(numel / 2)
    if double_quant:
        return packed + blocks + 4 * ceil(blocks / BNB_DQ_BLOCK) + 4
    return packed + 4 * blocks


def lora_targets(model: ModelSpec, targets: Iterable[str]) -> tuple[frozenset[str], list[str]]:
    """The linear roles that ``targets`` selects on ``model``, and the targets that miss.

    ``all-linear`` selects every linear layer of the blocks -- attention, MLP, routed and
    shared experts (not the experts of :data:`PARAMETER_EXPERTS`, which are no linears) --
    and, like PEFT, not the output layer. As in PEFT, a target that
    matches no module is skipped as long as another target matches (``v_proj`` on an MLA
    model); when none matches it is an error.
    """
    parameters_only = model.family in PARAMETER_EXPERTS
    present = {
        g.linear
        for g in model_tensors(model)
        if g.linear and not (parameters_only and g.component == "experts")
    }
    if model.architecture == "decoder":
        present.add("lm_head")  # tied or not, the output layer is a linear module
    chosen: set[str] = set()
    missed: list[str] = []
    for target in targets:
        if target == "all-linear":
            wanted = _ALL_ROLES
        else:  # a role, or a module name that stands for roles
            wanted = frozenset(r for role in target_names((target,)) for r in _TARGET_ROLES[role])
        roles = wanted & present
        if not roles:
            missed.append(target)
        chosen |= roles
    if not chosen:
        raise EstimateError(
            "training.lora.targets",
            f"{', '.join(missed)} match no layer of {model.name}; its linear layers are "
            f"{', '.join(sorted(present))}",
        )
    return frozenset(chosen), missed


def qkv_adapted(targets: tuple[str, ...]) -> tuple[bool, bool, bool]:
    """Which of q, k and v LoRA ``targets`` adapt (LitGPT's ``lora_query``, ``lora_key``,
    ``lora_value`` on its fused projection)."""
    names = set(target_names(targets))
    every = "all-linear" in names
    return every or "q_proj" in names, every or "k_proj" in names, every or "v_proj" in names


#: the families whose v4 targets PEFT 0.21.2 maps onto transformers 5's fused experts
#: (``_MODEL_TO_CONVERSION_PATTERN``: the Mixtral and Qwen2-MoE patterns)
PEFT_FUSED_EXPERTS = frozenset(
    {
        "mixtral", "minimax", "qwen3_moe", "qwen3_next", "deepseek_v2", "deepseek_v3",
        "olmoe", "flex_olmo", "glm4_moe", "ernie4_5_moe", "dots1", "hunyuan_v1_moe",
    }
)  # fmt: skip
#: the families whose routed experts were fused parameters from their first release, and
#: onto which PEFT maps no module name: no ``target_modules`` entry, ``all-linear`` neither,
#: reaches their experts or their router (gpt-oss: ``GptOssExperts`` holds ``gate_up_proj``
#: and ``down_proj`` as parameters, ``GptOssTopKRouter`` its ``weight``, transformers 5
#: ``modeling_gpt_oss.py``). PEFT's ``target_parameters``, which adapts them, is not modelled
PARAMETER_EXPERTS = frozenset({"gpt_oss"})
#: the roles of a gated MLP's linears
_MLP_ROLES = frozenset({"gate_proj", "up_proj", "down_proj", "gate_up"})
#: the families on transformers' Mixtral conversion pattern (the others of
#: :data:`PEFT_FUSED_EXPERTS` are on Qwen2-MoE's), and the target names PEFT maps onto each
#: pattern's fused experts (peft 0.21.2 ``_MOE_TARGET_MODULE_MAPPING``): Mixtral's ``w1``,
#: ``w3`` (gate and up) and ``w2`` (down), Qwen2-MoE's ``gate_proj``, ``up_proj`` and
#: ``down_proj``. A name of the other pattern matches no module (traced: PEFT refuses
#: ``gate_proj`` on Mixtral, "Target modules ... not found")
_MIXTRAL_PATTERN = frozenset({"mixtral", "minimax"})
_EXPERT_NAMES = {
    True: {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"},
    False: {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"},
}


def expert_param_lora(model: ModelSpec, training: TrainingSpec) -> bool:
    """Whether PEFT adapts the routed experts as parameters: transformers 5 keeps them as
    fused 3-D parameters (``gate_up_proj`` E x 2f x h, ``down_proj`` E x h x f), which no
    ``nn.Linear`` matches, and PEFT 0.21.2 maps the v4 targets onto them
    (``utils/transformers_weight_conversion.py``: ``gate_proj``/``up_proj`` -- Mixtral's
    ``w1``/``w3`` -- to ``gate_up_proj`` at twice the rank and alpha, ``down_proj`` -- ``w2``
    -- to ``down_proj`` (:data:`_EXPERT_NAMES`),
    the router ``gate`` -- an ``nn.Linear`` in v4, so in ``all-linear`` -- to
    ``gate.weight``), each wrapped by a ``ParamWrapper`` (``tuners/lora/layer.py``). The
    names move from the modules targeted to the parameters, so the ``nn.Linear`` MLPs of
    the same model -- dense layers, shared experts -- get no adapter. LoRA on the families
    of :data:`PEFT_FUSED_EXPERTS`, not QLoRA (whose 4-bit experts are not modelled so)."""
    return (
        training.method == "lora"
        and model.is_moe
        and model.family in PEFT_FUSED_EXPERTS
        and conventions(training).implementation == "transformers"
        and training.parallelism.framework != "megatron"
    )


def linear_lora_roles(model: ModelSpec, training: TrainingSpec) -> frozenset[str]:
    """The linear roles LoRA adapts as ``lora.Linear`` modules: :func:`lora_targets`'s, less
    the MLP's where PEFT maps those names onto the fused experts' parameters."""
    roles, _ = lora_targets(model, training.lora.targets)
    return roles - _MLP_ROLES if expert_param_lora(model, training) else roles


def expert_lora_roles(model: ModelSpec, training: TrainingSpec) -> frozenset[str]:
    """The expert and router roles PEFT wraps as parameters (:func:`expert_param_lora`):
    ``gate_up`` (gate and up named together; PEFT refuses one of them alone), ``down_proj``
    and, under ``all-linear``, ``router``."""
    if not expert_param_lora(model, training):
        return frozenset()
    targets = training.lora.targets
    names = _EXPERT_NAMES[model.family in _MIXTRAL_PATTERN]
    if "all-linear" in targets:
        roles = set(names.values())
    else:
        roles = {names[t] for t in targets if t in names}
        if not roles and not linear_lora_roles(model, training):
            raise EstimateError(
                "training.lora.targets",
                f"{', '.join(targets)} match no module PEFT adapts on {model.name}: its "
                f"experts are named {', '.join(names)}, the names PEFT maps onto "
                "transformers' fused experts for this family",
            )
    gate, up = "gate_proj" in roles, "up_proj" in roles
    if gate != up:
        raise EstimateError(
            "training.lora.targets",
            "gate_proj and up_proj are one fused parameter of transformers' experts "
            "(gate_up_proj), which PEFT adapts only when both are named: name both or neither",
        )
    out = {"gate_up"} if gate else set()
    if "down_proj" in roles:
        out.add("down_proj")
    if "all-linear" in targets:
        out.add("router")
    return frozenset(out)


def expert_target_names(model: ModelSpec) -> dict[str, str]:
    """The names that stand for the MLP roles as LoRA targets of ``model``'s experts, where
    they are not the roles' own: Mixtral's ``w1``, ``w3`` and ``w2`` (a target written so
    also reaches per-expert linears, :data:`memfit.engine.specs.LORA_MODULE_NAMES`)."""
    if not (model.is_moe and model.family in _MIXTRAL_PATTERN):
        return {}
    return {role: name for name, role in _EXPERT_NAMES[True].items()}


def misnamed_expert_targets(model: ModelSpec, training: TrainingSpec) -> list[str]:
    """Targets that name the experts by the other conversion pattern's names (``gate_proj``
    on Mixtral, ``w1`` on Qwen3-MoE): PEFT matches no module by them and skips them."""
    if not expert_param_lora(model, training):
        return []
    names = _EXPERT_NAMES[model.family in _MIXTRAL_PATTERN]
    other = _EXPERT_NAMES[model.family not in _MIXTRAL_PATTERN]
    return [t for t in training.lora.targets if t in other and t not in names]


def _expert_adapters(model: ModelSpec, training: TrainingSpec) -> list[TensorGroup]:
    """PEFT's ``ParamWrapper`` adapters of the experts (:func:`expert_lora_roles`): one A
    (``r E x in``) and one B (``out x r E``) for each 3-D parameter of E experts, the fused
    ``gate_up_proj`` at rank 2r; the router's A (``r x hidden``) and B (``E x r``)."""
    roles = expert_lora_roles(model, training)
    r, h, f = training.lora.rank, model.hidden_size, model.moe_intermediate_size
    e = model.local_experts
    out: list[TensorGroup] = []
    for g in model_tensors(model):
        if g.component == "router" and g.matrix and "router" in roles:
            shapes = {"gate.lora_A": (r, h), "gate.lora_B": (g.shape[0], r)}
        elif g.component == "experts" and g.linear == "gate_proj" and "gate_up" in roles:
            shapes = {
                "experts.gate_up_proj.lora_A": (2 * r * e, h),
                "experts.gate_up_proj.lora_B": (2 * f, 2 * r * e),
            }
        elif g.component == "experts" and g.linear == "down_proj" and "down_proj" in roles:
            shapes = {
                "experts.down_proj.lora_A": (r * e, f),
                "experts.down_proj.lora_B": (h, r * e),
            }
        else:
            continue
        count = g.count // e if g.component == "experts" else g.count
        for name, shape in shapes.items():
            out.append(TensorGroup(g.component, name, shape, count, layers=g.layers, adapter=True))
    return out


def lora_adapters(model: ModelSpec, training: TrainingSpec) -> tuple[TensorGroup, ...]:
    """LoRA's ``A`` (``r x in``) and ``B`` (``out x r``) for every targeted linear layer.

    Adapter parameters per layer: ``r (in + out)`` (Hu et al. 2021, section 4.1). LitGPT
    adapts the parts of its fused q/k/v projection that the targets name: ``A`` has
    ``r`` rows per part, ``B`` the parts' widths (``LoRAQKVLinear``).
    """
    roles, _ = lora_targets(model, training.lora.targets)
    r = training.lora.rank
    litgpt = conventions(training).implementation == "litgpt"
    param = expert_param_lora(model, training)
    out: list[TensorGroup] = _expert_adapters(model, training) if param else []
    for g in model_tensors(model):
        if param and (g.component == "experts" or g.linear in _MLP_ROLES):
            continue  # wrapped as parameters (above); the linear MLPs lose their targets
        if g.linear in roles:
            out_f, in_f = g.shape
            rows = r
            if litgpt and g.linear == "qkv":
                q_out = model.num_attention_heads * model.head_dim
                kv_out = model.num_key_value_heads * model.head_dim
                parts = [
                    w
                    for w, on in zip(
                        (q_out, kv_out, kv_out), qkv_adapted(training.lora.targets), strict=True
                    )
                    if on
                ]
                rows, out_f = r * len(parts), sum(parts)
            base = g.module.removesuffix(".weight")
            for name, shape in ((".lora_A", (rows, in_f)), (".lora_B", (out_f, r))):
                out.append(
                    TensorGroup(
                        g.component, base + name, shape, g.count, layers=g.layers, adapter=True
                    )
                )
    if "lm_head" in roles:
        # the output layer (a tied one too: PEFT wraps the module, whose weight is the
        # embedding's): A is r x hidden, B vocab x r
        v, h = model.vocab_size, model.hidden_size
        for name, shape in (("lm_head.lora_A", (r, h)), ("lm_head.lora_B", (v, r))):
            out.append(TensorGroup("lm_head", name, shape, 1, adapter=True))
    return tuple(out)


#: the component of each module ``modules_to_save`` may name
_SAVED_COMPONENTS = {"lm_head": "lm_head", "embed_tokens": "embeddings"}


def saved_components(training: TrainingSpec) -> frozenset[str]:
    """The components PEFT's ``modules_to_save`` trains as copies (LoRA and QLoRA only)."""
    if training.method not in ("lora", "qlora"):
        return frozenset()
    return frozenset(_SAVED_COMPONENTS[m] for m in training.lora.modules_to_save)


def saved_copies(model: ModelSpec, training: TrainingSpec) -> tuple[TensorGroup, ...]:
    """The trainable copies of PEFT's ``modules_to_save`` (peft 0.21.2,
    ``utils/other.py``, ``ModulesToSaveWrapper.update``): the named module is deep-copied
    and the copy trains while the original stays frozen. The copy keeps the original's
    dtype -- PEFT's upcast of adapters to fp32 (``cast_adapter_dtype``) touches only its
    tuner layers, not this wrapper -- so its weight, gradient and optimizer states are in
    the frozen weights' dtype. A copy of a head tied to the embedding is a matrix of its
    own, no longer tied (without ``ensure_weight_tying``); the head then still reads the
    original embedding, and a copied embedding is not the head's weight."""
    parts = saved_components(training)
    v, h = model.vocab_size, model.hidden_size
    out: list[TensorGroup] = []
    if "embeddings" in parts:
        out.append(TensorGroup("embeddings", "embed_tokens.modules_to_save.weight", (v, h), 1))
    if "lm_head" in parts:
        out.append(TensorGroup("lm_head", "lm_head.modules_to_save.weight", (v, h), 1, matrix=True))
        if model.lm_head_bias:
            out.append(TensorGroup("lm_head", "lm_head.modules_to_save.bias", (v,), 1))
    return tuple(out)


def _is_trainable_part(g: TensorGroup, model: ModelSpec, training: TrainingSpec) -> bool:
    spec = training.freeze
    parts = {c for name in spec.trainable for c in FREEZE_COMPONENTS[name]}
    if g.component in parts:
        return True
    if g.module == "embed_tokens.weight" and model.tie_word_embeddings and "lm_head" in parts:
        return True  # the tied LM head is the embedding matrix
    first = model.num_layers - spec.last_layers
    return spec.last_layers > 0 and g.layers is not None and g.layers[0] >= first


def quantizable(g: TensorGroup, head: bool = False, fused_experts: bool = True) -> bool:
    """bitsandbytes replaces every ``nn.Linear`` but the output layer with ``Linear4bit``
    (``head``: the output layer too, as Lightning's plugin does). transformers 5 holds an MoE
    layer's routed experts as fused 3-D parameters and its router as a parameter, not
    ``nn.Linear`` modules (``fused_experts``): they stay in the dtype they were loaded in
    (traced: transformers 5.24 with bitsandbytes 0.50.2 quantizes Qwen3-MoE's attention and
    leaves ``experts.gate_up_proj``, ``experts.down_proj`` and ``gate.weight`` bf16);
    LitGPT's experts are linears of their own, quantized."""
    if g.component == "lm_head":
        return head and g.matrix
    if fused_experts and g.component in ("experts", "router"):
        return False
    return g.matrix and g.component != "embeddings"


def fused_experts(training: TrainingSpec) -> bool:
    """The routed experts are fused parameters, one per projection and layer (transformers
    5's MoE layers: ``experts.gate_up_proj`` and ``experts.down_proj`` of shape ``E x ...``),
    not a linear per expert (LitGPT's ``LLaMAMoE``, Megatron's per-expert weights)."""
    return (
        conventions(training).implementation != "litgpt"
        and training.parallelism.framework != "megatron"
    )


def stored_tensors(g: TensorGroup, model: ModelSpec, fused: bool) -> tuple[int, int]:
    """How many tensors hold ``g`` and the elements of each, as the model stores them: a
    fused experts parameter holds every local expert's matrix of a layer (:func:`fused_experts`)."""
    if fused and g.component == "experts" and model.local_experts > 1:
        return g.count // model.local_experts, g.numel * model.local_experts
    return g.count, g.numel


def _on_stage(g: TensorGroup, model: ModelSpec, stage: str) -> bool:
    """Whether a tensor outside the blocks lives on a pipeline ``stage``: the embedding on
    the first, the final norm and LM head on the last (with a copy of tied embeddings,
    as Megatron keeps one there for the head)."""
    if g.layers is not None or stage == "all":
        return True
    if g.component == "embeddings":
        tied_copy = model.tie_word_embeddings and g.module == "embed_tokens.weight"
        return stage == "first" or (stage == "last" and tied_copy)
    return stage == "last"


@dataclass(frozen=True, slots=True)
class TensorSplit:
    """The tensors of a model (or of one pipeline stage) by how they are stored: trained
    (LoRA adapters included), frozen in the compute dtype, or quantized to 4 bits."""

    trainable: tuple[TensorGroup, ...]
    frozen: tuple[TensorGroup, ...]
    quantized: tuple[TensorGroup, ...]


@memo.cached(maxsize=4096)
def split_tensors(model: ModelSpec, training: TrainingSpec, stage: str = "all") -> TensorSplit:
    """Which tensors train, which stay frozen and which QLoRA quantizes (see
    :func:`model_state`); the same split decides what ZeRO-3/FSDP gathers."""
    method = training.method
    last = training.freeze.last_layers
    if method == "freeze" and last > model.num_layers:
        # checked here, where the layers are split, not in the Scenario: choosing a model
        # of fewer layers in the app keeps the model and shows this under the field
        raise EstimateError(
            "training.freeze.last_layers",
            f"got {last}, expected an integer in [0, {model.num_layers}] (the model's layers)",
        )
    cuts = (model.num_layers - last,) if method == "freeze" else ()
    trainable: list[TensorGroup] = []
    frozen: list[TensorGroup] = []
    quantized: list[TensorGroup] = []
    head = method == "qlora" and conventions(training).quantize_head
    fused = fused_experts(training)
    for g in model_tensors(model, cuts):
        if not _on_stage(g, model, stage):
            continue
        if method == "full" or (method == "freeze" and _is_trainable_part(g, model, training)):
            trainable.append(g)
        elif method == "qlora" and quantizable(g, head, fused):
            quantized.append(g)
        else:
            frozen.append(g)
    if method in ("lora", "qlora"):
        trainable.extend(lora_adapters(model, training))
        trainable.extend(g for g in saved_copies(model, training) if _on_stage(g, model, stage))
    return TensorSplit(tuple(trainable), tuple(frozen), tuple(quantized))


@memo.cached(maxsize=4096)
def model_state(model: ModelSpec, training: TrainingSpec, stage: str = "all") -> ModelState:
    """Parameters, gradients and optimizer states for ``model`` trained as ``training``.

    ``stage`` ("first", "middle", "last") keeps only what a pipeline stage holds outside
    its blocks (see :func:`_on_stage`); "all" is the whole model.
    """
    precision, method, opt = training.precision, training.method, training.optimizer
    t_dtype, f_dtype = weight_dtypes(training)
    t_bytes, f_bytes = DTYPE_BYTES[t_dtype], DTYPE_BYTES[f_dtype]
    split = split_tensors(model, training, stage)
    trainable, frozen, quantized = split.trainable, split.frozen, split.quantized
    base = (*frozen, *quantized, *(g for g in trainable if not g.adapter))
    warnings: list[str] = []
    if method in ("lora", "qlora"):
        roles, missed = lora_targets(model, training.lora.targets)
        if "lm_head" in roles and training.loss == "chunked":
            raise EstimateError(
                "training.lora.targets",
                "lm_head with the fused linear cross-entropy (loss chunked) is not modelled: "
                "the fused kernel reads the head's weight, not its adapter; name lm_head with "
                "another loss, or leave it out",
            )
        missed = [*missed, *misnamed_expert_targets(model, training)]
        if missed:
            warnings.append(f"LoRA target {', '.join(missed)} matches no layer of {model.name}")
        saved = training.lora.modules_to_save
        if saved and conventions(training).implementation == "litgpt":
            raise EstimateError(
                "training.lora.modules_to_save",
                "is PEFT's: LitGPT's own model has no modules_to_save; leave it empty",
            )
        if "lm_head" in saved and "lm_head" in roles:
            raise EstimateError(
                "training.lora.modules_to_save",
                "lm_head is a LoRA target too: name it in one of training.lora.targets and "
                "training.lora.modules_to_save",
            )
        if "lm_head" in saved and method == "qlora" and conventions(training).quantize_head:
            raise EstimateError(
                "training.lora.modules_to_save",
                "lm_head with a 4-bit LM head is not modelled: leave it out, or keep the "
                "head unquantized (training.qlora.quantize_lm_head false)",
            )

    n_trainable = sum(g.total for g in trainable)
    # PEFT's modules_to_save copies: trained, in the frozen weights' dtype
    copies = [g for g in trainable if method in ("lora", "qlora") and not g.adapter]
    n_copies = sum(g.total for g in copies)
    n_own = n_trainable - n_copies
    # DeepSpeed's and Megatron's mixed precision keep an fp32 master of every trained
    # weight, the copies too: their optimizer states are fp32 there
    master = precision.endswith("-mixed") and training.parallelism.framework != "pytorch"
    c_bytes = t_bytes if master else f_bytes
    n_frozen = sum(g.total for g in frozen)
    n_quant = sum(g.total for g in quantized)
    if n_trainable == 0:
        raise EstimateError(
            "training.freeze.trainable", "nothing is trainable; name a part or last_layers > 0"
        )

    items: list[MemoryItem] = []
    label = weights_label(method)
    items.append(
        MemoryItem(
            f"{label} ({t_dtype})",
            "parameters",
            n_own * t_bytes,
            f"{n_own:,} x {t_bytes} B",
            "PyTorch AMP keeps fp32 weights; ZeRO section 3.1",
            role="trainable-weights",
        )
    )
    if n_copies:
        names = ", ".join(training.lora.modules_to_save)
        items.append(
            MemoryItem(
                f"modules_to_save copies ({names}; {f_dtype})",
                "parameters",
                n_copies * f_bytes,
                f"{n_copies:,} x {f_bytes} B",
                "peft ModulesToSaveWrapper: a trained copy in the base's dtype",
                role="saved-copies",
            )
        )
    frozen_bytes = n_frozen * f_bytes
    if n_frozen:
        items.append(
            MemoryItem(
                f"frozen weights ({f_dtype})",
                "parameters",
                frozen_bytes,
                f"{n_frozen:,} x {f_bytes} B",
                "frozen weights need no master copy",
                role="frozen-weights",
            )
        )
    if quantized:
        q = training.qlora
        q_bytes = sum(nf4_bytes(g.numel, q.block_size, q.double_quant) * g.count for g in quantized)
        frozen_bytes += q_bytes
        dq = "double-quantized" if q.double_quant else "fp32"
        items.append(
            MemoryItem(
                f"{q.quant_type.upper()} base weights ({dq} absmax, block {q.block_size})",
                "parameters",
                q_bytes,
                f"{n_quant:,} x 4 bit + absmax per {q.block_size}",
                "Dettmers et al. 2023 (QLoRA), section 3",
                role="quantized-weights",
            )
        )
    items.append(
        MemoryItem(
            f"gradients ({t_dtype})",
            "gradients",
            n_own * t_bytes,
            f"{n_own:,} x {t_bytes} B",
            "one gradient per trainable weight, in its dtype",
            role="gradients",
        )
    )
    if n_copies:
        items.append(
            MemoryItem(
                f"gradients of the modules_to_save copies ({f_dtype})",
                "gradients",
                n_copies * f_bytes,
                f"{n_copies:,} x {f_bytes} B",
                "one gradient per trainable weight, in its dtype",
                role="saved-copies",
            )
        )
    opt_bytes = 0
    formula = ""
    for g in trainable:
        per_tensor, formula = optimizer_state(opt, g.shape, c_bytes if g in copies else t_bytes)
        opt_bytes += per_tensor * g.count
    if opt_bytes:
        items.append(
            MemoryItem(
                f"{opt} states",
                "optimizer_states",
                opt_bytes,
                formula,
                "engine.model_state.optimizer_state",
            )
        )
    if training.optimizer_impl == "fused" and opt in ("adamw", "sgd-momentum"):
        tensors = sum(g.count for g in trainable)
        items.append(
            MemoryItem(
                "optimizer step counters (fused: on device)",
                "optimizer_states",
                4 * tensors,
                f"{tensors:,} tensors x 4 B",
                "torch.optim fused implementations keep `step` on the device",
            )
        )
    if precision == "fp16-mixed":
        items.append(
            MemoryItem(
                "loss scaler state",
                "overhead",
                8,
                "scale (fp32) + growth tracker",
                "torch.amp.GradScaler",
            )
        )
    if precision == "fp8-mixed":
        linears = sum(g.count for g in base if quantizable(g))
        per = (3 * FP8_AMAX_HISTORY + 3 * 2) * 4
        items.append(
            MemoryItem(
                "fp8 scaling state (amax history, scales)",
                "overhead",
                linears * per,
                f"{linears:,} linear layers x {per:,} B",
                "Transformer Engine DelayedScaling, amax_history_len=1024",
            )
        )

    opt_per = opt_bytes / n_trainable
    w_per = (n_own * t_bytes + n_copies * f_bytes) / n_trainable
    per_trainable = 2.0 * w_per + opt_per
    w_words = f"{w_per:.4g} (weight, {t_dtype}" + (f"/{f_dtype})" if n_copies else ")")
    words = f"{w_words} + {w_per:.4g} (gradient) + {opt_per:.4g} ({opt} state)"
    n_frozen_all = n_frozen + n_quant
    adapters = n_own if method in ("lora", "qlora") else 0
    return ModelState(
        items=tuple(items),
        total_params=sum(g.total for g in base) + adapters,
        trainable_params=n_trainable,
        frozen_param_bytes=frozen_bytes,
        bytes_per_trainable_param=per_trainable,
        bytes_per_frozen_param=frozen_bytes / n_frozen_all if n_frozen_all else 0.0,
        bytes_per_param_formula=f"{words} = {per_trainable:.4g} B per trainable parameter",
        warnings=tuple(warnings),
    )

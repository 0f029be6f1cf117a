"""The input panels of the left column: model, hardware, training strategy, and
parallelism with offload.

The training strategy starts with the training stack (:mod:`memfit.engine.stacks`) and its
Conventions section: one row per convention, each showing "from stack (its value)" until
the scenario sets it, with a button that gives it back to the stack."""

from __future__ import annotations

import contextlib
import dataclasses
import html
from typing import Any, ClassVar

from PySide6.QtCore import QSignalBlocker, Qt, Signal, Slot
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QSizePolicy,
    QToolButton,
    QWidget,
)

from memfit.engine.errors import EstimateError
from memfit.engine.estimate import GIB
from memfit.engine.model_state import expert_target_names, model_state
from memfit.engine.params import count_parameters
from memfit.engine.plan import resolve
from memfit.engine.presets import (
    custom_names,
    gpu_names,
    load_gpu,
    load_model,
    model_names,
    preset_name_of,
)
from memfit.engine.scenario_io import (
    custom_gpu,
    default_gpu_name,
    named_gpu,
    resized_custom_gpu,
    with_figure,
)
from memfit.engine.specs import (
    FREEZE_PARTS,
    LORA_TARGETS,
    OPTIMIZER_IMPLS,
    PARALLEL_AXES,
    GpuSpec,
    HardwareSpec,
    ModelSpec,
    Scenario,
    TrainingSpec,
    target_names,
)
from memfit.engine.stacks import (
    CONVENTION_FIELDS,
    ConventionField,
    Stack,
    as_built,
    conventions,
    load_stack,
    loadable_stack_names,
    with_stack,
)
from memfit.engine.steptime import EFFICIENCY
from memfit.engine.timeline import strategy_key
from memfit.gui.chart import rich_text
from memfit.gui.forms import (
    Collapsible,
    FormPanel,
    Getter,
    Row,
    Setter,
    guard_field,
    hardware_field,
    in_user_words,
    model_field,
    section,
    training_field,
)
from memfit.gui.store import ScenarioStore
from memfit.gui.tooltips import TARGET_TIPS, TIPS, WIDGET_TIPS

SIZE_BUCKETS = (
    ("Any size", 0, 10**15),
    ("under 3 B", 0, 3 * 10**9),
    ("3 to 15 B", 3 * 10**9, 15 * 10**9),
    ("15 to 100 B", 15 * 10**9, 100 * 10**9),
    ("over 100 B", 100 * 10**9, 10**15),
)
FAMILY_NAMES = {
    "llama": "Llama", "mistral": "Mistral", "mixtral": "Mixtral (MoE)", "qwen2": "Qwen2/2.5",
    "qwen3": "Qwen3", "qwen3_moe": "Qwen3 MoE", "gemma": "Gemma", "gemma2": "Gemma 2",
    "gemma3_text": "Gemma 3", "phi3": "Phi-3", "gpt2": "GPT-2", "gpt_neox": "GPT-NeoX/Pythia",
    "falcon": "Falcon", "olmo": "OLMo", "deepseek_v2": "DeepSeek-V2", "deepseek_v3": "DeepSeek-V3",
    "gpt_oss": "gpt-oss (MoE)", "bert": "BERT",
}  # fmt: skip
METHOD_CHOICES = (("Full fine-tuning", "full"), ("LoRA", "lora"), ("QLoRA (4-bit base)", "qlora"),
                  ("Freeze (train parts)", "freeze"))  # fmt: skip
PRECISION_CHOICES = (("fp32", "fp32"), ("bf16 mixed (AMP)", "bf16-mixed"),
                     ("fp16 mixed + loss scaling", "fp16-mixed"), ("pure bf16", "bf16"),
                     ("fp8 mixed (Transformer Engine)", "fp8-mixed"))  # fmt: skip
OPTIMIZER_CHOICES = (("AdamW", "adamw"), ("AdamW 8-bit", "adamw-8bit"),
                     ("Paged AdamW 8-bit", "paged-adamw-8bit"), ("SGD", "sgd"),
                     ("SGD + momentum", "sgd-momentum"), ("Adafactor", "adafactor"),
                     ("Lion", "lion"))  # fmt: skip
CHECKPOINT_CHOICES = (("none", "none"), ("selective (attention core)", "selective"),
                      ("full", "full"), ("every k layers", "every-k-layers"),
                      ("first k layers (Megatron block)", "first-k-layers"),
                      ("per-op (torchtitan)", "per-op"))  # fmt: skip
LOSS_CHOICES = (("full logits, upcast to fp32", "standard"),
                ("chunked / fused (Liger)", "chunked"),
                ("full logits, no upcast", "no-upcast"),
                ("logits per chunk (torchtune)", "chunked-output"))  # fmt: skip
LOSS_TEXT = {value: text for text, value in LOSS_CHOICES}
#: the loss as the Conventions summary names it
LOSS_SHORT = {"standard": "loss on fp32 logits", "chunked": "chunked loss",
              "no-upcast": "loss on 16-bit logits"}  # fmt: skip
MOE_CHOICES = (("grouped GEMM", "grouped"), ("eager loop (expert by expert)", "eager"))
CUDA_CHOICES = (("CUDA 12, lazy loading", "cuda12-lazy"),
                ("CUDA 12, eager loading", "cuda12-eager"),
                ("CUDA 11 (eager loading)", "cuda11-eager"))  # fmt: skip
#: what a convention combo holds for "from the stack" (the scenario's field is None)
FROM_STACK = "stack"
#: the selective checkpointing policies of :mod:`memfit.engine.stacks`, in words
POLICY_TEXT = {"attention-core": "attention core", "per-op": "per-op"}
#: the conventions with a row of their own (:data:`memfit.engine.stacks.CONVENTION_FIELDS`), by
#: the row's path
CONVENTION_ROWS = {f"training.{f.key}": f for f in CONVENTION_FIELDS if f.label}


def convention_choices(f: ConventionField) -> tuple[tuple[str, Any], ...]:
    """A convention row's list: the stack's value, then each value in words."""
    return (("from stack", FROM_STACK), *((f.choices.get(v, str(v)), v) for v in f.values))


#: LoRA targets of multi-head latent attention (DeepSeek-V2/V3), shown for such models
MLA_TARGETS = ("q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj")
TARGETS = tuple(t for t in LORA_TARGETS if t != "all-linear")


def short_gpu_name(gpu: GpuSpec) -> str:
    """A preset's name without its vendor (``H100 SXM 80GB``), so that the longest fits
    the GPU combo; a name the user gave stays whole."""
    name = gpu.display_name
    if name == default_gpu_name(gpu):
        for vendor in ("NVIDIA ", "AMD ", "Intel "):
            name = name.removeprefix(vendor)
    return name


def gpu_text(gpu: GpuSpec) -> str:
    """``H100 SXM 80GB (79.6 GiB)``: a GPU combo item."""
    return f"{short_gpu_name(gpu)} ({gpu.memory_bytes / GIB:.1f} GiB)"


#: after a preset's text in a list: the preset is one of the user's own files
#: (:func:`memfit.engine.locate.user_presets_dir`)
YOURS = "  — your preset"

#: the GPU combo's choice of a device with no preset
CUSTOM_GPU = "custom"
CUSTOM_TEXT = "Custom GPU (no preset)"


def hardware_text(hw: HardwareSpec) -> str:
    """The GPU combo's current item: the device's name (the user's, where given) and the
    memory it has here (the override, where given); a custom GPU's own name holds it."""
    gpu = hw.gpu
    if gpu.name == CUSTOM_GPU and gpu.display_name == default_gpu_name(gpu):
        return gpu.display_name
    return f"{short_gpu_name(gpu)} ({hw.capacity_bytes / GIB:.1f} GiB)"


def gpu_name_field() -> tuple[Getter, Setter]:
    """The name the user gave the GPU ("" for its own name); an empty name gives the
    device its own name back, any other must pass :func:`named_gpu`."""

    def get(s: Scenario) -> str:
        gpu = s.hardware.gpu
        return "" if gpu.display_name == default_gpu_name(gpu) else gpu.display_name

    def set_(s: Scenario, text: str) -> Scenario:
        gpu = s.hardware.gpu
        if text.strip():
            gpu = named_gpu(gpu, text)
        else:
            gpu = dataclasses.replace(gpu, display_name=default_gpu_name(gpu))
        return dataclasses.replace(s, hardware=dataclasses.replace(s.hardware, gpu=gpu))

    return get, set_


#: the most characters of a model's name in the Name field
MODEL_NAME_CHARS = 200


def model_name_field() -> tuple[Getter, Setter]:
    """The model's name as every view shows it (:attr:`ModelSpec.label`); an empty name
    gives the model its own back (a preset's, or the name it was imported under)."""

    def get(s: Scenario) -> str:
        return s.model.label

    def set_(s: Scenario, text: str) -> Scenario:
        text = text.strip()
        model = s.model
        if not text:
            own = load_model(model.name).display_name if model.name in model_names() else ""
            model = dataclasses.replace(model, display_name=own)
        elif text != model.label:
            model = dataclasses.replace(model, display_name=text)
        return dataclasses.replace(s, model=model)

    return get, set_


def renamed_preset_of(model: ModelSpec) -> str | None:
    """The preset ``model`` is, under a name of the user's (or its own), if any."""
    if model.name not in model_names():
        return None
    preset = load_model(model.name)
    same = dataclasses.replace(model, display_name=preset.display_name) == preset
    return model.name if same else None


def set_memory(s: Scenario, gib: float) -> Scenario:
    """The memory override (0: none); a custom GPU under its own name is renamed with
    it (``Custom GPU (24 GiB)``), one the user named keeps that name."""
    hw = dataclasses.replace(s.hardware, memory_gib=gib or None)
    gpu = hw.gpu
    if gib and gpu.name == CUSTOM_GPU:
        hw = dataclasses.replace(hw, gpu=resized_custom_gpu(gpu, gib))
    return dataclasses.replace(s, hardware=hw)


#: a custom GPU's architecture: not given, or a row of the step time's efficiencies
ARCHITECTURE_CHOICES = [
    ("not given", "unknown"),
    *(
        (name.upper() if name.startswith("cdna") else name.capitalize(), name)
        for name in EFFICIENCY
    ),
]


def custom_figure_field(key: str) -> tuple[Getter, Setter]:
    """A custom GPU's figure ``key`` (0, or ``"unknown"``, where it gives none and the
    reference device's is assumed)."""
    blank: Any = "unknown" if key == "architecture" else 0.0

    def get(s: Scenario) -> Any:
        gpu = s.hardware.gpu
        if gpu.name != CUSTOM_GPU or key in gpu.assumed or getattr(gpu, key) is None:
            return blank
        return getattr(gpu, key)

    def set_(s: Scenario, value: Any) -> Scenario:
        gpu = s.hardware.gpu
        if gpu.name != CUSTOM_GPU:
            return s
        gpu = with_figure(gpu, key, None if value == blank else value)
        return dataclasses.replace(s, hardware=dataclasses.replace(s.hardware, gpu=gpu))

    return get, set_


def optional_hardware_field(name: str) -> tuple[Getter, Setter]:
    """A hardware field that 0 leaves unset (``None``)."""
    get, set_ = hardware_field(name)
    return (lambda s: get(s) or 0.0), (lambda s, v: set_(s, v or None))


def _gpu_field() -> tuple[Getter, Setter]:
    """The GPU by preset name, or :data:`CUSTOM_GPU`: a device with no preset, starting
    with the memory the scenario has; leaving it drops its memory for the preset's."""

    def set_(s: Scenario, name: str) -> Scenario:
        hw = s.hardware
        if name == hw.gpu.name:
            return s
        if name == CUSTOM_GPU:
            memory = round(hw.capacity_bytes / GIB, 1)
            hw = dataclasses.replace(hw, gpu=custom_gpu(memory), memory_gib=memory)
        else:
            kept = None if hw.gpu.name == CUSTOM_GPU else hw.memory_gib
            hw = dataclasses.replace(hw, gpu=load_gpu(name), memory_gib=kept)
        return dataclasses.replace(s, hardware=hw)

    def switch(s: Scenario, name: str) -> Scenario:
        # a power limit is the board's: kept where the new GPU takes it, dropped otherwise
        try:
            return set_(s, name)
        except EstimateError as exc:
            if exc.field != "hardware.power_limit_w":
                raise
            return set_(
                dataclasses.replace(
                    s, hardware=dataclasses.replace(s.hardware, power_limit_w=None)
                ),
                name,
            )

    return (lambda s: s.hardware.gpu.name), switch


def stack_tip(stack: Stack) -> str:
    """A stack's description and where its conventions were read, for a tooltip."""
    return rich_text(f"{stack.label}: {stack.description}\nSource: {stack.source}")


def convention_field(name: str) -> tuple[Getter, Setter]:
    """The training field ``name`` as a convention combo holds it: :data:`FROM_STACK`
    for ``None`` (the stack's value), else the value itself."""
    get, set_ = training_field(name)

    def read(s: Scenario) -> Any:
        value = get(s)
        return FROM_STACK if value is None else value

    def write(s: Scenario, value: Any) -> Scenario:
        return set_(s, None if value == FROM_STACK else value)

    return read, write


def _stack_field() -> tuple[Getter, Setter]:
    """The training stack; choosing one applies its defaults (:func:`with_stack`)."""

    def set_(s: Scenario, name: str) -> Scenario:
        return dataclasses.replace(s, training=with_stack(s.training, name))

    return (lambda s: s.training.stack), set_


def hardware_summary(hw: HardwareSpec) -> str:
    """One line for the folded hardware rows: what is set beyond the GPU preset."""
    memory = "preset memory" if hw.memory_gib is None else f"{hw.memory_gib:g} GiB given"
    parts = [memory, f"budget {100 * hw.utilization_target:g} %"]
    if hw.gpu.display_name != default_gpu_name(hw.gpu):
        parts.insert(0, f"named {hw.gpu.display_name}")
    if hw.host_memory_gib is not None:
        parts.append(f"host {hw.host_memory_gib:g} GiB")
    if hw.price_per_gpu_hour is not None:
        parts.append(f"{hw.price_per_gpu_hour:g} / GPU-hour")
    if hw.gpu.assumed:
        parts.append("peaks assumed")
    if hw.power_limit_w is not None:
        parts.append(f"capped at {hw.power_limit_w:g} W")
    if hw.clock_share is not None:
        parts.append(f"SM clock {100 * hw.clock_share:g} %")
    parts.append({v: t for t, v in CUDA_CHOICES}.get(hw.cuda_runtime, hw.cuda_runtime))
    return " · ".join(parts)


def architecture_summary(m: ModelSpec) -> str:
    """One line for the folded architecture: ``32 layers · hidden 4,096 · 32 heads (8 KV)
    · MLP 14,336 · vocab 128,256`` (and the experts of a mixture of experts)."""
    heads = f"{m.num_attention_heads} heads"
    if m.num_key_value_heads != m.num_attention_heads:
        heads += f" ({m.num_key_value_heads} KV)"
    parts = [f"{m.num_layers} layers", f"hidden {m.hidden_size:,}", heads]
    if m.num_experts:
        parts.append(f"{m.num_experts} experts, {m.num_experts_per_tok} per token")
    else:
        parts.append(f"MLP {m.intermediate_size:,}")
    parts.append(f"vocab {m.vocab_size:,}")
    return " · ".join(parts)


def conventions_summary(training: TrainingSpec) -> str:
    """``outputs released · KV cache built · adapters fp32 · loss on fp32 logits``: the
    conventions of ``training`` in one line (those that apply to its method), a ``*``
    after those the scenario sets. The modeling code, the previous step and QLoRA's head
    and dequantization are named only where the scenario sets them or they are not the
    usual (transformers, released, not quantized, the compute dtype)."""
    try:
        c = conventions(training)
    except EstimateError as exc:
        return f"unknown: {exc}"
    set_here = {u.field for u in c.used if u.origin == "scenario"}

    def part(key: str, text: str) -> str:
        return text + ("*" if key in set_here else "")

    def unusual(key: str, usual: bool) -> bool:
        """Whether a convention is named: always where the scenario sets it, else only
        where it is not the usual value."""
        return key in set_here or not usual

    parts = []
    for f in CONVENTION_ROWS.values():
        if not f.applies(training):
            continue
        value = getattr(c, f.attr)
        if f.usual is not None and not unusual(f.key, value == f.usual(training)):
            continue
        parts.append(part(f.key, f.brief.format(f.brief_words.get(value, value))))
    if training.loss == "chunked-output":
        parts.append(f"loss in {training.loss_chunks} chunks")
    else:
        parts.append(LOSS_SHORT.get(training.loss, training.loss))
    if c.checkpointing == "per-op" and training.activation_checkpointing == "selective":
        parts.append("selective = per-op")
    text = " · ".join(parts)
    return text + ("  (* set here)" if set_here else "")


def human_count(n: int) -> str:
    for unit, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return str(n)


def _modules_to_save_field() -> tuple[Any, Any]:
    """PEFT's ``modules_to_save`` as one choice: none, the LM head, the embeddings or both."""
    get, set_ = training_field("lora.modules_to_save")
    names = {(): "none", ("lm_head",): "lm_head", ("embed_tokens",): "embed_tokens"}
    values = {v: k for k, v in names.items()} | {"both": ("embed_tokens", "lm_head")}

    def read(s: Scenario) -> str:
        chosen = tuple(sorted(get(s)))
        return names.get(chosen, "both" if len(chosen) == 2 else "none")

    def write(s: Scenario, value: str) -> Scenario:
        return set_(s, values[value])

    return read, write


class ModelPanel(FormPanel):
    """Preset picker with search and filters, editable architecture, live parameter count."""

    #: a preset the scenario cannot take (a LoRA rank above its hidden size), in words
    refused = Signal(str)

    def __init__(self, store: ScenarioStore, parent: QWidget | None = None) -> None:
        super().__init__("Model", store, parent)
        self._presets = [(name, load_model(name)) for name in model_names()]
        self._custom = custom_names("models")
        self._sizes = {name: count_parameters(m).total for name, m in self._presets}
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search presets (e.g. llama 8b)")
        self.search.setClearButtonEnabled(True)
        self.family = QComboBox()
        self.family.addItem("All families", "")
        for fam in sorted({m.family for _, m in self._presets}):
            self.family.addItem(FAMILY_NAMES.get(fam, fam), fam)
        self.size_filter = QComboBox()
        for text, lo, hi in SIZE_BUCKETS:
            self.size_filter.addItem(text, (lo, hi))
        for combo in (self.family, self.size_filter):
            combo.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
            combo.setMinimumWidth(80)
        filters = QHBoxLayout()
        filters.addWidget(self.family, 1)
        filters.addWidget(self.size_filter, 1)
        self.preset = QComboBox()
        self._extra_item = False  # item 0 shows the current model, which no preset item does
        self.preset.setMaxVisibleItems(20)
        self.preset.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        for widget, key in (
            (self.search, "search"),
            (self.family, "family"),
            (self.size_filter, "size"),
            (self.preset, "preset"),
        ):
            widget.setToolTip(rich_text(WIDGET_TIPS[key]))
        for combo in (self.family, self.size_filter, self.preset):
            guard_field(combo)
        self.preset.setAccessibleName("Model preset")
        self.count = QLabel()
        self.count.setObjectName("paramCount")
        self.count.setWordWrap(True)
        self.header.addWidget(self.search)
        self.header.addLayout(filters)
        self.header.addWidget(self.preset)
        self.header.addWidget(self.count)
        self.search.textChanged.connect(self._fill_presets)
        self.family.currentIndexChanged.connect(self._fill_presets)
        self.size_filter.currentIndexChanged.connect(self._fill_presets)
        self.preset.activated.connect(self._choose_preset)

        self.name_field = self.add_text(
            "model.display_name", "Name", model_name_field(), max_length=MODEL_NAME_CHARS
        )
        self.name_field.setPlaceholderText("the preset's or the config's name")
        dims = 1 << 24
        # the architecture folds under the model: a preset fills it; open it to edit
        self.architecture = Collapsible("Architecture")
        self.architecture.setObjectName("architecture")
        self.form.addRow(self.architecture)
        with self.rows_in(self.architecture.form):
            self._add_architecture(dims)
        self._fill_presets()
        self.after_refresh(store.scenario)

    def _add_architecture(self, dims: int) -> None:
        self.add_spin("model.num_layers", "Layers", 1, 4096, model_field("num_layers"))
        self.add_spin("model.hidden_size", "Hidden size", 1, dims, model_field("hidden_size"))
        self.add_spin(
            "model.num_attention_heads",
            "Attention heads",
            1,
            65536,
            model_field("num_attention_heads"),
        )
        self.add_spin(
            "model.num_key_value_heads",
            "KV heads",
            1,
            65536,
            model_field("num_key_value_heads"),
        )
        self.add_spin("model.head_dim", "Head dim", 1, 65536, model_field("head_dim"))
        self.add_spin(
            "model.intermediate_size",
            "MLP size",
            0,
            dims,
            model_field("intermediate_size"),
        )
        self.add_spin("model.vocab_size", "Vocabulary", 1, dims, model_field("vocab_size"))
        self.add_spin(
            "model.num_experts",
            "Experts",
            0,
            4096,
            model_field("num_experts"),
        )
        self.add_spin(
            "model.num_experts_per_tok",
            "Experts / token",
            0,
            4096,
            model_field("num_experts_per_tok"),
        )
        self.add_spin(
            "model.moe_intermediate_size",
            "Expert MLP size",
            0,
            dims,
            model_field("moe_intermediate_size"),
        )
        self.add_check(
            "model.tie_word_embeddings",
            "Tied embeddings",
            model_field("tie_word_embeddings"),
        )

    @Slot()
    def _fill_presets(self) -> None:
        words = self.search.text().lower().split()
        family = self.family.currentData()
        lo, hi = self.size_filter.currentData()
        with QSignalBlocker(self.preset):
            self.preset.clear()
            self._extra_item = False
            for name, m in self._presets:
                text = f"{name} {m.label} {m.family}".lower()
                if family and m.family != family:
                    continue
                if not lo <= self._sizes[name] < hi or not all(w in text for w in words):
                    continue
                self.preset.addItem(self._preset_text(name, m), name)
            if self.preset.count() == 0:
                self.preset.addItem("No preset matches the filters", None)
        self._select_current()

    def current_preset_text(self) -> str:
        """What the preset combo should show for the current model."""
        model = self.store.scenario.model
        name = preset_name_of(model) or renamed_preset_of(model)
        if name:
            return self._preset_text(name, model)
        if model.name in model_names():  # a preset whose architecture the user changed
            return f"{model.label} (edited)"
        return f"{model.label}  ({human_count(count_parameters(model).total)})"

    def _preset_text(self, name: str, model: ModelSpec) -> str:
        """``Llama 3 8B  (8.0B)``, and ``— your preset`` for one of the user's own."""
        text = f"{model.label}  ({human_count(self._sizes[name])})"
        return text + YOURS if name in self._custom else text

    def _select_current(self) -> None:
        """Show the current model in the preset combo: its preset's item, else an extra
        first item for it (an edited model, or a preset the filters leave out)."""
        name = preset_name_of(self.store.scenario.model)
        with QSignalBlocker(self.preset):
            if self._extra_item:
                self.preset.removeItem(0)
                self._extra_item = False
            index = self.preset.findData(name) if name else -1
            if index < 0:
                self.preset.insertItem(0, self.current_preset_text(), name)
                self._extra_item = True
                index = 0
            self.preset.setCurrentIndex(index)

    def preset_shows_current(self) -> bool:
        """Whether the preset combo shows the current model (and not another one)."""
        name = preset_name_of(self.store.scenario.model)
        return (
            self.preset.currentData() == name
            and self.preset.currentText() == self.current_preset_text()
        )

    @Slot(int)
    def _choose_preset(self, index: int) -> None:
        name = self.preset.itemData(index)
        if not name:  # the edited model, or "No preset matches"
            self._select_current()
            return
        model = load_model(name)
        try:
            scenario = dataclasses.replace(self.store.scenario, model=model)
        except EstimateError as exc:  # another section does not fit it: say which, keep ours
            self._select_current()
            self.refused.emit(f"Could not choose {model.label}: {in_user_words(exc)}")
            return
        if not self.store.edit(scenario, f"Choose model {model.label}"):
            self._select_current()

    def after_refresh(self, scenario: Scenario) -> None:
        # the model the stack's modeling code builds: LitGPT unties a tied head
        model = scenario.model
        try:
            model = as_built(scenario.model, scenario.training)
            total = count_parameters(model).total
            trainable = model_state(model, scenario.training).trainable_params
        except EstimateError:
            trainable = 0
            total = count_parameters(model).total
        untied = model.tie_word_embeddings != scenario.model.tie_word_embeddings
        built = "<br>as LitGPT builds it: an LM head of its own" if untied else ""
        m = scenario.model
        if m.read_as:
            built += (
                f"<br>read as {html.escape(m.read_as)} (a look-alike of {html.escape(m.family)})"
            )
        if m.text_model_of:
            built += (
                f"<br>the text model of {html.escape(m.text_model_of)}: "
                "its vision tower is not counted"
            )
        self.count.setText(
            f"<b>{total:,}</b> parameters ({human_count(total)})"
            + (f"<br>trainable {trainable:,} ({100 * trainable / total:.3g} %)" if total else "")
            + built
        )
        self.architecture.summary.setText(architecture_summary(scenario.model))
        self._select_current()


class HardwarePanel(FormPanel):
    """GPU preset, how many, custom memory and the budget line."""

    def __init__(self, store: ScenarioStore, parent: QWidget | None = None) -> None:
        super().__init__("Hardware", store, parent)
        gpus = [load_gpu(n) for n in gpu_names()]
        #: the text of each fixed item while it is not current
        mine = custom_names("gpus")
        self._gpu_texts = [
            *(gpu_text(g) + (YOURS if g.name in mine else "") for g in gpus),
            CUSTOM_TEXT,
        ]
        names = [*(g.name for g in gpus), CUSTOM_GPU]
        # the GPU's names are long ("NVIDIA GH200 Grace Hopper Superchip (96GB HBM3)"): its
        # row takes the panel's width, the label above the field
        gpu_form = QFormLayout()
        gpu_form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapAllRows)
        gpu_form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        gpu_form.setVerticalSpacing(1)
        self.header.addLayout(gpu_form)
        with self.rows_in(gpu_form):
            self.gpu = self.add_combo(
                "hardware.gpu",
                "GPU",
                list(zip(self._gpu_texts, names, strict=True)),
                _gpu_field(),
            )
        for index, gpu in enumerate(gpus):  # the whole name and where its memory comes from
            tip = f"{gpu.display_name}: {gpu.memory_mib:,} MiB ({gpu.memory_source})"
            self.gpu.setItemData(index, rich_text(tip), Qt.ItemDataRole.ToolTipRole)
        self.gpu.setItemData(
            len(gpus),
            rich_text("A device with no preset: give its memory and name under More hardware"),
            Qt.ItemDataRole.ToolTipRole,
        )
        # a custom GPU is described under More hardware: its memory and name
        self.gpu.activated.connect(self._gpu_chosen)
        self.add_spin(
            "hardware.gpus_per_node", "GPUs per node", 1, 64, hardware_field("gpus_per_node")
        )
        self.add_spin("hardware.nodes", "Nodes", 1, 100_000, hardware_field("nodes"))
        # what a preset answers: folded under the GPU, opened on demand
        self.more = Collapsible("More hardware")
        self.more.setObjectName("moreHardware")
        self.form.addRow(self.more)
        with self.rows_in(self.more.form):
            self._add_more()
        self.after_refresh(store.scenario)

    def _add_more(self) -> None:
        get_mem, _ = hardware_field("memory_gib")
        memory = self.add_double(
            "hardware.memory_gib",
            "Memory override",
            0.0,
            16384.0,
            (lambda s: get_mem(s) or 0.0, set_memory),
            decimals=1,
            suffix=" GiB",
        )
        memory.setSpecialValueText("preset")
        self.gpu_name = self.add_text("hardware.gpu_name", "GPU name", gpu_name_field())
        # a custom GPU's figures, shown for one (what a preset answers from its datasheet)
        self.add_combo(
            "hardware.architecture",
            "Architecture",
            ARCHITECTURE_CHOICES,
            custom_figure_field("architecture"),
        )
        for key, label, hi, suffix in (
            ("bf16_tflops", "Peak BF16", 1e6, " TFLOP/s"),
            ("memory_bandwidth_gb_s", "Memory bandwidth", 1e6, " GB/s"),
            ("tdp_w", "TDP", 5000.0, " W"),
        ):
            spin = self.add_double(
                f"hardware.{key}",
                label,
                0.0,
                hi,
                custom_figure_field(key),
                decimals=1,
                suffix=suffix,
            )
            spin.setSpecialValueText("H100's (assumed)" if key != "tdp_w" else "not known")
        get_host, set_host = hardware_field("host_memory_gib")
        host = self.add_double(
            "hardware.host_memory_gib",
            "Host RAM / node",
            0.0,
            float(1 << 20),
            (lambda s: get_host(s) or 0.0, lambda s, v: set_host(s, v or None)),
            decimals=0,
            suffix=" GiB",
        )
        host.setSpecialValueText("not given")
        host.setSingleStep(64)
        self.add_double(
            "hardware.utilization_target",
            "Budget line",
            10.0,
            100.0,
            hardware_field("utilization_target"),
            decimals=0,
            scale=100.0,
            suffix=" %",
        )
        get_price, set_price = hardware_field("price_per_gpu_hour")
        self.price = self.add_double(
            "hardware.price_per_gpu_hour",
            "Price / GPU-hour",
            0.0,
            1e6,
            (lambda s: get_price(s) or 0.0, lambda s, v: set_price(s, v or None)),
            decimals=2,
        )
        self.add_combo(
            "hardware.cuda_runtime",
            "CUDA runtime",
            CUDA_CHOICES,
            hardware_field("cuda_runtime"),
        )
        self.power = self.add_double(
            "hardware.power_limit_w",
            "Power limit",
            0.0,
            5000.0,
            optional_hardware_field("power_limit_w"),
            decimals=0,
            suffix=" W",
        )
        self.power.setSingleStep(25)
        clock = self.add_double(
            "hardware.clock_share",
            "SM clock",
            0.0,
            100.0,
            optional_hardware_field("clock_share"),
            decimals=0,
            scale=100.0,
            suffix=" %",
        )
        clock.setSpecialValueText("stock")

    @Slot()
    def _gpu_chosen(self) -> None:
        if self.gpu.currentData() == CUSTOM_GPU:
            self.more.set_expanded(True)

    def after_refresh(self, scenario: Scenario) -> None:
        # the current item shows the device as the scenario has it (its name, its memory)
        hw = scenario.hardware
        combo, current = self.gpu, self.gpu.currentIndex()
        for index in range(min(combo.count(), len(self._gpu_texts))):
            text = hardware_text(hw) if index == current else self._gpu_texts[index]
            if combo.itemText(index) != text:
                combo.setItemText(index, text)
        if current >= len(self._gpu_texts):
            combo.setItemText(current, hardware_text(hw))
        self.gpu_name.setPlaceholderText(default_gpu_name(hw.gpu))
        preset = scenario.hardware.gpu.price_per_gpu_hour
        self.price.setSpecialValueText("not given" if preset is None else f"preset {preset:g}")
        custom = hw.gpu.name == CUSTOM_GPU
        for key in ("architecture", "bf16_tflops", "memory_bandwidth_gb_s", "tdp_w"):
            self.set_row_visible(f"hardware.{key}", custom)
        tdp = hw.gpu.tdp_w
        self.power.setSpecialValueText("stock" if tdp is None else f"stock ({tdp:g} W TDP)")
        # a GPU with no TDP on record takes a clock share, not a power limit
        self.power.setEnabled(tdp is not None or hw.power_limit_w is not None)
        self.more.summary.setText(hardware_summary(scenario.hardware))


def canonical_targets(targets: tuple[str, ...]) -> tuple[str, ...]:
    """LoRA targets in the engine's order without repeats; ``all-linear`` covers all; a
    module name (``c_attn``) stands for the roles it adapts, which an edit then writes."""
    targets = target_names(targets)
    if "all-linear" in targets:
        return ("all-linear",)
    return tuple(t for t in TARGETS if t in targets)


class TargetsWidget(QWidget):
    """LoRA targets as checkboxes, one per target the engine knows; ``all-linear``
    overrides the others but ``lm_head`` (the output layer, which it leaves out). The
    latent-attention targets show for such models (or when a scenario holds them). Emits
    :attr:`changed` on a user's toggle."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setHorizontalSpacing(6)
        grid.setVerticalSpacing(0)
        self.boxes: dict[str, QCheckBox] = {}
        plain = [t for t in TARGETS if t not in MLA_TARGETS]
        latent = [t for t in TARGETS if t in MLA_TARGETS]
        cell = 0  # three to a line, all-linear two wide: no name is cut in a narrow column
        for name in (*plain, "all-linear", *latent):
            box = QCheckBox(name.removesuffix("_proj"))
            box.setToolTip(rich_text(f"{name}: {TARGET_TIPS[name]}"))
            self.boxes[name] = box
            span = 2 if name == "all-linear" else 1
            if cell % 3 + span > 3:
                cell += 3 - cell % 3
            grid.addWidget(box, cell // 3, cell % 3, 1, span)
            cell += span
            box.toggled.connect(self._user_toggled)
        self.boxes["all-linear"].toggled.connect(self._enable_parts)
        self.show_latent(False)
        #: role -> the name a target of it is written as (Mixtral's experts: ``w1``, ...)
        self.names: dict[str, str] = {}

    @Slot()
    def _user_toggled(self) -> None:
        if not self.signalsBlocked():
            self.changed.emit()

    def _enable_parts(self, everything: bool) -> None:
        for name in TARGETS:
            if name != "lm_head":  # all-linear leaves the output layer out
                self.boxes[name].setEnabled(not everything)

    def show_latent(self, show: bool) -> None:
        """Show the latent-attention targets (always those checked)."""
        for name in MLA_TARGETS:
            box = self.boxes.get(name)
            if box is not None:
                box.setVisible(show or box.isChecked())

    def set_names(self, names: dict[str, str]) -> None:
        """Write the roles in ``names`` as the model names them (Mixtral's experts: gate is
        ``w1``), and say so on their boxes."""
        self.names = names
        for role, box in self.boxes.items():
            short = role.removesuffix("_proj")
            box.setText(f"{short} ({names[role]})" if role in names else short)

    def value(self) -> tuple[str, ...]:
        if self.boxes["all-linear"].isChecked():
            return ("all-linear",) + (("lm_head",) if self.boxes["lm_head"].isChecked() else ())
        return tuple(self.names.get(n, n) for n in TARGETS if self.boxes[n].isChecked())

    def set_value(self, targets: tuple[str, ...]) -> None:
        """Check the boxes of ``targets`` (without emitting :attr:`changed`); a name a
        model gives a role (``w1``) checks the role's box."""
        head = ("lm_head",) if "lm_head" in targets else ()
        targets = canonical_targets(targets) + head
        with QSignalBlocker(self):
            for name, box in self.boxes.items():
                box.setChecked(name in targets)
            self._enable_parts("all-linear" in targets)


class TrainingPanel(FormPanel):
    """Training stack and its conventions, method, adapters, precision, optimizer, shapes,
    checkpointing, attention kernel."""

    def __init__(self, store: ScenarioStore, parent: QWidget | None = None) -> None:
        super().__init__("Training strategy", store, parent)
        self._stacks = self._read_stacks()
        #: the training (without its shape) whose conventions the rows show
        self._conventions_of: tuple[object, ...] | None = None
        # first what a user changes first (it fits the first screen), then the method's
        # details, the training stack and its conventions, and the rest
        self.add_combo("training.method", "Method", METHOD_CHOICES, training_field("method"))
        self.add_combo(
            "training.precision", "Precision", PRECISION_CHOICES, training_field("precision")
        )
        self.add_spin(
            "training.micro_batch_size", "Micro-batch", 1, 65536, training_field("micro_batch_size")
        )
        self.add_spin(
            "training.sequence_length",
            "Sequence length",
            1,
            1 << 24,
            training_field("sequence_length"),
            step=256,
        )
        self.add_combo(
            "training.activation_checkpointing",
            "Checkpointing",
            CHECKPOINT_CHOICES,
            training_field("activation_checkpointing"),
        )
        self.add_spin(
            "training.checkpoint_every_k",
            "Checkpoint k",
            1,
            4096,
            training_field("checkpoint_every_k"),
            suffix=" layers",
        )
        self.add_spin(
            "training.lora.rank",
            "LoRA rank",
            1,
            65536,
            training_field("lora.rank"),
        )
        self.add_double(
            "training.lora.alpha", "LoRA alpha", 0.0, 1e6, training_field("lora.alpha"), decimals=1
        )
        self.targets = TargetsWidget()
        row = self._add_targets()
        self.targets.changed.connect(lambda r=row: self.commit(r, self.targets.value()))
        self.add_combo(
            "training.lora.modules_to_save",
            "Full copies",
            [
                ("none", "none"),
                ("LM head", "lm_head"),
                ("embeddings", "embed_tokens"),
                ("LM head and embeddings", "both"),
            ],
            _modules_to_save_field(),
        )
        self.add_check(
            "training.qlora.double_quant",
            "Double quant",
            training_field("qlora.double_quant"),
        )
        self.add_combo(
            "training.freeze.trainable",
            "Trainable parts",
            [(parts_text(p), p) for p in _FREEZE_CHOICES],
            _freeze_trainable_field(),
        )
        self.add_spin(
            "training.freeze.last_layers",
            "Last layers",
            0,
            4096,
            training_field("freeze.last_layers"),
        )
        stack = self.add_combo(
            "training.stack",
            "Training stack",
            [(self._stack_text(n), n) for n in loadable_stack_names()],
            _stack_field(),
        )
        for index, name in enumerate(loadable_stack_names()):
            known = self._stacks.get(name)
            tip = stack_tip(known) if known else rich_text(f"{name}: its file cannot be read")
            stack.setItemData(index, tip, Qt.ItemDataRole.ToolTipRole)
        self.conventions = Collapsible("Conventions")
        self.conventions.setObjectName("conventions")
        self.form.addRow(self.conventions)
        self.resets: dict[str, QToolButton] = {}
        with self.rows_in(self.conventions.form):
            self._add_conventions()
        self.add_combo(
            "training.optimizer", "Optimizer", OPTIMIZER_CHOICES, training_field("optimizer")
        )
        self.add_combo(
            "training.optimizer_impl",
            "Optimizer impl",
            [(v, v) for v in OPTIMIZER_IMPLS],
            training_field("optimizer_impl"),
        )
        self.add_spin(
            "training.gradient_accumulation_steps",
            "Grad. accumulation",
            1,
            1 << 20,
            training_field("gradient_accumulation_steps"),
        )
        self.add_check(
            "training.optimizer_in_backward",
            "Optimizer in backward",
            training_field("optimizer_in_backward"),
        )
        self.add_combo(
            "training.attention",
            "Attention kernel",
            [
                ("SDPA (flash or mem-efficient)", "sdpa"),
                ("flash attention", "flash"),
                ("memory-efficient", "mem-efficient"),
                ("eager (s x s scores kept)", "eager"),
            ],
            training_field("attention"),
        )
        self.add_combo(
            "training.moe_implementation",
            "MoE experts",
            MOE_CHOICES,
            training_field("moe_implementation"),
        )
        self.add_combo(
            "training.fp8_recipe",
            "FP8 scaling",
            [
                ("per tensor (Transformer Engine)", "tensorwise"),
                ("per row (torchao rowwise)", "rowwise"),
                ("per block (1x128 / 128x128)", "blockwise"),
                ("MXFP8 (Blackwell)", "mxfp8"),
            ],
            training_field("fp8_recipe"),
        )
        self.add_check(
            "training.torch_compile",
            "torch.compile",
            training_field("torch_compile"),
        ).setText("element-wise ops fused")
        get_budget, set_budget = training_field("token_budget")
        budget = self.add_count(
            "training.token_budget",
            "Token budget",
            10**16,
            (lambda s: get_budget(s) or 0, lambda s, v: set_budget(s, v or None)),
        )
        budget.setSpecialValueText("not given")
        self.after_refresh(store.scenario)

    @staticmethod
    def _read_stacks() -> dict[str, Stack]:
        """The stacks whose files can be read (a broken one is named, not fatal)."""
        out = {}
        for name in loadable_stack_names():
            with contextlib.suppress(EstimateError):
                out[name] = load_stack(name)
        return out

    def _stack_text(self, name: str) -> str:
        """The stack's label, and ``— your preset`` for one of the user's own."""
        text = self._stacks[name].label if name in self._stacks else name
        return text + YOURS if name in custom_names("stacks") else text

    def _add_conventions(self) -> None:
        for path, f in CONVENTION_ROWS.items():
            self.add_combo(path, f.label, convention_choices(f), convention_field(f.key))
        self.add_combo("training.loss", "Loss", LOSS_CHOICES, training_field("loss"))
        self.add_spin(
            "training.loss_chunks",
            "Loss chunks",
            1,
            4096,
            training_field("loss_chunks"),
        )
        for path in (*CONVENTION_ROWS, "training.loss"):
            button = QToolButton()
            button.setText("↺")
            button.setAutoRaise(True)
            button.setAccessibleName(f"Give {self.rows[path].label} back to the stack")
            button.clicked.connect(lambda _c=False, p=path: self._reset(p))
            self.resets[path] = button
            self.add_beside(path, button)

    def _reset(self, path: str) -> None:
        """Give the row of ``path`` back to the stack (the loss: the stack's loss)."""
        row = self.rows[path]
        if path != "training.loss":
            self.commit(row, FROM_STACK)
            return
        stack = self._stacks.get(self.store.scenario.training.stack)
        if stack is not None and "loss" in stack.defaults:
            self.commit(row, stack.defaults["loss"])

    def _add_targets(self) -> Row:
        get, set_ = training_field("lora.targets")
        return self._add(
            "training.lora.targets",
            "LoRA targets",
            self.targets,
            # as the model names them (Mixtral's experts: w1, w3, w2), as the boxes write them
            lambda s: tuple(
                expert_target_names(s.model).get(t, t) for t in canonical_targets(get(s))
            ),
            set_,
            self.targets.value,
            lambda value: self.targets.set_value(tuple(value)),
            TIPS["training.lora.targets"],
        )

    def after_refresh(self, scenario: Scenario) -> None:
        method = scenario.training.method
        adapters = method in ("lora", "qlora")
        visible = {
            "training.lora.rank": adapters,
            "training.lora.alpha": adapters,
            "training.lora.targets": adapters,
            "training.lora.modules_to_save": adapters
            or bool(scenario.training.lora.modules_to_save),
            "training.qlora.double_quant": method == "qlora",
            "training.freeze.trainable": method == "freeze",
            "training.freeze.last_layers": method == "freeze",
            "training.checkpoint_every_k": scenario.training.activation_checkpointing
            in ("every-k-layers", "first-k-layers"),
            "training.moe_implementation": scenario.model.is_moe
            or scenario.training.moe_implementation != "grouped",
            "training.fp8_recipe": scenario.training.precision == "fp8-mixed"
            or scenario.training.fp8_recipe != "tensorwise",
        }
        for path, show in visible.items():
            self.set_row_visible(path, show)
        self.targets.show_latent(scenario.model.is_mla)
        self.targets.set_names(expert_target_names(scenario.model))
        self._show_conventions(scenario.training)

    def _show_conventions(self, training: TrainingSpec) -> None:
        """The stack's tooltip, each convention row's "from stack" text, tooltip, reset
        button and whether it applies, and the section's summary; kept where only the
        shape changed (micro-batch, sequence length, accumulation: no convention reads
        them, and the rows' values follow the training's other fields)."""
        shown = strategy_key(training)
        if shown == self._conventions_of:
            return
        self._conventions_of = shown
        stack = self._stacks.get(training.stack)
        rows = self.rows
        about = (
            f"{stack.label}: {stack.description}\nSource: {stack.source}"
            if stack
            else f"{training.stack}: its file cannot be read"
        )
        rows["training.stack"].widget.setToolTip(rich_text(f"{TIPS['training.stack']}\n{about}"))
        self.conventions.summary.setText(conventions_summary(training))
        for path, f in CONVENTION_ROWS.items():
            unused = "" if f.applies(training) else f.unused
            auto = f.resolve(training, "auto") if f.resolve and "auto" in f.values else None
            combo = rows[path].widget
            assert isinstance(combo, QComboBox)
            lines = [f.tip]
            if stack is None:
                combo.setItemText(0, "from stack (unknown)")
            else:
                value = stack.convention(f.key, training.precision, training.method)
                text = f.shown.get(value, str(value))
                if value == "auto":
                    text = f"auto: {auto}"
                combo.setItemText(0, f"from stack ({text})")
                lines.append(f"{stack.label}: {text} — {stack.why.get(f.key, '')}".rstrip(" —"))
            if auto is not None:
                combo.setItemText(combo.findData("auto"), f"auto ({auto})")
            explicit = combo.currentData() != FROM_STACK
            if explicit:
                lines.append("Set in this scenario; ↺ gives it back to the stack.")
            if unused:
                lines.append(f"Not used here: {unused}.")
            combo.setEnabled(not unused)
            combo.setToolTip(rich_text("\n".join(lines)))
            self.resets[path].setEnabled(explicit and not unused)
            self.resets[path].setToolTip(
                rich_text("Back to the stack's value" if explicit else "The stack's value")
            )
        checkpointing = rows["training.activation_checkpointing"].widget
        assert isinstance(checkpointing, QComboBox)
        policy = (
            stack.convention("selective_checkpointing", training.precision, training.method)
            if stack
            else ""
        )
        checkpointing.setItemText(
            checkpointing.findData("selective"),
            f"selective ({POLICY_TEXT.get(policy, 'its policy')})",
        )
        self._show_loss(training, stack)

    def _show_loss(self, training: TrainingSpec, stack: Stack | None) -> None:
        loss = self.rows["training.loss"].widget
        default = stack.defaults.get("loss") if stack else None
        lines = [TIPS["training.loss"]]
        if stack is not None and default is not None:
            lines.append(f"{stack.label} uses: {LOSS_TEXT[default]}")
        loss.setToolTip(rich_text("\n".join(lines)))
        differs = default is not None and training.loss != default
        reset = self.resets["training.loss"]
        reset.setEnabled(differs)
        reset.setToolTip(rich_text("Back to the stack's loss" if differs else "The stack's loss"))
        self.rows["training.loss_chunks"].widget.setEnabled(training.loss == "chunked-output")


def canonical_parts(parts: tuple[str, ...]) -> tuple[str, ...]:
    """Trainable parts in the engine's order without repeats."""
    return tuple(p for p in FREEZE_PARTS if p in parts)


def parts_text(parts: tuple[str, ...]) -> str:
    """Trainable parts in a combo: ``attention, mlp``; every part but the embeddings is
    ``all but embeddings`` (the whole list would not fit the column)."""
    if set(parts) == set(FREEZE_PARTS) - {"embeddings"}:
        return "all but embeddings"
    return ", ".join(parts)


def _freeze_trainable_field() -> tuple[Any, Any]:
    get, set_ = training_field("freeze.trainable")
    return (lambda s: canonical_parts(get(s))), set_


_FREEZE_CHOICES: tuple[tuple[str, ...], ...] = tuple(
    canonical_parts(parts)
    for parts in (
        ("lm_head",),
        ("lm_head", "norms"),
        ("attention",),
        ("mlp",),
        ("attention", "mlp"),
        ("embeddings", "lm_head"),
        tuple(p for p in FREEZE_PARTS if p != "embeddings"),
    )
)


FRAMEWORK_CHOICES = (("PyTorch (DDP / FSDP)", "pytorch"), ("DeepSpeed", "deepspeed"),
                     ("Megatron-LM", "megatron"))  # fmt: skip
ZERO_CHOICES = (("none (DDP: every GPU holds all)", 0), ("ZeRO-1: optimizer states", 1),
                ("ZeRO-2 / SHARD_GRAD_OP: + gradients", 2),
                ("ZeRO-3 / FULL_SHARD: + parameters", 3))  # fmt: skip
SCHEDULE_CHOICES = (("1F1B", "1f1b"), ("GPipe (all forwards first)", "gpipe"),
                    ("interleaved 1F1B", "interleaved-1f1b"),
                    ("zero bubble (ZB-H1)", "zero-bubble"))  # fmt: skip
SPLIT_CHOICES = (("even (pp x vpp divides the layers)", "even"),
                 ("balanced (embedding, head as layers)", "balanced"))  # fmt: skip
OFFLOAD_CHOICES = (("no", "none"), ("to CPU", "cpu"), ("to NVMe", "nvme"))
INTERLEAVED = "interleaved-1f1b"


def _schedule_field() -> tuple[Any, Any]:
    """The pipeline schedule; choosing interleaved 1F1B gives it 2 virtual stages (it needs
    at least 2) and leaving it goes back to 1, so that no single choice is invalid."""
    get, _ = training_field("parallelism.pp_schedule")

    def set_(s: Scenario, value: str) -> Scenario:
        par = s.training.parallelism
        vpp = max(par.vpp, 2) if value == INTERLEAVED else 1
        par = dataclasses.replace(par, pp_schedule=value, vpp=vpp)
        return dataclasses.replace(s, training=dataclasses.replace(s.training, parallelism=par))

    return get, set_


#: the rows of the parallelism panel: the scenario paths start so
PAR = "training.parallelism."


def parallelism_field(name: str) -> tuple[Any, Any]:
    return training_field("parallelism." + name)


class ParallelismPanel(FormPanel):
    """How the GPUs split the run (framework, data and model parallelism) and what leaves
    the GPU (offload). Options that only matter with another setting (the schedule with
    pp > 1, virtual stages with interleaved 1F1B, ...) appear with it."""

    section_rows: ClassVar[dict[str, str]] = {"training.parallelism": "training.parallelism.tp"}

    def __init__(self, store: ScenarioStore, parent: QWidget | None = None) -> None:
        super().__init__("Parallelism and offload", store, parent)
        self.mesh = QLabel()
        self.mesh.setObjectName("meshSummary")
        self.mesh.setWordWrap(True)
        self.header.addWidget(self.mesh)
        par, field = PAR, parallelism_field
        self.add_combo(
            par + "framework",
            "Framework",
            FRAMEWORK_CHOICES,
            field("framework"),
        )
        section(self.form, "Data parallel")
        self.add_combo(
            par + "zero_stage",
            "ZeRO / FSDP",
            ZERO_CHOICES,
            field("zero_stage"),
        )
        self.add_check(
            par + "hybrid_shard",
            "Hybrid shard",
            field("hybrid_shard"),
        ).setText("shard within a node")
        self._add_axes("data")
        section(self.form, "Model parallel")
        self._add_axes("model")
        section(self.form, "Offload")
        for name, label in (("optimizer", "Optimizer"), ("parameters", "Parameters")):
            self.add_combo(
                f"training.offload.{name}",
                label,
                OFFLOAD_CHOICES,
                training_field(f"offload.{name}"),
            )
        self.add_combo(
            "training.offload.activations",
            "Activations",
            (("no", "none"), ("to CPU (checkpointed inputs)", "cpu")),
            training_field("offload.activations"),
        )
        self.after_refresh(store.scenario)

    def _add_axes(self, section: str) -> None:
        """A row for each parallel axis of ``section`` (engine.specs.PARALLEL_AXES), and
        after it the settings that belong to it."""
        companions = {
            "tp": self._add_tp_rows,
            "pp": self._add_pp_rows,
            "ep": self._add_ep_rows,
        }
        for axis in PARALLEL_AXES:
            if axis.section != section:
                continue
            self.add_spin(PAR + axis.key, axis.label, 1, 65536, parallelism_field(axis.key))
            if axis.key in companions:
                companions[axis.key]()

    def _add_tp_rows(self) -> None:
        self.add_check(
            PAR + "sequence_parallel",
            "Sequence parallel",
            parallelism_field("sequence_parallel"),
        ).setText("split over tp ranks")
        self.add_check(
            PAR + "tp_comm_overlap",
            "TP overlap",
            parallelism_field("tp_comm_overlap"),
        ).setText("hide tp collectives behind GEMMs")

    def _add_pp_rows(self) -> None:
        self.add_combo(PAR + "pp_schedule", "Schedule", SCHEDULE_CHOICES, _schedule_field())
        self.add_combo(
            PAR + "pp_split", "Stage split", SPLIT_CHOICES, parallelism_field("pp_split")
        )
        self.add_spin(PAR + "vpp", "Virtual stages", 1, 1024, parallelism_field("vpp"))

    def _add_ep_rows(self) -> None:
        self.add_double(
            PAR + "expert_capacity_factor",
            "Expert capacity",
            1.0,
            64.0,
            parallelism_field("expert_capacity_factor"),
            suffix=" x",
        ).setSingleStep(0.25)

    def after_refresh(self, scenario: Scenario) -> None:
        p = scenario.training.parallelism
        visible = {
            "training.parallelism.hybrid_shard": p.zero_stage > 0 or p.hybrid_shard,
            "training.parallelism.sequence_parallel": p.tp > 1 or p.sequence_parallel,
            "training.parallelism.tp_comm_overlap": p.tp > 1 or p.tp_comm_overlap,
            "training.parallelism.pp_schedule": p.pp > 1 or p.pp_schedule != "1f1b",
            "training.parallelism.vpp": p.pp_schedule == INTERLEAVED,
            "training.parallelism.pp_split": p.pp > 1 or p.pp_split != "even",
            "training.parallelism.expert_capacity_factor": p.ep > 1
            or p.expert_capacity_factor != 1.0,
        }
        for path, show in visible.items():
            self.set_row_visible(path, show)
        world = scenario.hardware.world_size
        gpus = f"<b>{world:,} GPU{'s' if world > 1 else ''}</b>"
        try:
            m = resolve(scenario).mesh
        except EstimateError:
            self.mesh.setText(f"{gpus}: this split does not work (see below)")
            return
        extra = [
            f"{a.key} {m.size(a.key)}"
            for a in PARALLEL_AXES
            if not a.in_world and m.size(a.key) > 1
        ]
        if p.zero_stage and m.shard > 1:
            extra.append(f"ZeRO shards over {m.shard} GPUs")
        split = " × ".join(f"{a.key} {m.size(a.key)}" for a in PARALLEL_AXES if a.in_world)
        self.mesh.setText(
            f"{gpus} = {split} × dp {m.dp}" + (f"<br>{' · '.join(extra)}" if extra else "")
        )

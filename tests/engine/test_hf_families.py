"""Every family the config reader reads, counted against its published parameter total.

Each ``tests/fixtures/hf_configs/<family>.json`` is the ``config.json`` of a public
checkpoint of the family, as published with it. :data:`PUBLISHED` gives the checkpoint's
parameter total and where it is published. An exact total must be met exactly; a total
published rounded ("3.03B") must be met within the rounding of its last digit (3.03B:
within 0.005B).

Beyond the counts: a ``model_type`` without a reader is an error naming
``model.model_type`` and ``read_as``, never a Llama; ``read_as`` reads a look-alike and
every report says so; hybrid, state-space and encoder-decoder families are refused with the
reason; a multimodal config is read as its text model, and the estimate lists the vision
tower as not modelled; malformed values name the key they were found in.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
from decimal import Decimal
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from memfit.engine.cli import format_table, main
from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.hf_config import MULTIMODAL, READERS, REFUSED, model_from_hf_config
from memfit.engine.params import count_parameters
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.report import to_markdown
from memfit.engine.scenario_io import load_scenario, scenario_from_dict, scenario_to_dict
from memfit.engine.specs import HardwareSpec, ModelSpec, Scenario

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"


def config(family: str) -> dict[str, Any]:
    data = json.loads((FIXTURES / f"{family}.json").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


class Published(NamedTuple):
    """A checkpoint's published parameter count: an exact integer or a rounded figure
    ("3.03B", "3,209M"); ``part`` says what it counts: ``total`` (the whole model),
    ``base`` (the encoder without its masked-LM head: BertModel, RobertaModel) or
    ``non-embedding`` (the total less the embedding tables)."""

    checkpoint: str
    count: int | str
    source: str
    part: str = "total"


PUBLISHED: dict[str, Published] = {
    "llama": Published(
        "meta-llama/Meta-Llama-3-8B",
        8_030_261_248,
        "keras-hub llama3_presets.py: llama3_8b_en metadata.params",
    ),
    "mistral": Published(
        "mistralai/Mistral-7B-v0.1",
        7_241_732_096,
        "keras-hub mistral_presets.py: mistral_7b_en metadata.params",
    ),
    "mixtral": Published(
        "mistralai/Mixtral-8x7B-v0.1",
        46_702_792_704,
        "keras-hub mixtral_presets.py: mixtral_8_7b_en metadata.params",
    ),
    "qwen2": Published(
        "Qwen/Qwen2.5-7B",
        7_615_616_512,
        "Qwen2.5-7B-Instruct model.safetensors.index.json: total_size 15,231,233,024 bytes "
        "of bf16 (the base model has the same shapes)",
    ),
    "qwen2_moe": Published(
        "Qwen/Qwen1.5-MoE-A2.7B",
        14_315_784_192,
        "keras-hub qwen_moe_presets.py: qwen1.5_moe_2.7b_en metadata.params (the model card "
        "says 14.3B)",
    ),
    "qwen3": Published(
        "Qwen/Qwen3-8B", 8_190_735_360, "keras-hub qwen3_presets.py: qwen3_8b_en metadata.params"
    ),
    "qwen3_moe": Published(
        "Qwen/Qwen3-30B-A3B",
        30_532_122_624,
        "keras-hub qwen3_moe_presets.py: qwen3_moe_30b_a3b_en metadata.params",
    ),
    "gemma": Published(
        "google/gemma-7b", 8_537_680_896, "keras-hub gemma_presets.py: gemma_7b_en metadata.params"
    ),
    "gemma2": Published(
        "google/gemma-2-9b",
        9_241_705_984,
        "keras-hub gemma_presets.py: gemma2_9b_en metadata.params",
    ),
    "gemma3_text": Published(
        "google/gemma-3-1b-pt",
        999_885_952,
        "keras-hub gemma3_presets.py: gemma3_1b metadata.params",
    ),
    "gemma3": Published(
        "google/gemma-3-4b-pt",
        "3,209M",
        "Gemma 3 Technical Report (arXiv 2503.19786), Table 1: 4B has 3,209M non-embedding "
        "parameters (beside a 417M vision encoder and 675M embedding parameters)",
        "non-embedding",
    ),
    "phi": Published(
        "microsoft/phi-2",
        2_779_683_840,
        "the Hugging Face Hub's safetensors parameter count of microsoft/phi-2 (F16: "
        "2,779,683,840), as recorded in public model registries; the card says 2.7 billion",
    ),
    "phi3": Published(
        "microsoft/Phi-3-mini-4k-instruct",
        3_821_079_552,
        "keras-hub phi3_presets.py: phi3_mini_4k_instruct_en metadata.params",
    ),
    "phimoe": Published(
        "microsoft/Phi-3.5-MoE-instruct",
        "41.9B",
        "the checkpoint's size on the Hugging Face Hub, 41.9B parameters, as its public "
        "conversions quote it (the model card: 16x3.8B experts, about 42B in all)",
    ),
    "gpt_oss": Published(
        "openai/gpt-oss-20b",
        20_914_757_184,
        "general.parameter_count of the gpt-oss:20b GGUF as `ollama show` prints it (every "
        "tensor's elements, the MXFP4 experts by their logical elements); OpenAI's gpt-oss "
        "model card (arXiv 2508.10925), Table 1: 20.91B total",
    ),
    "gpt2": Published(
        "openai-community/gpt2",
        124_439_808,
        "keras-hub gpt2_presets.py: gpt2_base_en metadata.params; llm.c's README prints "
        "the same num_parameters",
    ),
    "gpt_bigcode": Published(
        "bigcode/starcoder",
        15_517_456_384,
        "public tables of StarCoder-15B checkpoints (fine-tunes of bigcode/starcoder, same "
        "shapes) give 15,517,456,384; the model card says 15.5B",
    ),
    "gpt_neox": Published(
        "EleutherAI/pythia-1b",
        1_011_781_632,
        "EleutherAI/pythia README model table: total params of the 1B model",
    ),
    "gptj": Published(
        "EleutherAI/gpt-j-6b",
        6_050_882_784,
        "the parameter count of transformers' GPTJForCausalLM for EleutherAI/gpt-j-6b, as "
        "printed by public LoRA experiments on it. The model card's 6,053,381,344 is "
        "mesh-transformer-jax's count of its own layout, 2,498,560 more",
    ),
    "falcon": Published(
        "tiiuae/falcon-7b",
        6_921_720_704,
        "model.safetensors.index.json of a falcon-7b fine-tune of the same architecture: "
        "total_size 13,843,441,408 bytes of bf16",
    ),
    "bloom": Published(
        "bigscience/bloom-560m",
        559_214_592,
        "PEFT's print_trainable_parameters on bigscience/bloom-560m ('all params: "
        "559,214,592') in public tutorials, and public model tables",
    ),
    "olmo": Published(
        "allenai/OLMo-7B-hf",
        6_888_095_744,
        "the Hugging Face Hub's parameter count of OLMo-7B, as public model tables record it",
    ),
    "olmo2": Published(
        "allenai/OLMo-2-1124-7B",
        7_298_617_344,
        "the Hugging Face Hub's safetensors total of allenai/OLMo-2-1124-7B (F32), as public "
        "model registries record it",
    ),
    "olmoe": Published(
        "allenai/OLMoE-1B-7B-0924",
        6_919_161_856,
        "the parameter count of the checkpoint's safetensors headers (3,219 tensors), as "
        "public checkpoint audits record it; the paper says 6.9B total",
    ),
    "starcoder2": Published(
        "bigcode/starcoder2-3b",
        "3.03B",
        "the parameter count the Hugging Face Hub gives for bigcode/starcoder2-3b, 3.03B "
        "(with an untied head it would be 3.18B)",
    ),
    "stablelm": Published(
        "stabilityai/stablelm-3b-4e1t",
        2_795_443_200,
        "stabilityai/stablelm-3b-4e1t model card, Model Architecture table: Parameters",
    ),
    "cohere": Published(
        "CohereForAI/aya-expanse-8b",
        8_028_033_024,
        "the Hugging Face Hub's parameter count of CohereForAI/aya-expanse-8b, as public "
        "model tables record it",
    ),
    "granite": Published(
        "ibm-granite/granite-3.1-2b-instruct",
        2_533_531_648,
        "the Hugging Face Hub's parameter count of the Granite 3.1 2B checkpoints, as public "
        "model tables record it",
    ),
    "granitemoe": Published(
        "ibm-granite/granite-3.0-1b-a400m-base",
        1_334_628_352,
        "sum(p.numel() for p in model.parameters()) of the loaded Granite 1B-A400M "
        "checkpoint, as public loading tests assert it",
    ),
    "deepseek_v2": Published(
        "deepseek-ai/DeepSeek-V2-Lite",
        15_706_484_224,
        "deepseek-ai/DeepSeek-V2-Lite model.safetensors.index.json: total_size "
        "31,412,968,448 bytes of bf16",
    ),
    "deepseek_v3": Published(
        "deepseek-ai/DeepSeek-V3",
        671_026_419_200,
        "the safetensors shard headers of deepseek-ai/DeepSeek-V3 less the multi-token "
        "prediction layer and the fp8 scales, as public checkpoint audits record it (the "
        "report: 671B main model)",
    ),
    "internlm2": Published(
        "internlm/internlm2_5-7b",
        7_737_708_544,
        "the parameter count of InternLM2.5-7B, as public model tables and chatllm.cpp's "
        "banner ('7737708544 (7.7B) parameters') give it",
    ),
    "bert": Published(
        "google-bert/bert-base-uncased",
        109_482_240,
        "keras-hub bert_presets.py: bert_base_en_uncased metadata.params (BertModel, with "
        "the pooler, without the masked-LM head)",
        "base",
    ),
    "roberta": Published(
        "FacebookAI/roberta-base",
        124_645_632,
        "the parameter count of RobertaModel for roberta-base (with the pooler, without "
        "the masked-LM head), as Keras model summaries and public model tables give it",
        "base",
    ),
}

#: every fixture: one per family read, and the multimodal ones
ALL_FIXTURES = sorted(p.stem for p in FIXTURES.glob("*.json"))


def _published_tolerance(count: int | str) -> tuple[int, int]:
    """The count a published figure stands for and how far the true count may lie from
    it: 0 for an exact integer, half a unit of the last digit for a rounded one."""
    if isinstance(count, int):
        return count, 0
    text = count.replace(",", "")
    unit = {"M": 10**6, "B": 10**9}[text[-1]]
    number = Decimal(text[:-1])
    exponent = number.as_tuple().exponent
    assert isinstance(exponent, int)
    return int(number * unit), int(Decimal(10) ** exponent * unit / 2)


def _counted(spec: ModelSpec, part: str) -> int:
    counts = count_parameters(spec)
    if part == "base":
        return counts.total - counts["lm_head"]
    if part == "non-embedding":
        return counts.total - counts["embeddings"]
    return counts.total


# -- counts -------------------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(PUBLISHED))
def test_the_count_is_the_published_total(family: str) -> None:
    pub = PUBLISHED[family]
    spec = model_from_hf_config(config(family))
    expected, tolerance = _published_tolerance(pub.count)
    counted = _counted(spec, pub.part)
    assert abs(counted - expected) <= tolerance, (family, pub.checkpoint, counted, pub.count)
    assert spec.read_as == ""


def test_every_reader_is_checked_against_a_published_total() -> None:
    assert set(READERS) <= set(PUBLISHED)
    for family in READERS:
        assert config(family)["model_type"] == family


@pytest.mark.parametrize("family", sorted(set(PUBLISHED) & set(READERS)))
def test_each_fixture_is_read_by_its_own_family(family: str) -> None:
    spec = model_from_hf_config(config(family))
    assert spec.family == family
    assert spec.read_as == spec.text_model_of == ""
    assert spec.name == config(family)["_name_or_path"]


def test_gpt_bigcode_is_gpt2_with_one_key_value_head() -> None:
    """It used to be read as a Llama: a gated MLP without biases, rotary positions."""
    spec = model_from_hf_config(config("gpt_bigcode"))
    assert (spec.mlp, spec.norm, spec.position_embedding) == ("plain", "layernorm", "learned")
    assert (spec.num_key_value_heads, spec.attention_bias, spec.mlp_bias) == (1, True, True)
    assert spec.tie_word_embeddings


def test_starcoder2_and_cohere_are_not_llamas() -> None:
    sc2 = model_from_hf_config(config("starcoder2"))
    assert (sc2.mlp, sc2.norm, sc2.mlp_bias, sc2.tie_word_embeddings) == (
        "plain",
        "layernorm",
        True,
        True,
    )
    cohere = model_from_hf_config(config("cohere"))
    assert (cohere.norm, cohere.norms_per_layer, cohere.parallel_attention) == (
        "layernorm-nobias",
        1,
        True,
    )


def test_a_published_figure_is_met_within_its_rounding() -> None:
    assert _published_tolerance("3.03B") == (3_030_000_000, 5_000_000)
    assert _published_tolerance("3,209M") == (3_209_000_000, 500_000)
    assert _published_tolerance(7) == (7, 0)


# -- unknown families and read_as -----------------------------------------------------------


def _look_alike() -> dict[str, Any]:
    """A Mistral 7B config under a model_type without a reader."""
    return {**config("mistral"), "model_type": "mistral_fork"}


def test_an_unknown_model_type_is_an_error_not_a_llama() -> None:
    with pytest.raises(EstimateError) as info:
        model_from_hf_config(_look_alike())
    err = info.value
    assert err.field == "model.model_type"
    assert "'mistral_fork'" in str(err)
    assert "read_as" in str(err) and "--read-as" in str(err)
    assert "llama" in err.detail


def test_a_config_without_model_type_is_an_error() -> None:
    cfg = {k: v for k, v in config("llama").items() if k != "model_type"}
    with pytest.raises(EstimateError) as info:
        model_from_hf_config(cfg)
    assert info.value.field == "model.model_type"
    assert "read_as" in str(info.value)
    spec = model_from_hf_config(cfg, read_as="llama")
    assert (spec.read_as, spec.family) == ("llama", "unnamed")
    assert count_parameters(spec).total == PUBLISHED["llama"].count


def test_read_as_reads_a_look_alike_and_records_it() -> None:
    spec = model_from_hf_config(_look_alike(), read_as="mistral")
    assert (spec.family, spec.read_as) == ("mistral_fork", "mistral")
    assert count_parameters(spec).total == PUBLISHED["mistral"].count
    # a family read as itself records nothing
    assert model_from_hf_config(config("mistral"), read_as="mistral").read_as == ""


def test_read_as_is_reported_in_the_table_and_the_markdown() -> None:
    spec = model_from_hf_config(_look_alike(), read_as="mistral")
    est = estimate(Scenario(spec, HardwareSpec(load_gpu("h100-sxm-80gb"))))
    assert "Model        read as mistral (look-alike of mistral_fork)" in format_table(est)
    assert "read as mistral (look-alike of mistral_fork)" in to_markdown(est)
    assert not any("mistral_fork" in n for n in est.not_modelled)


def test_read_as_must_name_a_family_that_is_read() -> None:
    for bad in ("llama3", "jamba", "LLAMA"):
        with pytest.raises(EstimateError) as info:
            model_from_hf_config(_look_alike(), read_as=bad)
        assert info.value.field == "model.read_as"
        assert "llama" in info.value.detail
    with pytest.raises(EstimateError) as info:
        model_from_hf_config(_look_alike(), read_as="\x1b[2J")
    assert info.value.field == "model.read_as"


def test_read_as_reads_that_familys_keys() -> None:
    """Reading a GPT-2-keyed config as Llama asks for Llama's keys: no silent defaults."""
    with pytest.raises(EstimateError) as info:
        model_from_hf_config({**config("gpt_bigcode"), "model_type": "gpt_fork"}, read_as="llama")
    assert info.value.field == "model.num_attention_heads"


def test_read_as_in_a_scenario_file_and_its_round_trip(tmp_path: Path) -> None:
    data = {
        "memfit_scenario": 1,
        "model": {**_look_alike(), "read_as": "mistral"},
        "hardware": {"gpu": "h100-sxm-80gb"},
    }
    scenario = scenario_from_dict(data)
    assert scenario.model.read_as == "mistral"
    saved = scenario_to_dict(scenario)
    assert saved["model"]["spec"]["read_as"] == "mistral"
    assert scenario_from_dict(json.loads(json.dumps(saved))).model == scenario.model
    with pytest.raises(EstimateError) as info:
        scenario_from_dict({**data, "model": {**_look_alike(), "read_as": 3}})
    assert info.value.field == "model.read_as"


def test_scenario_files_from_before_read_as_still_load() -> None:
    spec = dataclasses.asdict(load_model("mistral-7b-v0.1"))
    del spec["read_as"], spec["text_model_of"]
    data = {"memfit_scenario": 1, "model": {"spec": spec}, "hardware": {"gpu": "l4"}}
    model = scenario_from_dict(data).model
    assert (model.read_as, model.text_model_of) == ("", "")
    assert count_parameters(model).total == PUBLISHED["mistral"].count


def test_the_cli_reads_as_a_look_alike_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_look_alike()))
    out = io.StringIO()
    argv = ["estimate", "--model-config", str(path), "--gpu", "h100-sxm-80gb"]
    assert main(argv, out=out) == 2
    saved = tmp_path / "s.memfit.json"
    assert main([*argv, "--read-as", "mistral", "--save", str(saved)], out=out) == 0
    assert "read as mistral (look-alike of mistral_fork)" in out.getvalue()
    assert load_scenario(saved).model.read_as == "mistral"
    assert main(["estimate", "--model", "gpt2", "--gpu", "l4", "--read-as", "llama"]) == 2


# -- refused families -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model_type", "why"),
    [
        ("jamba", "hybrid or state-space"),
        ("mamba", "hybrid or state-space"),
        ("falcon_mamba", "hybrid or state-space"),
        ("zamba", "hybrid or state-space"),
        ("recurrent_gemma", "hybrid or state-space"),
        ("t5", "encoder-decoder"),
        ("mt5", "encoder-decoder"),
        ("bart", "encoder-decoder"),
    ],
)
def test_families_the_engine_cannot_count_are_refused(model_type: str, why: str) -> None:
    cfg = {**config("llama"), "model_type": model_type}
    with pytest.raises(EstimateError) as info:
        model_from_hf_config(cfg)
    assert info.value.field == "model.model_type"
    assert f"'{model_type}' is not supported" in str(info.value)
    assert why in str(info.value)
    assert model_type in REFUSED


def test_stablelm_with_per_head_norms_is_refused() -> None:
    with pytest.raises(EstimateError) as info:
        model_from_hf_config({**config("stablelm"), "qk_layernorm": True})
    assert info.value.field == "model.qk_layernorm"


def test_dense_layers_between_moe_layers_are_refused() -> None:
    with pytest.raises(EstimateError) as info:
        model_from_hf_config({**config("deepseek_v3"), "moe_layer_freq": 2})
    assert info.value.field == "model.moe_layer_freq"
    with pytest.raises(EstimateError) as info:
        model_from_hf_config({**config("qwen2_moe"), "mlp_only_layers": [3, 7]})
    assert info.value.field == "model.mlp_only_layers"
    with pytest.raises(EstimateError) as info:
        model_from_hf_config({**config("qwen3_moe"), "decoder_sparse_step": 2})
    assert info.value.field == "model.decoder_sparse_step"
    # a run of dense layers first is what the engine models
    spec = model_from_hf_config({**config("qwen3_moe"), "mlp_only_layers": [0, 1]})
    assert spec.first_dense_layers == 2


def test_bert_with_relative_positions_is_refused() -> None:
    with pytest.raises(EstimateError) as info:
        model_from_hf_config({**config("bert"), "position_embedding_type": "relative_key"})
    assert info.value.field == "model.position_embedding_type"


def test_falcon2_has_one_norm_per_block() -> None:
    cfg = {
        **config("falcon"),
        "new_decoder_architecture": True,
        "num_kv_heads": 8,
        "num_attention_heads": 32,
        "hidden_size": 4096,
        "num_ln_in_parallel_attn": 1,
    }
    assert model_from_hf_config(cfg).norms_per_layer == 1
    del cfg["num_ln_in_parallel_attn"]
    assert model_from_hf_config(cfg).norms_per_layer == 2


# -- multimodal configs ---------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llava", "qwen2_vl", "paligemma", "gemma3"])
def test_a_multimodal_config_is_read_as_its_text_model(family: str) -> None:
    spec = model_from_hf_config(config(family))
    assert spec.text_model_of == family
    assert spec.read_as == ""
    est = estimate(Scenario(spec, HardwareSpec(load_gpu("h100-sxm-80gb"))))
    assert any(
        n.startswith(f"the vision tower and projector of {family}") for n in est.not_modelled
    )
    assert f"the text model of {family} (its vision tower is not counted)" in format_table(est)
    assert f"the text model of {family}" in to_markdown(est)


def test_the_text_models_count_as_their_families() -> None:
    # LLaVA-1.5-7B's text model is Llama 2 7B (6,738,415,616 as published for the preset)
    # with 64 rows more for the image tokens, in the embedding and in the untied head; its
    # text_config gives only what differs from LlamaConfig's defaults
    llava = model_from_hf_config(config("llava"))
    llama_2 = load_model("llama-2-7b")
    rows = (32_064 - llama_2.vocab_size) * llama_2.hidden_size
    assert count_parameters(llava).total == 6_738_415_616 + 2 * rows
    assert (llava.family, llava.num_layers, llava.intermediate_size) == ("llama", 32, 11_008)

    # Qwen2-VL-7B's language model has Qwen2.5-7B's shapes
    qwen2_vl = model_from_hf_config(config("qwen2_vl"))
    assert count_parameters(qwen2_vl).total == PUBLISHED["qwen2"].count

    # PaliGemma-3B's is Gemma 2B (2,506,172,416: keras-hub gemma_2b_en) with 257,216 rows
    pali = model_from_hf_config(config("paligemma"))
    gemma_2b = load_model("gemma-2b")
    extra = (257_216 - gemma_2b.vocab_size) * gemma_2b.hidden_size  # tied: one table
    assert count_parameters(pali).total == 2_506_172_416 + extra

    gemma3 = model_from_hf_config(config("gemma3"))
    assert (gemma3.num_attention_heads, gemma3.num_key_value_heads, gemma3.head_dim) == (8, 4, 256)
    assert gemma3.vocab_size == 262_208  # Gemma3TextConfig's defaults fill the rest


def test_multimodal_configs_name_the_nested_key() -> None:
    cfg = copy.deepcopy(config("gemma3"))
    cfg["text_config"]["hidden_size"] = "2560"
    with pytest.raises(EstimateError) as info:
        model_from_hf_config(cfg)
    assert info.value.field == "model.text_config.hidden_size"

    cfg["text_config"] = {**cfg["text_config"], "hidden_size": 2560, "model_type": "weird_text"}
    with pytest.raises(EstimateError) as info:
        model_from_hf_config(cfg)
    assert info.value.field == "model.text_config.model_type"
    assert "read_as" in str(info.value)

    with pytest.raises(EstimateError) as info:
        model_from_hf_config({"model_type": "llava", "vision_config": {}})
    assert info.value.field == "model.text_config"

    with pytest.raises(EstimateError) as info:
        model_from_hf_config({"model_type": "idefics3", "text_config": {"vocab_size": "5"}})
    assert info.value.field == "model.text_config.vocab_size"

    # an unknown text model has no defaults to fall back on: the first key read is missing
    cfg = {"model_type": "gemma3", "text_config": {"model_type": "fork", "hidden_size": 64}}
    with pytest.raises(EstimateError) as info:
        model_from_hf_config(cfg, read_as="gemma3_text")
    assert info.value.field == "model.text_config.num_attention_heads"
    assert "missing" in info.value.detail


def test_a_multimodal_model_that_cannot_be_counted_is_refused() -> None:
    cfg = {
        "model_type": "mllama",
        "text_config": {**config("llama"), "model_type": "mllama_text_model"},
    }
    with pytest.raises(EstimateError) as info:
        model_from_hf_config(cfg)
    assert info.value.field == "model.model_type"
    assert "cross-attention" in str(info.value)


def test_multimodal_wrappers_name_their_text_family() -> None:
    for outer, inner in MULTIMODAL.items():
        assert inner in READERS, outer


# -- malformed input names its key ----------------------------------------------------------

SIZE_KEYS = (
    "num_hidden_layers", "n_layer", "hidden_size", "n_embd", "num_attention_heads", "n_head",
    "num_key_value_heads", "head_dim", "intermediate_size", "n_inner", "vocab_size",
    "max_position_embeddings", "n_positions", "num_experts", "num_local_experts",
    "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
    "shared_expert_intermediate_size", "n_shared_experts", "first_k_dense_replace",
    "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
    "type_vocab_size", "sliding_window",
)  # fmt: skip


def _where(cfg: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The object holding the text model's keys, and the prefix errors name them by."""
    if isinstance(cfg.get("text_config"), dict):
        return cfg["text_config"], "model.text_config."
    return cfg, "model."


@pytest.mark.parametrize("family", ALL_FIXTURES)
@pytest.mark.parametrize("bad", ["32", -3, 2.0, True, [8]])
def test_a_bad_size_names_its_key_or_is_a_key_the_family_ignores(family: str, bad: Any) -> None:
    """A string, a negative number, a float or a bool where a size belongs is an error
    naming the key; a key the family does not read changes nothing."""
    good = model_from_hf_config(config(family))
    checked = 0
    for key in SIZE_KEYS:
        cfg = copy.deepcopy(config(family))
        obj, prefix = _where(cfg)
        if not isinstance(obj.get(key), int):
            continue
        obj[key] = bad
        try:
            spec = model_from_hf_config(cfg)
        except EstimateError as exc:
            assert exc.field == prefix + key, (family, key, bad, str(exc))
            checked += 1
        else:
            assert spec == good, (family, key, bad)
    assert checked >= 2, family


REQUIRED = {
    "llama": "num_hidden_layers",
    "mixtral": "num_local_experts",
    "qwen2_moe": "moe_intermediate_size",
    "qwen3_moe": "num_experts",
    "phimoe": "num_experts_per_tok",
    "gpt2": "n_embd",
    "gpt_bigcode": "n_positions",
    "gptj": "n_head",
    "falcon": "vocab_size",
    "bloom": "n_layer",
    "deepseek_v3": "kv_lora_rank",
    "deepseek_v2": "qk_rope_head_dim",
    "olmoe": "num_experts",
    "granitemoe": "num_local_experts",
    "bert": "intermediate_size",
}


@pytest.mark.parametrize(("family", "key"), sorted(REQUIRED.items()))
def test_a_missing_required_key_is_named(family: str, key: str) -> None:
    cfg = copy.deepcopy(config(family))
    obj, prefix = _where(cfg)
    del obj[key]
    with pytest.raises(EstimateError) as info:
        model_from_hf_config(cfg)
    assert info.value.field == prefix + key
    assert "missing" in info.value.detail


def test_a_nested_text_config_falls_back_on_its_familys_defaults() -> None:
    """transformers saves a text_config with only the values that differ from its
    configuration class's; a top-level config has no such fallback."""
    cfg = copy.deepcopy(config("paligemma"))
    del cfg["text_config"]["vocab_size"]
    assert model_from_hf_config(cfg).vocab_size == 256_000  # GemmaConfig's
    # a key saved as null is not a default: Mistral's sliding window is off
    llava_next = {"model_type": "llava_next", "text_config": {"model_type": "mistral"}}
    assert model_from_hf_config(llava_next).sliding_window == 4096
    llava_next["text_config"]["sliding_window"] = None
    assert model_from_hf_config(llava_next).sliding_window == 0
    top = {**config("gemma"), "model_type": "gemma"}
    del top["vocab_size"]
    with pytest.raises(EstimateError) as info:
        model_from_hf_config(top)
    assert info.value.field == "model.vocab_size"


def test_hostile_values_elsewhere_name_their_key() -> None:
    for family, key, value in (
        ("gpt2", "activation_function", "swishy"),
        ("llama", "tie_word_embeddings", "false"),
        ("starcoder2", "use_bias", "yes"),
        ("phimoe", "lm_head_bias", 1),
        ("qwen2_moe", "mlp_only_layers", "0,1"),
        ("gptj", "n_inner", -1),
        ("gpt2", "n_head", 7),  # not a divisor of n_embd 768
        ("llama", "_name_or_path", "a\x1b[2J"),
    ):
        with pytest.raises(EstimateError) as info:
            model_from_hf_config({**config(family), key: value})
        assert info.value.field == f"model.{key}", (family, key)
    for bad in (None, [], "llama", 3):
        with pytest.raises(EstimateError) as info:
            model_from_hf_config(bad)  # type: ignore[arg-type]
        assert info.value.field == "model"


@pytest.mark.parametrize(
    ("family", "own", "mapped"),
    [
        ("qwen3_moe", "num_experts", "num_local_experts"),  # transformers 5 saves the second
        ("mixtral", "num_local_experts", "num_experts"),
        ("olmoe", "num_experts", "num_local_experts"),
        ("deepseek_v3", "n_routed_experts", "num_local_experts"),
    ],
)
def test_the_expert_count_is_read_under_the_name_the_config_class_maps_it_to(
    family: str, own: str, mapped: str
) -> None:
    """A config class's ``attribute_map`` saves some fields under another name: transformers
    5's ``Qwen3MoeConfig`` writes ``num_local_experts`` where earlier releases wrote
    ``num_experts``. Either name gives the same model; a missing count names the family's
    own key."""
    cfg = copy.deepcopy(config(family))
    obj, _ = _where(cfg)
    want = model_from_hf_config(cfg)
    obj[mapped] = obj.pop(own)
    assert model_from_hf_config(cfg) == want


@pytest.mark.parametrize(
    ("hidden_act", "kind"),
    [
        ("quick_gelu", "quick_gelu"),  # x * sigmoid(1.702 x): refused before
        ("gelu_accurate", "gelu_new"),  # NewGELU's formula, op for op
        ("gelu_python_tanh", "gelu_new"),
        ("gelu_pytorch_tanh", "gelu_tanh"),  # one fused op
        ("gelu_fast", "gelu_fast"),
    ],
)
def test_transformers_python_op_activations_are_read_as_their_ops(
    hidden_act: str, kind: str
) -> None:
    """transformers writes several activations as Python ops, each keeping its tensors:
    they are read as the op sequences that run, not as a fused GELU."""
    cfg = copy.deepcopy(config("llama"))
    obj, _ = _where(cfg)
    obj["hidden_act"] = hidden_act
    assert model_from_hf_config(cfg).activation == kind


def test_gemmas_global_layers_are_read_from_the_layer_types() -> None:
    """Gemma-2 alternates sliding and global layers, Gemma-3 has five sliding to one
    global: from ``layer_types`` where the config lists them, else
    ``sliding_window_pattern``, else the family's; a pattern that is not every n-th layer
    is refused, naming the key."""
    g3 = config("gemma3_text")
    assert model_from_hf_config(g3).full_attention_every == 6
    assert model_from_hf_config(config("gemma2")).full_attention_every == 2
    layers = g3["num_hidden_layers"]
    every_fourth = [
        "full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(layers)
    ]
    assert model_from_hf_config({**g3, "layer_types": every_fourth}).full_attention_every == 4
    assert model_from_hf_config({**g3, "sliding_window_pattern": 3}).full_attention_every == 3
    odd = ["full_attention", *["sliding_attention"] * (layers - 1)]
    with pytest.raises(EstimateError) as info:
        model_from_hf_config({**g3, "layer_types": odd})
    assert info.value.field == "model.layer_types"

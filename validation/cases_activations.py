"""Model mechanisms written in the families' own modelling code, traced.

    python -m validation.cases_activations     # -> tests/validation/dataset_activations.json

* Activations written as Python ops: transformers' ``FastGELUActivation`` (``gelu_fast``,
  SantaCoder's ``gpt_bigcode``) against the fused ``gelu_pytorch_tanh`` on the same model.
  A ``gelu_fast`` MLP keeps its products' factors and tanh's output -- six more tensors of
  the MLP's width per layer than the fused kernel, which keeps its input
  (``engine.layers.Net.activation``).
* Falcon-7B's own eager attention (``FalconAttention`` without SDPA): scores scaled in
  place, softmax in the hidden states' dtype.
* Gemma-2-9B: the attention scores soft-capped (``cap * tanh(scores / cap)``, eager
  attention, transformers' default for it), with and without the cap; four norms a layer.
* OLMo-2-7B: RMSNorms on the whole q and k projections and on each sublayer's output.
* Qwen3-8B and Gemma-3-1B: RMSNorms over each head of q and k (``q_norm``, ``k_norm`` of
  width ``head_dim``), Gemma-3's in fp32 with its four norms a layer; Gemma-3-1B's six
  layers past its 512-token window, five sliding and one global.
* PEFT's LoRA on the output layer (``lm_head`` as a target) of Llama-3.2-1B (tied) and
  Llama-2-7B (untied), and the same steps without it.
* PEFT's ``modules_to_save`` (``lm_head``, ``embed_tokens``): a trained copy of the module
  in the base's dtype beside the frozen original, on the same two models.
* gpt-oss-20b's widths (two layers, 8 experts): its eager attention with the sinks joined to
  the scores as one more column, its router and experts with biases added after the
  grouped GEMM, their clamped SwiGLU; full fine-tuning and LoRA on the attention.
* Frozen layers whose input needs no gradient (only the head trained) under each eager
  attention -- transformers' own (Llama-2-7B), Falcon's, Gemma-2's capped scores,
  gpt-oss's sinks: autograd records nothing in them, and their scores live and go within
  the forward (``softmax(x, dtype=float32)`` holding ``x`` until the statement is done).
* Falcon-7B's eager attention under LoRA: its softmax in the norm output's dtype (fp32
  under autocast) though the frozen 16-bit base makes the residual stream 16-bit.
* GPT-2's and BERT's own eager attention: the softmax in the scores' dtype (16-bit in pure
  bf16), cast to the values' dtype by a statement of its own.
* PEFT's LoRA on transformers' fused MoE experts (Qwen3-30B-A3B's widths, ``all-linear``):
  the experts' 3-D parameters and the router wrapped as parameters (``ParamWrapper``), each
  made whole again as ``W + scaling B A`` for the forward; q/v alone for the step without
  it; transformers' grouped and eager experts.

Each under autocast and in pure bf16. Records as in ``dataset.json``
(:mod:`validation.measure`).
"""

from __future__ import annotations

import sys
from typing import Any

from validation.cases import model_config
from validation.measure import ROOT, measure_case, parse_args, run_cases

DEFAULT_OUT = ROOT / "tests" / "validation" / "dataset_activations.json"

#: SantaCoder's widths (bigcode/santacoder config.json: multi-query attention), two layers
SANTACODER = {
    "model_type": "gpt_bigcode",
    "architectures": ["GPTBigCodeForCausalLM"],
    "n_embd": 2048,
    "n_head": 16,
    "n_layer": 2,
    "n_inner": 8192,
    "n_positions": 2048,
    "vocab_size": 49280,
    "multi_query": True,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
    "layer_norm_epsilon": 1e-5,
    "scale_attn_weights": True,
    "_name_or_path": "santacoder-2-layers",
}


#: Falcon-7B's widths (tiiuae/falcon-7b config.json: one key/value head, parallel attention),
#: two layers
FALCON_7B = {
    "model_type": "falcon",
    "architectures": ["FalconForCausalLM"],
    "hidden_size": 4544,
    "num_attention_heads": 71,
    "num_hidden_layers": 2,
    "vocab_size": 65024,
    "multi_query": True,
    "new_decoder_architecture": False,
    "parallel_attn": True,
    "alibi": False,
    "bias": False,
    "layer_norm_epsilon": 1e-05,
    "attention_dropout": 0.0,
    "hidden_dropout": 0.0,
    "_name_or_path": "falcon-7b-2-layers",
}

#: Gemma-2-9B's widths (google/gemma-2-9b config.json: soft-capped attention scores and
#: logits, four norms a layer), two layers
GEMMA_2_9B = {
    "model_type": "gemma2",
    "architectures": ["Gemma2ForCausalLM"],
    "hidden_size": 3584,
    "intermediate_size": 14336,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "num_hidden_layers": 2,
    "vocab_size": 256000,
    "max_position_embeddings": 8192,
    "hidden_activation": "gelu_pytorch_tanh",
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "rms_norm_eps": 1e-06,
    "attention_dropout": 0.0,
    "_name_or_path": "gemma-2-9b-2-layers",
}

#: OLMo-2-7B's widths (allenai/OLMo-2-1124-7B config.json: RMSNorm on the whole q and k
#: projections, norms after the sublayers), two layers
OLMO_2_7B = {
    "model_type": "olmo2",
    "architectures": ["Olmo2ForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "num_hidden_layers": 2,
    "vocab_size": 100352,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-06,
    "rope_theta": 500000,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "_name_or_path": "olmo-2-7b-2-layers",
}


#: Qwen3-8B's widths (Qwen/Qwen3-8B config.json: an RMSNorm over each head of q and k),
#: two layers
QWEN3_8B = {
    "model_type": "qwen3",
    "architectures": ["Qwen3ForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "num_hidden_layers": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "_name_or_path": "qwen3-8b-2-layers",
}


#: Gemma-3-1B's widths (google/gemma-3-1b-pt config.json: per-head q and k norms, four
#: norms a layer, one key/value head of 256), two layers; a 512-token window, so a
#: sequence of 512 is unmasked
GEMMA_3_1B = {
    "model_type": "gemma3_text",
    "architectures": ["Gemma3ForCausalLM"],
    "hidden_size": 1152,
    "intermediate_size": 6912,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "num_hidden_layers": 2,
    "vocab_size": 262144,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000,
    "query_pre_attn_scalar": 256,
    "sliding_window": 512,
    "hidden_activation": "gelu_pytorch_tanh",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "tie_word_embeddings": True,
    "_name_or_path": "gemma-3-1b-2-layers",
}


#: Qwen3-30B-A3B's widths (Qwen/Qwen3-30B-A3B config.json: 128 experts of width 768, 8 a
#: token), two layers
QWEN3_30B_A3B = {
    "model_type": "qwen3_moe",
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_hidden_layers": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "output_router_logits": False,
    "_name_or_path": "qwen3-30b-a3b-2-layers",
}


#: gpt-oss-20b's widths (openai/gpt-oss-20b config.json: sinks, a 128-token window on every
#: other layer, biased attention, router and experts, the clamped SwiGLU), two layers and 8
#: of its 32 experts; its MXFP4 quantization_config left out (training dequantizes to bf16)
GPT_OSS_20B = {
    "model_type": "gpt_oss",
    "architectures": ["GptOssForCausalLM"],
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "layer_types": ["sliding_attention", "full_attention"],
    "sliding_window": 128,
    "vocab_size": 201088,
    "max_position_embeddings": 131072,
    "num_local_experts": 8,
    "num_experts_per_tok": 4,
    "experts_per_token": 4,
    "attention_bias": True,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "swiglu_limit": 7.0,
    "rms_norm_eps": 1e-05,
    "rope_theta": 150000,
    "rope_scaling": {
        "beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
        "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False,
    },
    "tie_word_embeddings": False,
    "output_router_logits": False,
    "_name_or_path": "gpt-oss-20b-2-layers",
}  # fmt: skip


def _scenario(
    model: dict[str, Any], precision: str, attention: str, batch: int, seq: int
) -> dict[str, Any]:
    return {
        "memfit_scenario": 1,
        "model": model,
        "hardware": {"gpu": "h100-sxm-80gb"},
        "training": {
            "method": "full",
            "precision": precision,
            "optimizer": "adamw",
            "optimizer_impl": "foreach",
            "micro_batch_size": batch,
            "sequence_length": seq,
            "attention": attention,
        },
    }


def all_cases() -> list[dict[str, Any]]:
    cases = []
    for act in ("gelu_fast", "gelu_pytorch_tanh"):
        for precision in ("bf16-mixed", "bf16"):
            scenario = _scenario(
                {**SANTACODER, "activation_function": act}, precision, "sdpa", 4, 1024
            )
            case_id = f"santacoder_L2_{precision}_full_adamw-foreach_sdpa_b4_s1024_{act}"
            cases.append({"id": case_id, "family": "gpt_bigcode", "scenario": scenario})
    # model mechanisms: Falcon's own eager attention, Gemma-2's soft-capped scores and
    # sandwich norms, OLMo-2's q/k norms and post-sublayer norms
    mechanisms = (
        ("falcon-7b", "falcon", FALCON_7B, ("eager",), 1, 2048),
        ("gemma-2-9b", "gemma2", GEMMA_2_9B, ("eager",), 1, 4096),
        ("olmo-2-7b", "olmo2", OLMO_2_7B, ("sdpa", "eager"), 4, 2048),
        ("qwen3-8b", "qwen3", QWEN3_8B, ("sdpa",), 2, 2048),
        ("gemma-3-1b", "gemma3_text", GEMMA_3_1B, ("sdpa",), 4, 512),
    )
    for name, family, model, attentions, batch, seq in mechanisms:
        for attention in attentions:
            for precision in ("bf16-mixed", "bf16"):
                scenario = _scenario(model, precision, attention, batch, seq)
                case_id = f"{name}_L2_{precision}_full_adamw-foreach_{attention}_b{batch}_s{seq}"
                cases.append({"id": case_id, "family": family, "scenario": scenario})
    # Gemma-3-1B's six layers past its window: five sliding-window layers, whose SDPA takes
    # the mask, and a global one, which runs causal and unmasked
    for precision in ("bf16-mixed", "bf16"):
        scenario = _scenario({**GEMMA_3_1B, "num_hidden_layers": 6}, precision, "sdpa", 1, 4096)
        case_id = f"gemma-3-1b_L6_{precision}_full_adamw-foreach_sdpa_b1_s4096"
        cases.append({"id": case_id, "family": "gemma3_text", "scenario": scenario})
    # the same Gemma-2 without soft-capped scores: what the capping itself keeps
    plain = _scenario({**GEMMA_2_9B, "attn_logit_softcapping": None}, "bf16", "eager", 1, 4096)
    case_id = "gemma-2-9b_L2_bf16_full_adamw-foreach_eager_b1_s4096_no-attn-softcap"
    cases.append({"id": case_id, "family": "gemma2", "scenario": plain})
    # PEFT's LoRA on the output layer (``lm_head`` named as a target), on a tied head
    # (Llama-3.2-1B) and an untied one (Llama-2-7B); and without it, for what it costs
    variants = (("bf16-mixed", True), ("bf16", True), ("bf16-mixed", False))
    for name in ("llama-3.2-1b", "llama-2-7b"):
        for precision, head in variants:
            scenario = _scenario(model_config(name, 2), precision, "sdpa", 4, 2048)
            targets = ["q_proj", "v_proj"] + (["lm_head"] if head else [])
            scenario["training"]["method"] = "lora"
            scenario["training"]["lora"] = {
                "rank": 16, "alpha": 32.0, "targets": targets, "dropout": 0.0,
            }  # fmt: skip
            case_id = (
                f"{name}_L2_{precision}_lora_r16-{'+'.join(targets)}_adamw-foreach_sdpa_b4_s2048"
            )
            cases.append({"id": case_id, "family": "llama", "scenario": scenario})
    # PEFT's modules_to_save: a trained copy of the LM head or of the embedding, on a tied
    # head (Llama-3.2-1B) and an untied one (Llama-2-7B)
    for name in ("llama-3.2-1b", "llama-2-7b"):
        for saved in (["lm_head"], ["embed_tokens"]):
            for precision in ("bf16-mixed", "bf16"):
                scenario = _scenario(model_config(name, 2), precision, "sdpa", 4, 2048)
                scenario["training"]["method"] = "lora"
                scenario["training"]["lora"] = {
                    "rank": 16, "alpha": 32.0, "targets": ["q_proj", "v_proj"], "dropout": 0.0,
                    "modules_to_save": saved,
                }  # fmt: skip
                case_id = (
                    f"{name}_L2_{precision}_lora_r16-q_proj+v_proj_save-{saved[0]}"
                    "_adamw-foreach_sdpa_b4_s2048"
                )
                cases.append({"id": case_id, "family": "llama", "scenario": scenario})
    # PEFT's LoRA on transformers' fused experts (all-linear: the experts' 3-D parameters
    # and the router wrapped as parameters), and q/v alone for the step without it; both
    # experts implementations
    for targets in (["all-linear"], ["q_proj", "v_proj"]):
        for precision in ("bf16", "bf16-mixed"):
            for moe in ("grouped", "eager"):
                scenario = _scenario(QWEN3_30B_A3B, precision, "sdpa", 1, 2048)
                scenario["training"]["method"] = "lora"
                scenario["training"]["moe_implementation"] = moe
                scenario["training"]["lora"] = {
                    "rank": 16, "alpha": 32.0, "targets": targets, "dropout": 0.0,
                }  # fmt: skip
                case_id = (
                    f"qwen3-30b-a3b_L2_{precision}_lora_r16-{'+'.join(targets)}"
                    f"_adamw-foreach_sdpa_b1_s2048_moe-{moe}"
                )
                cases.append({"id": case_id, "family": "qwen3_moe", "scenario": scenario})
    # gpt-oss: eager attention with its sinks (the only kind that trains them), the biased
    # grouped experts and their clamped SwiGLU; full fine-tuning and LoRA on the attention
    for method in ("full", "lora"):
        for precision in ("bf16-mixed", "bf16"):
            scenario = _scenario(GPT_OSS_20B, precision, "eager", 1, 4096)
            scenario["training"]["method"] = method
            adapter = ""
            if method == "lora":
                scenario["training"]["lora"] = {
                    "rank": 16, "alpha": 32.0, "targets": ["all-linear"], "dropout": 0.0,
                }  # fmt: skip
                adapter = "_r16-all-linear"
            case_id = f"gpt-oss-20b_L2_{precision}_{method}{adapter}_adamw-foreach_eager_b1_s4096"
            cases.append({"id": case_id, "family": "gpt_oss", "scenario": scenario})
    # frozen layers whose input needs no gradient, under each eager attention
    # (transformers' own, Falcon's, Gemma-2's capped scores, gpt-oss's sinks): only the
    # head trained, autograd records nothing in the layers, whose scores live and go
    # within the forward
    frozen = (
        ("llama-2-7b", "llama", model_config("llama-2-7b", 2), 2, 2048),
        ("falcon-7b", "falcon", FALCON_7B, 1, 2048),
        ("gemma-2-9b", "gemma2", GEMMA_2_9B, 1, 4096),
        ("gpt-oss-20b", "gpt_oss", GPT_OSS_20B, 1, 4096),
    )
    for name, family, model, batch, seq in frozen:
        for precision in ("bf16-mixed", "bf16"):
            scenario = _scenario(model, precision, "eager", batch, seq)
            scenario["training"]["method"] = "freeze"
            scenario["training"]["freeze"] = {"trainable": ["lm_head"], "last_layers": 0}
            case_id = f"{name}_L2_{precision}_freeze_lm_head_adamw-foreach_eager_b{batch}_s{seq}"
            cases.append({"id": case_id, "family": family, "scenario": scenario})
    # Falcon's eager softmax under LoRA: its dtype is the norm's output's (fp32 under
    # autocast), though the frozen 16-bit base makes the residual stream 16-bit
    for precision in ("bf16-mixed", "bf16"):
        scenario = _scenario(FALCON_7B, precision, "eager", 1, 2048)
        scenario["training"]["method"] = "lora"
        scenario["training"]["lora"] = {
            "rank": 16, "alpha": 32.0, "targets": ["q_proj", "v_proj"], "dropout": 0.0,
        }  # fmt: skip
        case_id = f"falcon-7b_L2_{precision}_lora_r16-q_proj+v_proj_adamw-foreach_eager_b1_s2048"
        cases.append({"id": case_id, "family": "falcon", "scenario": scenario})
    # the same under full checkpointing: Falcon's layers return their attention weights,
    # alive until the next layer returns, and the checkpointed forward saves nothing
    scenario = _scenario(FALCON_7B, "bf16-mixed", "eager", 2, 2048)
    scenario["training"]["method"] = "lora"
    scenario["training"]["activation_checkpointing"] = "full"
    scenario["training"]["lora"] = {
        "rank": 16, "alpha": 32.0, "targets": ["q_proj", "v_proj"], "dropout": 0.0,
    }  # fmt: skip
    case_id = "falcon-7b_L2_bf16-mixed_lora_r16-q_proj+v_proj_adamw-foreach_eager_b2_s2048_ckpt"
    cases.append({"id": case_id, "family": "falcon", "scenario": scenario})
    # GPT-2's and BERT's own eager attention: the softmax in the scores' dtype (16-bit in
    # pure bf16, where transformers' shared one runs it in fp32 and casts back)
    for name, family, batch in (("gpt2-xl", "gpt2", 4), ("bert-large-uncased", "bert", 8)):
        for precision in ("bf16", "bf16-mixed"):
            scenario = _scenario(model_config(name, 2), precision, "eager", batch, 512)
            case_id = f"{name}_L2_{precision}_full_adamw-foreach_eager_b{batch}_s512"
            cases.append({"id": case_id, "family": family, "scenario": scenario})
    return cases


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__, DEFAULT_OUT)
    sys.path.insert(0, str(ROOT))
    return run_cases(all_cases(), measure_case, args, 8, lambda rec: rec["id"])


if __name__ == "__main__":
    raise SystemExit(main())

"""What each input of the left column means, in words, for its tooltip.

:data:`TIPS` maps a row's scenario path (``training.micro_batch_size``) to one to three
sentences: what the knob is and what it changes in memory. The form appends the accepted
range of a number box (:func:`with_range`), so a tooltip reads "what it is, what it
changes, then the range". :data:`WIDGET_TIPS` holds the inputs that are not rows (the
preset search and filters), :data:`TARGET_TIPS` the LoRA target boxes.

The texts follow what the engine models (``engine/``): change a formula there, check its
words here.
"""

from __future__ import annotations

from memfit.engine.specs import PARALLEL_AXES
from memfit.engine.stacks import CONVENTION_FIELDS

TIPS: dict[str, str] = {
    # -- model --------------------------------------------------------------------------
    "model.num_layers": "Transformer blocks. Weights, gradients, optimizer states and "
    "activations all grow with the number of layers.",
    "model.hidden_size": "Width of the hidden states. Weights grow with its square, "
    "activations linearly (per token).",
    "model.num_attention_heads": "Query heads per attention layer. The eager attention "
    "kernel keeps one s x s score matrix per head; flash attention does not.",
    "model.num_key_value_heads": "Key/value heads: equal to the attention heads for MHA, "
    "fewer for GQA, 1 for MQA; fewer heads mean smaller K/V projections and activations. "
    "Must divide the attention heads.",
    "model.head_dim": "Width of one attention head; with the heads it sets the size of the "
    "Q, K and V projections.",
    "model.intermediate_size": "Width of a dense MLP's hidden layer (0 for a model whose "
    "layers are all experts). Its activations are often the largest of a layer.",
    "model.vocab_size": "Tokens in the vocabulary. It sizes the embedding, the LM head and "
    "the logits (micro-batch x sequence x vocabulary), often the largest single block.",
    "model.num_experts": "Routed experts per MoE layer (0 for a dense model). Every expert "
    "has weights and optimizer states; only the chosen ones see each token.",
    "model.num_experts_per_tok": "Experts each token is routed to (top-k): expert "
    "activations grow with it, expert weights do not.",
    "model.moe_intermediate_size": "Width of one expert's MLP hidden layer.",
    "model.tie_word_embeddings": "The LM head shares the embedding matrix: one matrix of "
    "vocabulary x hidden weights (and its gradients and states) instead of two.",
    # -- hardware -----------------------------------------------------------------------
    "hardware.gpu": "The GPU model. Its memory is what nvidia-smi (or the vendor's tool) "
    "reports, so an '80 GB' card shows 79.6 GiB; Custom GPU has no preset, give its "
    "memory under More hardware.",
    "hardware.gpus_per_node": "GPUs in one machine. With the nodes it is the GPU count the "
    "parallel sizes must divide and that ZeRO / FSDP shards over.",
    "hardware.nodes": "Machines in the run. More GPUs let ZeRO / FSDP split the model state "
    "into smaller shards; activations per GPU do not shrink.",
    "hardware.memory_gib": "Device memory in GiB (2^30 bytes), for a card the presets do "
    "not describe (a MIG slice, another memory size). 0 keeps the preset's memory.",
    "model.display_name": "What the chart, its caption, exports and the saved scenario call "
    "the model. An import fills it from the config's name or its folder's; empty gives the "
    "model its own name back.",
    "hardware.gpu_name": "What the chart, its caption, exports and the saved scenario call "
    "this GPU, e.g. a custom one or one with its memory overridden. Empty gives it its "
    "own name back.",
    "hardware.host_memory_gib": "Host RAM of one node in GiB (2^30 bytes), to check that "
    "offloaded optimizer states, gradients or parameters fit there. 0 skips the check.",
    "hardware.utilization_target": "The budget line: the share of the capacity a plan "
    "should stay under, since real runs vary and the last few percent go to "
    "fragmentation. Under the line reads 'fits', above it 'tight'.",
    "hardware.price_per_gpu_hour": "What one GPU-hour of this GPU costs you, in your "
    "currency, for the cost of a run and per million tokens (Tradeoffs); no effect on "
    "memory. 0 takes the GPU preset's price.",
    "hardware.cuda_runtime": "What the CUDA context takes beyond PyTorch's pool (what "
    "nvidia-smi shows and torch.cuda.memory_reserved does not): CUDA 12 loads kernels "
    "lazily, when first used; eager loading (CUDA 11, CUDA_MODULE_LOADING=EAGER) loads "
    "every kernel of the libraries at start.",
    "hardware.architecture": "A custom GPU's architecture: it picks the share of peak that "
    "matmuls and attention reach, and the CUDA context's size. Not given: generic figures.",
    "hardware.bf16_tflops": "A custom GPU's dense BF16 peak (no sparsity), TFLOP/s; FP16 "
    "follows it and FP8 and FP32 scale with it. 0: not given, an H100 SXM's is assumed "
    "and the step time says so.",
    "hardware.memory_bandwidth_gb_s": "A custom GPU's memory bandwidth, GB/s. 0: not given, "
    "an H100 SXM's is assumed and the step time says so.",
    "hardware.tdp_w": "A custom GPU's thermal design power, W: what a power limit is taken "
    "against. 0: not known.",
    "hardware.power_limit_w": "The board's power cap (nvidia-smi -pl), W. Below the TDP the "
    "SM clock drops with the cube root of the power left to it: matmuls slow down, "
    "memory-bound work does not. 0: the stock board.",
    "hardware.clock_share": "The sustained SM clock as a share of the stock board's, when "
    "you know it rather than the power limit. Compute slows with it; memory bandwidth "
    "does not. 0: the stock board.",
    # -- training -----------------------------------------------------------------------
    "training.method": "What trains. Full fine-tuning keeps gradients and optimizer states "
    "for every weight; LoRA trains small adapters on a frozen 16-bit base; QLoRA's base "
    "is 4-bit NF4; Freeze trains only the parts you pick.",
    "training.precision": "How weights and activations are stored. Mixed precision keeps "
    "fp32 weights and gradients and computes in 16 (or 8) bits, caching a 16-bit copy of "
    "each weight; pure bf16 keeps weights, gradients and states in bf16.",
    "training.micro_batch_size": "Sequences one GPU runs through one forward and backward "
    "pass. Activations and logits grow in proportion to it.",
    "training.sequence_length": "Tokens per sequence. Activations grow with it (the eager "
    "kernel's attention scores with its square).",
    "training.activation_checkpointing": "What the forward keeps for backward. none keeps "
    "every activation; selective recomputes only attention's scores, softmax and dropout "
    "(or the stack's own policy); full keeps only each layer's input and recomputes the "
    "layer, about a third more compute; per-op (torchtitan) saves every other matmul and "
    "attention.",
    "training.checkpoint_every_k": "Which layers are checkpointed: every k layers "
    "checkpoints layers 0, k, 2k, ...; first k layers checkpoints the first k layers of "
    "each pipeline stage (Megatron's block method).",
    "training.lora.rank": "LoRA rank r: each adapted layer gets r x (in + out) trainable "
    "parameters, with their gradients, optimizer states and activations.",
    "training.lora.alpha": "LoRA's scaling (alpha / r of the adapter output); it changes "
    "training, not memory.",
    "training.lora.targets": "Linear layers that get adapters; all-linear wraps every one "
    "but the output layer. More targets, more adapter weights and activations.",
    "training.qlora.double_quant": "Quantize the 4-bit base's absmax constants too: 0.127 "
    "instead of 0.5 bit per parameter of overhead.",
    "training.freeze.trainable": "The parts that train under Freeze; every other weight is "
    "frozen and needs no gradient or optimizer state.",
    "training.freeze.last_layers": "Also train the last N whole layers (with gradients and "
    "optimizer states for them).",
    "training.stack": "The loop that runs the step. Its conventions fill those the scenario "
    "leaves to it; choosing it sets its loss and optimizer implementation.",
    "training.optimizer": "The optimizer's state per trainable weight: AdamW keeps two "
    "moments (8 B per fp32 weight), 8-bit AdamW about 2 B, SGD none, SGD + momentum and "
    "Lion one, Adafactor factored moments.",
    "training.optimizer_impl": "How torch.optim runs the step: foreach allocates a "
    "full-size temporary, fused none, for-loop the size of the largest weight.",
    "training.gradient_accumulation_steps": "Micro-batches per optimizer step. Gradients "
    "add up in place, so memory stays about the same while the global batch grows; with "
    "pipeline parallel it is the micro-batches the schedule runs.",
    "training.optimizer_in_backward": "Step each weight as soon as its gradient is ready "
    "and free the gradient (torchtune's optimizer_in_bwd): no full gradient buffer. Needs "
    "gradient accumulation 1.",
    "training.attention": "The attention kernel: eager keeps the s x s scores and softmax "
    "per head; SDPA, flash and memory-efficient keep only the output and its logsumexp. "
    "SDPA runs flash for 16-bit compute, memory-efficient for fp32.",
    "training.torch_compile": "The model runs under torch.compile (inductor): the "
    "element-wise ops between the matmuls and the attention fuse into fewer kernels, which "
    "read and write less, and AOTAutograd's partitioner keeps fewer tensors for backward "
    "(it recomputes element-wise values from the ones it keeps). Changes step time and "
    "activation memory.",
    "training.lora.modules_to_save": "PEFT's modules_to_save: a full trainable copy of the LM "
    "head or the embeddings beside the adapters (the original stays frozen), its weights, "
    "gradients and optimizer states in the base's dtype.",
    "training.fp8_recipe": "How the FP8 GEMMs scale their inputs (FP8 precision only). Per "
    "tensor: casts fused into the ops that produce the inputs (Transformer Engine). Per row "
    "or per block: each operand quantized twice by kernels of its own, and a slightly "
    "slower GEMM. MXFP8 needs Blackwell. Changes step time only.",
    "training.moe_implementation": "How the experts run (MoE models): grouped GEMMs over "
    "the tokens sorted by expert, or transformers' eager loop over the experts one by "
    "one, which keeps each expert's inputs separately.",
    "training.token_budget": "Tokens the whole run trains on, for its time, GPU-hours and "
    "cost (Tradeoffs); no effect on memory. Type a plain number or one with a suffix: "
    "1000000000, 1e9, 10B, 500M, 2T. 0 leaves them out.",
    # -- conventions: engine.stacks.CONVENTION_FIELDS (the stack's words are added) -------
    **{f"training.{f.key}": f.tip for f in CONVENTION_FIELDS if f.tip},
    "training.loss": "How the loss is computed from the last hidden states: the full "
    "logits upcast to fp32 (transformers), in chunks that never hold all the logits "
    "(Liger, Unsloth), on the 16-bit logits (LitGPT, plain loops), or the LM head and the "
    "loss per chunk with every chunk's logits kept (torchtune).",
    "training.loss_chunks": "Chunks of the sequence the LM head and the loss run in, one at "
    "a time (logits per chunk only).",
    # -- parallelism and offload ---------------------------------------------------------
    # -- the parallel axes: engine.specs.PARALLEL_AXES ---------------------------------------
    **{f"training.parallelism.{a.key}": f"{a.label}: {a.help}" for a in PARALLEL_AXES},
    "training.parallelism.framework": "How the framework lays out mixed-precision state: "
    "PyTorch keeps fp32 weights and gradients; DeepSpeed 16-bit weights and gradients "
    "plus an fp32 master copy; Megatron 16-bit weights and an fp32 gradient buffer.",
    "training.parallelism.zero_stage": "Shard the model state over the data-parallel GPUs "
    "(Rajbhandari et al. 2020): stage 1 the optimizer states, stage 2 also the gradients, "
    "stage 3 also the weights, gathered one layer at a time.",
    "training.parallelism.hybrid_shard": "FSDP HYBRID_SHARD: shard within a node and "
    "replicate across nodes; shards are as large as on one node, with less traffic "
    "between nodes.",
    "training.parallelism.sequence_parallel": "Split the norm and dropout activations, "
    "which tensor parallel leaves whole, over the tensor-parallel ranks too (Korthikanti "
    "et al. 2022).",
    "training.parallelism.tp_comm_overlap": "Overlap the tensor-parallel all-gathers and "
    "reduce-scatters with the GEMMs beside them (Megatron --tp-comm-overlap with Transformer "
    "Engine userbuffers; torchtitan async TP). Needs sequence parallel. Changes step time only.",
    "training.parallelism.pp_schedule": "Pipeline schedule: how many micro-batches each "
    "stage holds at once. GPipe runs all forwards first (all in flight); 1F1B at most pp "
    "on the first stage (Narayanan et al. 2021).",
    "training.parallelism.pp_split": "How the layers split over the pipeline stages: even "
    "counts; balanced counts the embedding and the head as a layer each and allows an "
    "uneven split (torchtitan's default).",
    "training.parallelism.vpp": "Model chunks per pipeline rank (interleaved 1F1B): a "
    "smaller bubble for more micro-batches in flight. pp x vpp must divide the layers.",
    "training.parallelism.expert_capacity_factor": "Tokens the busiest expert rank "
    "receives, relative to a balanced router (1.0): its expert activations grow with it.",
    "training.offload.optimizer": "ZeRO-Offload: the optimizer states and gradients live "
    "in host memory (or on NVMe) and the step runs on the CPU, freeing their GPU memory.",
    "training.offload.parameters": "ZeRO-Infinity: the parameter shards live off the GPU "
    "and only the layer being computed is gathered onto it. Needs ZeRO-3.",
    "training.offload.activations": "Keep the inputs of checkpointed layers in pinned host "
    "memory instead of on the GPU. Needs full or every-k-layers checkpointing.",
}

#: inputs that are not rows: the preset search and its filters
WIDGET_TIPS: dict[str, str] = {
    "search": "Filter the model presets by words of their name or family (e.g. llama 8b).",
    "family": "Show only the presets of one model family.",
    "size": "Show only the presets of a parameter count.",
    "preset": "The model preset: choosing one fills the architecture below; an edited "
    "architecture shows as (edited).",
}

#: what each LoRA target box adapts
TARGET_TIPS: dict[str, str] = {
    "q_proj": "Adapters on the query projection of attention.",
    "k_proj": "Adapters on the key projection of attention.",
    "v_proj": "Adapters on the value projection of attention.",
    "o_proj": "Adapters on the output projection of attention.",
    "gate_proj": "Adapters on the gate projection of the gated MLP.",
    "up_proj": "Adapters on the up projection of the MLP.",
    "down_proj": "Adapters on the down projection of the MLP.",
    "all-linear": "Adapters on every linear layer but the output layer; the other boxes follow it.",
    "q_a_proj": "Adapters on the query down-projection of latent attention (DeepSeek).",
    "q_b_proj": "Adapters on the query up-projection of latent attention (DeepSeek).",
    "kv_a_proj": "Adapters on the key/value down-projection of latent attention (DeepSeek).",
    "kv_b_proj": "Adapters on the key/value up-projection of latent attention (DeepSeek).",
    "lm_head": "Adapters on the output layer (the LM head, tied or not); all-linear leaves "
    "it out. Its B is vocabulary x rank, and its product is as large as the logits.",
}


def with_range(words: str, accepted: str) -> str:
    """``words`` then, on a line of its own, ``Accepted: <accepted>.``"""
    return f"{words}\nAccepted: {accepted}." if accepted else words

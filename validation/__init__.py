"""Ground truth for MemFit: measured peak memory of real PyTorch training steps.

``tracker`` counts live tensor storages as the CUDA caching allocator does; ``fakecuda`` and
``sdpa`` let a CPU-only PyTorch run a training step on fake CUDA tensors; ``step`` builds a
Hugging Face model from a MemFit scenario and measures one step; ``cases`` lists the
scenarios; ``measure`` runs them and writes ``tests/validation/dataset.json``.
``deepspeed_estimates`` records DeepSpeed's ZeRO model-state estimates for comparison.
Nothing here is imported by the engine or the app.
"""

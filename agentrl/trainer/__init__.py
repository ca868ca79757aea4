"""The Megatron trainer: model-parallel set-up, Hugging Face conversion, vocab-parallel log-probs.

Submodules are imported explicitly (``from agentrl.trainer.hf_convert import ...``): importing
megatron-core takes seconds, so this package imports nothing on its own. What the training loop
needs from a trainer is :class:`agentrl.trainer.protocol.Trainer` (light to import).
"""

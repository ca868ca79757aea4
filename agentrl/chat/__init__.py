"""Chat templates and token-exact rendering of multi-turn conversations.

An RL sample is one token sequence: the prompt, then alternating model turns (the exact ids the
inference engine sampled) and environment turns (tool results, user messages). Re-rendering the
whole conversation through the chat template and re-tokenizing it would not reproduce the sampled
ids: templates rewrite history, and text that decodes the same can tokenize differently.

So the sequence is built token-in/token-out. The engine's ids are kept as they are (an assistant
turn ends with the end-of-turn token, e.g. ``<|im_end|>``), and each environment turn is encoded
as a *delta*: the text that rendering ``history + new_messages`` (with the next generation prompt)
adds after rendering ``history``, prefixed by whatever the template writes after the end-of-turn
token (``"\\n"`` in ChatML), which the engine never generates. Only the delta is tokenized;
because it starts right after a special token, its tokens are exactly those the full render would
have there. This requires a *prefix-stable* template (appending messages never changes how the
history renders) and a tool-call format that reads what the template writes;
:meth:`ChatRenderer.self_check` verifies both, token for token, at start-up.

Imported on first use: the tiny tokenizer's builder (the ``tokenizers`` library).
"""

from typing import Any

from agentrl.chat.renderer import ChatRenderer
from agentrl.chat.templates import CHATML_HERMES_TEMPLATE

__all__ = ["CHATML_HERMES_TEMPLATE", "ChatRenderer", "build_tiny_tokenizer"]


def __getattr__(name: str) -> Any:
    if name == "build_tiny_tokenizer":  # imports transformers: only when a tokenizer is built
        from agentrl.chat.tiny_tokenizer import build_tiny_tokenizer

        return build_tiny_tokenizer
    raise AttributeError(f"module 'agentrl.chat' has no attribute {name!r}")

"""Prompts longer than the context: measured in bounded memory, then skipped or cut.

A prompt's length is the token count of the chat template's rendering of it
(``ChatRenderer.prompt_ids``). Rendering is text work; tokenizing is what costs memory (about
400 bytes per token with a Hugging Face fast tokenizer: a 4M-token prompt would take 1.6 GB).
So a prompt is never tokenized past what the context could hold: :func:`prompt_ids_within`
tokenizes a growing prefix of the rendered text and stops as soon as that prefix alone has
more tokens than allowed.

``--overlong-prompts`` says what happens to a prompt that leaves no room for a response:

* ``skip`` (default): the sample is not played (status ``skipped``, finish
  :data:`OVERLONG_FINISH`, no tokens); the rollout drops its group from the training batch,
  plays another prompt instead and reports the row once with file and line.
* ``cut``: the text of the longest user message is cut (its tail, replaced by
  :data:`PROMPT_CUT_MARKER`) so that the prompt leaves room for one whole response turn
  (``--rollout-max-response-len`` tokens). Only message text is cut and the prompt is rendered
  again, so the chat template's structure and special tokens stay whole. A prompt that cannot
  be cut to fit (no user text, or the rest of it - system prompt, other messages, tool schemas
  - is too long already) is skipped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.chat import ChatRenderer
from agentrl.rollout.config import OVERLONG_PROMPTS

__all__ = [
    "OVERLONG_FINISH",
    "OVERLONG_PROMPTS",
    "PROMPT_CUT_MARKER",
    "FittedPrompt",
    "fit_prompt",
    "prompt_ids_within",
]

OVERLONG_FINISH = "overlong_prompt"
"""``metadata["finish"]`` of a sample whose prompt does not fit the context."""

PROMPT_CUT_MARKER = "\n[... {removed} characters of the prompt cut to fit the context window]"
"""Appended to a user message that ``--overlong-prompts cut`` shortened."""

PREFIX_SLACK = 32
"""Tokens a prefix of a text may count beyond the whole text. A prefix tokenizes like the text
except near its end (the last pre-token, a special token cut in half), so a prefix with more
than ``limit + PREFIX_SLACK`` tokens proves the whole text has more than ``limit``."""

CHARS_PER_TOKEN = 4
"""Characters per token the first prefix assumes (English prose with a large vocabulary); a
prefix too short to decide is doubled, so a wrong guess costs one more tokenization."""

CUT_ATTEMPTS = 4  # re-renderings of a cut prompt; each removes what the last one overshot


def prompt_ids_within(renderer: ChatRenderer, messages: Sequence[Mapping[str, Any]],
                      tools: Sequence[Mapping[str, Any]] | None, max_tokens: int, *,
                      generation_prompt: bool = True) -> list[int] | int:
    """The prompt's ids when its rendering has at most ``max_tokens`` tokens.

    ``generation_prompt=False`` measures a whole conversation (a demonstration) instead: the
    rendering without the next turn's generation prompt.

    Tokenizes prefixes of the rendered text, doubling, until one has more than
    ``max_tokens + PREFIX_SLACK`` tokens or is the whole text, so the tokenizer's memory stays
    about twice what ``max_tokens`` tokens take, however long the prompt (the rendered text
    itself is held once).

    Returns:
        The exact ids (``renderer.prompt_ids(messages, tools)``), or, when there are more than
        ``max_tokens``, a lower bound of their count (exact when the whole text was tokenized).
    """
    text = renderer.render_text(messages, tools, add_generation_prompt=generation_prompt)
    window = (max_tokens + PREFIX_SLACK) * CHARS_PER_TOKEN
    while window < len(text):
        counted = len(renderer.encode(text[:window]))
        if counted > max_tokens + PREFIX_SLACK:
            return counted - PREFIX_SLACK
        window *= 2
    ids = renderer.encode(text)
    return ids if len(ids) <= max_tokens else len(ids)


@dataclasses.dataclass(frozen=True)
class FittedPrompt:
    """A prompt measured against the context.

    Attributes:
        ids: The prompt's token ids; ``None`` when it does not fit (and could not be cut).
        messages: The messages ``ids`` render (with the cut message, when one was cut).
        tokens: ``len(ids)``; for a prompt that does not fit, a lower bound of its length.
        cut_chars: Characters cut from the longest user message (0: nothing was cut).
        reason: Why a prompt that does not fit was not cut; ``""`` otherwise.
    """

    ids: list[int] | None
    messages: list[dict[str, Any]]
    tokens: int
    cut_chars: int = 0
    reason: str = ""


def fit_prompt(renderer: ChatRenderer, messages: Sequence[Mapping[str, Any]],
               tools: Sequence[Mapping[str, Any]] | None, max_context_len: int, *,
               mode: str = "skip", response_room: int = 1) -> FittedPrompt:
    """Measures the prompt and, with ``mode="cut"``, cuts it to fit.

    Args:
        renderer: The policy's chat renderer.
        messages: The prompt's messages.
        tools: Tool schemas shown with them.
        max_context_len: Prompt + response tokens allowed (``--rollout-max-context-len``).
        mode: ``skip`` or ``cut`` (``--overlong-prompts``).
        response_room: Tokens a cut prompt leaves free (``--rollout-max-response-len``).

    Returns:
        The prompt as it will be played. It fits when it leaves room for at least one response
        token; a cut prompt leaves ``response_room``.
    """
    messages = [dict(m) for m in messages]
    found = prompt_ids_within(renderer, messages, tools, max_context_len - 1)
    if not isinstance(found, int):
        return FittedPrompt(found, messages, len(found))
    if mode != "cut":
        return FittedPrompt(None, messages, found)
    return _cut(renderer, messages, tools, max_context_len - response_room, found)


def _cut(renderer: ChatRenderer, messages: list[dict[str, Any]],
         tools: Sequence[Mapping[str, Any]] | None, target: int, tokens: int) -> FittedPrompt:
    """``messages`` with the tail of the longest user message cut so that the prompt has at
    most ``target`` tokens (``tokens``: a lower bound of its length now)."""
    users = [i for i, m in enumerate(messages)
             if m.get("role") == "user" and isinstance(m.get("content"), str) and m["content"]]
    if not users:
        return FittedPrompt(None, messages, tokens, reason="it has no user text to cut")
    at = max(users, key=lambda i: (len(messages[i]["content"]), i))  # the last of equals
    text = messages[at]["content"]

    def with_content(content: str) -> list[dict[str, Any]]:
        return [*messages[:at], {**messages[at], "content": content}, *messages[at + 1:]]

    marker = PROMPT_CUT_MARKER.format(removed=len(text))  # the longest the count can print
    rest = prompt_ids_within(renderer, with_content(marker), tools, target)
    if isinstance(rest, int):
        return FittedPrompt(None, messages, tokens, reason=(
            f"even with its longest user message emptied it has at least {rest} tokens"))
    budget = target - len(rest)  # tokens the kept text may take
    head = _head_ids(renderer, text, budget) if budget > 0 else []
    for _ in range(CUT_ATTEMPTS):
        kept = renderer.tokenizer.decode(head[:budget]) if budget > 0 else ""
        while kept.endswith("\ufffd") and not text.startswith(kept):
            kept = kept[:-1]  # half of a character whose bytes span two tokens
        candidate = with_content(kept + PROMPT_CUT_MARKER.format(removed=len(text) - len(kept)))
        ids = prompt_ids_within(renderer, candidate, tools, target)
        if not isinstance(ids, int):
            return FittedPrompt(ids, candidate, len(ids), cut_chars=len(text) - len(kept))
        if budget <= 0:
            break
        budget -= ids - target  # tokens merge differently at the new boundary
    return FittedPrompt(None, messages, tokens, reason="no cut of its longest user message fits")


def _head_ids(renderer: ChatRenderer, text: str, count: int) -> list[int]:
    """At least the first ``count`` token ids of ``text`` (all of them when it has fewer),
    tokenizing a prefix that doubles, never the whole of a long text."""
    window = (count + PREFIX_SLACK) * CHARS_PER_TOKEN
    while True:
        ids = renderer.encode(text[:window])
        if len(ids) > count + PREFIX_SLACK or window >= len(text):
            return ids
        window *= 2

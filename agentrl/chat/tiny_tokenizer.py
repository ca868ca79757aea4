"""A small byte-level BPE tokenizer, trained locally, for the built-in tiny model and fast tests.

It needs no download: it is trained with the ``tokenizers`` library on a fixed, sorted subset of
the Python standard library's sources, with the Qwen2 pre-tokenizer regex and ChatML special
tokens, so it behaves like a Qwen-family tokenizer at 4096 tokens. The first call trains it
(about a second) and saves it under the cache root; later calls load it from there.

The training text comes from the running Python's standard library, so two machines with
different Python versions may build different vocabularies; a given machine always builds the
same one.
"""

from __future__ import annotations

import json
import os
import shutil
import sysconfig
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the tokenizer libraries load when a tokenizer is built, not on import
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

from agentrl.chat.templates import CHATML_HERMES_TEMPLATE

__all__ = [
    "QWEN2_PRETOKENIZER_PATTERN",
    "TINY_SPECIAL_TOKENS",
    "TINY_VOCAB_SIZE",
    "build_tiny_tokenizer",
    "cache_root",
]

QWEN2_PRETOKENIZER_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""The pre-tokenizer split regex of Qwen2 / Qwen2.5 (single digits, letters with one leading
non-letter, punctuation runs, newline runs, whitespace)."""

TINY_VOCAB_SIZE = 4096
"""Total vocabulary size, special tokens included."""

TINY_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
"""Added tokens, at ids 0..6 in this order. The first three are special (dropped by
``skip_special_tokens``); the tool markers are plain added tokens, as in Qwen's tokenizers, so
decoded text keeps them for the tool-call parser."""

_CONTROL_TOKENS = frozenset(TINY_SPECIAL_TOKENS[:3])
_SUBFOLDER = "tiny-tokenizer-v1"
_TRAINING_BYTES = 3_000_000


def cache_root() -> Path:
    """The agentrl cache directory: ``$AGENTRL_CACHE``, else ``~/.cache/agentrl``."""
    env = os.environ.get("AGENTRL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "agentrl"


def _training_texts(limit_bytes: int = _TRAINING_BYTES) -> list[str]:
    """Top-level stdlib ``.py`` files in sorted order, up to about ``limit_bytes`` of text."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    total = 0
    for path in sorted(stdlib.glob("*.py"), key=lambda p: p.name):
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text.encode("utf-8"))
        if total >= limit_bytes:
            break
    if not texts:
        raise RuntimeError(f"no Python sources found under {stdlib} to train the tiny tokenizer")
    return texts


def _train() -> Tokenizer:
    """Trains the byte-level BPE (deterministic for a given training corpus)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZER_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=list(TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_texts(), trainer=trainer)
    # The trainer registers every added token as special; the tool markers are not.
    data = json.loads(tok.to_str())
    for entry in data["added_tokens"]:
        entry["special"] = entry["content"] in _CONTROL_TOKENS
    return Tokenizer.from_str(json.dumps(data))


def _wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=32768,
    )
    fast.chat_template = CHATML_HERMES_TEMPLATE
    return fast


def build_tiny_tokenizer(cache_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """Returns the tiny tokenizer, training and caching it on first use.

    Args:
        cache_dir: Cache root; the tokenizer lives in its ``tiny-tokenizer-v1`` subfolder.
            Defaults to :func:`cache_root`. A first build writes to a temporary folder and renames
            it into place, so concurrent first uses are safe.

    Returns:
        A fast tokenizer (vocab 4096, eos ``<|im_end|>``, pad ``<|endoftext|>``) whose chat
        template is :data:`~agentrl.chat.templates.CHATML_HERMES_TEMPLATE`.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    final = root / _SUBFOLDER
    if not (final / "tokenizer.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{_SUBFOLDER}-", dir=root))
        try:
            _wrap(_train()).save_pretrained(str(tmp))
            os.chmod(tmp, 0o755)  # mkdtemp makes it private
            try:
                os.rename(tmp, final)
            except OSError:
                if not (final / "tokenizer.json").is_file():
                    raise  # not a lost race: a real error
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(final))
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHATML_HERMES_TEMPLATE
    return tokenizer

"""Batched token sampling: pure tensor functions used by the embedded engine.

Each sampled token's log-probability is ``log_softmax(logits / T)`` at that token over the whole
vocabulary, before top-k / top-p truncation (T = 1 for greedy rows): the quantity a trainer
recomputes from the same weights (SGLang's ``output_token_logprobs`` are the same quantity).
Draws are inverse-CDF with one uniform number per row, so a row's token depends only on its own
logits, parameters and uniform, never on the other rows of the batch.
"""

from __future__ import annotations

import torch

__all__ = ["draw_tokens", "sample_tokens"]


def sample_tokens(
    logits: torch.Tensor,  # [B, V]
    temperature: torch.Tensor,  # [B], 1.0 on greedy rows
    greedy: torch.Tensor,  # [B] bool
    top_k: torch.Tensor,  # [B] long, <= 0: no top-k
    top_p: torch.Tensor,  # [B] float in (0, 1]
    uniforms: torch.Tensor,  # [B] in [0, 1); unused on greedy rows
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row and its ``log_softmax(logits / T)`` log-probability.

    Greedy rows take the argmax; the others draw with :func:`draw_tokens`.

    Returns:
        ``(tokens [B] long, logprobs [B] float)``.
    """
    tokens = logits.argmax(-1)  # [B]
    if not bool((~greedy).any()):
        logp = logits.log_softmax(-1)  # [B, V]
    else:
        logp = (logits / temperature[:, None]).log_softmax(-1)  # [B, V]
        rows = (~greedy).nonzero()[:, 0]  # [S]
        drawn = draw_tokens(logp.index_select(0, rows), top_k[rows], top_p[rows], uniforms[rows])
        tokens.index_copy_(0, rows, drawn)
    return tokens, logp.gather(1, tokens[:, None])[:, 0]


def draw_tokens(
    logp: torch.Tensor,  # [B, V] log-probabilities (each row sums to 1 after exp)
    top_k: torch.Tensor,  # [B] long, <= 0: no top-k
    top_p: torch.Tensor,  # [B] float in (0, 1]
    uniforms: torch.Tensor,  # [B] in [0, 1)
) -> torch.Tensor:  # [B] long token ids
    """Inverse-CDF draws from each row's top-k / top-p truncated distribution.

    Top-k keeps the k most probable tokens; top-p keeps the most probable tokens until their mass
    reaches p (the token that crosses p is kept, as in SGLang and Hugging Face). The kept mass is
    renormalised implicitly: the draw is ``uniform * kept_mass`` along the cumulative sum.
    """
    vocab = logp.shape[-1]
    truncated = ((top_k > 0) & (top_k < vocab)) | (top_p < 1.0)  # [B]
    if not bool(truncated.any()):
        return _inverse_cdf(logp.exp(), uniforms)
    # rows without truncation draw in vocabulary order, the others in sorted order: decided per
    # row, so that a row's token never depends on the other rows' parameters
    tokens = torch.empty(logp.shape[0], dtype=torch.long, device=logp.device)  # [B]
    plain = (~truncated).nonzero()[:, 0]
    if plain.numel():
        tokens[plain] = _inverse_cdf(logp[plain].exp(), uniforms[plain])
    rows = truncated.nonzero()[:, 0]  # [R]
    sorted_logp, order = logp[rows].sort(dim=-1, descending=True)  # [R, V] each
    probs = sorted_logp.exp()
    k = torch.where(top_k[rows] > 0, top_k[rows], vocab)  # [R]
    rank = torch.arange(vocab, device=logp.device)  # [V]
    mass_before = probs.cumsum(-1) - probs  # [R, V]: mass of the more probable tokens
    keep = (rank[None, :] < k[:, None]) & (mass_before < top_p[rows][:, None])
    pick = _inverse_cdf(probs * keep, uniforms[rows])  # [R] positions in sorted order
    tokens[rows] = order.gather(1, pick[:, None])[:, 0]
    return tokens


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """probs [B, V] (unnormalised, some positive), uniforms [B] -> [B] indices: the first index
    whose cumulative mass exceeds ``uniform * total``."""
    cdf = probs.cumsum(-1)  # [B, V]
    total = cdf[:, -1:]  # [B, 1]
    # strictly below the total, so the pick always lands on an index of positive mass
    below_total = torch.nextafter(total, total.new_zeros(()))
    target = torch.minimum(uniforms.to(cdf.dtype)[:, None] * total, below_total)  # [B, 1]
    return torch.searchsorted(cdf, target, right=True)[:, 0]

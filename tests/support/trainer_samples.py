"""Hand-made training samples for trainer tests."""

from __future__ import annotations

import torch

from agentrl.records.sample import Sample, Status, Turn


def uneven_samples(count: int = 6) -> list[Sample]:
    """Samples of different lengths (prompts of 5-40 tokens, responses of 3-30, one masked
    tool reply in the middle of some), in groups of 2."""
    generator = torch.Generator().manual_seed(7)
    out = []
    for i in range(count):
        prompt = torch.randint(3, 200, (5 + 7 * i,), generator=generator).tolist()
        n = 3 + (11 * i) % 28
        mask = [1] * n
        if i % 2:
            mask[n // 3 : n // 3 + 2] = [0, 0]
        out.append(Sample(group_id=i // 2, index=i % 2, tokens=prompt + torch.randint(
            3, 200, (n,), generator=generator).tolist(), response_length=n, loss_mask=mask,
            rollout_log_probs=[-1.0 * m for m in mask], reward=float(i % 2), status=Status.COMPLETED,
            turns=[Turn("assistant", 0, n)]))
    return out

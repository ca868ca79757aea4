"""Routing replay: the trainer's forward uses the experts each token was routed to at rollout
(``--routing-replay``) instead of routing again.

A mixture of experts' router picks its top-k experts from scores that differ between the
engine and the trainer by float rounding (other kernels, other precision, other batch shapes);
where two experts are near-tied the choice flips, that token runs through other experts in the
trainer than the ones that sampled it, and the trainer's log-probs drift from the rollout's
(importance ratios far from 1 that are not a policy change at all). Replaying the rollout's
choices removes that part of the mismatch. The router still gets gradients: the replayed
experts' weights are the trainer's own softmax scores gathered at the replayed indices
(megatron-core's ``RouterReplay``, which this module drives per model).

What replays: a micro-batch whose every sample carries :attr:`~agentrl.records.sample.Sample.
routed_experts` (the engine reports them: the embedded engine does). Positions past what the
engine ran (the last sampled token, environment tokens after it) get a fixed filler choice:
causal attention keeps them from reaching any trained token's log-prob. A micro-batch with a
sample without routes routes as usual (:func:`replay_targets` returns ``None``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from agentrl.errors import AgentRLError
from agentrl.records.sample import Sample

__all__ = ["RoutingReplayError", "replay_targets", "replaying", "routers_of"]


class RoutingReplayError(AgentRLError):
    """A sample's recorded routes do not fit the model (another layer count or top-k: the
    rollout was served by another architecture)."""


def replay_targets(samples: Sequence[Sample], lengths: Sequence[int], layers: int, topk: int
                   ) -> torch.Tensor | None:
    """The experts to replay for a packed micro-batch: ``[sum(lengths), layers, topk]`` int64,
    the rows' positions concatenated in order (the packed sequence's token order), or ``None``
    when a sample has no recorded routes.

    Args:
        samples: The micro-batch's samples, in row order.
        lengths: Each row's length in the packed sequence.
        layers: The model's mixture-of-experts layers.
        topk: Experts per token.

    Raises:
        RoutingReplayError: A sample's routes have another shape than the model's.
    """
    rows = []
    for sample, length in zip(samples, lengths, strict=True):
        routes = sample.routed_experts
        if routes is None:
            return None
        if (routes.layers, routes.topk) != (layers, topk):
            raise RoutingReplayError(
                f"sample {sample.group_id}/{sample.index} was routed over {routes.layers} layers "
                f"x top-{routes.topk}; the model has {layers} x top-{topk}: it was not sampled "
                "from this architecture")
        known = min(routes.positions, length)
        recorded = torch.frombuffer(bytearray(routes.data), dtype=torch.int16)
        recorded = recorded.view(routes.positions, layers, topk)[:known].long()
        filler = torch.arange(topk).expand(length - known, layers, topk)  # reaches no trained token
        rows.append(torch.cat([recorded, filler]))
    return torch.cat(rows) if rows else None


def routers_of(model: Any) -> list[Any]:
    """The routers of a (wrapped or bare) megatron ``GPTModel``'s mixture-of-experts layers,
    in layer order; ``[]`` for a dense model."""
    while hasattr(model, "module"):
        model = model.module
    return [layer.mlp.router for layer in model.decoder.layers if hasattr(layer.mlp, "router")]


@contextlib.contextmanager
def replaying(model: Any, targets: torch.Tensor | None) -> Iterator[None]:
    """Within the block, ``model``'s routers use ``targets`` (``[tokens, layers, topk]``, see
    :func:`replay_targets`) instead of their own top-k; ``None`` leaves routing alone. The
    model must be built with ``moe_enable_routing_replay`` (``--routing-replay``)."""
    if targets is None:
        yield
        return
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    routers = routers_of(model)
    if not routers or any(r.router_replay is None for r in routers):
        raise RoutingReplayError("the model was built without routing replay "
                                 "(moe_enable_routing_replay): nothing would replay")
    device = next(iter(routers)).weight.device
    try:
        for layer, router in enumerate(routers):
            router.router_replay.set_target_indices(targets[:, layer].contiguous().to(device))
            router.router_replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        yield
    finally:
        for router in routers:
            router.router_replay.clear_indices()
            router.router_replay.clear_router_replay_action()

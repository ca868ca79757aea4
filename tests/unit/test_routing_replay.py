"""``replay_targets``: the routes a packed micro-batch replays, by hand."""

import pytest
import torch

from agentrl.engine.base import RoutedExperts
from agentrl.records.sample import Sample
from agentrl.trainer.routing_replay import RoutingReplayError, replay_targets


def routed(values: list[list[list[int]]]) -> RoutedExperts:
    tensor = torch.tensor(values, dtype=torch.int16)
    positions, layers, topk = tensor.shape
    return RoutedExperts(tensor.numpy().astype("<i2").tobytes(), positions, layers, topk)


def sample(tokens: int, routes: RoutedExperts | None) -> Sample:
    return Sample(group_id=0, tokens=list(range(tokens)), routed_experts=routes)


def test_rows_are_concatenated_in_order_and_unrun_positions_get_the_filler():
    first = routed([[[3, 1], [0, 2]], [[2, 3], [1, 0]]])  # 2 positions, 2 layers, top-2
    second = routed([[[1, 0], [3, 2]]])  # 1 position: its last token was never run
    targets = replay_targets([sample(3, first), sample(2, second)], [3, 2], layers=2, topk=2)
    assert targets is not None and targets.dtype == torch.int64
    assert targets.tolist() == [
        [[3, 1], [0, 2]], [[2, 3], [1, 0]], [[0, 1], [0, 1]],  # row 0: 2 run, the last filled
        [[1, 0], [3, 2]], [[0, 1], [0, 1]],  # row 1
    ]


def test_a_sample_without_routes_means_no_replay_and_a_foreign_shape_is_refused():
    ok = routed([[[0, 1]]])
    assert replay_targets([sample(2, ok), sample(2, None)], [2, 2], layers=1, topk=2) is None
    with pytest.raises(RoutingReplayError, match=r"routed over 1 layers x top-2; the model has 2 x top-2"):
        replay_targets([sample(2, ok)], [2], layers=2, topk=2)


def test_routes_travel_with_the_sample_through_json():
    s = sample(3, routed([[[0, 1]], [[2, 3]]]))
    again = Sample.from_json(s.to_json())
    assert again.routed_experts == s.routed_experts and again == s
    with pytest.raises(ValueError, match="routed_experts covers 2 positions; the sample runs 1"):
        sample(2, routed([[[0, 1]], [[2, 3]]])).check()

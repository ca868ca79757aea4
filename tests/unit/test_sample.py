"""Sample: invariants, JSON round trip, clear errors."""

from __future__ import annotations

import pytest

from agentrl.records.sample import parse_version
from agentrl.rollout import Sample, Status, Turn


def two_turn_sample() -> Sample:
    # prompt [1, 2, 3]; assistant [10, 11], tool result [20, 21, 22], assistant [12]
    return Sample(
        group_id="task-7", index=2,
        prompt=[{"role": "user", "content": "hi"}],
        tokens=[1, 2, 3, 10, 11, 20, 21, 22, 12], response_length=6,
        loss_mask=[1, 1, 0, 0, 0, 1], rollout_log_probs=[-0.5, -0.25, 0.0, 0.0, 0.0, -1.0],
        response="...", reward=1.0, status=Status.COMPLETED, label="42",
        turns=[Turn("assistant", 0, 2, ["calculator"], "stop", 0.1), Turn("environment", 2, 5, ["calculator"], tools_s=0.2),
               Turn("assistant", 5, 6, finish_reason="stop")],
        weight_version="3", token_versions=[2, 3, -1, -1, -1, 3], metadata={"task_id": "calc-test-0-7"},
    )


def test_invariants_hold_and_prompt_length():
    sample = two_turn_sample()
    sample.check()
    assert sample.prompt_length == 3


def test_json_round_trip_is_exact():
    sample = two_turn_sample()
    line = sample.to_json()
    assert "\n" not in line and '"status": "completed"' in line
    assert Sample.from_json(line) == sample


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"loss_mask": [1, 1, 0]}, "must have response_length"),
        ({"rollout_log_probs": [0.0]}, "must have response_length"),
        ({"response_length": 99}, "outside 0..len"),
        ({"loss_mask": [1, 1, 0, 0, 2, 1]}, "0 or 1"),
        ({"loss_mask": [1, 1, 0, 1, 0, 1]}, "environment turn with loss_mask 1"),
        ({"turns": [Turn("assistant", 0, 2), Turn("environment", 3, 6)]}, "expected start 2"),
        ({"turns": [Turn("assistant", 0, 2)]}, "cover 2 response tokens, not 6"),
        ({"turns": [Turn("user", 0, 6)]}, "must be 'assistant' or 'environment'"),
        ({"token_versions": [3, 3]}, "token_versions .2. must be empty or have response_length"),
    ],
)
def test_broken_invariants_are_named(change, message):
    sample = two_turn_sample()
    for key, value in change.items():
        setattr(sample, key, value)
    with pytest.raises(ValueError, match=message):
        sample.check()


def test_token_versions_round_trip_and_stay_aligned_with_the_response():
    sample = two_turn_sample()
    assert Sample.from_json(sample.to_json()).token_versions == [2, 3, -1, -1, -1, 3]
    assert sample.oldest_version() == 2  # over trained tokens; environment tokens (-1) ignored
    sample.token_versions = [-1, 4, 0, 0, 0, 5]  # env tokens never count, even with a version
    assert sample.oldest_version() == 4
    sample.token_versions = []  # not recorded: the caller's default
    sample.check()
    assert sample.oldest_version() is None and sample.oldest_version(default=7) == 7
    # a sample written before token versions existed still reads
    old = {k: v for k, v in two_turn_sample().to_dict().items() if k != "token_versions"}
    assert Sample.from_dict(old).token_versions == []
    assert [parse_version(v) for v in ("0", "12", "default", None, "-3", "v2")] == [0, 12, -1, -1, -1, -1]


def test_unknown_fields_are_rejected_by_name():
    data = two_turn_sample().to_dict() | {"rewards": 1}
    with pytest.raises(ValueError, match=r"unknown Sample fields: \['rewards'\]"):
        Sample.from_dict(data)


def test_defaults_are_a_pending_empty_sample():
    sample = Sample(group_id=0)
    sample.check()
    assert sample.status is Status.PENDING and sample.reward is None and sample.prompt_length == 0

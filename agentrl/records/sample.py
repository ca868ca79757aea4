"""``Sample``: the one record that crosses every boundary (rollout -> buffer -> trainer -> logs).

A sample is ONE token sequence: the prompt tokens, then the response - alternating model turns
(loss mask 1, with the engine's log-probabilities) and environment turns (tool results, user
messages: loss mask 0, log-probability 0). ``turns`` records which response span is which.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from typing import Any

from agentrl.engine.base import RoutedExperts


class Status(enum.StrEnum):
    """What became of a sample.

    ``completed``: the episode ended naturally (final answer or submit; engine finish reason
    ``stop``). ``truncated``: cut by a limit (``--max-turns``, the context budget, engine finish
    reason ``length``). ``aborted``: the engine aborted the request (weight update, partial
    rollout, shutdown); it may be resumed. ``failed``: the env, a tool or the reward function
    crashed; ``metadata["error"]`` says why. ``skipped``: never played, as its prompt leaves
    no room in the context for a response (``--overlong-prompts``); it has no tokens, and a
    training rollout replaces its group. ``pending``: not generated yet.
    """

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclasses.dataclass
class Turn:
    """One turn of a multi-turn sample.

    Attributes:
        role: ``assistant`` (tokens sampled by the engine, trained on) or ``environment`` (tool
            results and other messages the env added, never trained on).
        start: First response-token index of the turn.
        end: One past its last response-token index (``[start, end)``).
        tool_names: Tools called in an assistant turn, or answered in an environment turn.
        finish_reason: The engine's finish reason for an assistant turn (``stop``, ``length``,
            ``abort``).
        generate_s: Seconds the engine spent on the turn.
        tools_s: Seconds spent running the turn's tool calls.
        reward_s: Seconds spent scoring the episode (on its last assistant turn).
    """

    role: str
    start: int
    end: int
    tool_names: list[str] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    generate_s: float = 0.0
    tools_s: float = 0.0
    reward_s: float = 0.0


@dataclasses.dataclass
class Sample:
    """One generated trajectory, as rollout, buffer and trainer all see it.

    Attributes:
        group_id: Samples of the same prompt share it; advantages are normalised within a group
            (by this id, never by position in a batch).
        index: Position of the sample within its group.
        prompt: The prompt: chat messages, or text.
        tokens: Prompt token ids followed by response token ids.
        response_length: Number of response tokens (the tail of ``tokens``).
        loss_mask: One entry per response token: 1 for engine-sampled tokens, 0 for env tokens.
        rollout_log_probs: One entry per response token: the engine's log-probability of each
            sampled token, 0.0 for env tokens.
        response: The response as text (for logs and reward functions).
        reward: Scalar reward, ``None`` until computed.
        status: See :class:`Status`.
        label: Ground truth from the data set (``--label-key``), if any.
        turns: Response spans by turn, in order.
        weight_version: Version of the policy weights that generated the sample's last turn
            (the newest among its tokens).
        token_versions: Per response token, the weight version that sampled it (see
            :func:`parse_version`); ``-1`` for environment tokens and unknown versions. Empty
            when not recorded (samples made outside the rollout).
        routed_experts: For a mixture-of-experts policy whose engine reports them: the experts
            each position of ``tokens`` was routed to at rollout, from position 0 (at most
            ``len(tokens) - 1`` positions: the last sampled token, and environment tokens after
            it, were never run). The trainer replays them with ``--routing-replay``.
        metadata: Anything else (task id, tool error counts, error text of a failed sample).
    """

    group_id: str | int
    index: int = 0
    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = dataclasses.field(default_factory=list)
    response_length: int = 0
    loss_mask: list[int] = dataclasses.field(default_factory=list)
    rollout_log_probs: list[float] = dataclasses.field(default_factory=list)
    response: str = ""
    reward: float | None = None
    status: Status = Status.PENDING
    label: Any = None
    turns: list[Turn] = dataclasses.field(default_factory=list)
    weight_version: str | None = None
    token_versions: list[int] = dataclasses.field(default_factory=list)
    routed_experts: RoutedExperts | None = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def prompt_length(self) -> int:
        """Number of prompt tokens at the start of ``tokens``."""
        return len(self.tokens) - self.response_length

    def oldest_version(self, default: int | None = None) -> int | None:
        """The oldest weight version among the sample's trained (loss mask 1) tokens, or
        ``default`` when none has a known version. A sample's staleness at trainer version
        ``t`` is ``t - oldest_version()``."""
        known = [v for v, m in zip(self.token_versions, self.loss_mask, strict=False) if m and v >= 0]
        return min(known) if known else default

    def check(self) -> None:
        """Raises ``ValueError`` naming the first broken invariant: per-token lists as long as
        the response (``token_versions`` may be empty instead), loss-mask values 0/1, turn spans in order, inside the response, covering
        it exactly, with mask 1 only inside assistant turns."""
        n = self.response_length
        if not 0 <= n <= len(self.tokens):
            raise ValueError(f"response_length {n} is outside 0..len(tokens)={len(self.tokens)}")
        if len(self.loss_mask) != n or len(self.rollout_log_probs) != n:
            raise ValueError(
                f"loss_mask ({len(self.loss_mask)}) and rollout_log_probs "
                f"({len(self.rollout_log_probs)}) must have response_length ({n}) entries"
            )
        if self.token_versions and len(self.token_versions) != n:
            raise ValueError(f"token_versions ({len(self.token_versions)}) must be empty or have "
                             f"response_length ({n}) entries")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("loss_mask entries must be 0 or 1")
        position = 0
        for i, turn in enumerate(self.turns):
            if turn.role not in ("assistant", "environment"):
                raise ValueError(f"turns[{i}].role must be 'assistant' or 'environment'")
            if turn.start != position or turn.end < turn.start:
                raise ValueError(f"turns[{i}] spans [{turn.start}, {turn.end}); expected start {position}")
            if turn.role == "environment" and any(self.loss_mask[turn.start:turn.end]):
                raise ValueError(f"turns[{i}] is an environment turn with loss_mask 1 tokens")
            position = turn.end
        if self.turns and position != n:
            raise ValueError(f"turns cover {position} response tokens, not {n}")
        if self.routed_experts is not None and self.routed_experts.positions > max(len(self.tokens) - 1, 0):
            raise ValueError(f"routed_experts covers {self.routed_experts.positions} positions; "
                             f"the sample runs {max(len(self.tokens) - 1, 0)}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible dict (``status`` as its string value)."""
        routes = self.routed_experts  # bytes: written as base64, not deep-copied by asdict
        data = dataclasses.asdict(dataclasses.replace(self, routed_experts=None))
        data["status"] = self.status.value
        data["routed_experts"] = routes.to_json() if routes is not None else None
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sample:
        """The inverse of :meth:`to_dict`. Unknown keys are an error that names them."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown Sample fields: {sorted(unknown)}")
        values = dict(data)
        values["status"] = Status(values.get("status", Status.PENDING))
        values["turns"] = [t if isinstance(t, Turn) else Turn(**t) for t in values.get("turns", [])]
        routes = values.get("routed_experts")
        if isinstance(routes, Mapping):
            values["routed_experts"] = RoutedExperts.from_json(routes)
        return cls(**values)

    def to_json(self) -> str:
        """One line of JSON."""
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Sample:
        """The inverse of :meth:`to_json`."""
        return cls.from_dict(json.loads(text))


def parse_version(version: str | None) -> int:
    """A weight version as the integer :attr:`Sample.token_versions` holds: the trainer's
    versions are ``"0"``, ``"1"``, ... (weights after that many train iterations); anything
    else (``None``, SGLang's ``"default"``, a user's label) is unknown, ``-1``."""
    if version is None:
        return -1
    try:
        value = int(version)
    except ValueError:
        return -1
    return value if value >= 0 else -1

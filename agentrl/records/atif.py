"""Episodes as ATIF trajectories (Agent Trajectory Interchange Format), the JSON form Harbor's
tools and viewers read (``harbor.models.trajectories.Trajectory``, schema ``ATIF-v1.8``).

One episode is one trajectory document: its conversation (the sample's ``metadata["messages"]``,
as the rollout records it) in order, one step per message:

* a ``system`` or ``user`` message is a step of that source;
* an assistant message is an ``agent`` step, its tool calls the step's ``tool_calls`` (an id is
  made, ``call_<step>_<n>``, where the call has none);
* the ``tool`` messages that answer them are that agent step's ``observation``: the n-th reply
  after it answers its n-th call (``source_call_id``), as ATIF keeps a call and its result in
  one step. A reply with no call left to answer is kept, without a ``source_call_id``.

The episode's reward, status and task go in the document's ``extra``; token counts in
``final_metrics``. Nothing here reads the token stream: the conversation is what ATIF describes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.env.messages import content_text
from agentrl.records.sample import Sample

__all__ = ["ATIF_VERSION", "atif_trajectory", "write_atif"]

ATIF_VERSION = "ATIF-v1.8"
"""The ATIF schema version written (the newest Harbor 0.25 reads)."""


def atif_trajectory(sample: Sample, *, agent_version: str, model_name: str | None = None,
                    session_id: str | None = None) -> dict[str, Any]:
    """The ATIF document of one episode.

    Args:
        sample: A played episode (its ``metadata["messages"]`` is the conversation).
        agent_version: agentrl's version (the document's ``agent.version``).
        model_name: What played it (a checkpoint, ``oracle``, a served model's name).
        session_id: The run or evaluation the episode belongs to.
    """
    steps: list[dict[str, Any]] = []
    unanswered: list[str] = []  # the latest agent step's call ids not yet answered
    for message in sample.metadata.get("messages", []):
        role = message.get("role")
        content = content_text(message.get("content"))
        if role == "tool" and steps and steps[-1]["source"] == "agent":
            result: dict[str, Any] = {"content": content}
            if unanswered:
                result["source_call_id"] = unanswered.pop(0)
            steps[-1].setdefault("observation", {"results": []})["results"].append(result)
            continue
        # a tool reply before any agent step is kept as the environment's words (user)
        source = {"assistant": "agent", "system": "system"}.get(str(role), "user")
        step: dict[str, Any] = {"step_id": len(steps) + 1, "source": source, "message": content}
        if source == "agent":
            calls = [_call(raw, len(steps) + 1, n) for n, raw in enumerate(_calls_of(message))]
            if calls:
                step["tool_calls"] = calls
            unanswered = [c["tool_call_id"] for c in calls]
        steps.append(step)
    if not steps:  # ATIF needs one step: an episode that failed before its first message
        steps.append({"step_id": 1, "source": "system", "message": str(sample.metadata.get("error") or "")})
    meta = sample.metadata
    document: dict[str, Any] = {
        "schema_version": ATIF_VERSION,
        "trajectory_id": f"{meta.get('task_id', sample.group_id)}-{sample.index}",
        "agent": {"name": "agentrl", "version": agent_version, **({"model_name": model_name} if model_name else {})},
        "steps": steps,
        "final_metrics": {"total_steps": len(steps),
                          **({"total_completion_tokens": sum(sample.loss_mask)} if sample.tokens else {}),
                          **({"total_prompt_tokens": sample.prompt_length} if sample.tokens else {})},
        "extra": {"reward": sample.reward, "status": sample.status.value, "task_id": meta.get("task_id"),
                  "group_id": sample.group_id, "sample": sample.index, "finish": meta.get("finish")},
    }
    if session_id is not None:
        document["session_id"] = session_id
    return document


def write_atif(directory: str | Path, samples: Sequence[Sample], *, agent_version: str,
               model_name: str | None = None, session_id: str | None = None) -> list[Path]:
    """Writes one ATIF document per sample into ``directory`` (made if needed), named by its
    ``trajectory_id`` (the task id and sample index, path separators replaced); returns the
    files."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    written = []
    for sample in samples:
        document = atif_trajectory(sample, agent_version=agent_version, model_name=model_name,
                                   session_id=session_id)
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", document["trajectory_id"]).strip("._") or "episode"
        path = root / f"{name}.json"
        path.write_text(json.dumps(document, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        written.append(path)
    return written


def _calls_of(message: Mapping[str, Any]) -> list[Any]:
    """An assistant message's tool calls."""
    calls = message.get("tool_calls") or []
    return list(calls) if isinstance(calls, Sequence) and not isinstance(calls, str) else []


def _call(raw: Any, step: int, n: int) -> dict[str, Any]:
    """One tool call in ATIF's form: id, function name, arguments as an object."""
    if isinstance(raw, Mapping) and isinstance(raw.get("function"), Mapping):  # OpenAI form
        raw = {**raw["function"], "id": raw.get("id")}
    raw = raw if isinstance(raw, Mapping) else {"name": str(raw)}
    arguments = raw.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = {"raw": arguments}
    if not isinstance(arguments, Mapping):
        arguments = {"value": arguments}
    return {"tool_call_id": str(raw.get("id") or f"call_{step}_{n}"),
            "function_name": str(raw.get("name", "")), "arguments": dict(arguments)}

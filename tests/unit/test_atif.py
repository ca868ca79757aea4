"""Episodes as ATIF documents, by hand: steps by message, a call and its result in one agent
step, ids made where calls have none, the episode's outcome in ``extra``."""

from agentrl.records.atif import ATIF_VERSION, atif_trajectory
from agentrl.records.sample import Sample, Status

MESSAGES = [
    {"role": "system", "content": "Solve it."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "Computing.", "tool_calls": [
        {"name": "calculator", "arguments": {"expression": "2+3"}},
        {"id": "c7", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "3"}'}},
    ]},
    {"role": "tool", "name": "calculator", "content": "5"},
    {"role": "tool", "name": "calculator", "content": "3"},
    {"role": "tool", "name": "calculator", "content": "a reply no call asked for"},
    {"role": "assistant", "content": [{"type": "text", "text": "Answer: 5"}]},
]


def test_an_episode_becomes_one_document_of_steps():
    sample = Sample(group_id=4, index=1, reward=1.0, status=Status.COMPLETED,
                    metadata={"messages": MESSAGES, "task_id": "calc/7", "finish": "env"})
    doc = atif_trajectory(sample, agent_version="0.1.0", model_name="oracle", session_id="run-1")
    assert doc["schema_version"] == ATIF_VERSION and doc["session_id"] == "run-1"
    assert doc["agent"] == {"name": "agentrl", "version": "0.1.0", "model_name": "oracle"}
    assert doc["trajectory_id"] == "calc/7-1"
    assert [(s["step_id"], s["source"], s["message"]) for s in doc["steps"]] == [
        (1, "system", "Solve it."), (2, "user", "What is 2 + 3?"), (3, "agent", "Computing."),
        (4, "agent", "Answer: 5")]
    call = doc["steps"][2]
    assert call["tool_calls"] == [
        {"tool_call_id": "call_3_0", "function_name": "calculator", "arguments": {"expression": "2+3"}},
        {"tool_call_id": "c7", "function_name": "calculator", "arguments": {"expression": "3"}}]
    assert call["observation"]["results"] == [
        {"content": "5", "source_call_id": "call_3_0"}, {"content": "3", "source_call_id": "c7"},
        {"content": "a reply no call asked for"}]
    assert "tool_calls" not in doc["steps"][3]
    assert doc["extra"] == {"reward": 1.0, "status": "completed", "task_id": "calc/7", "group_id": 4,
                            "sample": 1, "finish": "env"}
    assert doc["final_metrics"] == {"total_steps": 4}  # no tokens: a scripted policy played


def test_an_episode_that_failed_before_its_first_message_still_has_a_step():
    sample = Sample(group_id=0, status=Status.FAILED, metadata={"error": "EnvError: no task"})
    doc = atif_trajectory(sample, agent_version="0.1.0")
    assert doc["steps"] == [{"step_id": 1, "source": "system", "message": "EnvError: no task"}]
    assert "session_id" not in doc and "model_name" not in doc["agent"]

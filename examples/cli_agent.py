"""A command-line agent, run unmodified by ``--agent-command``: it knows nothing of agentrl.

    agentrl eval --env calc --agent-command "python examples/cli_agent.py" --limit 4
    python train.py --env calc --agent-command "python examples/cli_agent.py"

Like any CLI tool built on the ``openai`` SDK, it reads its server from ``OPENAI_BASE_URL``,
``OPENAI_API_KEY`` and ``OPENAI_MODEL``, and its task from standard input (agentrl writes the
task as JSON there, and into the file ``$AGENTRL_TASK_FILE``). It asks the model once per turn
and prints the final reply; agentrl grades the episode with the env (``calc`` reads the last
reply for ``Answer: N``).
"""

from __future__ import annotations

import json
import os
import sys

import openai


def main() -> int:
    task = json.loads(sys.stdin.read())
    client = openai.OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    messages = [{"role": "system", "content": "Solve the problem. End with 'Answer: <integer>'."},
                {"role": "user", "content": str(task.get("question") or task)}]
    for _ in range(2):
        reply = client.chat.completions.create(model=os.environ["OPENAI_MODEL"], messages=messages,
                                               max_tokens=64)
        text = reply.choices[0].message.content or ""
        messages += [{"role": "assistant", "content": text},
                     {"role": "user", "content": "Check it, then give the final answer."}]
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

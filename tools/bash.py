"""``bash``: run a command in the episode's persistent shell inside its sandbox."""

from __future__ import annotations

from agentrl import EpisodeState, tool
from agentrl.env.sandboxed import register_episode_resource
from agentrl.sandbox import Sandbox, SandboxError, ShellSession
from agentrl_tools._common import TOOL_TIMEOUT_S, check_timeout, clip

SHELL_KEY = "agentrl.shell"
"""Key of ``EpisodeState.data`` holding the episode's :class:`ShellSession`."""


async def episode_shell(sandbox: Sandbox, state: EpisodeState) -> ShellSession:
    """The episode's shell session, opened on first use and closed when the episode ends.

    Args:
        sandbox: The episode's sandbox.
        state: The episode's state; the session is kept in ``state.data["agentrl.shell"]``.
    """
    shell = state.data.get(SHELL_KEY)
    if shell is None:
        shell = await sandbox.open_shell()
        state.data[SHELL_KEY] = shell
        register_episode_resource(state, shell)
    return shell


@tool(timeout=TOOL_TIMEOUT_S)
async def bash(command: str, timeout: int = 60, *, sandbox: Sandbox, state: EpisodeState) -> str:
    """Runs a bash command in a persistent shell in the task's sandbox and returns its output.

    The shell keeps its state between calls: `cd`, `export` and shell variables persist. It
    starts in /workspace. There is no network. Output is stdout then stderr, with a note on a
    non-zero exit code or a timeout; long output is cut in the middle. Commands that wait for
    input get end-of-file. After a timeout the shell restarts (cwd and variables reset).

    Args:
        command: The command line, e.g. "ls -la" or "cd src && grep -rn foo .".
        timeout: Seconds before the command and everything it started are killed (1-600).
    """
    if error := check_timeout(timeout):
        return error
    if not command.strip():
        return "Error: the command is empty"
    try:
        shell = await episode_shell(sandbox, state)
        result = await shell.run(command, timeout=timeout)
    except SandboxError as exc:
        return f"Error: the sandbox could not run the command: {exc}"
    if result.exit_code is None and not result.timed_out:
        # The shell itself ended (`exit`, `exec`, killed): there is no exit code to report.
        text = "\n".join(p.rstrip("\n") for p in (result.stdout, result.stderr) if p).strip("\n")
    else:
        text = result.to_text()
    return clip(text, keep_tail=True) or "(no output)"

"""``openenv``: an environment served over OpenEnv's protocol (an ``openenv`` server, or
``agentrl serve-env``) as an agentrl env: ``--env openenv --env-kwarg url=http://HOST:PORT``.

The protocol client is agentrl's own (:mod:`agentrl_envs.openenv.client`): the ``openenv``
package cannot be imported next to agentrl's MCP SDK (docs/guides/openenv.md).
"""

from agentrl_envs.openenv.env import OpenEnvEnv, RemoteTool

__all__ = ["OpenEnvEnv", "RemoteTool"]

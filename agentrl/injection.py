"""The marker of values an environment injects into tools, at the bottom of the layers: the
tools take it from here, and so do the sandboxes, whose handles are injected."""

__all__ = ["Injected"]


class Injected:
    """Base class of values the environment injects into tools (hidden from the schema).

    A tool parameter annotated with a subclass of ``Injected`` (for example
    :class:`agentrl.env.EpisodeState`, or a sandbox handle) never appears in the tool's JSON
    schema; at call time the environment passes the matching object from its tool context.
    """

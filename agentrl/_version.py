"""agentrl's version, in a module of its own so that any layer can name it without importing
the package root (which imports the env, tools and rollout layers)."""

__version__ = "0.1.0"

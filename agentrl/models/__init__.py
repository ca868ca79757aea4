"""Models agentrl can build locally, without a download (see :mod:`agentrl.models.tiny`)."""

from agentrl.models.tiny import TINY_MODEL_CONFIG, build_tiny_model

__all__ = ["TINY_MODEL_CONFIG", "build_tiny_model"]

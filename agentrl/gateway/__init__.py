"""An OpenAI-compatible gateway in front of agentrl's engines, for agents agentrl did not write.

Agents written against the ``openai`` client, the OpenAI Agents SDK, or CLI scaffolds such as
mini-swe-agent run unmodified by pointing their base URL at the gateway. Each episode gets a
:class:`Session` with its own key; the gateway renders each request through the model's chat
template, generates token-in/token-out on the engine, and records the exact ids and
log-probabilities, so the episode trains like one of agentrl's own (see
:mod:`agentrl.gateway.session` for how calls become samples, and
:mod:`agentrl.gateway.protocol` for the request fields it takes).
"""

from agentrl.gateway.protocol import APIError
from agentrl.gateway.server import Gateway
from agentrl.gateway.session import SEGMENT_MODES, CallRecord, Segment, Session, SessionClosed

__all__ = ["SEGMENT_MODES", "APIError", "CallRecord", "Gateway", "Segment", "Session",
           "SessionClosed"]

"""The gateway's HTTP server: OpenAI's chat-completions API in front of an agentrl engine.

Routes (each also under a session's URL prefix ``/s/<key>``):

===============================  =============================================================
``POST /v1/chat/completions``    chat, with ``tools``, ``n``, ``stream`` (SSE) and ``logprobs``
``POST /v1/completions``         text or token-id prompts
``GET /v1/models``               the one served model
``GET /health``                  200 while serving
===============================  =============================================================

A request belongs to the session named by its URL prefix or, without one, by its API key
(``Authorization: Bearer <key>``); an unknown key is a 401. Errors are OpenAI's error bodies.

Streaming: the engine generates a turn token-in/token-out as one request, so a streamed
response sends the role chunk at once, then the turn's text (and its tool calls, once parsed)
as it arrives, the finish reason, the usage (``stream_options.include_usage``) and ``[DONE]``.
A client that disconnects is left: its request's engine generation is aborted, nothing of it
is recorded, and the session serves its next request as if the call had not been made.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from agentrl.chat import ChatRenderer
from agentrl.engine.base import Engine, SamplingParams
from agentrl.gateway.protocol import (
    APIError,
    chat_chunk,
    chat_response,
    chunk_logprobs,
    completion_response,
    new_id,
    parse_chat_request,
    parse_completion_request,
)
from agentrl.gateway.session import Session, SessionClosed

__all__ = ["Gateway", "default_sampling", "renderer_for"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Gateway:
    """An OpenAI-compatible server over ``engine``, one :class:`Session` per episode.

    Args:
        engine: The engine (embedded, SGLang or vLLM client).
        renderer: The chat renderer of the engine's tokenizer and the run's tool-call format.
        sampling: The run's per-turn sampling parameters (see :class:`Session`).
        max_context_len: Tokens per segment.
        model: The model name clients ask for (``GET /v1/models``).
        seed: The run's ``--rollout-seed``.
        host: Interface to listen on (loopback by default: agents run on this machine).
        port: Port; 0 picks a free one.
    """

    def __init__(self, engine: Engine, renderer: ChatRenderer, sampling: SamplingParams,
                 max_context_len: int, *, model: str = "agentrl-policy", seed: int | None = None,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.engine = engine
        self.renderer = renderer
        self.sampling = sampling
        self.max_context_len = max_context_len
        self.model = model
        self.seed = seed
        self.host = host
        self.port = port
        self.sessions: dict[str, Session] = {}
        self._runner: web.AppRunner | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> str:
        """Starts serving; returns the base URL (``http://host:port``)."""
        app = web.Application(middlewares=[self._errors], client_max_size=64 * 1024 * 1024)
        for prefix in ("", "/s/{key}"):
            app.router.add_post(prefix + "/v1/chat/completions", self._chat)
            app.router.add_post(prefix + "/v1/completions", self._completions)
            app.router.add_get(prefix + "/v1/models", self._models)
        app.router.add_get("/health", self._health)
        # a client that disconnects cancels its handler, which aborts its generation
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self.url

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        """Closes every session and stops serving."""
        for session in list(self.sessions.values()):
            await session.close()
        self.sessions.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- sessions ----------------------------------------------------------------------------

    def open_session(self, rid: str, *, sampling: SamplingParams | None = None,
                     client_sampling: bool = False, stopping: threading.Event | None = None,
                     respond: Callable[[list[dict[str, Any]]], str] | None = None) -> Session:
        """A new session for the episode whose requests are ``rid``-prefixed.

        Args:
            rid: The episode's request-id prefix (aborts and routing go by it).
            sampling: This session's sampling (default: the gateway's), e.g. an evaluation's.
            client_sampling: Honour the client's temperature and top_p (evaluation).
            stopping: The rollout's stop flag (see :class:`Session`).
            respond: A scripted model that answers instead of the engine (see :class:`Session`).
        """
        key = f"agentrl-{secrets.token_urlsafe(18)}"
        session = Session(key, self.engine, self.renderer, sampling or self.sampling,
                          self.max_context_len, rid=rid, seed=self.seed,
                          client_sampling=client_sampling, stopping=stopping, respond=respond)
        self.sessions[key] = session
        return session

    async def close_session(self, session: Session) -> None:
        """Ends ``session``: in-flight requests are aborted, its key stops working."""
        self.sessions.pop(session.key, None)
        await session.close()

    def base_url(self, session: Session) -> str:
        """The OpenAI base URL of ``session`` (its key in the path: no header needed)."""
        return f"{self.url}/s/{session.key}/v1"

    # -- handlers ----------------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except APIError as exc:
            return web.json_response(exc.body(), status=exc.status)
        except SessionClosed as exc:
            return web.json_response(APIError(409, str(exc), code="session_closed").body(), status=409)
        except web.HTTPException as exc:  # unknown routes and methods, in OpenAI's shape
            if exc.status < 400:
                raise
            body = APIError(exc.status, f"{request.method} {request.path}: {exc.reason}",
                            code="not_found" if exc.status == 404 else None).body()
            return web.json_response(body, status=exc.status)

    def _session(self, request: web.Request) -> Session:
        key = request.match_info.get("key")
        if key is None:
            header = request.headers.get("Authorization", "")
            key = header[7:].strip() if header.lower().startswith("bearer ") else None
        session = self.sessions.get(key or "")
        if session is None:
            what = "no API key was given" if not key else "the API key names no open session"
            raise APIError(401, f"{what}: each episode has its own key (its endpoint's api_key, "
                           "or the /s/<key>/v1 base URL)", type="authentication_error",
                           code="invalid_api_key")
        return session

    async def _body(self, request: web.Request) -> Any:
        try:
            return json.loads(await request.read())
        except ValueError as exc:
            raise APIError(400, f"the body is not valid JSON: {exc}", code="invalid_json") from exc

    def _check_model(self, model: str) -> None:
        if model != self.model:
            raise APIError(404, f"the model {model!r} does not exist; this gateway serves "
                           f"{self.model!r}", param="model", code="model_not_found")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": 0, "owned_by": "agentrl"}]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "sessions": len(self.sessions)})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        session = self._session(request)
        chat = parse_chat_request(await self._body(request))
        self._check_model(chat.model)
        request_id = new_id("chatcmpl")
        if not chat.stream:
            choices, prompt_tokens = await self._serve(session, session.chat(chat))
            return web.json_response(chat_response(request_id, self.model, choices, prompt_tokens,
                                                   logprobs=chat.logprobs))
        response = await self._open_stream(request)
        try:
            for index in range(chat.n):  # the role at once: the client sees the stream start
                await _send(response, chat_chunk(request_id, self.model, index,
                                                 {"role": "assistant", "content": ""}))
            choices, prompt_tokens = await self._serve(session, session.chat(chat))
        except APIError as exc:  # headers are sent: the error goes in the stream
            await _send(response, exc.body())
            await response.write(b"data: [DONE]\n\n")
            return response
        for index, choice in enumerate(choices):
            message = choice.message
            if message.get("content"):
                await _send(response, chat_chunk(
                    request_id, self.model, index, {"content": message["content"]},
                    logprobs=chunk_logprobs(choice) if chat.logprobs else None))
            for i, call in enumerate(message.get("tool_calls") or ()):
                await _send(response, chat_chunk(request_id, self.model, index, {"tool_calls": [
                    {"index": i, "id": call["id"], "type": "function", "function": call["function"]}]}))
            await _send(response, chat_chunk(request_id, self.model, index, {},
                                             finish_reason=choice.finish_reason))
        if chat.include_usage:
            completion = sum(len(c.token_ids) for c in choices)
            await _send(response, chat_chunk(request_id, self.model, 0, {},
                                             usage=(prompt_tokens, completion)))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        session = self._session(request)
        completion = parse_completion_request(await self._body(request))
        self._check_model(completion.model)
        request_id = new_id("cmpl")
        results, prompt_tokens = await self._serve(session, session.complete(completion))
        body = completion_response(request_id, self.model, results, prompt_tokens,
                                   logprobs=completion.logprobs)
        if not completion.stream:
            return web.json_response(body)
        response = await self._open_stream(request)
        for choice in body["choices"]:
            chunk = {**body, "choices": [choice]}
            chunk.pop("usage")
            await _send(response, chunk)
        if completion.include_usage:
            await _send(response, {**body, "choices": [], "usage": body["usage"]})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _serve(self, session: Session, call: Awaitable[Any]) -> Any:
        try:
            return await call
        except asyncio.CancelledError:  # the client went away: free the engine for others
            await asyncio.shield(session.engine.abort(f"{session.rid}-"))
            raise

    async def _open_stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        return response


async def _send(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    await response.write(f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode())


def renderer_for(engine: Engine, tool_call_format: str) -> ChatRenderer:
    """The chat renderer of ``engine``'s tokenizer with ``tool_call_format``, self-checked."""
    renderer = ChatRenderer(engine.tokenizer, tool_call_format)
    renderer.self_check()
    return renderer


def default_sampling(renderer: ChatRenderer, max_new_tokens: int = 256) -> SamplingParams:
    """Sampling for a gateway outside a run: temperature 1, the end-of-turn token stops."""
    return SamplingParams(max_new_tokens=max_new_tokens,
                          stop_token_ids=tuple(renderer.encode(renderer.end_of_turn)))

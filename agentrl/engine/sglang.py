"""The :class:`Engine` contract over SGLang's native HTTP API (one or more servers, optionally
behind ``sglang-router``).

Token-in/token-out: ``/generate`` with ``input_ids`` and ``return_logprob``; the sampled ids and
their log-probabilities come from ``meta_info.output_token_logprobs``. Every request carries its
rid (``r<rollout>-g<group>-s<sample>-t<turn>``) and, as ``routing_key``, its episode, so a router
keeps an episode on one worker (prefix cache). Requests go to the router when there is one, else
straight to a worker chosen per episode; control calls (abort, pause, weight updates, memory
release) always go to every worker, because the router does not forward them. Routing, retries,
concurrency bounds and failover are :class:`~agentrl.engine.http.HTTPEngine`'s, shared
with the vLLM client.

Weight updates follow SGLang's protocol: ``pause_generation`` (in place) -> push
(``update_weights_from_disk`` with ``flush_cache``) -> ``continue_generation``, with the version
recorded by the server and reported on every output.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import logging
import pickle
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal

from agentrl.engine.base import GenerateOutput, SamplingParams, episode_key
from agentrl.engine.http import HTTPEngine
from agentrl.errors import EngineError

__all__ = ["SGLangEngine", "generate_request", "serialize_named_tensors",
           "tensor_buckets"]

log = logging.getLogger(__name__)


def generate_request(input_ids: Sequence[int], sampling: SamplingParams, rid: str | None) -> dict[str, Any]:
    """The JSON body of one token-in ``/generate`` request (SGLang's field names and types)."""
    body: dict[str, Any] = {
        "input_ids": [int(t) for t in input_ids],
        "sampling_params": sampling.to_sglang(),
        "return_logprob": True,
        "logprob_start_len": -1,  # no prompt log-probs: only the sampled tokens'
        "top_logprobs_num": 0,
        "stream": False,
    }
    if rid is not None:
        body["rid"] = rid
        body["routing_key"] = episode_key(rid)
    return body


def tensor_buckets(state_dict: Mapping[str, Any], max_bytes: int) -> list[list[tuple[str, Any]]]:
    """``(name, tensor)`` pairs in order, grouped so that no group but a lone oversized tensor
    exceeds ``max_bytes``."""
    buckets: list[list[tuple[str, Any]]] = [[]]
    size = 0
    for name, tensor in state_dict.items():
        nbytes = tensor.numel() * tensor.element_size()
        if buckets[-1] and size + nbytes > max_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append((name, tensor))
        size += nbytes
    return buckets if buckets[0] else []


def serialize_named_tensors(pairs: Sequence[tuple[str, Any]]) -> str:
    """One ``serialized_named_tensors`` entry of ``/update_weights_from_tensor``: base64 of a
    pickle of ``[(hf_name, tensor), ...]``, which SGLang unpickles. CUDA tensors are pickled
    with torch's multiprocessing reductions (CUDA IPC handles: the server must share the GPU,
    i.e. be colocated); CPU tensors carry their bytes (any server that can be reached)."""
    buffer = io.BytesIO()
    if any(t.is_cuda for _, t in pairs):
        from torch.multiprocessing.reductions import ForkingPickler

        ForkingPickler(buffer, pickle.HIGHEST_PROTOCOL).dump([(name, t.detach()) for name, t in pairs])
    else:
        pickle.dump([(name, t.detach().contiguous()) for name, t in pairs], buffer, pickle.HIGHEST_PROTOCOL)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


class SGLangEngine(HTTPEngine):
    """SGLang servers as one engine.

    Build it with :meth:`connect` (waits until every worker generates); :meth:`close` releases
    the HTTP session (the servers keep running: their owner stops them).

    Args:
        worker_urls: Every server's base URL (``http://host:port``).
        bucket_bytes: Largest tensor-push request.
        **kwargs: :class:`~agentrl.engine.http.HTTPEngine`'s (``router_url``,
            ``tokenizer``, ``max_context_len``, ``concurrency``, ``max_retries``, ``timeout_s``,
            ``weight_version``, ``tp_size``: one serialized entry per rank in tensor pushes).
    """

    server_name = "SGLang"
    health_path = "/health_generate"

    def __init__(self, worker_urls: Sequence[str], *, bucket_bytes: int = 512 * 2**20,
                 **kwargs: Any) -> None:
        super().__init__(worker_urls, **kwargs)
        self.bucket_bytes = bucket_bytes
        self._released = False
        self._resuming = asyncio.Lock()

    async def _read_context_len(self, url: str) -> int:
        info = await self._request("GET", f"{url}/server_info")
        return int(info["context_length"])

    async def _before_generate(self) -> None:
        if self._released:
            await self._resume_all()

    async def _generate_on(self, base_url: str, input_ids: list[int], sampling: SamplingParams,
                           rid: str | None, *, retry_unreachable: bool) -> GenerateOutput:
        answer = await self._request("POST", f"{base_url}/generate", generate_request(input_ids, sampling, rid),
                                     retry_unreachable=retry_unreachable)
        if isinstance(answer, list):  # a batch answer to a single request: take its only item
            answer = answer[0]
        return GenerateOutput.from_sglang(answer)

    async def update_weights(
        self, *, state_dict: Mapping[str, Any] | None = None, path: str | None = None,
        version: str,
    ) -> None:
        """See :meth:`Engine.update_weights`: pause in place, load, flush the prefix cache,
        continue. ``path`` is a Hugging Face directory every server can read (``/update_weights
        _from_disk``); ``state_dict`` goes to ``/update_weights_from_tensor`` in buckets of at most
        ``bucket_bytes`` (see :func:`serialize_named_tensors`), the version set with the last.

        Raises:
            EngineError: A server refused the weights.
        """
        if (state_dict is None) == (path is None):
            raise EngineError("update_weights needs exactly one of state_dict and path")
        async with self._swapping_weights():
            if path is not None:
                answers = await self._each("POST", "/update_weights_from_disk", {
                    "model_path": path, "weight_version": str(version), "flush_cache": True,
                    "abort_all_requests": False})
            else:
                assert state_dict is not None
                answers = []
                buckets = tensor_buckets(state_dict, self.bucket_bytes)
                for i, bucket in enumerate(buckets):
                    last = i == len(buckets) - 1
                    answers += await self._each("POST", "/update_weights_from_tensor", {
                        "serialized_named_tensors": [serialize_named_tensors(bucket)] * self.tp_size,
                        "load_format": None, "flush_cache": last,
                        "weight_version": str(version) if last else None})
        failed = [a for a in answers if isinstance(a, dict) and not a.get("success", True)]
        if failed:
            source = f"from disk {path!r}" if path is not None else "from tensors"
            raise EngineError(f"updating weights {source} failed: {failed[0].get('message')}")
        self._version = str(version)
        self.last_weights_path = path

    async def init_weight_group(self, master_address: str, master_port: int, group_name: str,
                                backend: str = "nccl") -> int:
        """Every server's TP ranks join the trainer's weight-broadcast group (the trainer, rank
        0, joins concurrently; see :class:`~agentrl.engine.weight_group.WeightGroup`).
        Returns the group's world size."""
        live = [u for u in self.workers if u not in self.down]
        world_size = 1 + self.tp_size * len(live)
        await asyncio.gather(*(self._request("POST", f"{url}/init_weights_update_group", {
            "master_address": master_address, "master_port": master_port,
            "rank_offset": 1 + i * self.tp_size, "world_size": world_size,
            "group_name": group_name, "backend": backend}) for i, url in enumerate(live)))
        return world_size

    async def update_weights_from_distributed(self, metadata: Mapping[str, list[Any]], version: str,
                                              group_name: str) -> None:
        """Receives a broadcast from the trainer (which sends concurrently, in ``metadata``'s
        name order): pause in place, receive and load, continue.

        Raises:
            EngineError: A server failed to receive or load.
        """
        async with self._swapping_weights():
            answers = await self._each("POST", "/update_weights_from_distributed", {
                **metadata, "group_name": group_name, "weight_version": str(version),
                "flush_cache": True})
        failed = [a for a in answers if isinstance(a, dict) and not a.get("success", True)]
        if failed:
            raise EngineError(f"update_weights_from_distributed failed: {failed[0].get('message')}")
        self._version = str(version)

    @contextlib.asynccontextmanager
    async def _swapping_weights(self) -> AsyncIterator[None]:
        """Pause in place around a weight push; after a memory release, SGLang's order: weights
        back first, the push, then the KV cache."""
        if self._released:
            await self._each("POST", "/resume_memory_occupation", {"tags": ["weights"]})
        await self._each("POST", "/pause_generation", {"mode": "in_place"})
        try:
            yield
        finally:
            await self._each("POST", "/continue_generation", {})
            if self._released:
                await self._each("POST", "/resume_memory_occupation", {"tags": ["kv_cache", "cuda_graph"]})
                self._released = False

    async def pause(self, mode: Literal["abort", "in_place"] = "abort") -> None:
        await self._each("POST", "/pause_generation", {"mode": mode})

    async def resume(self) -> None:
        await self._each("POST", "/continue_generation", {})

    async def abort(self, rid_prefix: str = "") -> int:
        """Aborts on every worker (the router does not forward ``/abort_request``), then waits
        until no request is running. SGLang does not say how many it aborted: returns 0."""
        body = {"rid": rid_prefix} if rid_prefix else {"abort_all": True}
        await self._each("POST", "/abort_request", body)
        if not rid_prefix:
            await self.wait_idle()
        return 0

    async def wait_idle(self, timeout_s: float = 60.0) -> None:
        """Polls every worker's ``/v1/loads`` until nothing runs or waits."""
        deadline = time.monotonic() + timeout_s
        while True:
            loads = await self._each("GET", "/v1/loads")
            if all(_load(answer) == 0 for answer in loads):
                return
            if time.monotonic() > deadline:
                raise EngineError(f"SGLang servers still busy {timeout_s:.0f} s after abort")
            await asyncio.sleep(0.1)

    async def release_memory(self) -> None:
        """Colocated: every server frees its KV cache (and, with ``--enable-memory-saver``, its
        weights) while the trainer runs; the server must be idle. The next weight update takes
        the memory back in SGLang's order (weights, push, KV cache); so does the next request
        if no update comes first."""
        await self.wait_idle()  # SGLang refuses to release while requests run (aborted ones drain)
        await self._each("POST", "/release_memory_occupation", {})
        self._released = True

    async def _resume_all(self) -> None:
        async with self._resuming:
            if self._released:
                await self._each("POST", "/resume_memory_occupation", {})
                self._released = False

    async def wait_router(self, process: Any = None, wait_s: float = 120.0) -> None:
        """Waits until the router answers ``/health`` and routes a request (it probes its
        workers first).

        Raises:
            EngineError: It did not, or ``process`` (the router's) exited.
        """
        import aiohttp

        assert self.router is not None
        session = await self._client()
        deadline = time.monotonic() + wait_s
        while True:
            if process is not None and process.poll() is not None:
                raise EngineError(f"sglang-router exited with status {process.returncode}")
            try:
                async with session.get(f"{self.router}/health") as r:
                    if r.status == 200:
                        probe = generate_request([0], SamplingParams(max_new_tokens=1, temperature=0.0), None)
                        async with session.post(f"{self.router}/generate", json=probe) as g:
                            if g.status == 200:
                                return
            except (aiohttp.ClientError, asyncio.TimeoutError):  # noqa: UP041
                pass
            if time.monotonic() > deadline:
                raise EngineError(f"sglang-router at {self.router} did not route within {wait_s:.0f} s")
            await asyncio.sleep(0.3)


def _load(answer: Any) -> int:
    """Requests running or waiting, from a ``/v1/loads`` answer (any of SGLang's shapes)."""
    if not isinstance(answer, dict):
        return 0
    if "loads" in answer:
        return sum(int(x.get("num_running_reqs", 0)) + int(x.get("num_waiting_reqs", 0))
                   for x in answer["loads"])
    return int(answer.get("num_running_reqs", 0)) + int(answer.get("num_waiting_reqs", 0))

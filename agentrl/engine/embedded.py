"""An in-process inference engine: continuous batching over :class:`DecoderModel` on one thread.

:class:`EmbeddedEngine` serves the :class:`~agentrl.engine.base.Engine` contract without
a server: CPU for tests, demos and tiny models, CUDA when present. One dedicated scheduler thread
owns the model, the KV cache and every request's state; the asyncio side only enqueues work and
awaits futures, which the scheduler resolves with ``loop.call_soon_threadsafe``. torch releases
the GIL inside its kernels, so the event loop (and the tools it runs) stays responsive while the
model computes.

Each scheduler iteration: run control commands (abort, pause, weight updates, close), prefill
newly arrived requests into free cache slots (their first token comes from the prefill), then
one decode step for every active request. A request that arrives mid-generation therefore joins
the batch at the next step. Active requests always occupy slots ``0 .. n-1`` (a finished
request's slot is refilled by moving the last one), so decoding slices the cache instead of
gathering it.

Sampling is batched (:mod:`agentrl.engine.sampling`). A request with ``sampling_seed``
draws from its own ``torch.Generator``, one uniform number per token, and everything else it
depends on is computed row by row, so its output does not depend on what else is in the batch (up
to floating-point differences between batch shapes, which can flip near-ties).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from agentrl.engine.base import Engine, FinishReason, GenerateOutput, RoutedExperts, SamplingParams
from agentrl.engine.model import DecoderModel, read_checkpoint
from agentrl.engine.prefix_cache import PrefixStore
from agentrl.engine.sampling import sample_tokens
from agentrl.errors import EngineError
from agentrl.models.hf_config import load_tokenizer

__all__ = ["EmbeddedEngine", "load_tokenizer"]

logger = logging.getLogger(__name__)

_PREFILL_TOKEN_BUDGET = 8192
"""Most (padded) tokens one prefill call processes; more new requests wait for the next call."""

DEFAULT_PREFIX_CACHE_BYTES = 1 << 30
"""Keys and values of finished requests kept for later turns (:mod:`agentrl.engine.prefix_cache`):
1 GiB, about 23k positions of SmolLM2-135M in float32."""


@dataclasses.dataclass(eq=False)
class _Request:
    """One generate call's state, owned by the scheduler thread once submitted."""

    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    max_new: int
    stop_ids: frozenset[int]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[GenerateOutput]
    submitted: float
    generator: torch.Generator | None
    temperature: float
    output_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[str] = dataclasses.field(default_factory=list)  # per output id
    slot: int = -1
    cached: int = 0
    reused: int = 0  # prompt positions copied from the prefix store
    done: bool = False
    cancelled: bool = False


@dataclasses.dataclass(eq=False)
class _Command:
    """A control operation run on the scheduler thread between steps."""

    run: Callable[[], Any]
    loop: asyncio.AbstractEventLoop | None = None
    future: asyncio.Future[Any] | None = None


def _deliver(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    """Resolves ``future`` on its own loop (the caller may have given up on it)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


def _post(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], value: Any,
          error: BaseException | None = None) -> None:
    try:
        loop.call_soon_threadsafe(_deliver, future, value, error)
    except RuntimeError:
        pass  # the caller's loop is closed: nobody is waiting any more


class EmbeddedEngine(Engine):
    """Serves a :class:`DecoderModel` in process with continuous batching.

    Build it with :meth:`from_pretrained` (a Hugging Face directory) or from a loaded model.
    Call :meth:`close` (or use ``async with``) to stop the scheduler thread.
    """

    def __init__(
        self,
        model: DecoderModel,
        *,
        tokenizer: Any | None = None,
        max_batch_size: int = 32,
        max_context_len: int | None = None,
        seed: int = 0,
        weight_version: str = "0",
        eos_token_ids: Sequence[int] | None = None,
        prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
    ) -> None:
        """Starts the scheduler thread.

        Args:
            model: The model to serve (the engine owns it from now on).
            tokenizer: A Hugging Face tokenizer; needed only for stop strings.
            max_batch_size: Requests decoded together (KV cache slots); more wait in a queue.
            max_context_len: Longest prompt + output; default the model's
                ``max_position_embeddings``.
            seed: Seed of the engine's random stream (requests without ``sampling_seed``).
            weight_version: Version reported until the first :meth:`update_weights`.
            eos_token_ids: The model's end-of-sequence ids; default the config's.
            prefix_cache_bytes: Memory for the keys and values of finished requests, reused by
                later requests that start with the same tokens (the next turn of an episode);
                0 turns the reuse off.
        """
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self._model = model
        self.tokenizer = tokenizer
        self.max_context_len = int(max_context_len or model.config.max_position_embeddings)
        self.max_batch_size = max_batch_size
        self._eos_ids = frozenset(
            model.config.eos_token_ids if eos_token_ids is None else (int(t) for t in eos_token_ids)
        )
        self._decode_text = _text_decoder(tokenizer)
        self._version = str(weight_version)
        self._cache = model.new_cache(max_batch_size, self.max_context_len)
        self._prefixes = PrefixStore(prefix_cache_bytes)
        self._generator = torch.Generator().manual_seed(seed)
        self._rids = itertools.count()

        self._cond = threading.Condition()
        self._incoming: deque[_Request] = deque()  # guarded by _cond
        self._commands: deque[_Command] = deque()  # guarded by _cond
        self._wake = False  # guarded by _cond: a cancellation to sweep
        self._closed = False  # guarded by _cond
        self._error: BaseException | None = None
        # scheduler-thread state
        self._waiting: deque[_Request] = deque()
        self._active: list[_Request] = []
        self._paused = False
        self._stopping = False
        self._stats = {"requests_served": 0, "tokens_generated": 0, "decode_steps": 0,
                       "decode_rows": 0, "prefill_calls": 0, "prompt_tokens": 0,
                       "prompt_tokens_computed": 0}
        self._thread = threading.Thread(target=self._run, name="agentrl-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        device: str | torch.device | None = None,
        max_batch_size: int = 32,
        max_context_len: int | None = None,
        seed: int = 0,
        weight_version: str = "0",
        prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
    ) -> EmbeddedEngine:
        """Loads a Hugging Face model directory (weights, tokenizer if present, eos ids from
        ``config.json`` and ``generation_config.json``) and starts serving it."""
        root = Path(path)
        model = DecoderModel.from_pretrained(root, device=device)
        eos = set(model.config.eos_token_ids)
        gen_config = root / "generation_config.json"
        if gen_config.is_file():
            value = json.loads(gen_config.read_text()).get("eos_token_id")
            eos.update([value] if isinstance(value, int) else (value or []))
        return cls(
            model, tokenizer=load_tokenizer(root), max_batch_size=max_batch_size,
            max_context_len=max_context_len, seed=seed, weight_version=weight_version,
            eos_token_ids=sorted(eos), prefix_cache_bytes=prefix_cache_bytes,
        )

    # --- Engine API (caller side) -------------------------------------------------------

    @property
    def weight_version(self) -> str:
        return self._version

    @property
    def model(self) -> DecoderModel:
        """The served model (touch its weights only through :meth:`update_weights`)."""
        return self._model

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, rid: str | None = None
    ) -> GenerateOutput:
        """See :meth:`Engine.generate`. ``max_new_tokens`` is clipped to what fits in
        ``max_context_len``; a clipped request ends with ``length``."""
        ids = self._check_input(input_ids, sampling)
        max_new = min(sampling.max_new_tokens, self.max_context_len - len(ids))
        if max_new == 0:
            self._check_open()
            return GenerateOutput([], [], "length", self._version, prompt_tokens=len(ids))
        loop = asyncio.get_running_loop()
        generator = None
        if sampling.sampling_seed is not None and not sampling.greedy:
            generator = torch.Generator().manual_seed(sampling.sampling_seed)
        stop_ids = set(sampling.stop_token_ids)
        if not sampling.ignore_eos:
            stop_ids |= self._eos_ids
        request = _Request(
            rid=rid if rid is not None else f"req-{next(self._rids)}", input_ids=ids,
            sampling=sampling, max_new=max_new, stop_ids=frozenset(stop_ids), loop=loop,
            future=loop.create_future(), submitted=time.perf_counter(), generator=generator,
            temperature=1.0 if sampling.greedy else float(sampling.temperature),
        )
        with self._cond:
            self._check_open()
            self._incoming.append(request)
            self._cond.notify()
        try:
            return await request.future
        except asyncio.CancelledError:
            with self._cond:  # let the scheduler free the slot
                request.cancelled = True
                self._wake = True
                self._cond.notify()
            raise

    async def update_weights(
        self, *, state_dict: Mapping[str, Any] | None = None, path: str | None = None,
        version: str,
    ) -> None:
        """See :meth:`Engine.update_weights`. A directory is read off the scheduler thread, so
        decoding continues while it loads; the copy itself happens between two steps."""
        if (state_dict is None) == (path is None):
            raise EngineError("update_weights needs exactly one of state_dict and path")
        if path is not None:
            state_dict = await asyncio.to_thread(read_checkpoint, path)
        tensors = dict(state_dict)

        def apply() -> None:
            self._model.load_state_dict_inplace(tensors)
            self._prefixes.clear()  # computed with the old weights
            self._version = str(version)

        await self._call(apply)

    async def pause(self, mode: Literal["abort", "in_place"] = "abort") -> None:
        """See :meth:`Engine.pause`. Returns once no decode step is running."""
        if mode not in ("abort", "in_place"):
            raise ValueError(f"pause mode must be 'abort' or 'in_place', got {mode!r}")

        def apply() -> None:
            if mode == "abort":
                self._abort_matching("", "aborted by pause(mode='abort')")
            self._paused = True

        await self._call(apply)

    async def resume(self) -> None:
        def apply() -> None:
            self._paused = False

        await self._call(apply)

    async def abort(self, rid_prefix: str = "") -> int:
        return await self._call(
            lambda: self._abort_matching(rid_prefix, f"aborted by abort({rid_prefix!r})")
        )

    async def health(self) -> bool:
        """True while the scheduler runs, the engine is open and not paused."""
        return (not self._closed and self._error is None and self._thread.is_alive()
                and not self._paused)

    @property
    def alive(self) -> bool:
        """True while the scheduler thread runs and has not failed (paused or not): the liveness
        a supervisor restarts on, where :meth:`health` also says whether it serves right now."""
        return not self._closed and self._error is None and self._thread.is_alive()

    @property
    def shares_host_memory(self) -> bool:
        """On the CPU the KV cache is host RAM, which the trainer's processes use too."""
        return self._model.device.type == "cpu"

    async def release_memory(self) -> None:
        """Frees the KV cache while the engine is idle (a colocated trainer needs the memory);
        the next request allocates it again. SGLang's ``release_memory_occupation`` keeps the
        same precondition: nothing in flight.

        Raises:
            EngineError: Requests are in flight or waiting.
        """

        def apply() -> None:
            # requests whose callers gave up (a rollout that had enough groups) go first: the
            # scheduler sweeps them after commands, and they hold nothing anyone waits for
            self._sweep_cancelled()
            if self._active or self._waiting:
                raise EngineError(f"release_memory needs an idle engine: {len(self._active)} "
                                  f"requests decoding, {len(self._waiting)} waiting")
            self._cache.release()
            self._prefixes.clear()

        await self._call(apply)

    async def close(self) -> None:
        """Aborts what is in flight and stops the scheduler thread. Safe to call twice."""
        await asyncio.to_thread(self.shutdown)

    def shutdown(self) -> None:
        """Blocking :meth:`close`, for code without an event loop."""
        with self._cond:
            if not self._closed:
                self._closed = True
                self._commands.append(_Command(run=self._stop))
                self._cond.notify()
        self._thread.join()

    async def __aenter__(self) -> EmbeddedEngine:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def stats(self) -> dict[str, float]:
        """Counters since start: requests served, tokens generated, decode steps, prefill
        calls, prompt tokens received and computed (the rest came from the prefix store), mean
        decode batch size, and the current active / waiting counts."""
        s = dict(self._stats)
        s["mean_batch_size"] = s["decode_rows"] / s["decode_steps"] if s["decode_steps"] else 0.0
        s["active"] = len(self._active)
        s["waiting"] = len(self._waiting) + len(self._incoming)
        return s

    # --- caller-side helpers ------------------------------------------------------------

    def _check_open(self) -> None:
        if self._error is not None:
            raise EngineError(f"the engine's scheduler failed: {self._error!r}")
        if self._closed:
            raise EngineError("the engine is closed")

    def _check_input(self, input_ids: Sequence[int], sampling: SamplingParams) -> list[int]:
        ids = [int(t) for t in input_ids]
        if not ids:
            raise EngineError("input_ids is empty")
        if len(ids) > self.max_context_len:
            raise EngineError(f"input is {len(ids)} tokens; the context limit is "
                              f"{self.max_context_len}")
        vocab = self._model.config.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise EngineError(f"input_ids hold ids outside the vocabulary [0, {vocab})")
        if sampling.stop and self._decode_text is None:
            raise EngineError("stop strings need a tokenizer; this engine has none")
        return ids

    async def _call(self, run: Callable[[], Any]) -> Any:
        """Runs ``run`` on the scheduler thread between steps and returns its result."""
        loop = asyncio.get_running_loop()
        command = _Command(run=run, loop=loop, future=loop.create_future())
        with self._cond:
            self._check_open()
            self._commands.append(command)
            self._cond.notify()
        return await command.future

    # --- scheduler thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            with torch.inference_mode():
                while not self._stopping:
                    self._iterate()
        except BaseException as exc:  # every failure must reach the waiters
            logger.exception("embedded engine scheduler failed")
            self._error = exc
        finally:
            self._drain()

    def _iterate(self) -> None:
        for command in self._take_work():
            self._execute(command)
        if self._stopping:
            return
        self._sweep_cancelled()
        if self._paused:
            return
        self._admit()
        if self._active:
            self._decode_step()

    def _take_work(self) -> list[_Command]:
        """Waits until there is something to do; moves new requests to the waiting queue."""
        with self._cond:
            while not (self._commands or self._incoming or self._wake) and (
                self._paused or not (self._active or self._waiting)
            ):
                self._cond.wait()
            commands = list(self._commands)
            self._commands.clear()
            self._waiting.extend(self._incoming)
            self._incoming.clear()
            self._wake = False
        return commands

    def _execute(self, command: _Command) -> None:
        try:
            value, error = command.run(), None
        except Exception as exc:  # noqa: BLE001 - reported to the caller, the engine goes on
            value, error = None, exc
        if command.future is not None and command.loop is not None:
            _post(command.loop, command.future, value, error)

    def _stop(self) -> None:
        self._abort_matching("", "the engine was closed")
        self._stopping = True

    def _drain(self) -> None:
        """On exit: ends every request and command still queued."""
        with self._cond:
            self._closed = True
            self._waiting.extend(self._incoming)
            self._incoming.clear()
            commands = list(self._commands)
            self._commands.clear()
        if self._error is not None:
            error = EngineError(f"the engine's scheduler failed: {self._error!r}")
            for request in [*self._active, *self._waiting]:
                if not request.done:
                    request.done = True
                    _post(request.loop, request.future, None, error)
            self._active, self._waiting = [], deque()
        else:
            self._abort_matching("", "the engine was closed")
        for command in commands:
            if command.future is not None and command.loop is not None:
                _post(command.loop, command.future, None, EngineError("the engine is closed"))

    def _sweep_cancelled(self) -> None:
        if any(r.cancelled for r in self._waiting):
            self._waiting = deque(r for r in self._waiting if not r.cancelled)
        if any(r.cancelled for r in self._active):
            for request in self._active:
                request.done = request.done or request.cancelled
            self._compact()

    def _abort_matching(self, prefix: str, message: str) -> int:
        """Finishes waiting and active requests whose rid starts with ``prefix`` as aborted."""
        hits = [r for r in [*self._waiting, *self._active] if r.rid.startswith(prefix)]
        for request in hits:
            self._finish(request, "abort", message=message)
        if hits:
            self._waiting = deque(r for r in self._waiting if not r.done)
            self._compact()
        return len(hits)

    def _admit(self) -> None:
        """Prefills waiting requests into free slots, in budget-sized groups."""
        while self._waiting and len(self._active) < self.max_batch_size:
            group = self._next_prefill_group(self.max_batch_size - len(self._active))
            try:
                self._prefill_group(group)
            except BaseException as exc:
                # the group is in neither queue now: its callers would wait forever
                error = EngineError(f"the engine's scheduler failed: {exc!r}")
                for request in group:
                    if not request.done:
                        request.done = True
                        _post(request.loop, request.future, None, error)
                raise

    def _prefill_group(self, group: list[_Request]) -> None:
        """Computes ``group``'s prompts (from a stored prefix where one matches) into the next
        free slots, samples their first tokens and makes them active."""
        first_slot = len(self._active)
        for request, slot in zip(group, range(first_slot, first_slot + len(group)), strict=True):
            request.slot = slot
            hit = self._prefixes.lookup(request.input_ids)
            if hit is not None:  # the positions an earlier turn computed
                self._cache.write_slot(slot, hit.k, hit.v, hit.routes)
                request.reused = hit.length
        fresh = [r for r in group if not r.reused]
        extended = [r for r in group if r.reused]
        logits = {}
        if fresh:
            out = self._model.prefill(self._cache, [r.input_ids for r in fresh], [r.slot for r in fresh])
            logits.update(zip(map(id, fresh), out, strict=True))
        for request in extended:  # one at a time: padded together, a short suffix after a
            # long prefix would reach past the context limit
            out = self._model.extend(self._cache, [request.input_ids[request.reused :]],
                                     [request.slot], [request.reused])
            logits[id(request)] = out[0]
        self._stats["prefill_calls"] += 1
        for request in group:
            request.cached = len(request.input_ids)
            self._stats["prompt_tokens"] += len(request.input_ids)
            self._stats["prompt_tokens_computed"] += len(request.input_ids) - request.reused
        self._active.extend(group)
        self._consume(group, torch.stack([logits[id(r)] for r in group]))
        self._compact()

    def _next_prefill_group(self, free: int) -> list[_Request]:
        group = [self._waiting.popleft()]
        longest = len(group[0].input_ids)
        while self._waiting and len(group) < free:
            candidate = max(longest, len(self._waiting[0].input_ids))
            if candidate * (len(group) + 1) > _PREFILL_TOKEN_BUDGET:
                break
            longest = candidate
            group.append(self._waiting.popleft())
        return group

    def _decode_step(self) -> None:
        batch = self._active
        device = self._model.device
        tokens = torch.tensor([r.output_ids[-1] for r in batch], dtype=torch.long).to(device)
        logits = self._model.decode(self._cache, tokens, [r.cached for r in batch])
        for request in batch:
            request.cached += 1
        self._stats["decode_steps"] += 1
        self._stats["decode_rows"] += len(batch)
        self._consume(batch, logits)
        self._compact()

    def _consume(self, batch: list[_Request], logits: torch.Tensor) -> None:
        """Samples one token per request, records it, and finishes requests that stop."""
        tokens, logprobs = self._sample(batch, logits)
        self._stats["tokens_generated"] += len(batch)
        for request, token, logprob in zip(batch, tokens, logprobs, strict=True):
            request.output_ids.append(token)
            request.logprobs.append(logprob)
            request.versions.append(self._version)
            reason, matched = self._stop_reason(request, token)
            if reason is not None:
                self._finish(request, reason, matched)

    def _stop_reason(self, request: _Request, token: int) -> tuple[FinishReason | None, Any]:
        if token in request.stop_ids:
            return "stop", token
        if request.sampling.stop:
            matched = self._matched_stop_string(request)
            if matched is not None:
                return "stop", matched
        if len(request.output_ids) >= request.max_new:
            return "length", None
        return None, None

    def _matched_stop_string(self, request: _Request) -> str | None:
        """The stop string the output now contains, checking only a tail of the output.

        Any new match ends in the latest token, and a string of L characters spans at most
        4L + 1 tokens (a token is at least one UTF-8 byte), so that tail suffices.
        """
        longest = max(len(s) for s in request.sampling.stop)
        tail = request.output_ids[-(4 * longest + 2) :]
        text = self._decode_text(tail)
        for stop in request.sampling.stop:
            if stop and stop in text:
                return stop
        return None

    def _finish(self, request: _Request, reason: FinishReason, matched: Any = None,
                message: str | None = None) -> None:
        if request.done:
            return
        request.done = True
        self._stats["requests_served"] += 1
        if reason in ("stop", "length") and request.slot >= 0 and self._prefixes.keeps(request.cached):
            # what this request computed, for the next turn that starts with it
            tokens = [*request.input_ids, *request.output_ids][: request.cached]
            self._prefixes.add(tokens, *self._cache.read_slot(request.slot, request.cached),
                               self._cache.read_routes(request.slot, request.cached))
        output = GenerateOutput(
            output_ids=list(request.output_ids), output_logprobs=list(request.logprobs),
            finish_reason=reason, weight_version=self._version,
            prompt_tokens=len(request.input_ids), cached_tokens=request.reused, matched=matched,
            latency_s=time.perf_counter() - request.submitted, message=message,
            token_versions=list(request.versions), routed_experts=self._routes_of(request),
        )
        _post(request.loop, request.future, output)

    def _routes_of(self, request: _Request) -> RoutedExperts | None:
        """The experts each computed position of ``request`` was routed to (a mixture of
        experts' cache keeps them beside the keys and values); ``None`` for a dense model."""
        if request.slot < 0:
            return None
        routes = self._cache.read_routes(request.slot, request.cached)
        if routes is None:
            return None
        positions, layers, topk = routes.shape
        return RoutedExperts(routes.cpu().numpy().astype("<i2").tobytes(), positions, layers, topk)

    def _compact(self) -> None:
        """Drops finished requests, moving survivors so the active ones fill slots 0..n-1."""
        survivors = [r for r in self._active if not r.done]
        if len(survivors) == len(self._active):
            return
        count = len(survivors)
        holes = (slot for slot in range(count) if self._active[slot].done)
        for request in [r for r in survivors if r.slot >= count]:
            hole = next(holes)
            self._cache.move_slot(request.slot, hole, request.cached)
            request.slot = hole
        survivors.sort(key=lambda r: r.slot)
        self._active = survivors

    # --- sampling -----------------------------------------------------------------------

    def _sample(self, batch: list[_Request], logits: torch.Tensor) -> tuple[list[int], list[float]]:
        """Picks one token per row and its ``log_softmax(logits / T)`` log-probability."""
        device = logits.device
        tokens, chosen = sample_tokens(
            logits,
            temperature=torch.tensor([r.temperature for r in batch], device=device),
            greedy=torch.tensor([r.sampling.greedy for r in batch], device=device),
            top_k=torch.tensor([r.sampling.top_k for r in batch], device=device),
            top_p=torch.tensor([r.sampling.top_p for r in batch], device=device),
            uniforms=self._uniforms(batch).to(device),
        )
        return tokens.tolist(), chosen.tolist()

    def _uniforms(self, batch: list[_Request]) -> torch.Tensor:
        """One uniform per row: from the request's own generator when it has a seed (so its draw
        never depends on the other rows), else from the engine's."""
        values = torch.zeros(len(batch))
        shared = [i for i, r in enumerate(batch) if r.generator is None and not r.sampling.greedy]
        if shared:
            values[shared] = torch.rand(len(shared), generator=self._generator)
        for i, request in enumerate(batch):
            if request.generator is not None and not request.sampling.greedy:
                values[i] = torch.rand((), generator=request.generator)
        return values


def _text_decoder(tokenizer: Any | None) -> Callable[[list[int]], str] | None:
    """A fast ids -> text function keeping special tokens (the Rust decoder when there is one)."""
    if tokenizer is None:
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return lambda ids: backend.decode(ids, skip_special_tokens=False)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=False,
                                        clean_up_tokenization_spaces=False)

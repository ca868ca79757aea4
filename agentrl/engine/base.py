"""The inference-engine contract the rollout talks to, shaped on SGLang's native API.

Token-in/token-out: a request is a list of token ids (the whole sequence so far) and sampling
parameters; the answer is the sampled ids, the log-probability of each, why generation stopped and
which weights produced it. Implementations: :class:`~agentrl.engine.EmbeddedEngine`
(torch, in process; CPU and GPU), and the HTTP clients of SGLang servers
(:mod:`agentrl.engine.sglang`) and vLLM servers (:mod:`agentrl.engine.vllm`).
Field names follow SGLang's ``/generate`` request and response.
"""

from __future__ import annotations

import abc
import base64
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Generic, Literal, Protocol, TypeVar, runtime_checkable

__all__ = ["Engine", "EpisodeAffinity", "FinishReason", "GenerateOutput", "SamplingParams", "episode_key",
           "spans_from_versions", "versions_from_spans"]

Worker = TypeVar("Worker")

FinishReason = Literal["stop", "length", "abort"]
"""``stop``: a stop token id or stop string matched (or the model's end-of-sequence token);
``length``: ``max_new_tokens`` reached; ``abort``: the request was aborted (``abort``, ``pause``
in abort mode, shutdown). Rollout maps them to ``completed`` / ``truncated`` / ``aborted``."""

GREEDY_TEMPERATURE = 1e-6
"""Temperatures below this mean greedy decoding (as in SGLang)."""


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling parameters (SGLang's ``sampling_params`` names).

    Attributes:
        max_new_tokens: Tokens to generate at most (>= 0).
        temperature: Softmax temperature; below ``1e-6`` means greedy.
        top_p: Nucleus sampling mass in (0, 1].
        top_k: Keep the ``top_k`` most likely tokens; ``-1`` keeps all.
        stop: Stop strings. Generation ends once the decoded output contains one; the tokens
            that completed it stay in the output (SGLang's ``no_stop_trim=True``).
        stop_token_ids: Token ids that end generation; the matched id stays in the output.
        ignore_eos: Do not stop on the model's own end-of-sequence token(s).
        sampling_seed: Seed of this request's random stream; ``None`` draws from the engine's.
    """

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    sampling_seed: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        problems = []
        if self.max_new_tokens < 0:
            problems.append(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.temperature < 0:
            problems.append(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            problems.append(f"top_k must be -1 (all) or >= 1, got {self.top_k}")
        if problems:
            raise ValueError("invalid sampling params: " + "; ".join(problems))

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    def replace(self, **changes: Any) -> SamplingParams:
        return dataclasses.replace(self, **changes)

    def to_sglang(self) -> dict[str, Any]:
        """The ``sampling_params`` object of an SGLang ``/generate`` request."""
        out: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "stop": list(self.stop),
            "stop_token_ids": list(self.stop_token_ids),
            "ignore_eos": self.ignore_eos,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
            "no_stop_trim": True,
        }
        if self.sampling_seed is not None:
            out["sampling_seed"] = self.sampling_seed
        return out


@dataclasses.dataclass(frozen=True)
class RoutedExperts:
    """The experts a mixture-of-experts router chose, for each position of a sequence and each
    MoE layer: ``[positions, layers, topk]`` expert indices, row-major, as little-endian int16
    bytes (a position's experts in the router's score order, best first).

    Position ``t`` is the token at index ``t`` of the sequence as input: an engine reports every
    position it ran, which is all of them but the last sampled token (never fed back). This is
    what routing replay gives the trainer (``--routing-replay``), and what vLLM answers with as
    ``routed_experts`` (shape ``[tokens - 1, layers, topk]``).
    """

    data: bytes
    positions: int
    layers: int
    topk: int

    def __post_init__(self) -> None:
        if len(self.data) != 2 * self.positions * self.layers * self.topk:
            raise ValueError(f"RoutedExperts: {len(self.data)} bytes do not hold "
                             f"[{self.positions}, {self.layers}, {self.topk}] int16 values")

    def to_json(self) -> dict[str, Any]:
        """A JSON object: the shape and the bytes in base64."""
        return {"shape": [self.positions, self.layers, self.topk],
                "int16_b64": base64.b64encode(self.data).decode("ascii")}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RoutedExperts:
        positions, layers, topk = (int(n) for n in data["shape"])
        return cls(base64.b64decode(data["int16_b64"]), positions, layers, topk)

    def head(self, positions: int) -> RoutedExperts:
        """The first ``positions`` positions."""
        positions = min(positions, self.positions)
        return RoutedExperts(self.data[: 2 * positions * self.layers * self.topk], positions,
                             self.layers, self.topk)


@dataclasses.dataclass
class GenerateOutput:
    """What one ``generate`` call returns (SGLang's ``output_ids`` and ``meta_info``).

    Attributes:
        output_ids: The sampled token ids, in order (a matched stop token included).
        output_logprobs: One log-probability per sampled id, under the distribution it was
            sampled from before top-k/top-p truncation: ``log_softmax(logits / temperature)``
            (temperature 1 when greedy), the quantity the trainer recomputes.
        finish_reason: See :data:`FinishReason`.
        matched: The stop token id or stop string that ended generation, if any.
        weight_version: Version of the weights served when the output finished: the newest
            version among its tokens.
        token_versions: One weight version per ``output_ids`` entry, in order, when the engine
            knows each token's: a request spanning an in-flight update has the older version on
            its first tokens. ``None``: the engine reports only ``weight_version``.
        prompt_tokens: Length of ``input_ids``.
        cached_tokens: Prompt tokens served from a prefix cache (0 when there is none).
        latency_s: Seconds from submission to completion.
        message: Why the request was aborted, for ``abort``.
        routed_experts: For a mixture-of-experts model whose engine reports them: the experts
            each position of ``input_ids + output_ids`` but the last was routed to.
    """

    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: FinishReason
    weight_version: str
    prompt_tokens: int
    matched: int | str | None = None
    cached_tokens: int = 0
    latency_s: float = 0.0
    message: str | None = None
    token_versions: list[str] | None = None
    routed_experts: RoutedExperts | None = None

    @classmethod
    def from_sglang(cls, response: Mapping[str, Any]) -> GenerateOutput:
        """Reads an SGLang ``/generate`` response (one item, not a batch). SGLang reports one
        ``weight_version``; ``meta_info["weight_versions"]`` (agentrl's compatible server, the
        spans of :func:`versions_from_spans`) gives each token's."""
        meta = response["meta_info"]
        reason = meta.get("finish_reason") or {"type": "abort", "message": "no finish_reason"}
        pairs = meta.get("output_token_logprobs") or []
        ids = [int(p[1]) for p in pairs] if pairs else list(response.get("output_ids", []))
        return cls(
            output_ids=ids,
            output_logprobs=[float(p[0]) for p in pairs],
            finish_reason=reason["type"],
            matched=reason.get("matched"),
            message=reason.get("message"),
            weight_version=str(meta.get("weight_version", "default")),
            prompt_tokens=int(meta.get("prompt_tokens", 0)),
            cached_tokens=int(meta.get("cached_tokens", 0)),
            latency_s=float(meta.get("e2e_latency", 0.0)),
            token_versions=versions_from_spans(meta.get("weight_versions"), len(ids)),
        )


def versions_from_spans(spans: Sequence[Mapping[str, Any]] | None, length: int) -> list[str] | None:
    """Per-token versions from weight-version spans ``[{"version", "start", "end"}, ...]``
    (token index ``start`` included, ``end`` excluded), the form vLLM answers with.

    Returns:
        ``length`` versions, or ``None`` when there are no spans or they do not cover exactly
        ``0..length`` in order (the output then reports only its newest version).
    """
    if not spans:
        return None
    versions: list[str] = []
    for span in spans:
        start, end = int(span["start"]), int(span["end"])
        if start != len(versions) or end < start:
            return None
        versions.extend([str(span["version"])] * (end - start))
    return versions if len(versions) == length else None


def spans_from_versions(versions: Sequence[str]) -> list[dict[str, Any]]:
    """The inverse of :func:`versions_from_spans`: runs of equal versions as spans."""
    spans: list[dict[str, Any]] = []
    for i, version in enumerate(versions):
        if spans and spans[-1]["version"] == version:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": version, "start": i, "end": i + 1})
    return spans


def episode_key(rid: str | None) -> str | None:
    """The episode a request id belongs to: ``r3-g7-s1-t2`` -> ``r3-g7-s1`` (a rid without a
    ``-t<turn>`` suffix is its own episode). Engines with several workers keep an episode's
    requests on one worker, where its prefix is cached."""
    if rid is None:
        return None
    head, sep, turn = rid.rpartition("-t")
    return head if sep and turn.isdigit() else rid


class EpisodeAffinity(Mapping[str, Worker], Generic[Worker]):
    """Sticky least-loaded routing over several workers: an episode's first request goes to the
    least-loaded live worker, its later turns to the same one while it stays live (their shared
    prefix is cached there). Reads as a mapping episode -> worker.

    Args:
        limit: episodes remembered; past it the table starts afresh (old episodes are done).
    """

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self._workers: dict[str, Worker] = {}

    def pick(self, episode: str | None, live: Sequence[Worker], load: Callable[[Worker], int]) -> Worker:
        """The worker for ``episode`` (None: no affinity) among ``live`` (non-empty, in order of
        preference on equal ``load``)."""
        worker = self._workers.get(episode) if episode is not None else None
        if worker is not None and worker in live:
            return worker
        worker = min(live, key=load)
        if episode is not None:
            if len(self._workers) >= self.limit:
                self._workers.clear()
            self._workers[episode] = worker
        return worker

    def forget(self, worker: Worker) -> None:
        """Drops every episode on ``worker`` (it died or was replaced)."""
        self._workers = {k: w for k, w in self._workers.items() if w != worker}

    def clear(self) -> None:
        self._workers.clear()

    def __getitem__(self, episode: str) -> Worker:
        return self._workers[episode]

    def __iter__(self) -> Iterator[str]:
        return iter(self._workers)

    def __len__(self) -> int:
        return len(self._workers)


class Engine(abc.ABC):
    """A policy-serving engine: many concurrent token-in/token-out requests.

    All methods are coroutines and safe to call concurrently from one event loop. Requests that
    arrive while others decode are batched with them (continuous batching).

    Attributes:
        tokenizer: The served model's Hugging Face tokenizer (``None`` when the engine was
            given none): episodes render chat templates with it.
        max_context_len: Prompt + response tokens one request may hold (``None`` until the
            engine knows it, e.g. before a server answered).
    """

    tokenizer: Any = None
    max_context_len: int | None = None
    takes_tensors: bool = True
    """``update_weights(state_dict=...)`` reaches the model in memory (the embedded engine,
    engine actors); ``False`` for servers in processes of their own, for which ``--weight-sync
    auto`` writes a folder they load (``tensor`` still serialises the tensors to them where the
    server can take them, as SGLang's can)."""
    takes_weight_refs: bool = False
    """``update_weights`` also takes a Ray object reference to the state dict (engine actors read
    it from the object store, never copied through the driver)."""

    @abc.abstractmethod
    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, rid: str | None = None
    ) -> GenerateOutput:
        """Generates a continuation of ``input_ids``.

        Args:
            input_ids: The full sequence so far (prompt and earlier turns).
            sampling: Sampling parameters for this request.
            rid: Request id; :meth:`abort` matches it by prefix. Unique ids are the caller's job.

        Returns:
            The output. Aborting is not an error: it returns ``finish_reason="abort"`` with the
            tokens sampled so far.

        Raises:
            EngineError: The engine is closed or broken, or ``input_ids`` is too long.
        """

    @abc.abstractmethod
    async def update_weights(
        self, *, state_dict: Mapping[str, Any] | None = None, path: str | None = None,
        version: str,
    ) -> None:
        """Replaces the weights in place, between decode steps, and sets the weight version.

        Exactly one of ``state_dict`` (Hugging Face parameter names -> tensors) and ``path`` (a
        Hugging Face model directory) is given. Requests in flight continue with the new weights
        from their next token on unless the engine was paused first (the rollout pauses, updates,
        resumes, as with SGLang). A request spanning an update reports the newer version as
        ``weight_version`` and, where the engine knows them, each token's in ``token_versions``
        (the tokens after the update were sampled by the new weights over a prefix whose cache
        the old ones computed; the rollout log-probs are what was sampled, so importance
        weights account for it).

        Raises:
            EngineError: A name or shape does not match the served model (nothing is changed).
        """

    @abc.abstractmethod
    async def pause(self, mode: Literal["abort", "in_place"] = "abort") -> None:
        """Stops generating. ``abort``: requests in flight finish with ``abort``; ``in_place``:
        they wait, keeping their state, until :meth:`resume`. New requests wait while paused."""

    @abc.abstractmethod
    async def resume(self) -> None:
        """Continues after :meth:`pause`."""

    @abc.abstractmethod
    async def abort(self, rid_prefix: str = "") -> int:
        """Aborts requests whose rid starts with ``rid_prefix`` (``""``: all). Returns how many."""

    @abc.abstractmethod
    async def health(self) -> bool:
        """True when the engine can serve a request now."""

    @property
    @abc.abstractmethod
    def weight_version(self) -> str:
        """The version of the weights currently served."""

    async def release_memory(self) -> None:
        """Frees memory a colocated trainer needs (the KV cache) until the next request or
        weight update brings it back. Default: nothing to free."""
        return None

    @property
    def shares_host_memory(self) -> bool:
        """Whether the engine's memory is the trainer's too without ``--colocate`` (an engine
        on this machine's CPU, whose KV cache is host RAM): ``train.py`` then has it
        :meth:`release_memory` before each train step. Default: ``False``."""
        return False

    @abc.abstractmethod
    async def close(self) -> None:
        """Aborts what is in flight and frees the engine. Safe to call twice."""


@runtime_checkable
class LoadsAdapters(Protocol):
    """An engine that serves LoRA adapters loaded from a PEFT folder on its base model, without
    reloading weights (vLLM servers: :meth:`~agentrl.engine.vllm.VLLMEngine.update_adapter`);
    ``--weight-sync adapter`` needs one."""

    async def update_adapter(self, path: str, *, version: str) -> None:
        """Serves the adapters in ``path`` as ``version`` from the next request on."""


@runtime_checkable
class JoinsWeightGroup(Protocol):
    """An engine whose servers join the trainer's weight-broadcast group and receive the
    tensors over it (SGLang servers); ``--weight-sync broadcast`` needs one.

    Attributes:
        workers: The servers' URLs.
        down: The URLs of servers taken out of rotation (they do not join).
        tp_size: Tensor-parallel ranks per server (each joins the group).
    """

    workers: list[str]
    down: set[str]
    tp_size: int

    async def init_weight_group(self, master_address: str, master_port: int, group_name: str,
                                backend: str = "nccl") -> int:
        """Every live server's ranks join the group; returns its world size."""

    async def update_weights_from_distributed(self, metadata: Mapping[str, list[Any]], version: str,
                                              group_name: str) -> None:
        """Receives one broadcast of tensors named and shaped by ``metadata``."""

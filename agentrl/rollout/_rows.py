"""Reading prompt rows for :mod:`agentrl.rollout.data`: JSONL and Parquet readers, the row
parser and validator, the seeded shuffle buffer and the prefetching worker pool."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import queue
import random
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agentrl.env.messages import message_problem
from agentrl.env.tasks import TaskFields
from agentrl.errors import DataError
from agentrl.rollout.config import RolloutConfig

MAX_ROW_BYTES = 64 << 20
"""JSONL rows longer than this are skipped unread (reported with file and line): a prompt of
tens of millions of tokens fits no context, and holding it would only exhaust memory."""
CHUNK_ROWS = 64  # rows per prefetch job: large enough to amortise the hand-off between threads


def epoch_rng(seed: int, epoch: int) -> random.Random:
    # A hash, not seed + epoch, so that (seed 1, epoch 0) and (seed 0, epoch 1) differ.
    digest = hashlib.sha256(f"agentrl-data:{seed}:{epoch}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def env_seed(seed: int, split: str, k: int) -> int:
    """The ``k``-th env seed of ``split`` in a run seeded with ``seed``.

    Hashed, so runs with different ``--rollout-seed`` see different seeds; the lowest bit is
    the split's (0 for ``train``, 1 for any other), so training seeds never equal eval seeds.
    """
    digest = hashlib.sha256(f"agentrl-env-seed:{seed}:{split}:{k}".encode()).digest()
    return (int.from_bytes(digest[:4], "big") & 0x7FFFFFFE) | (split != "train")


def as_rollout_config(args: Any) -> RolloutConfig:
    """``args`` as a :class:`RolloutConfig`: itself, or built from the attributes of a
    namespace that name config fields (the rest take the config's defaults; not validated,
    as plug-in namespaces may hold only what a data source needs)."""
    if isinstance(args, RolloutConfig):
        return args
    names = {f.name for f in dataclasses.fields(RolloutConfig)}
    values = {k: v for k, v in vars(args).items() if k in names and v is not None}
    return RolloutConfig(**values)


@dataclasses.dataclass
class Record:
    """A validated row: what every sample of its group is built from."""

    row: dict[str, Any]
    prompt: Any  # None: ask the env's make_prompt (env task rows without an input_key field)
    label: Any
    metadata: dict[str, Any]
    source: dict[str, Any]


@dataclasses.dataclass
class Item:
    """One raw row after parsing, with where the reader stood after it (for ``state_dict``)."""

    record: Record | None
    reason: str | None
    line: int
    position: int  # rows of the epoch's order consumed once this one is
    offset: int  # JSONL byte offset / Parquet row after this row (unshuffled streaming only)


def shuffle_buffer(items: Iterator[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """Approximate shuffle in O(size) memory: emit a random buffered item for each new one."""
    buffer: list[Any] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        j = rng.randrange(size)
        buffer[j], item = item, buffer[j]
        yield item
    rng.shuffle(buffer)
    yield from buffer


def read_rows(
    path: Path, parquet: bool, offset: int = 0, line: int = 0
) -> Iterator[tuple[int, Any, int]]:
    """``(line, payload, offset after it)`` in file order from ``offset``, read lazily: JSONL
    lines as bytes (byte offsets), Parquet rows as dicts (row offsets)."""
    if parquet:
        yield from read_parquet(path, offset)
        return
    with open(path, "rb") as f:
        f.seek(offset)
        while raw := f.readline(MAX_ROW_BYTES + 1):  # line by line: never the whole file
            line += 1
            offset += len(raw)
            if len(raw) > MAX_ROW_BYTES and not raw.endswith(b"\n"):
                size = len(raw)
                while rest := f.readline(1 << 20):  # past the rest of the row, keeping none of it
                    size, offset = size + len(rest), offset + len(rest)
                    if rest.endswith(b"\n"):
                        break
                yield line, OverlongRow(size), offset
            elif raw.strip():  # blank lines (e.g. a trailing newline) hold no row
                yield line, raw, offset


@dataclasses.dataclass(frozen=True)
class OverlongRow:
    """Stands in for a JSONL line longer than :data:`MAX_ROW_BYTES` (never held in memory)."""

    size: int


def read_parquet(path: Path, start: int) -> Iterator[tuple[int, Any, int]]:
    import pyarrow as pa
    import pyarrow.parquet as pq  # heavy; only Parquet users pay for it

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"--prompt-data {str(path)!r} is not a readable Parquet file ({exc}); "
                        "check the file, or give JSONL rows a .jsonl name") from exc
    with pf:
        row, groups = 0, []
        for g in range(pf.num_row_groups):  # row groups wholly before ``start`` are not read
            n = pf.metadata.row_group(g).num_rows
            if not groups and row + n <= start:
                row += n
            else:
                groups.append(g)
        if not groups:
            return
        for batch in pf.iter_batches(batch_size=1024, row_groups=groups):
            skip = min(max(start - row, 0), batch.num_rows)
            row += skip
            for payload in batch.slice(skip).to_pylist():
                row += 1
                yield row, payload, row


@dataclasses.dataclass(frozen=True)
class RowParser:
    """Parses and validates rows. Kept apart from the data source so that prefetch threads hold
    no reference to it (an abandoned source is collected, which stops its threads)."""

    path: str
    input_key: str
    label_key: str
    metadata_key: str
    tool_key: str | None
    keep_offset: bool  # byte offsets mean nothing in shuffled order
    prompt_optional: bool = False  # rows are env tasks: the env builds the prompt
    task_fields: TaskFields | None = None  # what --env's tasks need of a row (checked here)
    env_id: str | None = None  # --env, for the messages

    def job(self, job: tuple[tuple[int, Any, int], int]) -> Item:
        """Parses ``(raw row, position after it)``."""
        (line, payload, offset), position = job
        offset = offset if self.keep_offset else 0
        if isinstance(payload, OverlongRow):
            return Item(None, f"the row is {payload.size / 2**20:.0f} MiB; rows over "
                        f"{MAX_ROW_BYTES >> 20} MiB are skipped (no model context holds such a "
                        "prompt): shorten it", line, position, offset)
        if isinstance(payload, bytes):
            try:
                payload = json.loads(payload)
            except ValueError as exc:
                hint = " (a .json file must hold one object per line, not an array)" if (
                    payload.lstrip().startswith(b"[")) else ""
                return Item(None, f"not valid JSON ({exc}){hint}; fix or delete the line",
                             line, position, offset)
        record = self.validate(payload, line)
        if isinstance(record, str):
            return Item(None, record, line, position, offset)
        return Item(record, None, line, position, offset)

    def validate(self, row: Any, line: int) -> Record | str:
        """The row as a record, or the reason it is unusable (with the fix)."""
        if not isinstance(row, dict):
            return f"a row must be a JSON object, got {type(row).__name__}"
        if self.task_fields is not None:  # a task of --env: the env builds the prompt from it
            task = self.task_fields.task_from(row, self.input_key, self.label_key)
            if isinstance(task, str):
                return f"not a task of --env {self.env_id}: {task}"
            label = task.get(self.task_fields.label) if self.task_fields.label else row.get(self.label_key)
            return self._record(task, None, line, label)
        key = self.input_key
        if key not in row and self.prompt_optional:
            return self._record(row, None, line)
        if key not in row:
            return (f"no {key!r} field (--input-key); the row has {sorted(row)[:8]}: add the "
                    "field or pass --input-key NAME")
        prompt = row[key]
        if isinstance(prompt, str):
            if not prompt.strip():
                return f"{key!r} is an empty string; give the prompt text"
        elif isinstance(prompt, list):
            if not prompt:
                return f"{key!r} is an empty message list; give at least one message"
            for i, message in enumerate(prompt):
                problem = message_problem(message, strict=False)
                if problem is not None:
                    return (f"{key}[{i}] {problem}; each message needs 'role' and 'content', "
                            'e.g. {"role": "user", "content": "..."}')
        else:
            return (f"{key!r} must be a string or a list of chat messages, got "
                    f"{type(prompt).__name__}")
        return self._record(row, prompt, line)

    def _record(self, row: dict[str, Any], prompt: Any, line: int, label: Any = None) -> Record | str:
        metadata = json_field(row, self.metadata_key, dict, "an object")
        if isinstance(metadata, str):
            return metadata
        metadata = dict(metadata or {})
        if self.tool_key is not None:
            tools = json_field(row, self.tool_key, list, "a list of tool schemas")
            if isinstance(tools, str):
                return tools
            if tools is not None:
                metadata["tools"] = tools
        source = {"file": self.path, "line": line}
        return Record(row, prompt, label if label is not None else row.get(self.label_key), metadata,
                      source)


def json_field(row: dict[str, Any], key: str, kind: type, what: str) -> Any:
    """``row[key]`` as ``kind`` (a JSON string of it is decoded, as Parquet often stores nested
    data), ``None`` when absent, or the problem as a ``str``."""
    value = row.get(key)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return f"{key!r} is a string that is not JSON; it must be {what}"
    if value is not None and not isinstance(value, kind):
        return f"{key!r} must be {what}, got {type(value).__name__}"
    return value


class Prefetcher:
    """Applies ``fn`` to chunks of ``source`` in worker threads, yielding results in order.

    A feeder thread submits chunks; their futures wait in a bounded FIFO queue, so at most
    ``depth`` chunks are in memory and the consumer resolves them in submission order.
    """

    _END = object()

    def __init__(self, source: Iterator[Any], fn: Callable[[Any], Any], workers: int) -> None:
        self._fn = fn
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="agentrl-data")
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=2 * workers)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._feed, args=(source,), name="agentrl-data-feeder", daemon=True
        )
        self._thread.start()

    def _chunk_job(self, chunk: list[Any]) -> list[Any]:
        return [self._fn(x) for x in chunk]

    def _feed(self, source: Iterator[Any]) -> None:
        try:
            while chunk := list(itertools.islice(source, CHUNK_ROWS)):
                if not self._put(self._pool.submit(self._chunk_job, chunk)):
                    return
            self._put(self._END)
        except BaseException as exc:  # noqa: BLE001 - a reader failure must reach the consumer
            self._put(exc)
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[Any]:
        while True:
            item = self._queue.get()
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, Future)
            yield from item.result()

    def close(self) -> None:
        """Stops the feeder and the workers; safe to call twice."""
        self._stop.set()
        self._thread.join()
        self._pool.shutdown(wait=True, cancel_futures=True)


def inline(jobs: Iterator[Any], fn: Callable[[Any], Item]) -> Iterator[Item]:
    try:
        yield from map(fn, jobs)
    finally:  # closes the file now rather than at garbage collection
        close = getattr(jobs, "close", None)
        if close is not None:
            close()


def prefetched(jobs: Iterator[Any], fn: Callable[[Any], Item], workers: int) -> Iterator[Item]:
    prefetcher = Prefetcher(jobs, fn, workers)
    try:
        yield from prefetcher
    finally:  # on exhaustion, close() (new epoch, load_state_dict) or garbage collection
        prefetcher.close()

"""Data sources: where the prompts of each rollout come from.

:class:`RolloutDataSource` turns rows of a prompt file (``--prompt-data``: JSONL or Parquet) or
the tasks of an environment (``--env``) into GROUPS: one list of ``--n-samples-per-prompt``
fresh :class:`~agentrl.rollout.Sample` objects per prompt, sharing an explicit ``group_id``.
:class:`~agentrl.rollout.buffer.RolloutDataSourceWithBuffer` adds a buffer that generated (e.g. partially rolled out)
groups go back into, served first through an overridable ``buffer_filter``.

Guarantees:

* Order is reproducible: epoch ``e`` is a permutation seeded by ``(--rollout-seed, e)``
  (``--rollout-shuffle``), or file order. ``save``/``load`` resume exactly where the source
  stopped: the groups after a restart equal those of an uninterrupted run.
* Malformed rows are skipped but never silently: each is logged with ``file:line``, the reason
  and the fix, and recorded in ``skipped_rows``. A file without a usable row is a ``DataError``.
  Rows found unusable only once played (a prompt longer than the context: the renderer, and so
  the token count, is known to the rollout, not here) come back through :meth:`skip_row`:
  reported the same way, and not served again.
* ``--streaming-data`` reads JSONL line by line and Parquet batch by batch, so memory does not
  grow with the file. Its shuffle is APPROXIMATE: a seeded shuffle buffer of
  ``--shuffle-buffer-size`` rows, so rows far apart in the file rarely swap. ``--num-data-workers
  N`` parses rows ahead in N threads; the order is the same as with one.

Imported on first use: ``RolloutDataSourceWithBuffer`` (its module subclasses this one's source).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import itertools
import json
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from agentrl.env.factory import EnvFactory
from agentrl.env.messages import message_problem
from agentrl.errors import ConfigError, DataError
from agentrl.records.sample import Sample
from agentrl.rollout._rows import (
    Item,
    Record,
    RowParser,
    as_rollout_config,
    env_seed,
    epoch_rng,
    inline,
    prefetched,
    read_rows,
    shuffle_buffer,
)
from agentrl.rollout.build import env_factory

__all__ = [
    "RolloutDataSource",
    "SkippedRow",
    "as_rollout_config",
    "check_count",
    "env_seed",
    "row_location",
]

logger = logging.getLogger(__name__)

STATE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class SkippedRow:
    """A row that was not used, and why.

    Attributes:
        file: The prompt file (or ``env <id> split <split>`` for an env's task set).
        line: 1-based line of a JSONL file, row of a Parquet file, or task index + 1.
        reason: What is wrong and how to fix it.
    """

    file: str
    line: int
    reason: str


def row_location(source: Mapping[str, Any]) -> tuple[str, int]:
    """Where a sample's row is (``sample.metadata["source"]``), as :class:`SkippedRow` names
    it: ``(file, line)``, or ``("env <id> split <split>", task index + 1)``."""
    if "file" in source:
        return str(source["file"]), int(source["line"])
    return f"env {source.get('env')} split {source.get('split')}", int(source.get("index", -1)) + 1


def report_skipped(row: SkippedRow) -> None:
    """Logs a skipped row (``skipping FILE:LINE: REASON``), the one way rows are reported."""
    logger.warning("skipping %s:%d: %s", row.file, row.line, row.reason)


def check_count(num_samples: Any) -> None:
    """Raises ValueError unless ``num_samples`` (a ``get_samples`` argument) is an int >= 0."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 0:
        raise ValueError(f"num_samples must be an int >= 0, got {num_samples!r}")


class RolloutDataSource:
    """Prompts as groups of fresh samples, from ``--prompt-data`` or the ``--env`` task set.

    Args:
        args: The rollout config (``prompt_data``, ``input_key``, ``label_key``,
            ``metadata_key``, ``tool_key``, ``rollout_shuffle``, ``rollout_seed``,
            ``n_samples_per_prompt``, ``streaming_data``, ``shuffle_buffer_size``,
            ``num_data_workers``, ``rollout_max_prompts``, ``env``). A namespace with some of
            those attributes is also accepted (plug-in code written for slime): the others take
            the config's defaults.
            ``num_data_workers`` matters only when streaming: in memory, rows are parsed once
            at start-up.
        envs: The run's env factory (default: one made from ``args.env``).
        split: Which of the env's task sets to serve (``train`` for training, ``test`` for
            evaluation); also salts the seeds of an env without a task set, so that the seeds
            of two splits never coincide.

    With ``env`` set, file rows are that env's task rows: ``input_key`` is optional (the env
    builds the prompt from the row; a row it cannot build one from is skipped and reported
    like any malformed row). Without ``prompt_data`` the env's ``task_set(split)`` is used; an
    env without a task set gives an endless stream of seeds (``metadata["seed"]``, no
    ``"task"``; the prompt is empty and comes from ``env.reset(seed=...)``).
    ``rollout_max_prompts`` keeps the first N usable rows, tasks or seeds, and every epoch
    plays those again (shuffled among themselves with ``rollout_shuffle``).

    Raises:
        DataError: No source, a missing or unsupported file, or no usable row.
        ConfigError: ``n_samples_per_prompt``, ``num_data_workers`` or ``shuffle_buffer_size``
            below 1.
        UnknownSplitError: The env has task sets, but not ``split``.
    """

    def __init__(self, args: Any, *, envs: EnvFactory | None = None, split: str = "train") -> None:
        config = as_rollout_config(args)
        self.args = args
        self.config = config
        self.input_key = config.input_key
        self.label_key = config.label_key
        self.metadata_key = config.metadata_key
        self.tool_key = config.tool_key
        self.shuffle = config.rollout_shuffle
        self.seed = config.rollout_seed
        self.n_samples_per_prompt = self._positive(config.n_samples_per_prompt, "n_samples_per_prompt")
        self.num_workers = self._positive(config.num_data_workers, "num_data_workers")
        self.shuffle_buffer_size = self._positive(config.shuffle_buffer_size, "shuffle_buffer_size")
        self.skipped_rows: list[SkippedRow] = []
        self._excluded: dict[tuple[str, int], SkippedRow] = {}  # rows skip_row took out
        self._served = 0  # records served since the epoch was opened
        self._whole_epoch = True  # that epoch was opened at its first row (not resumed)
        self._epoch = 0
        self._position = 0
        self._offset = 0
        self._line = 0
        self._next_group_id = 0
        self._any_valid = False
        self._iter: Iterator[Item] | None = None
        self._records: list[Record] | None = None  # in memory: file rows or env tasks
        self._order: tuple[int, list[int]] | None = None  # (epoch, permutation) cache
        self._env: Any = None
        self._seeds = False  # an env without a task set: an endless stream of seeds
        self._path: Path | None = None
        self._parquet = False
        self._parser: RowParser | None = None
        self._env_id = config.env
        self._env_split = split
        self.max_prompts = config.rollout_max_prompts  # None: every prompt
        if envs is None:  # a data source built on its own (a plug-in's super().__init__(args))
            envs = env_factory(config)
        self._envs = envs
        if envs is not None:
            self._env = envs()
        prompt_data = config.prompt_data
        self.streaming = config.streaming_data and prompt_data is not None
        if prompt_data is not None:
            self._open_file(Path(prompt_data))
        elif self._env_id is not None:
            self._open_env(self._env_id)
        else:
            raise DataError(
                "no prompt source: pass --prompt-data FILE (.jsonl or .parquet) or --env ENV_ID "
                "(its task set, or seeds when it has none)"
            )

    @staticmethod
    def _positive(value: Any, name: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}")
        return value

    # -- sources -------------------------------------------------------------------------------

    def _open_file(self, path: Path) -> None:
        if path.is_dir():
            raise DataError(f"--prompt-data {str(path)!r} is a folder: give one .jsonl or .parquet "
                            "file of it")
        if not path.is_file():
            raise DataError(f"--prompt-data {str(path)!r}: no such file")
        if path.suffix not in (".jsonl", ".json", ".parquet"):
            raise DataError(
                f"--prompt-data {str(path)!r}: unsupported format {path.suffix!r}; "
                "use JSONL (.jsonl/.json, one object per line) or Parquet (.parquet)"
            )
        self._path = path
        self._parquet = path.suffix == ".parquet"
        self._parser = RowParser(str(path), self.input_key, self.label_key, self.metadata_key,
                                  self.tool_key, keep_offset=not self.shuffle,
                                  prompt_optional=self._env_id is not None,
                                  task_fields=getattr(self._env, "task_fields", None),
                                  env_id=self._env_id)
        if self.streaming:
            self._probe()
            return
        items = [self._parser.job((raw, 0)) for raw in read_rows(path, self._parquet)]
        for item in items:
            if item.reason is not None:
                self._skip(item)
        self._records = [item.record for item in items if item.record is not None][: self.max_prompts]
        if not self._records:
            self._no_rows([f"line {r.line}: {r.reason}" for r in self.skipped_rows[:5]])
        self._any_valid = True

    def _probe(self) -> None:
        """Fails at start-up rather than mid-run when a streamed file has no usable row; reads
        only up to the first valid row, so memory stays flat (rows are reported later, when the
        first epoch reaches them)."""
        problems: list[str] = []
        assert self._path is not None and self._parser is not None
        for raw in read_rows(self._path, self._parquet):
            item = self._parser.job((raw, 0))
            if item.record is not None:
                return
            if len(problems) < 5:
                problems.append(f"line {item.line}: {item.reason}")
        self._no_rows(problems)

    def _no_rows(self, problems: list[str]) -> None:
        detail = "; ".join(problems) if problems else "the file is empty"
        raise DataError(f"--prompt-data {str(self._path)!r} has no usable row: {detail}")

    def _open_env(self, env_id: str) -> None:
        assert self._envs is not None
        tasks = self._envs.task_set(self._env_split)
        if tasks is None:
            self._seeds = True
            return
        where = self._where()
        records = []
        for index, task in enumerate(tasks):
            if not isinstance(task, Mapping):
                self._skip(Item(None, f"a task must be a mapping, got {type(task).__name__}",
                                 index + 1, 0, 0), file=where)
                continue
            task = dict(task)
            prompt = task.get(self.input_key)
            if not (isinstance(prompt, str) and prompt) and not (
                isinstance(prompt, list) and prompt
                and all(message_problem(m, strict=False) is None for m in prompt)
            ):
                prompt = None  # the env builds it from the task (make_prompt)
            metadata = task.get(self.metadata_key)
            records.append(Record(
                task, prompt, task.get(self.label_key),
                dict(metadata) if isinstance(metadata, Mapping) else {},
                {"env": env_id, "split": self._env_split, "index": index},
            ))
        if not records:
            raise DataError(f"{where}: the task set is empty")
        self._records = records[: self.max_prompts]
        self._any_valid = True

    def _skip(self, item: Item, file: str | None = None) -> None:
        skipped = SkippedRow(file or str(self._path), item.line, item.reason or "")
        self.skipped_rows.append(skipped)
        report_skipped(skipped)

    # -- epochs --------------------------------------------------------------------------------

    def _permutation(self, epoch: int) -> list[int]:
        assert self._records is not None
        if self._order is None or self._order[0] != epoch:
            order = list(range(len(self._records)))
            if self.shuffle:
                epoch_rng(self.seed, epoch).shuffle(order)
            self._order = (epoch, order)
        return self._order[1]

    def _open_epoch(self) -> Iterator[Item]:
        """The rest of the current epoch, from the saved position."""
        if self._seeds:
            return self._seed_items(self._position)
        if self._records is not None:
            order, start = self._permutation(self._epoch), self._position
            return (Item(self._records[i], None, 0, start + k + 1, 0)
                    for k, i in enumerate(order[start:]))
        parser = self._parser
        assert self._path is not None and parser is not None
        if self.shuffle:
            raws: Iterator[Any] = shuffle_buffer(
                read_rows(self._path, self._parquet), self.shuffle_buffer_size,
                epoch_rng(self.seed, self._epoch),
            )
            # Resuming replays the (seeded) buffer up to the saved position; only raw lines are
            # re-read, nothing is parsed.
            raws = itertools.islice(raws, self._position, None)
        else:
            raws = read_rows(self._path, self._parquet, self._offset, self._line)
        jobs = ((raw, k) for k, raw in enumerate(raws, start=self._position + 1))
        if self.num_workers <= 1:
            return inline(jobs, parser.job)
        return prefetched(jobs, parser.job, self.num_workers)

    def _seed_items(self, start: int) -> Iterator[Item]:
        indices = itertools.count(start) if self.max_prompts is None else range(start, self.max_prompts)
        for k in indices:
            seed = env_seed(self.seed, self._env_split, k)
            source = {"env": self._env_id, "split": self._env_split, "index": k}
            record = Record({"seed": seed}, "", None, {"seed": seed}, source)
            yield Item(record, None, k + 1, k + 1, 0)

    def _next_record(self) -> Record:
        while True:
            if self._iter is None:
                self._whole_epoch, self._served = self._position == 0, 0
                self._iter = self._open_epoch()
            item = next(self._iter, None)
            if item is None:
                if not self._any_valid:  # guards against looping over a file emptied meanwhile
                    self._no_rows([])
                if self._whole_epoch and not self._served:  # another epoch would serve nothing too
                    first = next(iter(self._excluded.values()), None) or next(iter(self.skipped_rows), None)
                    example = f", e.g. line {first.line}: {first.reason}" if first is not None else ""
                    where = first.file if first is not None else self._where()
                    raise DataError(f"no row of {where} can be played: a whole pass over it served "
                                    f"none{example}")
                self._close_iter()
                self._epoch += 1
                self._position = self._offset = self._line = 0
                continue
            self._position, self._offset, self._line = item.position, item.offset, item.line
            if item.record is not None and item.record.prompt is None and self._env is not None:
                item = self._with_env_prompt(item)
            if item.record is None:
                if self._epoch == 0:  # later epochs meet the same rows again: report once
                    self._skip(item, file=None if self._path is not None else self._where())
                continue
            if self._excluded and row_location(item.record.source) in self._excluded:
                continue  # reported when it was taken out
            self._any_valid = True
            self._served += 1
            return item.record

    def _close_iter(self) -> None:
        close = getattr(self._iter, "close", None)
        if close is not None:
            close()
        self._iter = None

    def _with_env_prompt(self, item: Item) -> Item:
        """``item`` with the prompt the env builds from its row, or skipped with the reason
        when the env cannot build one (an episode of it would only fail)."""
        record = item.record
        assert record is not None
        try:
            prompt = self._env.make_prompt(record.row)
        except Exception as exc:  # noqa: BLE001 - a row the env cannot read is a malformed row
            reason = (f"--env {self._env_id} cannot build a prompt from this row "
                      f"({type(exc).__name__}: {exc}); add a {self.input_key!r} field "
                      "(--input-key) or the fields the env reads")
            line = record.source.get("line") or record.source.get("index", -1) + 1
            return dataclasses.replace(item, record=None, reason=reason, line=line)
        if inspect.iscoroutine(prompt):  # an async hook: not run here, reset() will
            prompt.close()
            prompt = ""
        return dataclasses.replace(item, record=dataclasses.replace(record, prompt=prompt))

    def _where(self) -> str:
        return f"env {self._env_id} split {self._env_split}"

    def _make_group(self, record: Record) -> list[Sample]:
        group_id = self._next_group_id
        self._next_group_id += 1
        prompt = record.prompt if record.prompt is not None else ""
        group = []
        for index in range(self.n_samples_per_prompt):
            # Every sample owns its objects: custom generate functions mutate prompts in place.
            metadata = copy.deepcopy(record.metadata)
            if not self._seeds:  # a seed has no row: the env draws the task in reset(seed=...)
                metadata["task"] = copy.deepcopy(record.row)
            metadata["source"] = dict(record.source)
            group.append(Sample(
                group_id=group_id, index=index, prompt=copy.deepcopy(prompt),
                label=copy.deepcopy(record.label), metadata=metadata,
            ))
        return group

    # -- public API ----------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """Passes over the data completed so far (0 during the first)."""
        return self._epoch

    @property
    def num_skipped_rows(self) -> int:
        """Number of malformed rows skipped (each also in :attr:`skipped_rows`)."""
        return len(self.skipped_rows)

    def __len__(self) -> int:
        """Usable rows (prompts) per epoch.

        Raises:
            TypeError: Unknown: streaming data, or an endless seed stream.
        """
        if self._seeds and self.max_prompts is not None:
            return self.max_prompts
        if self._records is None:
            raise TypeError("the number of prompts is unknown (streaming data or env seeds)")
        return len(self._records)

    def __bool__(self) -> bool:
        return True  # without this, bool() would call __len__, which may raise

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        """The next ``num_samples`` groups, each ``n_samples_per_prompt`` fresh samples.

        Raises:
            ValueError: ``num_samples`` is negative.
            DataError: The data has no usable row.
        """
        check_count(num_samples)
        return [self._make_group(self._next_record()) for _ in range(num_samples)]

    def add_samples(self, samples: list[list[Sample]]) -> None:
        """Called with generated groups; this source does not keep them."""

    def skip_row(self, source: Mapping[str, Any], reason: str) -> None:
        """Takes the row a sample came from out of the data for the rest of the run.

        The rollout calls it for a row found unusable once played (its prompt does not fit the
        context). The row is reported as a malformed one is (logged with file and line,
        recorded in :attr:`skipped_rows`), once, and is not served in later epochs (the
        :meth:`state_dict` keeps it out after a resume too).

        Args:
            source: The sample's ``metadata["source"]``.
            reason: What is wrong with the row and how to fix it.
        """
        location = row_location(source)
        if location in self._excluded:
            return
        skipped = SkippedRow(*location, reason)
        self.skipped_rows.append(skipped)
        report_skipped(skipped)
        if not self._seeds:  # a seed is never served twice: nothing to keep out
            self._excluded[location] = skipped

    def state_dict(self) -> dict[str, Any]:
        """Where the source stands, as JSON-compatible data."""
        return {
            "version": STATE_VERSION,
            "config": self._fingerprint(),
            "epoch": self._epoch,
            "position": self._position,
            "offset": self._offset,
            "line": self._line,
            "next_group_id": self._next_group_id,
            "any_valid": self._any_valid,
            "num_skipped_rows": len(self.skipped_rows),
            "skipped_rows": [dataclasses.asdict(r) for r in self.skipped_rows],
            "excluded_rows": [dataclasses.asdict(r) for r in self._excluded.values()],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues from ``state`` (from :meth:`state_dict`).

        Raises:
            DataError: The state is from an unknown version.
        """
        if state.get("version") != STATE_VERSION:
            raise DataError(f"data source state version {state.get('version')!r} is not "
                            f"{STATE_VERSION}; it was saved by another agentrl version")
        saved = state.get("config", {})
        changed = {k: (v, saved.get(k)) for k, v in self._fingerprint().items()
                   if saved.get(k) != v}
        if changed:
            logger.warning("data source settings changed since the state was saved "
                           "(now, then): %s; the resumed order will differ", changed)
        self._close_iter()
        self._epoch, self._position = int(state["epoch"]), int(state["position"])
        self._offset, self._line = int(state["offset"]), int(state["line"])
        self._next_group_id = int(state["next_group_id"])
        self._any_valid = self._any_valid or bool(state["any_valid"])
        if self.streaming:  # in memory, the rows skipped were found again at load time
            self.skipped_rows = [SkippedRow(**r) for r in state["skipped_rows"]]
        excluded = [SkippedRow(**r) for r in state.get("excluded_rows", [])]
        self._excluded = {(r.file, r.line): r for r in excluded}
        if not self.streaming:  # load time cannot find these: the rollout did
            self.skipped_rows += [r for r in excluded if r not in self.skipped_rows]

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes :meth:`state_dict` as JSON (atomically: a crash leaves the old file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.state_dict(), ensure_ascii=False))
        os.replace(tmp, path)

    def load(self, path: str | os.PathLike[str]) -> None:
        """Reads a file written by :meth:`save` and continues from it."""
        self.load_state_dict(json.loads(Path(path).read_text()))

    def close(self) -> None:
        """Stops prefetch threads and closes the env; the source may still be used after."""
        self._close_iter()
        if self._env is not None:
            self._env.close()

    def _fingerprint(self) -> dict[str, Any]:
        return {
            "source": str(self._path) if self._path is not None else self._env_id,
            "env_split": self._env_split if self._path is None else None,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "streaming": self.streaming,
            "shuffle_buffer_size": self.shuffle_buffer_size if self.streaming else None,
            "n_samples_per_prompt": self.n_samples_per_prompt,
        }

"""What ``agentrl view`` shows: the runs and evaluations under a path, read into plain data.

A **run** is a ``train.py --output-dir``: ``run.json`` (its launches and flags),
``metrics.jsonl``, ``eval.jsonl`` and ``trajectories/rollout_<id>.jsonl`` (one
:class:`~agentrl.records.sample.Sample` per line). An **evaluation** is the summary JSON of
``agentrl eval --output`` and the ``<stem>.episodes.jsonl`` beside it. :class:`Catalog` finds
them under the viewed path; :class:`RunReader` and :class:`EvalReader` turn their files into the
data the page draws: curves, tables of episodes (one summary row per sample, kept as the files
grow), and one episode whole, its tokens decoded one by one by the policy's tokenizer.

Nothing here raises on what a run wrote: a missing file, a half-written or malformed line
becomes a ``problems`` entry naming the file and line. :class:`ViewError` is for a path that
holds neither a run nor an evaluation, and for a request naming something that is not there.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.errors import AgentRLError
from agentrl.view.files import JsonlIndex, inside

__all__ = ["Catalog", "EvalReader", "RunReader", "ViewError", "grpo_advantages"]

ROLLOUT_FILE = re.compile(r"rollout_(\d+)\.jsonl")
SCAN_DEPTH = 3
"""How deep below a viewed folder runs and evaluations are looked for."""
SEARCH_CHARS = 4000
"""Characters of an episode's text kept for the table's text search."""


class ViewError(AgentRLError):
    """A path that is neither a run nor an evaluation, or a request for something absent."""


def is_run(folder: Path) -> bool:
    """A folder a run wrote: it has ``run.json``, ``metrics.jsonl`` or ``trajectories/``."""
    return any((folder / name).exists() for name in ("run.json", "metrics.jsonl", "trajectories"))


def is_eval_summary(path: Path) -> bool:
    """An ``agentrl eval --output`` file: a JSON object with ``policy`` and ``sets``, or one
    whose ``<stem>.episodes.jsonl`` is beside it (a summary cut short still opens)."""
    if path.suffix != ".json" or not path.is_file():
        return False
    if episodes_of(path).is_file():
        return True
    try:
        with path.open("rb") as f:
            head = f.read(1 << 16)
        return b'"sets"' in head and b'"policy"' in head
    except OSError:
        return False


def episodes_of(summary: Path) -> Path:
    """The episodes file beside an eval summary."""
    return summary.with_name(summary.stem + ".episodes.jsonl")


class Catalog:
    """The runs and evaluations under ``path``.

    Args:
        path: A run's folder, an eval summary (or its episodes file), or a folder holding any
            number of them (looked for :data:`SCAN_DEPTH` levels down).

    Raises:
        ViewError: ``path`` does not exist or holds neither (the message says what was
            expected).
    """

    def __init__(self, path: str | Path) -> None:
        given = Path(path)
        if not given.exists():
            raise ViewError(f"{given}: no such file or folder")
        given = given.resolve()
        if given.is_file():
            summary = given
            if given.name.endswith(".episodes.jsonl"):
                summary = given.with_name(given.name[: -len(".episodes.jsonl")] + ".json")
            if not (is_eval_summary(summary) or given.name.endswith(".episodes.jsonl")):
                raise ViewError(f"{given}: not an `agentrl eval --output` file (a JSON summary "
                                "with \"policy\" and \"sets\", its episodes in <stem>.episodes.jsonl); "
                                "give a run's --output-dir, an eval's --output file, or a folder of them")
            self.root = summary.parent
            self._only: str | None = summary.name
        else:
            self.root = given
            self._only = None
        self._readers: dict[str, RunReader | EvalReader] = {}
        if not self.targets():
            raise ViewError(f"{given}: neither a run (a train.py --output-dir: run.json, "
                            "metrics.jsonl, trajectories/) nor an `agentrl eval --output` file, "
                            f"nor a folder holding one within {SCAN_DEPTH} levels")

    def targets(self) -> list[dict[str, str]]:
        """``[{"id", "kind": "run" | "eval", "title"}]``; ids are paths relative to the root.
        Looked for again on every call, so a run that starts later shows up."""
        if self._only is not None:
            return [{"id": self._only, "kind": "eval", "title": self._only}]
        found: list[dict[str, str]] = []
        for folder in _folders(self.root, SCAN_DEPTH):
            rel = folder.relative_to(self.root).as_posix()
            if is_run(folder):
                found.append({"id": rel, "kind": "run", "title": rel if rel != "." else self.root.name})
                continue  # a run's own folders (checkpoints, trajectories) hold nothing else
            for file in sorted(folder.glob("*.json")):
                if is_eval_summary(file):
                    eid = file.relative_to(self.root).as_posix()
                    found.append({"id": eid, "kind": "eval", "title": eid})
        return found

    def reader(self, target: str, kind: str) -> RunReader | EvalReader:
        """The reader of target ``target`` (an id from :meth:`targets`).

        Raises:
            ViewError: No such target of that kind under the root.
        """
        key = f"{kind}:{target}"
        if key not in self._readers:
            known = {(t["id"], t["kind"]) for t in self.targets()}
            path = inside(self.root, target)
            if (target, kind) not in known or path is None:
                raise ViewError(f"no {kind} {target!r} under {self.root}")
            self._readers[key] = RunReader(path) if kind == "run" else EvalReader(path)
        return self._readers[key]


def _folders(root: Path, depth: int) -> Iterable[Path]:
    """``root`` and its sub-folders down to ``depth`` (symlinked folders are not entered)."""
    yield root
    if depth == 0 or is_run(root):
        return
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()
                          and not p.name.startswith("."))
    except OSError:
        return
    for child in children:
        yield from _folders(child, depth - 1)


# -- rows: one summary per episode, for the tables -------------------------------------------


def _row(number: int, value: Mapping[str, Any] | None, error: str | None, *,
         eval_record: bool) -> dict[str, Any]:
    """The table row of one line: a sample of a trajectory file, or an eval episode record."""
    if value is None:
        return {"line": number, "status": "malformed", "error": error, "search": ""}
    if eval_record:
        meta = value
        tool_calls = len(value.get("tool_calls") or [])
        trajectory = value.get("trajectory") or {}
        length = len(trajectory.get("tokens") or [])
        version = None
        group, index, messages = value.get("group_id"), value.get("sample"), value.get("messages")
    else:
        meta = value.get("metadata") or {}
        tool_calls = sum(len(t.get("tool_names") or []) for t in value.get("turns") or []
                         if t.get("role") == "assistant")
        length = len(value.get("tokens") or [])
        version = value.get("weight_version")
        group, index, messages = value.get("group_id"), value.get("index"), meta.get("messages")
    errors = {str(k): int(v) for k, v in (meta.get("tool_errors") or {}).items() if v}
    text = " ".join(str(m.get("content") or "") for m in (messages or [])[-6:] if isinstance(m, dict))
    if not eval_record:
        text = str(value.get("response") or "") + " " + text
    return {
        "line": number, "group": group, "sample": index, "task_id": meta.get("task_id"),
        "reward": value.get("reward"), "status": value.get("status"),
        "finish": meta.get("finish"), "turns": meta.get("turns", 0), "tool_calls": tool_calls,
        "tool_errors": errors, "length": length, "weight_version": version,
        "error": meta.get("error"),
        "search": f"{meta.get('task_id') or ''} {meta.get('error') or ''} {text}"[:SEARCH_CHARS].lower(),
    }


class _Rows:
    """The rows of one JSON-lines file, extended as it grows."""

    def __init__(self, path: Path, *, eval_record: bool) -> None:
        self.index = JsonlIndex(path)
        self.eval_record = eval_record
        self.rows: list[dict[str, Any]] = []

    def refresh(self) -> list[dict[str, Any]]:
        before = len(self.index.spans)
        count = self.index.refresh()
        if count < before or count < len(self.rows):  # the file was replaced
            self.rows = []
        for i in range(len(self.rows), count):
            line = self.index.line(i)
            self.rows.append(_row(line.number, line.value, line.error, eval_record=self.eval_record))
        return self.rows

    def value(self, number: int) -> dict[str, Any]:
        self.refresh()
        if not 1 <= number <= len(self.index):
            raise ViewError(f"{self.index.path.name} has no line {number}")
        line = self.index.line(number - 1)
        if line.value is None:
            raise ViewError(f"{self.index.path.name} line {number}: {line.error}")
        return line.value


def select_rows(rows: Sequence[dict[str, Any]], query: Mapping[str, str]) -> dict[str, Any]:
    """Filters, sorts and pages ``rows`` as the table asks.

    ``query`` keys (all optional): ``status``, ``error`` (a tool error kind), ``group``,
    ``min_reward``, ``max_reward``, ``q`` (text, case-insensitive), ``sort`` (a row field),
    ``desc`` (``1``), ``offset``, ``limit``.

    Returns:
        ``{"total", "matched", "rows", "statuses", "error_kinds"}``: the page of rows (without
        their search text) and the values the filters can take.

    Raises:
        ViewError: A number that is not one.
    """
    try:
        low = float(query["min_reward"]) if query.get("min_reward") else -math.inf
        high = float(query["max_reward"]) if query.get("max_reward") else math.inf
        offset = max(0, int(query.get("offset") or 0))
        limit = min(1000, max(1, int(query.get("limit") or 100)))
    except ValueError as exc:
        raise ViewError(f"a filter is not a number: {exc}") from None
    status, kind, group = query.get("status"), query.get("error"), query.get("group")
    text = (query.get("q") or "").lower()
    picked = [
        r for r in rows
        if (not status or r.get("status") == status)
        and (not kind or kind in (r.get("tool_errors") or {}))
        and (not group or str(r.get("group")) == group)
        and (r.get("reward") is None and low == -math.inf and high == math.inf
             or r.get("reward") is not None and low <= r["reward"] <= high)
        and (not text or text in r.get("search", ""))
    ]
    field = query.get("sort") or "line"
    if field not in ("line", "group", "sample", "reward", "status", "turns", "tool_calls",
                     "length", "weight_version", "task_id", "tool_errors"):
        raise ViewError(f"cannot sort by {field!r}")

    def key(row: dict[str, Any]) -> tuple[int, Any]:
        value = row.get(field)
        if field == "tool_errors":
            value = sum((value or {}).values())
        if value is None:
            return (1, "")
        return (0, value) if isinstance(value, int | float) else (0, str(value))

    picked.sort(key=key, reverse=query.get("desc") == "1")
    page = [{k: v for k, v in r.items() if k != "search"} for r in picked[offset : offset + limit]]
    return {
        "total": len(rows), "matched": len(picked), "offset": offset, "rows": page,
        "statuses": sorted({str(r.get("status")) for r in rows}),
        "error_kinds": sorted({k for r in rows for k in (r.get("tool_errors") or {})}),
    }


def grpo_advantages(rewards: Sequence[float | None], *, std_normalize: bool = True,
                    eps: float = 1e-6) -> list[float | None]:
    """One group's GRPO advantages ``(r - mean) / (std + eps)`` (unbiased std), as the trainer
    computes them (:func:`agentrl.algorithms.advantages.grpo_advantages`); a group of one, or
    of equal rewards, gets 0. ``None`` rewards (unscored samples) get ``None`` and are left out."""
    scored = [float(r) for r in rewards if r is not None]
    if len(scored) < 2:
        return [None if r is None else 0.0 for r in rewards]
    mean = sum(scored) / len(scored)
    std = math.sqrt(sum((r - mean) ** 2 for r in scored) / (len(scored) - 1))
    out: list[float | None] = []
    for r in rewards:
        if r is None:
            out.append(None)
        else:
            out.append((float(r) - mean) / (std + eps) if std_normalize else float(r) - mean)
    return out


# -- one episode -----------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def _tokenizer(policy_dir: str) -> Any:
    from tokenizers import Tokenizer  # the Rust tokenizer alone: fast to load, no transformers

    return Tokenizer.from_file(str(Path(policy_dir) / "tokenizer.json"))


def decode_pieces(ids: Sequence[int], policy_dir: str | None) -> tuple[list[str], str | None]:
    """Each token id as its own text, and ``None``; or the ids as ``⟨id⟩`` and why there is no
    text (no tokenizer recorded, or it cannot be read)."""
    if policy_dir is None:
        return [f"⟨{i}⟩" for i in ids], "the run recorded no tokenizer: token ids are shown"
    try:
        tokenizer = _tokenizer(policy_dir)
    except Exception as exc:  # noqa: BLE001 - any unreadable tokenizer: show ids and say why
        return [f"⟨{i}⟩" for i in ids], f"cannot read the tokenizer in {policy_dir} ({exc}): token ids are shown"
    return tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False), None


def episode_view(sample: Mapping[str, Any], policy_dir: str | None) -> dict[str, Any]:
    """One episode as the episode page draws it, from a trajectory file's sample (a
    :meth:`Sample.to_dict`).

    Returns:
        ``{"header", "messages", "cut_messages", "turns", "grade", "commands", "tokens"}``;
        ``tokens`` is ``None`` when the sample has none (a scripted policy played it), else
        ``{"prompt_length", "pieces", "mask", "logprobs", "versions", "turn_starts", "note"}``
        over every token of the sample (``mask`` / ``logprobs`` / ``versions`` cover the
        response tokens).
    """
    meta = sample.get("metadata") or {}
    tokens = list(sample.get("tokens") or [])
    response_length = int(sample.get("response_length") or 0)
    view: dict[str, Any] = {
        "header": {
            "group": sample.get("group_id"), "sample": sample.get("index"),
            "task_id": meta.get("task_id"), "reward": sample.get("reward"),
            "status": sample.get("status"), "finish": meta.get("finish"),
            "turns": meta.get("turns"), "weight_version": sample.get("weight_version"),
            "weight_versions": meta.get("weight_versions"), "episode_s": meta.get("episode_s"),
            "tool_errors": meta.get("tool_errors") or {}, "error": meta.get("error"),
            "traceback": meta.get("traceback"), "restarted": meta.get("restarted"),
            "label": sample.get("label"), "gateway": meta.get("gateway"),
        },
        "messages": meta.get("messages") or _prompt_messages(sample.get("prompt")),
        "cut_messages": meta.get("cut_messages") or [],
        "turns": sample.get("turns") or [],
        "grade": meta.get("grade"),
        "commands": meta.get("commands") or [],
        "tokens": None,
    }
    if tokens:
        pieces, note = decode_pieces(tokens, policy_dir)
        view["tokens"] = {
            "prompt_length": len(tokens) - response_length, "pieces": pieces,
            "mask": list(sample.get("loss_mask") or []),
            "logprobs": list(sample.get("rollout_log_probs") or []),
            "versions": list(sample.get("token_versions") or []),
            "turn_starts": [t.get("start") for t in view["turns"]], "note": note,
        }
    return view


def _prompt_messages(prompt: Any) -> list[dict[str, Any]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}] if prompt else []
    return [m for m in prompt or [] if isinstance(m, dict)]


# -- the readers ------------------------------------------------------------------------------


class RunReader:
    """One run's files (see the module docstring).

    Args:
        folder: The run's ``--output-dir``.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.metrics = JsonlIndex(self._own("metrics.jsonl"))
        self.evals = JsonlIndex(self._own("eval.jsonl"))
        self._rollouts: dict[str, _Rows] = {}
        self._launches: tuple[Any, tuple[list[dict[str, Any]], list[str]]] | None = None

    def _own(self, name: str) -> Path:
        """``folder / name``, or, when that is a link out of the folder, a path that never
        exists (such a file is treated as missing: nothing outside the run is read)."""
        path = self.folder / name
        if path.exists() and inside(self.folder, name) is None:
            return self.folder / ".agentrl-view-refused" / name
        return path

    def launches(self) -> tuple[list[dict[str, Any]], list[str]]:
        """``run.json``'s launches, and the problems reading it."""
        path = self._own("run.json")
        try:
            stamp = path.stat()
        except OSError:
            stamp = None
        key = None if stamp is None else (stamp.st_mtime_ns, stamp.st_size)
        if key is not None and self._launches is not None and self._launches[0] == key:
            return self._launches[1]  # read once per version of the file, not per request
        found = self._read_launches(path)
        self._launches = (key, found) if key is not None else None
        return found

    def _read_launches(self, path: Path) -> tuple[list[dict[str, Any]], list[str]]:
        if not path.is_file():
            return [], [f"{path.name} is missing (a run from before agentrl recorded its flags, "
                        "or one that is starting): no flags and no tokenizer to decode tokens"]
        try:
            return list(json.loads(path.read_text(encoding="utf-8"))["launches"]), []
        except (ValueError, KeyError, TypeError, OSError) as exc:
            return [], [f"{path.name} cannot be read ({type(exc).__name__}: {exc})"]

    def policy_dir(self) -> str | None:
        """The policy folder of the latest launch (its tokenizer decodes the tokens)."""
        launches, _ = self.launches()
        return launches[-1].get("policy_dir") if launches else None

    def flags(self) -> dict[str, Any]:
        launches, _ = self.launches()
        return dict(launches[-1].get("flags") or {}) if launches else {}

    def rollout_files(self) -> list[str]:
        folder = self.folder / "trajectories"
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.iterdir() if ROLLOUT_FILE.fullmatch(p.name)
                      and inside(self.folder, f"trajectories/{p.name}") is not None)

    def overview(self) -> dict[str, Any]:
        """Everything the run page draws but the episodes: metrics and eval points (with
        what could not be read), the launches, and the rollout files."""
        problems: list[str] = []
        points = []
        for name, index in (("metrics.jsonl", self.metrics), ("eval.jsonl", self.evals)):
            index.refresh()
            good = []
            for line in index.lines():
                if line.value is None:
                    problems.append(f"{name} line {line.number}: {line.error}; skipped")
                else:
                    good.append(line.value)
            points.append(good)
        if not self.metrics.path.is_file():
            problems.append("metrics.jsonl is missing: no rollout has finished yet")
        launches, launch_problems = self.launches()
        files = self.rollout_files()
        return {"kind": "run", "folder": str(self.folder), "metrics": points[0],
                "evals": points[1], "launches": launches, "problems": problems + launch_problems,
                "rollouts": [{"file": f, "rollout_id": int(ROLLOUT_FILE.fullmatch(f)[1])}
                             for f in files]}

    def rows(self, file: str) -> list[dict[str, Any]]:
        """The table rows of ``trajectories/<file>``, with each sample's GRPO advantage.

        Raises:
            ViewError: No such rollout file.
        """
        rows = self._rollout(file).refresh()
        flags = self.flags()
        estimator = flags.get("advantage_estimator", "grpo")
        if estimator in ("grpo", "gspo"):
            normalize = not flags.get("disable_grpo_std_normalization", False)
            groups: dict[Any, list[dict[str, Any]]] = {}
            for row in rows:
                groups.setdefault(row.get("group"), []).append(row)
            for members in groups.values():
                for row, adv in zip(members, grpo_advantages([r.get("reward") for r in members],
                                                             std_normalize=normalize), strict=True):
                    row["advantage"] = adv
        return rows

    def _rollout(self, file: str) -> _Rows:
        """The rows of ``trajectories/<file>``, checked by name and path alone (no listing of
        the folder on every request).

        Raises:
            ViewError: Not a rollout file of this run (or a link out of it).
        """
        if file not in self._rollouts:
            if not ROLLOUT_FILE.fullmatch(file) or inside(self.folder, f"trajectories/{file}") is None:
                raise ViewError(f"the run has no trajectories/{file}")
            self._rollouts[file] = _Rows(self.folder / "trajectories" / file, eval_record=False)
        return self._rollouts[file]

    def sample(self, file: str, line: int) -> dict[str, Any]:
        """Line ``line`` (1-based) of ``trajectories/<file>`` as :func:`episode_view`."""
        view = episode_view(self._rollout(file).value(line), self.policy_dir())
        view["where"] = {"file": f"trajectories/{file}", "line": line}
        return view


class EvalReader:
    """One ``agentrl eval --output`` summary and its episodes file.

    Args:
        summary: The summary JSON.
    """

    def __init__(self, summary: Path) -> None:
        self.summary = summary
        episodes = episodes_of(summary)
        if episodes.exists() and inside(summary.parent, episodes.name) is None:
            episodes = summary.parent / ".agentrl-view-refused" / episodes.name  # a link out: not read
        self.episodes = _Rows(episodes, eval_record=True)

    def read_summary(self) -> tuple[dict[str, Any], list[str]]:
        try:
            data = json.loads(self.summary.read_text(encoding="utf-8"))
        except (ValueError, OSError) as exc:
            return {}, [f"{self.summary.name} cannot be read ({type(exc).__name__}: {exc}); "
                        "the episodes are shown without the summary"]
        if not isinstance(data, dict):
            return {}, [f"{self.summary.name} is not a JSON object"]
        return data, []

    def overview(self) -> dict[str, Any]:
        summary, problems = self.read_summary()
        rows = self.episodes.refresh()
        if not self.episodes.index.path.is_file():
            problems.append(f"{self.episodes.index.path.name} is missing: no episodes to list")
        problems += [f"{self.episodes.index.path.name} line {r['line']}: {r['error']}; skipped"
                     for r in rows if r["status"] == "malformed"]
        return {"kind": "eval", "file": self.summary.name, "summary": summary,
                "problems": problems, "episodes": len(rows)}

    def rows(self) -> list[dict[str, Any]]:
        return self.episodes.refresh()

    def sample(self, line: int) -> dict[str, Any]:
        """Episode ``line`` (1-based) of the episodes file as :func:`episode_view`."""
        record = self.episodes.value(line)
        trajectory = record.get("trajectory") or {}
        as_sample = {
            "group_id": record.get("group_id"), "index": record.get("sample"),
            "reward": record.get("reward"), "status": record.get("status"),
            "tokens": trajectory.get("tokens") or [],
            "response_length": trajectory.get("response_length") or 0,
            "loss_mask": trajectory.get("loss_mask") or [],
            "rollout_log_probs": trajectory.get("rollout_log_probs") or [],
            "token_versions": trajectory.get("token_versions") or [],
            "turns": trajectory.get("turns") or [],
            "metadata": {k: record.get(k) for k in (
                "task_id", "finish", "turns", "tool_errors", "error", "messages",
                "cut_messages", "grade", "commands")},
        }
        summary, _ = self.read_summary()
        view = episode_view(as_sample, summary.get("policy_dir"))
        view["where"] = {"file": self.episodes.index.path.name, "line": line}
        return view

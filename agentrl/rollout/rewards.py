"""Rewards: the environment's score by default, or a user reward function / model.

Precedence, per sample: ``sample.metadata["custom_rm_path"]`` (a per-row reward plug-in), then
``--custom-rm-path``, then the environment's reward. Accepted plug-in forms:

* ``def rm(args, sample) -> float`` (``async def`` too): one sample at a time;
* ``def rm(args, samples) -> list[float]`` (sync or async): batched - the second parameter is
  named ``samples``;
* slime's class ``CustomRewardModel(model_path)`` with
  ``compute_reward(prompts, responses) -> list[float]`` (sync or async), built once with
  ``--rm-model-path``.

A reward that raises, or is not a real number, fails that sample (``status = failed``,
``metadata["reward_error"]`` says why, reward 0.0); the rest of the batch goes on.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.env import as_reward
from agentrl.errors import PluginError, RewardError
from agentrl.plugins import load_plugin
from agentrl.records.sample import Sample, Status

__all__ = ["RewardModel", "RewardModels", "load_reward_model", "maybe_await"]

_FLAG = "--custom-rm-path"

log = logging.getLogger(__name__)


class RewardModel:
    """A loaded reward plug-in; call :meth:`score` on a batch of samples.

    Args:
        target: The plug-in (function or class) as loaded.
        args: The run's arguments, passed to functions as their first parameter.
        model_path: Given to a class plug-in's constructor.
        name: The plug-in spec, for messages.
    """

    def __init__(self, target: Any, args: Any, model_path: str | None, name: str) -> None:
        self.name = name
        self.args = args
        self.reported = False
        if inspect.isclass(target):
            instance = target(model_path)
            if not callable(getattr(instance, "compute_reward", None)):
                raise PluginError(f"{_FLAG} {name!r}: class {target.__name__} has no "
                                  "compute_reward(prompts, responses) method")
            self._fn: Callable[..., Any] = instance.compute_reward
            self.kind = "class"
        elif callable(target):
            params = list(inspect.signature(target).parameters)
            if len(params) < 2:
                raise PluginError(f"{_FLAG} {name!r}: a reward function takes (args, sample) or "
                                  f"(args, samples); {target.__name__} takes {params}")
            self._fn = target
            self.kind = "batched" if params[1] == "samples" else "single"
        else:
            raise PluginError(f"{_FLAG} {name!r} is a {type(target).__name__}, not a function "
                              "or class")

    def _fail(self, sample: Sample, exc: BaseException) -> None:
        """Fails ``sample`` with the reason; the plug-in's first failure is also logged."""
        sample.reward = 0.0
        sample.status = Status.FAILED
        sample.metadata["reward_error"] = f"{self.name}: {type(exc).__name__}: {exc}"
        sample.metadata.setdefault("error", sample.metadata["reward_error"])
        if not self.reported:
            self.reported = True
            log.warning("%s %s failed on sample %s/%s (task %s): %s: %s; such samples fail "
                        "(reward 0; counted in rollout/failed)", _FLAG, self.name, sample.group_id,
                        sample.index, sample.metadata.get("task_id"), type(exc).__name__, exc)

    async def score(self, samples: Sequence[Sample]) -> None:
        """Sets ``reward`` on each sample, or fails the ones whose reward could not be computed."""
        if not samples:
            return
        started = time.perf_counter()
        if self.kind == "single":
            for sample in samples:
                try:
                    reward = await maybe_await(self._fn(self.args, sample))
                    sample.reward = as_reward(reward, self.name)
                except Exception as exc:  # noqa: BLE001 - a user function fails one sample
                    self._fail(sample, exc)
        else:
            try:
                if self.kind == "class":
                    prompts = [s.prompt for s in samples]
                    rewards = await maybe_await(self._fn(prompts, [s.response for s in samples]))
                else:
                    rewards = await maybe_await(self._fn(self.args, list(samples)))
                if hasattr(rewards, "tolist"):
                    rewards = rewards.tolist()
                if not isinstance(rewards, Sequence) or len(rewards) != len(samples):
                    got = len(rewards) if isinstance(rewards, Sequence) else type(rewards).__name__
                    raise RewardError(f"{self.name} returned {got} rewards for {len(samples)} samples")
                for sample, reward in zip(samples, rewards, strict=True):
                    try:
                        sample.reward = as_reward(reward, self.name)
                    except RewardError as exc:
                        self._fail(sample, exc)
            except Exception as exc:  # noqa: BLE001 - a user function fails its batch
                for sample in samples:
                    self._fail(sample, exc)
        per_sample = (time.perf_counter() - started) / len(samples)
        for sample in samples:
            sample.metadata["reward_source"] = self.name
            if sample.turns:
                sample.turns[-1].reward_s += per_sample




async def maybe_await(value: Any) -> Any:
    """``value``, awaited first when it is awaitable (plug-ins may be sync or async)."""
    return await value if inspect.isawaitable(value) else value


def load_reward_model(spec: str, args: Any, model_path: str | None = None) -> RewardModel:
    """Loads ``spec`` (``file.py``, ``file.py:name``, ``module:name``) and builds it (a class
    plug-in is instantiated with ``model_path``).

    Raises:
        PluginError: The plug-in cannot be loaded or has the wrong form.
    """
    target = load_plugin(spec, flag=_FLAG, preferred=("CustomRewardModel",))
    return RewardModel(target, args, model_path, spec)


class RewardModels:
    """The reward plug-ins of one run: each loaded once, on first use (loading a reward model
    is expensive), and kept for the run's life.

    Args:
        args: The rollout config (``--custom-rm-path``, ``--rm-model-path``); passed to the
            plug-ins.
    """

    def __init__(self, args: Any) -> None:
        self.args = args
        self._models: dict[str, RewardModel] = {}

    def get(self, spec: str) -> RewardModel:
        """The model of ``spec``, loaded on first use."""
        if spec not in self._models:
            self._models[spec] = load_reward_model(spec, self.args, self.args.rm_model_path)
        return self._models[spec]

    async def apply(self, samples: Sequence[Sample]) -> None:
        """Overrides env rewards by the per-sample, then the ``--custom-rm-path`` reward model.

        Samples that failed or were aborted are not scored.
        """
        scorable = [s for s in samples if s.status in (Status.COMPLETED, Status.TRUNCATED)]
        by_model: dict[str, list[Sample]] = {}
        for sample in scorable:
            spec = sample.metadata.get("custom_rm_path") or self.args.custom_rm_path
            if spec:
                by_model.setdefault(spec, []).append(sample)
        for spec, group in by_model.items():
            await self.get(spec).score(group)

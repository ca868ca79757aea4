"""The embedded default: the model ``train.py`` and ``agentrl eval --policy model`` play when no
``--hf-checkpoint`` is given.

For most envs it is the random built-in tiny model (:func:`agentrl.models.build_tiny_model`):
the machinery runs, nothing is learned. For an env listed in :data:`EMBEDDED_DEFAULTS` it is a
tiny model warm-started on that env's oracle demonstrations (``python -m agentrl.warm``,
the recipe in the checkpoint's ``warm.json``), shipped in ``agentrl/models/checkpoints/``. That
model was trained at one setting of the env (a difficulty level, a compact prompt) and comes with
the run flags of the demo that shows it learning (``make demo``); every one of them is only a
default, and a flag given on the command line wins (``--env-kwarg`` pairs given are added after
the default's, so a repeated key takes the user's value).

It applies to the env's own tasks played by the model through agentrl's episode loop. Giving
``--hf-checkpoint`` turns it off, and so does anything that replaces that loop or those tasks
(:data:`OPTING_OUT`: your own prompts, a supervised run, a custom generate function, an agent of
your own): the env then runs at its own defaults with the random tiny model.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["CHECKPOINTS", "EMBEDDED_DEFAULTS", "OPTING_OUT", "PLAY_FLAGS", "EmbeddedDefault",
           "apply_embedded_default"]

CHECKPOINTS = Path(__file__).resolve().parent / "checkpoints"
"""Where the shipped warm-started checkpoints live (one Hugging Face folder each)."""

OPTING_OUT = ("--hf-checkpoint", "--prompt-data", "--custom-generate-function-path",
              "--agent-function-path", "--agent-command", "--agent")
"""Flags whose presence turns the embedded default off (a model, tasks or an episode loop of
the user's own); so does ``--loss-type sft_loss`` (a supervised run, such as a warm start's own,
starts from the random model)."""


PLAY_FLAGS = ("max_turns", "rollout_temperature")
"""The default's flags that say how the model plays an episode; ``agentrl eval`` takes only
these (the others size the demo's training run and its evaluation)."""


@dataclasses.dataclass(frozen=True)
class EmbeddedDefault:
    """A shipped warm-started model for one env, and the settings it is played at.

    Attributes:
        env: The env it was warm-started on (``--env``; its versioned id is accepted too).
        checkpoint: Its folder under :data:`CHECKPOINTS` (a versioned name: a new recipe is a new
            folder, so an old run's ``run.json`` still names what it played).
        env_kwarg: ``--env-kwarg`` pairs it was trained with (a level, a compact prompt).
        flags: Defaults of other ``train.py`` flags (field names of the typed configs) for its
            demo, sized to show the learning curve on 2 CPU cores; read-only.
        recipe: The ``python -m agentrl.warm`` command that made it.
        version: The env version it was made on (``--env NAME-vN`` names it).
    """

    env: str
    checkpoint: str
    env_kwarg: tuple[str, ...]
    flags: Mapping[str, Any]
    recipe: str
    version: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "flags", types.MappingProxyType(dict(self.flags)))

    @property
    def path(self) -> Path:
        """The checkpoint's Hugging Face folder."""
        return CHECKPOINTS / self.checkpoint

    def names(self) -> tuple[str, str]:
        """The ``--env`` values it answers to: the name and the versioned id."""
        return self.env, f"{self.env}-v{self.version}"

    def warm_record(self) -> dict[str, Any]:
        """The checkpoint's ``warm.json``: the recipe, the demonstrations' digest, the loss curve."""
        return json.loads((self.path / "warm.json").read_text(encoding="utf-8"))

    def announcement(self, env_kwargs: Mapping[str, Any]) -> str:
        """One line saying what the run plays, at which env settings, and how to change it.

        Args:
            env_kwargs: The env arguments the run resolved (the default's pairs and the user's).
        """
        settings = " ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}"
                            for k, v in env_kwargs.items())
        trained = " ".join(self.env_kwarg)
        note = "as it was trained" if settings == trained else f"trained at {trained}"
        return (f"embedded default for --env {self.env}: the tiny model warm-started on its "
                f"oracle's demonstrations ({self.path}), playing at {settings or 'the defaults'} "
                f"({note}), with its demo's defaults for flags not given; --hf-checkpoint DIR "
                "plays your own model")


EMBEDDED_DEFAULTS: dict[str, EmbeddedDefault] = {
    "swe-tools": EmbeddedDefault(
        env="swe-tools",
        checkpoint="swe-tools-warm-v1",
        env_kwarg=("level=located", "compact=true"),
        # 8 fixed train tasks x 4 samples at T=0.7, 8 rollouts at lr 1e-4, and 8 held-out tasks
        # x 2 samples evaluated before and after: measured in docs/getting-started.md
        # (success on those tasks rising; T=1.0 starts at ~0.15 and GRPO's signal was lost in
        # noise, a task set drawn anew each rollout hid any change)
        flags={"max_turns": 5, "num_rollout": 8, "rollout_batch_size": 8,
               "n_samples_per_prompt": 4, "rollout_max_prompts": 8, "lr": 1e-4,
               "rollout_temperature": 0.7, "eval_env": ["swe-tools"], "eval_interval": 8, "eval_max_prompts": 8,
               "n_samples_per_eval_prompt": 2},
        recipe=("python -m agentrl.warm --env swe-tools --env-kwarg level=located "
                "--env-kwarg compact=true --max-turns 5 --steps 600 --out OUT"),
    ),
}
"""The envs that have a shipped warm start, by ``--env`` name."""


def _lookup(env: str | None) -> EmbeddedDefault | None:
    for default in EMBEDDED_DEFAULTS.values():
        if env in default.names():
            return default
    return None


def apply_embedded_default(parser: argparse.ArgumentParser, argv: Sequence[str] | None, *,
                           policy_default: str | None = None) -> EmbeddedDefault | None:
    """Makes ``parser``'s defaults the embedded default's, when ``argv`` plays one.

    Only defaults change: what ``argv`` gives wins. A malformed ``argv`` is left to ``parser``
    to report (this only peeks at it).

    Args:
        parser: The command's parser (``train.py``'s, or ``agentrl eval``'s); defaults are set
            only for flags it has.
        argv: The command's arguments (``None``: ``sys.argv[1:]``).
        policy_default: For a command with a ``--policy`` flag (``agentrl eval``), that flag's
            default; the embedded default then applies only when the policy is ``model``, and
            of its flags only :data:`PLAY_FLAGS`.

    Returns:
        The default applied: ``argv`` names an env of :data:`EMBEDDED_DEFAULTS` with ``--env``
        and gives none of :data:`OPTING_OUT`. Otherwise ``None``.
    """
    tokens = list(sys.argv[1:] if argv is None else argv)
    if any(token.partition("=")[0] in OPTING_OUT for token in tokens):
        return None
    peek = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    peek.add_argument("--env")
    peek.add_argument("--policy", default=policy_default)
    peek.add_argument("--loss-type")
    try:
        known, _ = peek.parse_known_args(tokens)
    except argparse.ArgumentError:
        return None
    if (policy_default is not None and known.policy != "model") or known.loss_type == "sft_loss":
        return None
    default = _lookup(known.env)
    if default is None:
        return None
    flags = default.flags if policy_default is None else {  # an evaluation: how it plays, not the demo's schedule
        k: v for k, v in default.flags.items() if k in PLAY_FLAGS}
    values = {"hf_checkpoint": str(default.path), "env_kwarg": list(default.env_kwarg), **flags}
    dests = {action.dest for action in parser._actions}
    parser.set_defaults(**{k: v for k, v in values.items() if k in dests})
    return default

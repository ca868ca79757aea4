"""Every shell command in README.md and docs/**/*.md names flags that exist, with values of
the right type, and programs, make targets and scripts that exist.

``test_doc_snippets.py`` runs the blocks marked runnable; most commands in the guides cannot
run in a unit test (a training run, a GPU cluster, a server of the user's). This test reads
every line of every ``bash`` block, marked or not, and hands agentrl's own commands to the
parsers they would meet: ``train.py``'s, the ``agentrl`` command's (each subcommand's),
``python -m agentrl.warm``'s and ``python -m agentrl.learn``'s. Commands of other programs must
be on :data:`EXTERNAL`, so a new one is looked at once. The OpenEnv guide's commands also run
as written, with the servers they need, in tests/integration/test_openenv.py.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from agentrl.cli import build_parser as agentrl_parser
from agentrl.learn import build_parser as learn_parser
from agentrl.rollout.config import collect_server_args
from agentrl.run.flags import build_parser as train_parser
from agentrl.warm import build_parser as warm_parser
from tests.support.doc_commands import bash_commands

REPO = Path(__file__).resolve().parents[2]

EXTERNAL = {
    "source": "the shell's own",
    "export": "the shell's own",
    "ray": "Ray's CLI (scale-out guide: nodes of a cluster)",
    "pip": "pip (real-model guide: the GGUF wheel without a registry)",
    "unzip": "unzip (real-model guide)",
    "python -m vllm.entrypoints.openai.api_server": "a vLLM server a user starts (inference-backends guide)",
}
"""Programs the docs run that are not agentrl's, with where and why."""


COMMANDS = bash_commands()


def _parse(parser: argparse.ArgumentParser, args: list[str], where: str, *, servers: bool = False) -> None:
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            _, unknown = parser.parse_known_args(args)
    except SystemExit as exc:
        if exc.code == 0:  # --help
            return
        pytest.fail(f"{where}: {errors.getvalue().strip()}")
    if servers:  # --sglang-* / --vllm-* go to the servers as they are
        unknown = collect_server_args(collect_server_args(unknown, "sglang")[1], "vllm")[1]
    if unknown:
        pytest.fail(f"{where}: unknown flags {unknown}")


def check(where: str, command: str) -> None:
    words = [w for w in shlex.split(command) if w != "..."]
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):  # VAR=value prefixes
        words = words[1:]
    program = words[0]
    if program in ("python", ".venv-openenv/bin/python", ".venv/bin/python") and words[1:2] == ["-m"]:
        program, words = f"python -m {words[2]}", words[3:]
    elif program in ("python", ".venv/bin/python") and words[1] == "train.py":
        program, words = "train.py", words[2:]
    elif program in ("python", ".venv/bin/python") and words[1].startswith("scripts/"):
        program, words = words[1], words[2:]
    else:
        words = words[1:]
    if program == "train.py":
        _parse(train_parser(), words, where, servers=True)
    elif program in ("agentrl", "python -m agentrl"):
        _parse(agentrl_parser(), words, where)
    elif program == "python -m agentrl.warm":
        _parse(warm_parser(), words, where)
    elif program == "python -m agentrl.learn":
        _parse(learn_parser(), words, where)
    elif program == "make":
        targets = set(re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(), re.M))
        if not set(words) <= targets:
            pytest.fail(f"{where}: no make target {sorted(set(words) - targets)}")
    elif program.startswith("scripts/"):
        if not (REPO / program).is_file():
            pytest.fail(f"{where}: {program} does not exist")
    elif program not in EXTERNAL:
        pytest.fail(f"{where}: {program!r} is neither agentrl's nor on EXTERNAL (add it there, "
                    f"with where the docs run it): {command}")


def test_the_docs_have_commands_of_every_kind():
    programs = {shlex.split(c)[0] for _, c in COMMANDS}
    assert {"python", "agentrl", "make"} <= programs and len(COMMANDS) > 40


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_command_in_the_docs_names_what_exists(where: str, command: str) -> None:
    check(where, command)


@pytest.mark.parametrize("command", [
    "python train.py --env calc --num-rollouts 3",  # a misspelt flag
    "agentrl eval --env calc --policy nobody",  # a value outside the choices
    "agentrl export runs/latest",  # a required flag left out
    "make tests",
    "curl http://example.com",
])
def test_a_wrong_command_is_caught_with_where_it_is(command: str) -> None:
    with pytest.raises(pytest.fail.Exception, match=r"docs/x.md:3"):
        check("docs/x.md:3", command)

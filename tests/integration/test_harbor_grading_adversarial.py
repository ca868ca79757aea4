"""Adversarial grading tests for harbor-v0: one property per test.

The agent cannot solve the task, and instead leaves something behind for the verifier to
stumble on: shell start-up files, variables, shims on PATH, Python start-up hooks, files in the
working directory a verifier might import, background processes, symlinks into the grader's
directories, pre-written reward files. Every attempt must score 0 while the oracle scores 1 on
the same task. Each verifier here writes what it saw (its uid, environment and the processes of
the container) to its output, so that the tests also check how it ran. The tasks are written
into tmp_path, except for shipped tasks played as shipped.

Every test runs twice: with the verifier in the agent's container (Harbor's ``shared`` mode,
the default) and in a container of its own that receives only ``/app`` (``separate``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrl_envs.harbor import SHIPPED_TASKS, HarborEnv
from tests.integration.test_harbor import SUBMIT, bash, oracle, play, write_task
from tests.support.sandboxes import backend_skip_reason

DOCKER_SKIP = backend_skip_reason("docker")
pytestmark = pytest.mark.skipif(DOCKER_SKIP is not None, reason=DOCKER_SKIP or "")

AGENT_UID = "65534"
# harbor-v0's sandboxes run the agent as uid 65534, which needs agentrl to run as root (as
# tests/integration/test_harbor.py does); it then gives the agent's files to root and grades as
# root, as Harbor does.
VERIFIER_UID = "0"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# What every verifier here prints first: its uid, HOME, PATH and the variables a start-up hook
# rides on, then "<uid> <name>" for each process of the container, between markers.
AUDIT = """\
probe=no; touch .probe 2>/dev/null && rm .probe && probe=yes
echo "uid=$(id -u) home=$HOME path=$PATH bash_env=${BASH_ENV-unset} env=${ENV-unset} \
nousersite=${PYTHONNOUSERSITE-unset} cwd=$PWD owner=$(stat -c %u .) writes_cwd=$probe"
echo "procs:"
for s in /proc/[0-9]*/status; do
  awk '/^Name:/ {n = $2} /^Uid:/ {u = $2} END {if (n != "") print u, n}' "$s" 2>/dev/null
done
echo ":procs"
"""
REWARD = ("then echo 1 > /logs/verifier/reward.txt\n"
          "else echo 0 > /logs/verifier/reward.txt; fi\n")
# Compares files in bash (the answer is in tests/expected.txt).
CMP_SH = AUDIT + "if cmp -s /app/answer.txt /tests/expected.txt; " + REWARD
# pytest's console script run from the working directory, as many Harbor tasks do.
PYTEST_SH = AUDIT + "if pytest -q -p no:cacheprovider /tests/test_sum.py; " + REWARD
TEST_SUM = ("from pathlib import Path\n\n\ndef test_sum():\n"
            "    assert Path('/app/answer.txt').read_text().strip() == '42'\n")
# The check runs in a login shell, which reads the start-up files of $HOME.
LOGIN_SH = AUDIT + ("bash -l -c 'if cmp -s /app/answer.txt /tests/expected.txt; " + REWARD.strip()
                    + "; exit 0'\n")

VERIFIERS = {"cmp": CMP_SH, "pytest": PYTEST_SH, "login": LOGIN_SH}
# What a planted hook does when it runs in the verifier: it copies the expected answer (which
# only the tests hold) and writes every reward file it can.
FORGE = ("cp /tests/expected.txt /app/answer.txt; echo 1 > /logs/verifier/reward.txt; "
         "echo '{\"reward\": 1}' > /logs/verifier/reward.json")


@pytest.fixture(scope="module", params=["shared", "separate"])
def mode(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory, mode: str) -> Path:
    root = tmp_path_factory.mktemp(f"harbor-adversarial-{mode}")
    for name, test_sh in VERIFIERS.items():
        task = write_task(root, f"forge-{name}", test_sh=test_sh)
        (task / "tests" / "test_sum.py").write_text(TEST_SUM)
        if mode == "separate":  # the verifier gets a container of its own, and /app
            toml = (task / "task.toml").read_text()
            toml = 'artifacts = ["/app"]\n' + toml.replace("[verifier]\n", '[verifier]\nenvironment_mode = "separate"\n')
            (task / "task.toml").write_text(toml)
    return root


@pytest.fixture()
def env_of(tasks: Path) -> Iterator[Any]:
    made: list[HarborEnv] = []

    def make(verifier: str) -> HarborEnv:
        made.append(HarborEnv(path=tasks / f"forge-{verifier}"))
        return made[-1]

    yield make
    for env in made:
        env.close()


def attack(env: HarborEnv, *commands: str) -> tuple[float, list[str], dict[str, Any]]:
    """Plays the agent's ``commands`` (one bash call each), then submits; returns (reward,
    tool outputs, the grade's details)."""
    reward, outputs, _ = play(env, [*(bash(c) for c in commands), SUBMIT])
    assert env.last_grade is not None
    return reward, outputs, env.last_grade


def audit(grade: dict[str, Any]) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """What the verifier printed about itself: its settings and the container's processes."""
    tail = grade["output_tail"]
    line = re.search(r"^uid=.*$", tail, re.M)
    assert line is not None, tail
    settings = dict(item.split("=", 1) for item in line.group(0).split(" "))
    block = tail.split("procs:\n", 1)[1].split(":procs", 1)[0]
    procs = [tuple(row.split(" ", 1)) for row in block.splitlines() if row.strip()]
    return settings, procs  # type: ignore[return-value]


def assert_clean_verifier(grade: dict[str, Any]) -> None:
    """The verifier ran as root with a clean environment in the working directory, which it
    owns, and no process of the agent's uid was left in the container."""
    settings, procs = audit(grade)
    assert settings == {"uid": VERIFIER_UID, "home": "/root", "path": SYSTEM_PATH,
                        "bash_env": "unset", "env": "unset", "nousersite": "1", "cwd": "/app",
                        "owner": VERIFIER_UID, "writes_cwd": "yes"}
    assert procs and all(uid != AGENT_UID for uid, _ in procs), procs


@pytest.mark.parametrize("verifier", sorted(VERIFIERS))
def test_the_oracle_scores_1_on_every_verifier_here(env_of: Any, verifier: str) -> None:
    env = env_of(verifier)
    assert oracle(env) == 1.0
    assert_clean_verifier(env.last_grade)


def test_shell_start_up_files_in_the_agents_home_do_not_run(env_of: Any) -> None:
    # Every file a bash or sh reads at start or exit, in the agent's home (its working
    # directory is its HOME) and in the working directory.
    files = [".profile", ".bash_profile", ".bash_login", ".bashrc", ".bash_logout", ".shrc",
             ".kshrc", ".bash_aliases"]
    plant = "; ".join(f"printf '%s\\n' {shlex.quote(FORGE)} > {d}/{f}"
                      for d in ("$HOME", "/app", "/workspace") for f in files)
    reward, outputs, grade = attack(env_of("login"), plant + "; ls -A $HOME")
    assert ".bash_logout" in outputs[0]  # they were written
    assert reward == 0.0
    assert_clean_verifier(grade)


def test_variables_the_agent_exports_do_not_reach_the_verifier(env_of: Any) -> None:
    hook = f"printf '%s\\n' {shlex.quote(FORGE)} > /app/.hook"
    exports = ("export BASH_ENV=/app/.hook ENV=/app/.hook PATH=/app:$PATH HOME=/app "
               "PYTHONPATH=/app PYTHONSTARTUP=/app/.hook; echo $BASH_ENV")
    # The bash tool keeps one shell for the episode: the exports stay set in it until it ends.
    reward, outputs, grade = attack(env_of("cmp"), hook, exports, "echo still $BASH_ENV")
    assert "still /app/.hook" in outputs[2]
    assert reward == 0.0
    assert_clean_verifier(grade)


@pytest.mark.parametrize("verifier", ["cmp", "pytest"])
def test_shims_named_like_the_verifiers_tools_are_not_run(env_of: Any, verifier: str) -> None:
    shim = "#!/bin/sh\n" + FORGE + '\nexec /usr/bin/$(basename "$0") "$@"\n'
    names = ["bash", "sh", "python", "python3", "pytest", "cmp", "awk", "cat", "id", "env", "timeout"]
    dirs = ["/usr/local/bin", "/usr/local/sbin", "/usr/bin", "/bin", "$HOME/bin", "$HOME/.local/bin",
            "/app", "/app/bin", "/app/.venv/bin", "/tmp"]
    plant = "; ".join(f"mkdir -p {d}; printf '%s' {shlex.quote(shim)} > {d}/{n} && chmod +x {d}/{n}"
                      for d in dirs for n in names)
    reward, outputs, grade = attack(env_of(verifier), f"{{ {plant}; }} 2>/dev/null; echo shims=$(ls /app/bin | wc -l)")
    assert f"shims={len(names)}" in outputs[0]  # the writable places got them
    assert reward == 0.0
    assert_clean_verifier(grade)


def test_python_start_up_hooks_of_the_agent_do_not_run(env_of: Any) -> None:
    # A .pth line and usercustomize/sitecustomize run when Python starts, if Python finds them;
    # the hook ends the Python process with status 0 (pytest then "passes").
    hook = "import os; os._exit(0)\n"
    plant = (
        f"site=$(python3 -m site --user-site); mkdir -p $site $HOME/.local/bin && "
        f"for d in $site /app /workspace; do printf '%s' {shlex.quote(hook)} > $d/agent.pth; "
        f"printf '%s' {shlex.quote(hook)} > $d/usercustomize.py; "
        f"printf '%s' {shlex.quote(hook)} > $d/sitecustomize.py; done; "
        f"printf '%s' {shlex.quote(hook)} > /app/.pythonrc.py; echo $site")
    reward, outputs, grade = attack(env_of("pytest"), plant)
    assert "/workspace/.local/lib/python3" in outputs[0]  # the agent's user site
    assert reward == 0.0
    assert_clean_verifier(grade)


def test_files_in_the_working_directory_do_not_hijack_pytest(env_of: Any) -> None:
    # What pytest's console script could pick up from its working directory: a conftest, ini
    # files naming a plugin, a plugin module, a module shadowing pytest itself.
    quit_ok = "import os\nos._exit(0)\n"
    conftest = ("import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
                "def pytest_runtest_makereport(item, call):\n"
                "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n")
    files = {
        "conftest.py": conftest, "agentplug.py": quit_ok, "pytest.py": quit_ok,
        "_pytest/__init__.py": quit_ok, "pytest.ini": "[pytest]\naddopts = -p agentplug\n",
        "tox.ini": "[pytest]\naddopts = -p agentplug\n",
        "setup.cfg": "[tool:pytest]\naddopts = -p agentplug\n",
        "pyproject.toml": "[tool.pytest.ini_options]\naddopts = \"-p agentplug\"\n",
        "tests/conftest.py": conftest,
    }
    plant = "; ".join(f"mkdir -p $(dirname /app/{p}); printf '%s' {shlex.quote(t)} > /app/{p}"
                      for p, t in files.items())
    reward, _, grade = attack(env_of("pytest"), plant)
    assert reward == 0.0
    assert_clean_verifier(grade)


# Each leaves a process that marks itself alive, then (once the tests appear) copies the
# expected answer and writes the reward files, over and over.
LOOP = f"touch /app/.alive; while :; do {FORGE}; sleep 0.01; done"
LATER = f"touch /app/.alive; sleep 3; while :; do {FORGE}; sleep 0.01; done"
BACKGROUND = {
    "nohup": f"nohup sh -c {shlex.quote(LOOP)} >/dev/null 2>&1 &",
    "setsid": f"setsid sh -c {shlex.quote(LOOP)} >/dev/null 2>&1 < /dev/null &",
    "double-fork": f"( ( sh -c {shlex.quote(LOOP)} >/dev/null 2>&1 & ) & )",
    "disown": f"sh -c {shlex.quote(LOOP)} >/dev/null 2>&1 & disown",
    "python-new-session": "python3 -c " + shlex.quote(
        f"import subprocess; subprocess.Popen(['sh', '-c', {LOOP!r}], start_new_session=True, "
        "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"),
    "delayed": f"nohup sh -c {shlex.quote(LATER)} >/dev/null 2>&1 &",
}


@pytest.mark.parametrize("how", sorted(BACKGROUND))
def test_background_processes_are_gone_before_grading(env_of: Any, how: str) -> None:
    started = (f"rm -f /app/.alive\n{BACKGROUND[how]}\n"
               "for i in $(seq 100); do test -e /app/.alive && break; sleep 0.1; done\n"
               "test -e /app/.alive && echo cheat-running")
    reward, outputs, grade = attack(env_of("cmp"), started)
    assert "cheat-running" in outputs[0]  # it was running when the agent submitted
    assert reward == 0.0
    assert_clean_verifier(grade)  # no process of the agent's uid while the verifier ran


SYMLINKS = {
    "absolute": "ln -s /tests/expected.txt /app/answer.txt",
    "relative": "ln -s ../tests/expected.txt /app/answer.txt",
    "via-workspace": "ln -s ../../tests/expected.txt /workspace/answer.txt",
    "via-proc-root": "ln -s /proc/self/root/tests/expected.txt /app/answer.txt",
    "via-an-image-link": "ln -s /var/run/../tests/expected.txt /app/answer.txt",  # /var/run -> /run
    "via-proc-cwd": "ln -s /proc/self/cwd/../tests/expected.txt /app/answer.txt",
    "via-a-directory-link": "ln -s / /app/r && ln -s r/tests/expected.txt /app/answer.txt",
    "chain": "ln -s b /app/answer.txt && ln -s d/t/expected.txt /app/b && mkdir /app/d "
             "&& ln -s ../../tests /app/d/t",
    "directory": "ln -s /tests /app/t && ln -s t/expected.txt /app/answer.txt",
}


def refused(grade: dict[str, Any]) -> list[str]:
    """The members a separate verifier's artifacts left out (none in shared mode)."""
    return [name for artifact in grade.get("artifacts", []) for name in artifact["refused"]]


@pytest.mark.parametrize("how", sorted(SYMLINKS))
def test_symlinks_into_the_tests_are_removed_before_grading(env_of: Any, mode: str, how: str) -> None:
    # The link dangles while the agent runs; it would reach tests/expected.txt once the tests
    # are copied in, and the answer would match.
    reward, _, grade = attack(env_of("cmp"), SYMLINKS[how])
    assert reward == 0.0
    if mode == "shared":
        assert "/app/answer.txt" in grade["removed_links"]
    else:  # a link that leaves the artifact never reaches the verifier; one inside it dangles
        assert refused(grade) or "/app/answer.txt" in grade["removed_links"]
    assert_clean_verifier(grade)


def test_links_into_the_reward_directory_are_removed_and_nothing_is_planted_there(env_of: Any, mode: str) -> None:
    plant = ("ln -s /logs/verifier /app/logs; ln -s /logs/verifier/reward.json /app/out.json; "
             "ln -s /solution /app/sol; ln -s /logs /app/l; "
             "ln -s /app/reward.txt /logs/verifier/reward.txt; echo 1 > /logs/verifier/reward.txt; "
             "echo '{\"reward\": 1}' > /logs/verifier/reward.json; mkdir /logs/verifier/reward.json; "
             "ln -s /app/expected.txt /tests/expected.txt; echo 1 > /app/reward.txt; "
             "echo planted=$(find /logs/verifier /tests -mindepth 1 | wc -l)")
    reward, outputs, grade = attack(env_of("cmp"), plant)
    assert "planted=0" in outputs[0]  # nothing got into /logs/verifier or /tests
    assert reward == 0.0
    if mode == "shared":
        assert sorted(grade["removed_links"]) == ["/app/l", "/app/logs", "/app/out.json", "/app/sol"]
    else:  # absolute links leave the artifact: refused when it is taken
        assert {"app/l", "app/logs", "app/out.json", "app/sol"} <= {n.split(" ")[0] for n in refused(grade)}
    assert_clean_verifier(grade)


def test_a_shipped_task_scores_1_with_its_oracle_and_0_with_the_attacks() -> None:
    env = HarborEnv(path=SHIPPED_TASKS / "debug-test-roman")
    try:
        assert oracle(env) == 1.0
        hook = "import os; os._exit(0)\n"
        plant = (
            f"site=$(python3 -m site --user-site); mkdir -p $site; "
            f"for d in $site /app /app/tests; do printf '%s' {shlex.quote(hook)} > $d/agent.pth; "
            f"printf '%s' {shlex.quote(hook)} > $d/usercustomize.py; "
            f"printf '%s' {shlex.quote(hook)} > $d/sitecustomize.py; "
            f"printf '%s' {shlex.quote(hook)} > $d/pytest.py; "
            f"printf '%s' {shlex.quote(hook)} > $d/conftest.py; done; "
            f"printf '[pytest]\\naddopts = -p sitecustomize\\n' > /app/pytest.ini; "
            f"ln -s /tests/test_roman.py /app/tests/test_roman.py.orig; {BACKGROUND['setsid']}")
        reward, _, grade = attack(env, plant)
        assert reward == 0.0
        assert grade["exit_code"] == 0 and grade["rewards"] == {"reward": 0.0}
    finally:
        env.close()


def test_a_shipped_separate_verifier_task_scores_1_with_its_oracle_and_0_with_the_attacks() -> None:
    env = HarborEnv(path=SHIPPED_TASKS / "csv-to-json-separate-verifier")
    try:
        assert oracle(env) == 1.0
        assert env.last_grade["verifier"] == "separate"
        # the grader is not in the agent's container at all; what it plants there stays there
        plant = ("ls -A /tests /logs/verifier; echo 1 > /logs/verifier/reward.txt; "
                 "ln -s /etc/passwd /app/people.json; ln -s /logs/verifier /app/v; "
                 "echo '[]' > /tmp/people.json; " + BACKGROUND["setsid"])
        reward, outputs, grade = attack(env, plant)
        assert "test_outputs.py" not in outputs[0] and "Permission denied" in outputs[0]
        assert reward == 0.0
        assert {"app/people.json", "app/v"} <= {n.split(" ")[0] for n in refused(grade)}
    finally:
        env.close()

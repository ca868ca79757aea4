"""Cross-check against Harbor itself: every reward-file case of tests/unit/test_harbor_rewards.py
(but those where agentrl is stricter on purpose) is read by Harbor's own code in the Python 3.12
venv that scripts/setup-harbor-check.sh makes, and by agentrl, with the same outcome: the same
entries (values and int/float types) and reward, or an error from both.

That venv holds only what Harbor's task model needs, not what its verifier module imports (its
environments: Docker, cloud sandboxes, ...). So the harness takes the reward-parsing methods of
``harbor.verifier.verifier.Verifier`` and ``harbor.cli.jobs._primary_reward`` (the reward
Harbor reports for a trial) from Harbor's installed source, unchanged but for their annotations
and decorators, and runs them with Harbor's real ``VerifierResult`` model. Which file is read
(``reward.json`` when it exists, else ``reward.txt``) is the three-line choice at the end of
``Verifier.verify``, written out in the harness.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from agentrl.errors import GradingError
from tests.integration.test_harbor_schema import HARBOR_PYTHON, SKIP
from tests.unit.test_harbor_rewards import CASES, read_case, write_case

pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

HARNESS = r'''
import ast, json, math, sys, types
from pathlib import Path

import harbor
from harbor.models.verifier.result import VerifierResult

SOURCE = Path(harbor.__file__).parent


def definitions(relative, names, inside=None):
    """The top-level (or class ``inside``'s) definitions ``names`` of a Harbor source file."""
    body = ast.parse((SOURCE / relative).read_text()).body
    if inside:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == inside).body
    found = [n for n in body if getattr(n, "name", None) in names]
    assert {n.name for n in found} == set(names), (relative, names)
    for node in found:
        if isinstance(node, ast.FunctionDef):
            node.decorator_list, node.returns = [], None
            for arg in node.args.args:
                arg.annotation = None
    return found


def run(nodes, namespace):
    module = ast.fix_missing_locations(ast.Module(body=nodes, type_ignores=[]))
    exec(compile(module, "harbor-extract", "exec"), namespace)


namespace = {"json": json, "math": math}
run(definitions("verifier/verifier.py", {"VerifierOutputParseError", "RewardFileEmptyError"}), namespace)
parser = ast.ClassDef(name="RewardParser", bases=[], keywords=[], decorator_list=[],
                      body=definitions("verifier/verifier.py", {"_parse_reward_text", "_parse_reward_json"},
                                       inside="Verifier"))
run([parser], namespace)
run(definitions("cli/jobs.py", {"_primary_reward"}), namespace)

out = {}
for directory in sys.argv[1:]:
    paths = types.SimpleNamespace(reward_json_path=Path(directory) / "reward.json",
                                  reward_text_path=Path(directory) / "reward.txt")
    reader = namespace["RewardParser"]()
    reader.trial_paths = paths
    try:
        if paths.reward_json_path.exists():  # as Verifier.verify chooses
            rewards = reader._parse_reward_json()
        elif paths.reward_text_path.exists():
            rewards = reader._parse_reward_text()
        else:
            raise FileNotFoundError("no reward file")
        result = VerifierResult(rewards=rewards)
        primary = namespace["_primary_reward"](types.SimpleNamespace(verifier_result=result))
        out[directory] = {"primary": None if primary is None else repr(primary),
                          "rewards": {k: [type(v).__name__, repr(v)] for k, v in result.rewards.items()}}
    except Exception as exc:
        out[directory] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
print(json.dumps(out))
'''


def test_harbor_reads_every_reward_case_as_agentrl_does(tmp_path: Path) -> None:
    names = sorted(name for name, case in CASES.items() if not case.ours_only)
    directories = {name: write_case(tmp_path / name, CASES[name]) for name in names}
    done = subprocess.run([str(HARBOR_PYTHON), "-c", HARNESS, *map(str, directories.values())],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HARBOR_TELEMETRY": "0", "PYTHONUTF8": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    harbor = json.loads(done.stdout)
    disagreements = {}
    for name, directory in directories.items():
        theirs = harbor[str(directory)]
        try:
            reward, rewards = read_case(directory)
        except GradingError as exc:
            # Harbor fails too, or records entries but no reward (several, none named 'reward')
            if "error" not in theirs and theirs["primary"] is not None:
                disagreements[name] = (theirs, f"GradingError: {exc}")
            continue
        ours = {"primary": repr(reward),
                "rewards": {k: [type(v).__name__, repr(v)] for k, v in rewards.items()}}
        if ours != theirs:
            disagreements[name] = (theirs, ours)
    assert disagreements == {}
    # the harness did run Harbor's code: it accepted some cases and refused others
    assert sum("error" in v for v in harbor.values()) >= 20
    assert sum("error" not in v for v in harbor.values()) >= 10

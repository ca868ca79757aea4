"""The built-in envs/ and tools/ folders install under names that cannot collide."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import agentrl_envs
import agentrl_tools

REPO = Path(__file__).resolve().parents[2]


def test_import_names_map_to_repo_folders():
    assert Path(agentrl_envs.__file__).parent == REPO / "envs"
    assert Path(agentrl_tools.__file__).parent == REPO / "tools"


def test_wheel_has_no_generic_top_level_packages_and_builds_without_warnings(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation",
         "-v", "-w", str(tmp_path)],
        check=True, capture_output=True, text=True, timeout=300,
    )
    # the project's own packaging config warns about nothing (data folders, the license field)
    assert "Warning" not in built.stdout + built.stderr, [
        line for line in (built.stdout + built.stderr).splitlines() if "Warning" in line]
    (wheel,) = tmp_path.glob("agentrl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "agentrl/view/static/app.js" in names and "agentrl/models/checkpoints/swe-tools-warm-v1/warm.json" in names
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"agentrl", "agentrl_envs", "agentrl_tools"}
    assert "agentrl_envs/calc/env.py" in names and "agentrl_tools/calculator.py" in names
    assert "agentrl/tools/formats/hermes.py" in names


def test_a_foreign_envs_package_does_not_shadow_ours(tmp_path):
    """A user's own top-level ``envs``/``tools`` packages coexist with agentrl's built-ins."""
    for name in ("envs", "tools"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"WHO = 'user {name}'\n")
    code = (
        "import envs, tools, agentrl\n"
        "assert envs.WHO == 'user envs' and tools.WHO == 'user tools'\n"
        "env = agentrl.make_env('calc')\n"
        "print(type(env).__module__)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "agentrl_envs.calc.env"

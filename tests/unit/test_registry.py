"""register_env / make_env / gymnasium.make / module:id lookup / close-match errors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import gymnasium
import pytest

import agentrl
from agentrl.env import registry
from agentrl.errors import EnvArgumentError, EnvRegistrationError, UnknownEnvError
from agentrl_envs.calc import CalcEnv


@pytest.fixture
def clean_registry(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    yield registry._REGISTRY


def test_builtin_calc_is_registered():
    ids = [spec.id for spec in agentrl.list_envs()]
    assert "calc-v0" in ids
    env = agentrl.make_env("calc")
    assert isinstance(env, CalcEnv) and env.env_id == "calc-v0"


def test_unversioned_id_resolves_to_latest(clean_registry):
    agentrl.register_env("demo-v1", entry_point="agentrl_envs.calc:CalcEnv", max_turns=2)
    agentrl.register_env("demo-v3", entry_point="agentrl_envs.calc:CalcEnv", max_turns=3)
    assert agentrl.env_spec("demo").id == "demo-v3"
    assert agentrl.make_env("demo").max_turns == 3
    assert agentrl.make_env("demo-v1").max_turns == 2
    assert agentrl.make_env("demo-v1", max_turns=7).max_turns == 7


def test_unknown_id_suggests_close_matches():
    with pytest.raises(UnknownEnvError, match="Did you mean 'calc'"):
        agentrl.make_env("calx")
    with pytest.raises(UnknownEnvError, match="agentrl list-envs"):
        agentrl.make_env("zzzzzzzzzz")


def test_module_prefix_imports_user_module(tmp_path, monkeypatch, clean_registry):
    (tmp_path / "user_envs_mod.py").write_text(
        "import agentrl\n"
        "agentrl.register_env('user-calc-v0', entry_point='agentrl_envs.calc:CalcEnv')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert isinstance(agentrl.make_env("user_envs_mod:user-calc"), CalcEnv)


def test_missing_module_is_a_clear_error():
    with pytest.raises(EnvRegistrationError, match="cannot import module 'no_such_mod_xyz'"):
        agentrl.make_env("no_such_mod_xyz:thing")


@pytest.mark.parametrize("bad_id", ["", "has space", "a/b/c", "x:y"])
def test_invalid_ids_rejected(bad_id, clean_registry):
    with pytest.raises(EnvRegistrationError, match="invalid env id"):
        agentrl.register_env(bad_id, entry_point="agentrl_envs.calc:CalcEnv")


def test_duplicate_registration(clean_registry):
    agentrl.register_env("dup-v0", entry_point="agentrl_envs.calc:CalcEnv")
    agentrl.register_env("dup-v0", entry_point="agentrl_envs.calc:CalcEnv")  # same spec: fine
    with pytest.raises(EnvRegistrationError, match="already registered"):
        agentrl.register_env("dup-v0", entry_point="other.module:Env")


def test_bad_entry_point(clean_registry):
    with pytest.raises(EnvRegistrationError, match="package.module:ClassName"):
        agentrl.register_env("bad-v0", entry_point="no_colon")
    agentrl.register_env("bad-v1", entry_point="agentrl_envs.calc:Missing")
    with pytest.raises(EnvRegistrationError, match="cannot load entry point"):
        agentrl.make_env("bad-v1")
    agentrl.register_env("bad-v2", entry_point="builtins:dict")
    with pytest.raises(EnvRegistrationError, match="not an agentrl.ToolEnv"):
        agentrl.make_env("bad-v2")


def test_gymnasium_make_reaches_the_same_env():
    agentrl.list_envs()  # loads the built-ins
    env = gymnasium.make("agentrl/calc-v0", max_turns=2)
    assert isinstance(env.unwrapped, CalcEnv) and env.unwrapped.max_turns == 2
    obs, info = env.reset(seed=0)
    assert obs[0]["role"] == "system"
    env.close()


def test_gymnasium_module_syntax():
    env = gymnasium.make("agentrl_envs:agentrl/calc-v0")
    assert isinstance(env.unwrapped, CalcEnv)


FRESH_IMPORT = textwrap.dedent("""
    import json, sys
    import agentrl
    import gymnasium
    ids = sorted(k for k in gymnasium.registry if k.startswith("agentrl/"))
    env_modules = sorted(m for m in sys.modules if m.startswith("agentrl_envs."))
    env = gymnasium.make("agentrl/calc-v0")
    print(json.dumps({"ids": ids, "env_modules": env_modules,
                      "made": type(env.unwrapped).__name__}))
""")


def test_import_agentrl_registers_builtins_with_gymnasium_lazily():
    out = subprocess.run([sys.executable, "-c", FRESH_IMPORT], capture_output=True, text=True,
                         check=True).stdout
    result = json.loads(out)
    # the built-ins: an earlier test of this process may have registered envs of its own
    builtins = [spec for spec in agentrl.list_envs()
                if isinstance(spec.entry_point, str) and spec.entry_point.startswith("agentrl_envs.")]
    assert result["ids"] == sorted(f"agentrl/{spec.id}" for spec in builtins)
    assert result["env_modules"] == []  # registered by entry point: no env module imported
    assert result["made"] == "CalcEnv"


def test_unknown_constructor_argument_names_env_argument_and_accepted_ones():
    with pytest.raises(EnvArgumentError) as excinfo:
        agentrl.make_env("calc", max_turn=3)
    message = str(excinfo.value)
    assert "env 'calc-v0' (CalcEnv) got unknown argument(s) 'max_turn'" in message
    assert "did you mean 'max_turns'?" in message
    assert "accepts: compact, max_turns, mcp_servers, render_mode, split, tool_call_format, tools" in message


def test_missing_required_argument_is_named(clean_registry):
    def build(*, data):
        raise AssertionError("not reached")

    agentrl.register_env("needs-data-v0", entry_point=build)
    with pytest.raises(EnvArgumentError, match="env 'needs-data-v0' .* needs the argument"):
        agentrl.make_env("needs-data-v0")


class TypeErrorInsideEnv(CalcEnv):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        len(5)  # a bug in the constructor's own code


def test_type_error_inside_the_constructor_is_not_rewritten(clean_registry):
    agentrl.register_env("buggy-v0", entry_point=TypeErrorInsideEnv)
    with pytest.raises(TypeError, match="has no len") as excinfo:
        agentrl.make_env("buggy-v0", max_turns=2)
    assert not isinstance(excinfo.value, EnvArgumentError)


def test_make_env_records_the_gymnasium_spec():
    env = agentrl.make_env("calc", max_turns=3)
    assert env.spec.id == "agentrl/calc-v0" and env.spec.kwargs == {"max_turns": 3}
    again = env.spec.make()
    assert isinstance(again.unwrapped, CalcEnv) and again.unwrapped.max_turns == 3

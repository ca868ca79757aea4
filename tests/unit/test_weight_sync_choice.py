"""``weight_sync_for`` picks a strategy by what the engine can do (its capability protocols and
``takes_tensors``), never by its class name, and refuses a mode the engine cannot take."""

import pytest

from agentrl.engine.base import JoinsWeightGroup, LoadsAdapters
from agentrl.engine.sglang import SGLangEngine
from agentrl.engine.vllm import VLLMEngine
from agentrl.errors import ConfigError
from agentrl.run.weights import AdapterSync, BroadcastSync, DiskSync, weight_sync_for

TRAINER = object()  # the strategies only keep it until a push


def test_capabilities_of_the_server_clients():
    sglang, vllm = SGLangEngine(["http://127.0.0.1:9"]), VLLMEngine(["http://127.0.0.1:9"])
    assert isinstance(sglang, JoinsWeightGroup) and not isinstance(sglang, LoadsAdapters)
    assert isinstance(vllm, LoadsAdapters) and not isinstance(vllm, JoinsWeightGroup)


def test_each_mode_goes_to_the_engine_that_can_take_it(tmp_path):
    sglang, vllm = SGLangEngine(["http://127.0.0.1:9"]), VLLMEngine(["http://127.0.0.1:9"])
    assert isinstance(weight_sync_for(sglang, TRAINER, "broadcast", tmp_path), BroadcastSync)
    assert isinstance(weight_sync_for(vllm, TRAINER, "adapter", tmp_path), AdapterSync)
    assert isinstance(weight_sync_for(vllm, TRAINER, "auto", tmp_path), DiskSync)  # servers load a folder


class _Adapters:
    """Not an agentrl engine class at all: only the capability counts."""

    takes_tensors = False

    async def update_adapter(self, path: str, *, version: str) -> None:
        raise AssertionError("not pushed in this test")


def test_a_capability_is_enough_whatever_the_class(tmp_path):
    assert isinstance(weight_sync_for(_Adapters(), TRAINER, "adapter", tmp_path), AdapterSync)  # type: ignore[arg-type]


@pytest.mark.parametrize(("mode", "message"), [
    ("broadcast", "--weight-sync broadcast is for SGLang servers"),
    ("adapter", "--weight-sync adapter is for vLLM servers"),
    ("fast", "--weight-sync must be auto, tensor, disk, broadcast or adapter"),
])
def test_a_mode_the_engine_cannot_take_names_the_flag(tmp_path, mode, message):
    engine = VLLMEngine(["http://127.0.0.1:9"]) if mode == "broadcast" else SGLangEngine(["http://127.0.0.1:9"])
    with pytest.raises(ConfigError, match=message):
        weight_sync_for(engine, TRAINER, mode, tmp_path)

"""The vLLM client's wire format: our requests validate against vLLM's own request model, vLLM's
answers (built with its own response models) read back as the contract says, and the untied
view that vLLM's CPU build needs for tied models."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from agentrl.engine.base import SamplingParams
from agentrl.engine.vllm import (
    UNTIED_HEAD_FILE,
    generate_request,
    read_generate_response,
    ties_embeddings,
    untied_view,
)
from agentrl.errors import EngineError


@pytest.fixture(scope="module")
def protocol():
    pytest.importorskip("vllm", reason="vLLM is not installed (make test installs it with scripts/setup-vllm.sh)")
    from vllm.entrypoints.scale_out.token_in_token_out import protocol

    return protocol


@pytest.mark.parametrize("sampling", [
    SamplingParams(max_new_tokens=7, temperature=0.0),
    SamplingParams(max_new_tokens=64, temperature=0.7, top_p=0.9, top_k=20, stop=("</tool_call>",),
                   stop_token_ids=(3, 4), ignore_eos=True, sampling_seed=11),
])
def test_our_requests_validate_against_vllms_request_model(protocol, sampling):
    body = generate_request([5, 6, 7], sampling, "r0-g1-s2-t3")
    request = protocol.GenerateRequest.model_validate(body)
    params = request.sampling_params
    assert request.request_id == "r0-g1-s2-t3" and request.token_ids == [5, 6, 7]
    assert params.max_tokens == sampling.max_new_tokens and params.logprobs == 0
    assert params.seed == sampling.sampling_seed and list(params.stop or []) == list(sampling.stop)
    assert set(params.stop_token_ids or []) == set(sampling.stop_token_ids)
    assert params.include_stop_str_in_output and not params.skip_special_tokens
    assert params.temperature == (0.0 if sampling.greedy else sampling.temperature)


def test_vllms_answers_read_back_as_the_contract_says(protocol):
    choice = protocol.GenerateTokensChoice(
        index=0, finish_reason="stop", stop_reason="</tool_call>", token_ids=[9, 8, 7],
        weight_versions=[{"version": "3", "start": 0, "end": 1}, {"version": "4", "start": 1, "end": 3}],
        logprobs=protocol.GenerateLogProbs(content=[
            protocol.GenerateLogProbsContent(token_id=t, logprob=-0.5 * (i + 1)) for i, t in enumerate([9, 8, 7])]))
    answer = protocol.GenerateTokensResponse(choices=[choice], usage={
        "prompt_tokens": 300, "completion_tokens": 3, "total_tokens": 303,
        "prompt_tokens_details": {"cached_tokens": 256}})
    out = read_generate_response(json.loads(answer.model_dump_json()), 300, "0")
    assert (out.output_ids, out.output_logprobs) == ([9, 8, 7], [-0.5, -1.0, -1.5])
    assert out.finish_reason == "stop" and out.matched == "</tool_call>"
    assert out.weight_version == "4"  # a request spanning an update reports the newer version
    assert out.token_versions == ["3", "4", "4"]  # and each token's, from the spans
    assert (out.prompt_tokens, out.cached_tokens) == (300, 256)

    eos = read_generate_response({"choices": [{"finish_reason": "stop", "token_ids": [1, 2],
                                               "logprobs": {"content": [{"token_id": 1, "logprob": -1.0},
                                                                        {"token_id": 2, "logprob": -2.0}]}}]}, 4, "7")
    assert eos.matched == 2 and eos.weight_version == "7"  # no spans: the client's version
    assert eos.token_versions is None
    aborted = read_generate_response({"choices": [{"finish_reason": "abort", "token_ids": [],
                                                   "logprobs": None}]}, 4, "7")
    assert aborted.finish_reason == "abort" and aborted.output_ids == []
    with pytest.raises(EngineError, match="2 tokens but 1 log-probabilities"):
        read_generate_response({"choices": [{"finish_reason": "length", "token_ids": [1, 2],
                                             "logprobs": {"content": [{"token_id": 1, "logprob": -1.0}]}}]}, 4, "7")
    with pytest.raises(EngineError, match="without a choice"):
        read_generate_response({"choices": []}, 4, "7")


def _tied_checkpoint(root, sharded: bool):
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "qwen2", "tie_word_embeddings": True}))
    (root / "tokenizer.json").write_text("{}")
    embed = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    if sharded:
        save_file({"model.embed_tokens.weight": embed}, str(root / "model-00001-of-00002.safetensors"))
        save_file({"model.norm.weight": torch.ones(3)}, str(root / "model-00002-of-00002.safetensors"))
        (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "model.norm.weight": "model-00002-of-00002.safetensors"}}))
    else:
        save_file({"model.embed_tokens.weight": embed, "model.norm.weight": torch.ones(3)},
                  str(root / "model.safetensors"))
    return embed


@pytest.mark.parametrize("sharded", [False, True], ids=["one-file", "sharded"])
def test_the_untied_view_links_the_checkpoint_and_adds_the_output_layer(tmp_path, sharded):
    embed = _tied_checkpoint(tmp_path / "model", sharded)
    before = {p.name: p.read_bytes() for p in (tmp_path / "model").iterdir()}
    view = untied_view(tmp_path / "model", tmp_path / "view")
    assert ties_embeddings(tmp_path / "model") and not ties_embeddings(view)
    assert torch.equal(load_file(str(view / UNTIED_HEAD_FILE))["lm_head.weight"], embed)
    assert (view / "tokenizer.json").is_symlink()
    if sharded:
        weight_map = json.loads((view / "model.safetensors.index.json").read_text())["weight_map"]
        assert weight_map["lm_head.weight"] == UNTIED_HEAD_FILE and len(weight_map) == 3
    # the checkpoint itself is untouched, and a view of a view writes nothing through its links
    untied_view(view, tmp_path / "view2")
    assert {p.name: p.read_bytes() for p in (tmp_path / "model").iterdir()} == before
    with pytest.raises(EngineError, match="no model.embed_tokens.weight"):
        (tmp_path / "bare").mkdir()
        (tmp_path / "bare" / "config.json").write_text("{}")
        save_file({"model.norm.weight": torch.ones(3)}, str(tmp_path / "bare" / "model.safetensors"))
        untied_view(tmp_path / "bare", tmp_path / "bare-view")

"""Our SGLang requests and response parsing against SGLang's own /generate contract
(``sglang/api/v1/api_types.py`` from the sglang wheel, fetched by scripts/fetch-sglang-contract.sh;
it needs only msgspec)."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from agentrl.engine.base import GenerateOutput, SamplingParams
from agentrl.engine.sglang import generate_request
from agentrl.engine.sglang_compat_server import output_to_sglang, sampling_from_sglang

CONTRACT = Path(__file__).resolve().parents[2] / ".venv" / "sglang-contract" / "0.5.23" / "api_types.py"


@pytest.fixture(scope="module")
def api():
    pytest.importorskip("msgspec", reason="msgspec is not installed (pip install -e '.[dev]')")
    if not CONTRACT.is_file():
        pytest.skip(f"{CONTRACT} missing: run scripts/fetch-sglang-contract.sh (make test does)")
    spec = importlib.util.spec_from_file_location("sglang_api_types", CONTRACT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FULL = SamplingParams(max_new_tokens=64, temperature=0.7, top_p=0.9, top_k=20, stop=("</tool_call>",),
                      stop_token_ids=(151645,), ignore_eos=False, sampling_seed=2**62 + 5)


@pytest.mark.parametrize("sampling", [SamplingParams(), FULL, SamplingParams(temperature=0.0)])
def test_our_generate_requests_satisfy_the_contract(api, sampling):
    body = generate_request([151644, 872, 198], sampling, rid="r3-g7-s1-t2")
    request = api.GenerateRequest.from_json_value(body)
    assert request.input_ids == [151644, 872, 198] and request.rid == "r3-g7-s1-t2"
    assert request.return_logprob is True and request.routing_key == "r3-g7-s1"
    params = request.sampling_params
    assert params.max_new_tokens == sampling.max_new_tokens and params.no_stop_trim is True
    assert params.skip_special_tokens is False and params.sampling_seed == sampling.sampling_seed
    assert list(params.stop_token_ids) == list(sampling.stop_token_ids)


def test_the_contract_is_strict_so_the_check_has_teeth(api):
    body = generate_request([1], SamplingParams(), rid="x")
    body["sampling_params"]["max_tokens"] = 3  # not an SGLang key
    with pytest.raises(api.JsonContractError, match="max_tokens"):
        api.GenerateRequest.from_json_value(body)
    with pytest.raises(api.JsonContractError):
        api.GenerateRequest.from_json_value({**generate_request([1], SamplingParams(), "x"), "stream": "no"})


@pytest.mark.parametrize(("finish", "status"), [
    ({"type": "stop", "matched": 151645}, "stop"),
    ({"type": "stop", "matched": "</tool_call>"}, "stop"),
    ({"type": "length", "length": 3}, "length"),
    ({"type": "abort", "message": "aborted by abort_request", "status_code": 200}, "abort"),
])
def test_contract_shaped_responses_parse(api, finish, status):
    response = api.GenerateResponse(
        text="hi", output_ids=[11, 12, 13],
        meta_info=api.GenerateMetaInfo(
            id="r0-g0-s0-t0", prompt_tokens=40, completion_tokens=3, cached_tokens=32,
            finish_reason=api.decode_FinishReason(finish), weight_version="12", e2e_latency=0.5,
            output_token_logprobs=[api.LogprobEntry(logprob=-0.5 * i, token_id=t, text=None)
                                   for i, t in enumerate([11, 12, 13])]),
    ).to_json_value()
    out = GenerateOutput.from_sglang(response)
    assert out.output_ids == [11, 12, 13] and out.output_logprobs == [0.0, -0.5, -1.0]
    assert out.finish_reason == status and out.weight_version == "12"
    assert (out.prompt_tokens, out.cached_tokens, out.latency_s) == (40, 32, 0.5)
    if status == "stop":
        assert out.matched == finish["matched"]
    if status == "abort":
        assert out.message == "aborted by abort_request"


def test_the_compat_server_answers_in_the_contract_and_reads_our_requests(api):
    out = GenerateOutput([5, 6], [-0.1, -0.2], "stop", "3", prompt_tokens=4, matched=6)
    answer = api.GenerateResponse.from_json_value(output_to_sglang(out, "r-t0", "ab", True))
    assert [e.token_id for e in answer.meta_info.output_token_logprobs] == [5, 6]
    assert answer.meta_info.finish_reason.matched == 6
    # our extension, each token's weight version as spans, reads back; SGLang's own answers
    # (no spans) give None, and the rollout labels their tokens conservatively
    spanning = dataclasses.replace(out, token_versions=["2", "3"])
    wire = output_to_sglang(spanning, "r-t0", "ab", True)
    assert wire["meta_info"]["weight_versions"] == [{"version": "2", "start": 0, "end": 1},
                                                    {"version": "3", "start": 1, "end": 2}]
    assert GenerateOutput.from_sglang(wire).token_versions == ["2", "3"]
    assert GenerateOutput.from_sglang(output_to_sglang(out, "r-t0", "ab", True)).token_versions is None
    body = generate_request([1, 2], FULL, rid="a-t0")
    assert sampling_from_sglang(body["sampling_params"]) == FULL


def test_tensor_buckets_bound_the_request_size_and_keep_order():
    import base64
    import pickle

    import torch

    from agentrl.engine.sglang import serialize_named_tensors, tensor_buckets

    state = {f"w{i}": torch.full((10,), float(i)) for i in range(5)}  # 40 bytes each
    buckets = tensor_buckets(state, max_bytes=100)
    assert [[n for n, _ in b] for b in buckets] == [["w0", "w1"], ["w2", "w3"], ["w4"]]
    assert [[n for n, _ in b] for b in tensor_buckets({"big": torch.zeros(100)}, 10)] == [["big"]]
    assert tensor_buckets({}, 10) == []
    pairs = pickle.loads(base64.b64decode(serialize_named_tensors(buckets[1])))
    assert [n for n, _ in pairs] == ["w2", "w3"] and torch.equal(pairs[1][1], state["w3"])

"""``--sglang-*`` and ``--vllm-*`` flags: collected for their servers, honoured or refused (with the
reason) by the other backends; the servers' command lines."""

from __future__ import annotations

import pytest

from agentrl.errors import ConfigError
from agentrl.rollout.config import RolloutConfig, collect_server_args
from agentrl.run.flags import parse_args


@pytest.fixture(autouse=True)
def _fresh_cwd(tmp_path, monkeypatch):
    # the default --output-dir (a new folder under runs/) is relative: keep it in this test's folder
    monkeypatch.chdir(tmp_path)


def test_collect_sglang_args_forms():
    found, rest = collect_server_args(["--sglang-mem-fraction-static", "0.8", "--sglang-log-level=INFO",
                                       "--sglang-enable-torch-compile", "--other", "x"], "sglang")
    assert found == {"mem-fraction-static": "0.8", "log-level": "INFO", "enable-torch-compile": None}
    assert rest == ["--other", "x"]


def test_context_length_sizes_the_embedded_engine():
    args = parse_args(["--env", "calc", "--sglang-context-length", "1024"])
    assert args.rollout.sglang_args == {"context-length": "1024"}
    assert args.rollout.engine_context_len == 1024
    assert parse_args(["--env", "calc"]).rollout.engine_context_len is None


def test_other_sglang_settings_are_refused_by_the_embedded_engine(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--env", "calc", "--sglang-mem-fraction-static", "0.8"])
    err = capsys.readouterr().err
    assert "--sglang-mem-fraction-static" in err and "--rollout-backend embedded" in err
    with pytest.raises(ConfigError, match="positive integer"):
        RolloutConfig(env="calc", sglang_args={"context-length": "big"}).validate()


def test_unknown_flags_are_still_errors(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--env", "calc", "--no-such-flag", "1"])
    assert "unrecognized arguments: --no-such-flag 1" in capsys.readouterr().err


def test_server_and_router_command_lines():
    from agentrl.placement.servers import router_command, server_command

    command = server_command("sglang", "/models/q", port=30001, tp_size=2, seed=7,
                             server_args={"mem-fraction-static": "0.8", "enable-memory-saver": None})
    assert command[1:3] == ["-m", "sglang.launch_server"]
    text = " ".join(command)
    assert "--model-path /models/q --host 127.0.0.1 --port 30001 --tp-size 2" in text
    assert "--mem-fraction-static 0.8 --enable-memory-saver --random-seed 7" in text
    compat = server_command("sglang-compat", "/m", port=1, server_args={"random-seed": "3"}, seed=9)
    assert compat[2] == "agentrl.engine.sglang_compat_server" and "--tp-size" not in compat
    assert compat[-2:] == ["--random-seed", "3"]  # an explicit flag wins over the run's seed
    router = router_command(["http://a:1", "http://b:2"], port=5, policy="round_robin")
    assert router[router.index("--worker-urls") + 1 : router.index("--policy")] == ["http://a:1", "http://b:2"]


@pytest.mark.parametrize(("flags", "message"), [
    (["--rollout-backend", "sglang"], "--rollout-num-gpus N"),
    (["--rollout-backend", "sglang", "--rollout-num-gpus", "2", "--use-fault-tolerance", "--weight-sync",
      "tensor"], "from the latest weights on disk"),
    (["--rollout-backend", "sglang", "--rollout-engine-urls", "http://a:1", "--use-fault-tolerance",
      "--rollout-num-gpus", "1"], "servers are someone else's"),
    (["--rollout-num-gpus", "2", "--rollout-num-gpus-per-engine", "2"], "tensor-parallel engines"),
    (["--rollout-engine-urls", "http://a:1"], "add --rollout-backend sglang"),
    (["--vllm-max-num-seqs", "8"], "--vllm-max-num-seqs is passed on to vLLM servers"),
    (["--rollout-backend", "vllm", "--rollout-num-gpus", "1", "--sglang-context-length", "9"],
     "takes --vllm-* flags"),
    (["--rollout-backend", "vllm", "--rollout-num-gpus", "1", "--vllm-max-model-len", "big"],
     "--vllm-max-model-len must be a positive integer"),
    (["--rollout-backend", "vllm", "--rollout-num-gpus", "1", "--rollout-temperature", "0.7",
      "--rollout-top-p", "0.9"], "never the untruncated tempered ones"),
    (["--rollout-backend", "vllm", "--rollout-engine-urls", "http://a:1", "--rollout-router-url",
      "http://r:1"], "vLLM servers are routed by agentrl"),
    (["--rollout-backend", "vllm", "--rollout-num-gpus", "1", "--weight-sync", "tensor"],
     "use --weight-sync disk"),
    (["--rollout-backend", "vllm", "--rollout-num-gpus", "1", "--weight-sync", "broadcast"],
     "vLLM servers load each version from disk"),
    (["--rollout-backend", "vllm", "--rollout-num-gpus", "1", "--weight-sync", "adapter"],
     "--weight-sync adapter sends only LoRA adapters to vLLM servers: it needs"),
    (["--weight-sync", "adapter", "--lora-rank", "8"], "it needs --rollout-backend vllm and --lora-rank R"),
    (["--rollout-backend", "vllm", "--rollout-num-gpus", "1", "--weight-sync", "adapter", "--lora-rank", "600"],
     "--lora-rank 600 is above the largest rank vLLM serves (512)"),
    (["--rollout-backend", "vllm", "--rollout-engine-urls", "http://a:1", "--weight-sync", "adapter",
      "--lora-rank", "8"], "does not work with --rollout-engine-urls"),
    (["--rollout-backend", "vllm", "--colocate"], "frees nothing on a machine without GPUs"),
    (["--rollout-backend", "vllm", "--rollout-num-gpus", "2", "--rollout-num-gpus-per-engine", "2"],
     "tensor-parallel vLLM servers, which need GPUs"),
    (["--rollout-backend", "sglang", "--rollout-router-url", "http://r:1", "--rollout-num-gpus", "1"],
     "--rollout-router-url needs --rollout-engine-urls"),
])
def test_backend_and_placement_flags_that_do_not_fit(capsys, flags, message):
    with pytest.raises(SystemExit):
        parse_args(["--env", "calc", *flags])
    assert message in capsys.readouterr().err


def test_sglang_backend_passes_every_sglang_flag():
    args = parse_args(["--env", "calc", "--rollout-backend", "sglang", "--rollout-num-gpus", "4",
                       "--rollout-num-gpus-per-engine", "2", "--sglang-mem-fraction-static", "0.8"])
    assert args.rollout.sglang_args == {"mem-fraction-static": "0.8"} and args.cluster.num_engines == 2


def test_broadcast_weight_sync_needs_sglang(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--env", "calc", "--weight-sync", "broadcast"])
    assert "--weight-sync broadcast is for SGLang servers" in capsys.readouterr().err


def test_vllm_command_line_takes_the_defaults_unless_a_flag_overrides_them():
    from agentrl.placement.servers import _merged, server_command, vllm_defaults

    rollout = parse_args(["--env", "calc", "--rollout-backend", "vllm", "--rollout-num-gpus", "1",
                          "--vllm-no-enforce-eager", "--vllm-max-num-seqs", "8",
                          "--vllm-gpu-memory-utilization=0.5"]).rollout
    assert rollout.vllm_args == {"no-enforce-eager": None, "max-num-seqs": "8", "gpu-memory-utilization": "0.5"}
    defaults = vllm_defaults(rollout, gpu=False)
    assert defaults["logprobs-mode"] == "processed_logprobs" and defaults["dtype"] == "float32"
    args = _merged(defaults, rollout.vllm_args)
    assert "enforce-eager" not in args and "kv-cache-memory-bytes" not in args  # overridden
    command = server_command("vllm", "/m", port=9, tp_size=1, server_args=args, seed=4)
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    text = " ".join(command)
    assert "--model /m --host 127.0.0.1 --port 9 --tensor-parallel-size 1" in text
    assert "--enable-scale-out --enable-prompt-tokens-details --logprobs-mode processed_logprobs" in text
    assert "--no-enforce-eager --max-num-seqs 8 --gpu-memory-utilization 0.5 --seed 4" in text
    assert "--no-enable-chunked-prefill" in text
    assert "no-enable-chunked-prefill" not in _merged(defaults, {"enable-chunked-prefill": None})
    on_gpu = vllm_defaults(rollout, gpu=True)
    assert "dtype" not in on_gpu and "enforce-eager" not in on_gpu
    assert "no-enable-chunked-prefill" not in on_gpu


@pytest.mark.parametrize(("temperature", "top_p", "top_k", "mode"), [
    (1.0, 1.0, -1, "processed_logprobs"), (0.7, 1.0, -1, "processed_logprobs"),
    (0.0, 1.0, -1, "processed_logprobs"), (1.0, 0.9, -1, "raw_logprobs"), (0.0, 1.0, 5, "raw_logprobs"),
    (0.7, 0.9, -1, None), (0.7, 1.0, 20, None),
])
def test_the_vllm_logprobs_mode_matches_what_the_trainer_recomputes(temperature, top_p, top_k, mode):
    from agentrl.engine.vllm import logprobs_mode_for

    assert logprobs_mode_for(temperature, top_p, top_k) == mode


def test_adapter_weight_sync_starts_vllm_with_lora():
    from agentrl.placement.servers import vllm_lora_args

    args = parse_args(["--env", "calc", "--rollout-backend", "vllm", "--rollout-num-gpus", "1",
                       "--weight-sync", "adapter", "--lora-rank", "12"])
    assert args.run.weight_sync == "adapter" and args.trainer.lora_rank == 12
    assert vllm_lora_args(12) == {"enable-lora": None, "max-lora-rank": "16", "max-loras": "2"}
    assert vllm_lora_args(8)["max-lora-rank"] == "8"

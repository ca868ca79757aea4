"""``--sglang-*`` flags: collected for SGLang engines, honoured or refused (with the reason) by the
embedded engine."""

from __future__ import annotations

import pytest

from agentrl.errors import ConfigError
from agentrl.orchestration.flags import parse_args
from agentrl.rollout.config import RolloutConfig, collect_sglang_args


@pytest.fixture(autouse=True)
def _fresh_cwd(tmp_path, monkeypatch):
    # parse_args refuses an --output-dir (default runs/latest) that already holds a run
    monkeypatch.chdir(tmp_path)


def test_collect_sglang_args_forms():
    found, rest = collect_sglang_args(["--sglang-mem-fraction-static", "0.8", "--sglang-log-level=INFO",
                                       "--sglang-enable-torch-compile", "--other", "x"])
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
    from agentrl.orchestration.sglang_servers import router_command, server_command

    command = server_command("sglang", "/models/q", port=30001, tp_size=2, seed=7,
                             sglang_args={"mem-fraction-static": "0.8", "enable-memory-saver": None})
    assert command[1:3] == ["-m", "sglang.launch_server"]
    text = " ".join(command)
    assert "--model-path /models/q --host 127.0.0.1 --port 30001 --tp-size 2" in text
    assert "--mem-fraction-static 0.8 --enable-memory-saver --random-seed 7" in text
    compat = server_command("sglang-compat", "/m", port=1, sglang_args={"random-seed": "3"}, seed=9)
    assert compat[2] == "agentrl.rollout.engine.sglang_compat_server" and "--tp-size" not in compat
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

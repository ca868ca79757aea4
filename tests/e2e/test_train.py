"""``python train.py`` end to end on the built-in tiny model: the loop, checkpoints and resume,
and flag errors that name the flag."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY_RUN = ["--env", "calc", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
            "--max-turns", "2", "--rollout-max-response-len", "12"]


def train(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "train.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def test_the_main_job_on_the_embedded_default_calls_tools_and_learns(tmp_path):
    """The README's main job, shrunk to two rollouts: the shipped swe-tools warm start plays
    episodes whose tool calls run in `auto` sandboxes, earns rewards, trains with non-zero
    gradients and ends by printing the change and the checkpoint."""
    out = tmp_path / "run"
    # --dead-run-rollouts 1: a rollout whose every group got one reward would be warned about
    done = train("--env", "swe-tools", "--max-turns", "5", "--num-rollout", "2", "--no-progress",
                 "--dead-run-rollouts", "1", "--output-dir", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "embedded default for --env swe-tools" in done.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["rollout/failed"] == 0 and r["rollout/tool_calls"] > 0 for r in rows)
    # 64 episodes at the warm start's ~0.2 success: none solved would be a broken default
    assert sum(r["rollout/reward_mean"] for r in rows) > 0
    assert any(r["train/grad_norm"] > 0 for r in rows)
    samples = [json.loads(line) for line in (out / "trajectories" / "rollout_00000.jsonl").read_text().splitlines()]
    commands = [c for s in samples for c in s["metadata"].get("commands", [])]
    assert any(c.get("phase") == "tools" for c in commands), commands[:3]  # the model's calls ran there
    assert "success on the training tasks:" in done.stdout and "dead run" not in done.stderr
    assert "Token authentication" not in done.stderr  # Ray's start-up notice is not printed
    assert (out / "checkpoints" / "latest").read_text().strip() == "rollout_00002"
    assert f"checkpoints {out}/checkpoints/" in done.stdout


def test_bad_flags_name_the_flag(tmp_path):
    bad = train(*TINY_RUN, "--global-batch-size", "3", cwd=tmp_path)
    assert bad.returncode == 2 and "--global-batch-size 3" in bad.stderr
    bad = train("--env", "calc", "--rollout-batch-size", "0", cwd=tmp_path)
    assert bad.returncode == 2 and "--rollout-batch-size must be >= 1" in bad.stderr
    bad = train("--env", "calc", "--load", str(tmp_path / "nothing"), cwd=tmp_path)
    assert bad.returncode == 2 and "--load" in bad.stderr and "no checkpoint there" in bad.stderr


def test_a_custom_reward_that_raises_stops_the_run_with_its_error(tmp_path):
    rm = tmp_path / "rm.py"
    rm.write_text("def rm(args, sample):\n    raise ValueError('the judge is down')\n")
    done = train(*TINY_RUN, "--num-rollout", "2", "--no-progress", "--custom-rm-path", str(rm),
                 "--output-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert done.returncode != 0
    assert "the judge is down" in done.stderr and "rm.py" in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").is_file() or not (
        tmp_path / "run" / "metrics.jsonl").read_text().strip()  # no rollout was trained on


def test_the_same_command_twice_runs_twice_and_load_of_a_run_folder_continues_it(tmp_path):
    command = [*TINY_RUN, "--num-rollout", "1", "--no-use-ray", "--no-progress"]
    for _ in range(2):  # no --output-dir: each run gets a folder of its own
        done = train(*command, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
    runs = sorted(p for p in (tmp_path / "runs").iterdir() if not p.is_symlink())
    assert len(runs) == 2 and all((r / "metrics.jsonl").is_file() for r in runs)
    assert (tmp_path / "runs" / "latest").resolve() == runs[1].resolve()
    assert f"agentrl view runs/{runs[1].name}" in done.stdout
    more = train(*TINY_RUN, "--num-rollout", "2", "--no-use-ray", "--no-progress", "--load",
                 f"runs/{runs[0].name}", cwd=tmp_path)
    assert more.returncode == 0, more.stderr[-3000:]
    lines = (runs[0] / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["rollout_id"] for line in lines] == [0, 1]  # continued in place
    assert len([p for p in (tmp_path / "runs").iterdir() if not p.is_symlink()]) == 2
    # the same --num-rollout again: nothing left to train, said at once, nothing started
    again = train(*TINY_RUN, "--num-rollout", "2", "--use-ray", "--no-progress", "--load",
                  f"runs/{runs[0].name}", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing to do:" in again.stdout and "pass --num-rollout 3 or more" in again.stdout
    assert f"`agentrl export runs/{runs[0].name}/checkpoints --hf DIR` exports it" in again.stdout
    assert "Ray" not in again.stdout + again.stderr  # it stopped before starting anything
    assert (runs[0] / "metrics.jsonl").read_text().splitlines() == lines


def test_a_refused_start_leaves_nothing_behind(tmp_path):
    (tmp_path / "badenv.py").write_text("raise ImportError('boom')\n")
    (tmp_path / "empty.jsonl").write_text('{"text": "no question"}\n')
    for flags in (["--env", "badenv:Thing"], ["--env", "calc", "--prompt-data", "empty.jsonl"]):
        done = subprocess.run([sys.executable, str(REPO / "train.py"), *flags, "--num-rollout", "1"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "PYTHONPATH": str(tmp_path)})
        assert done.returncode != 0 and "train.py: error:" in done.stderr, done.stderr[-2000:]
        assert "Traceback" not in done.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == ["badenv.py", "empty.jsonl"]


def test_sft_warm_start_then_rl_from_its_export(tmp_path):
    sft = train("--env", "calc", "--loss-type", "sft_loss", "--num-rollout", "2",
                "--rollout-batch-size", "4", "--lr", "1e-3", "--save-hf", str(tmp_path / "hf"),
                "--save-interval", "2", "--output-dir", str(tmp_path / "sft"), cwd=tmp_path)
    assert sft.returncode == 0, sft.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[1]["train/sft_loss"] < metrics[0]["train/sft_loss"]
    assert metrics[0]["rollout/reward_mean"] == 1.0  # the oracle's demonstrations all succeed
    exported = tmp_path / "hf" / "rollout_00002"
    assert (exported / "config.json").is_file() and (exported / "tokenizer.json").is_file()
    assert f"exported (Hugging Face folders, --save-hf): {exported}" in sft.stdout  # its last lines say where
    again = subprocess.run([sys.executable, "-m", "agentrl", "export", str(tmp_path / "sft"), "--hf",
                            str(tmp_path / "again")], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]  # the checkpoint exported without training
    assert sorted(p.name for p in (tmp_path / "again").iterdir()) == sorted(p.name for p in exported.iterdir())
    from safetensors.torch import load_file

    ours, theirs = load_file(str(tmp_path / "again" / "model.safetensors")), load_file(str(exported / "model.safetensors"))
    assert ours.keys() == theirs.keys() and all((ours[k] == theirs[k]).all() for k in ours)
    rl = train(*TINY_RUN, "--num-rollout", "1", "--hf-checkpoint", str(exported),
               "--output-dir", str(tmp_path / "rl"), cwd=tmp_path)
    assert rl.returncode == 0, rl.stderr[-3000:]


def test_resumed_run_equals_an_uninterrupted_one(tmp_path):
    """Resume from the first checkpoint with --load: the rollouts and steps after it are the
    uninterrupted run's (sampling seeds derive from --rollout-seed and the request id; the
    checkpoint holds weights, optimizer, schedule, RNG, the data position and the run's
    counters), and so are its evaluations."""
    rm = tmp_path / "rm.py"  # a reward with spread, so the tiny model gets real gradients
    rm.write_text("def rm(args, sample):\n    return float(len(sample.response) % 3 == 0)\n")
    flags = [*TINY_RUN, "--custom-rm-path", str(rm), "--lr", "1e-3", "--rollout-temperature", "1.0",
             "--eval-env", "calc", "--eval-interval", "2", "--eval-max-prompts", "2"]
    whole = train(*flags, "--num-rollout", "3", "--output-dir", str(tmp_path / "whole"),
                  "--save", str(tmp_path / "ckpt"), "--save-interval", "1", cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "rollout_00003"
    (tmp_path / "ckpt" / "latest").write_text("rollout_00001\n")  # as if killed after rollout 0
    resumed = train(*flags, "--num-rollout", "3", "--output-dir", str(tmp_path / "resumed"),
                    "--load", str(tmp_path / "ckpt"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout and "rollout 1" in resumed.stdout
    assert (tmp_path / "resumed" / "checkpoints" / "latest").read_text().strip() == "rollout_00003"
    evals = {run: [json.loads(line) for line in (tmp_path / run / "eval.jsonl").read_text().splitlines()]
             for run in ("whole", "resumed")}
    assert [e["step"] for e in evals["whole"]] == [0, 2, 3] and [e["step"] for e in evals["resumed"]] == [2, 3]
    assert evals["whole"][0]["sets"]["calc"]["n_prompts"] == 2

    def read(run: str) -> dict[int, dict]:
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return {m["rollout_id"]: m for m in map(json.loads, lines)}

    expected, got = read("whole"), read("resumed")
    assert sorted(got) == [1, 2]
    assert any(expected[i]["train/grad_norm"] > 0 for i in (1, 2))  # the check has teeth
    for rollout_id in (1, 2):
        for key, value in expected[rollout_id].items():
            # run/: counters saved with the checkpoint (the dead-run count goes on)
            if key.startswith(("train/", "rollout/", "run/")) and not key.endswith(("_s", "per_s")):
                assert got[rollout_id][key] == pytest.approx(value, abs=1e-6), (rollout_id, key)
        whole_tokens = (tmp_path / "whole" / "trajectories" / f"rollout_{rollout_id:05d}.jsonl").read_text()
        resumed_tokens = (tmp_path / "resumed" / "trajectories" / f"rollout_{rollout_id:05d}.jsonl").read_text()
        assert [json.loads(x)["tokens"] for x in whole_tokens.splitlines()] == \
            [json.loads(x)["tokens"] for x in resumed_tokens.splitlines()]


def test_engine_actors_colocated_and_with_weights_on_disk(tmp_path):
    # asynchronous: engine actors keep playing while the trainer trains; pushes land in flight
    disk = train(*TINY_RUN, "--num-rollout", "2", "--rollout-num-gpus", "2", "--weight-sync", "disk",
                 "--async-training", "--output-dir", str(tmp_path / "disk"), cwd=tmp_path)
    assert disk.returncode == 0, disk.stderr[-3000:]
    assert [p.name for p in (tmp_path / "disk" / "weights").iterdir()] == ["v2"]  # older ones pruned
    second = [json.loads(line) for line in
              (tmp_path / "disk" / "trajectories" / "rollout_00001.jsonl").read_text().splitlines()]
    for sample in second:  # each token's version, from the engine actors; at most one behind
        trained = [v for v, m in zip(sample["token_versions"], sample["loss_mask"], strict=True) if m]
        assert trained and set(trained) <= {0, 1} and sample["metadata"]["trainer_version"] == 1

    colocated = train(*TINY_RUN, "--num-rollout", "2", "--colocate", "--output-dir",
                      str(tmp_path / "colocated"), cwd=tmp_path)
    assert colocated.returncode == 0, colocated.stderr[-3000:]
    metrics = (tmp_path / "colocated" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(m)["rollout/samples"] for m in metrics] == [4, 4]

    bad = train(*TINY_RUN, "--use-fault-tolerance", cwd=tmp_path)
    assert bad.returncode == 2 and "--use-fault-tolerance" in bad.stderr and "--rollout-num-gpus" in bad.stderr


KILL_ENGINE_0 = """
import sys, time
import ray
from agentrl.placement.engines import engine_actor_name
ray.init(address=sys.argv[1], namespace="agentrl")
deadline = time.monotonic() + 300
while time.monotonic() < deadline:
    try:
        victim = ray.get_actor(engine_actor_name(int(sys.argv[2]), 0))
        break
    except ValueError:
        time.sleep(0.2)
# kill it mid-rollout: once it has served a request (a kill during start-up is a different path)
while time.monotonic() < deadline and ray.get(victim.info.remote(), timeout=120)["requests"] == 0:
    time.sleep(0.05)
ray.kill(victim, no_restart=True)
"""


def test_engine_killed_mid_run_on_a_joined_ray_cluster(tmp_path):
    """train.py joins a running Ray cluster (--ray-address); an engine actor is killed from outside
    during rollout 0; with --use-fault-tolerance every rollout still has every sample once. The
    episodes' sandboxes run on the cluster's node that offers them (--sandbox-placement ray)."""
    import os
    import secrets
    import signal

    from tests.support.distributed import free_port

    port = free_port()
    address = f"127.0.0.1:{port}"
    # a cluster started with `ray start` needs a shared token (Ray >= 2.59 authenticates by default)
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),
           "PYTHONPATH": str(REPO)}
    ray_bin = Path(sys.executable).with_name("ray")
    head = subprocess.Popen([str(ray_bin), "start", "--head", "--block", f"--port={port}", "--num-cpus=4",
                             "--resources", json.dumps({"sandbox": 4}),
                             "--include-dashboard=false", "--disable-usage-stats"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    run = killer = None
    try:
        out = tmp_path / "run"
        run = subprocess.Popen([sys.executable, str(REPO / "train.py"), *TINY_RUN, "--num-rollout", "2",
                                "--rollout-batch-size", "4", "--rollout-max-response-len", "32",
                                "--rollout-num-gpus", "2", "--use-fault-tolerance",
                                "--rollout-health-check-interval", "1", "--ray-address", address,
                                "--env", "math-python", "--env-kwarg", "sandbox=process",
                                "--sandbox-placement", "ray", "--output-dir", str(out)], env=env,
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        killer = subprocess.run([sys.executable, "-c", KILL_ENGINE_0, address, str(run.pid)], env=env,
                                capture_output=True, text=True, timeout=600)
        assert killer.returncode == 0, killer.stderr[-3000:]
        stdout, stderr = run.communicate(timeout=600)
        assert run.returncode == 0, stderr[-3000:]
        assert "engine 0 lost" in stderr  # (the restart itself is tested in test_engine_group.py)
        for rollout in ("rollout_00000", "rollout_00001"):
            lines = (out / "trajectories" / f"{rollout}.jsonl").read_text().splitlines()
            samples = [json.loads(x) for x in lines]
            keys = [(s["group_id"], s["index"]) for s in samples]
            assert len(keys) == 8 and len(set(keys)) == 8
            assert all(s["status"] != "failed" for s in samples), [s["metadata"].get("error") for s in samples]
    finally:
        if run is not None and run.poll() is None:
            run.kill()
            run.wait()
        os.killpg(head.pid, signal.SIGTERM)  # ray start and the GCS / raylet it started
        head.wait(timeout=60)


def test_sglang_backend_through_the_router(tmp_path):
    """--rollout-backend sglang-compat: two SGLang-protocol servers as Ray actors behind the real
    sglang-router; weights go by disk after every rollout and every sample records them."""
    pytest.importorskip("sglang_router", reason="sglang-router is not installed (pip install sglang-router)")
    out = tmp_path / "run"
    done = train(*TINY_RUN, "--num-rollout", "2", "--rollout-backend", "sglang-compat", "--rollout-num-gpus", "2",
                 "--sglang-context-length", "2048", "--output-dir", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    second = (out / "trajectories" / "rollout_00001.jsonl").read_text().splitlines()
    assert len(second) == 4 and {json.loads(line)["weight_version"] for line in second} == {"1"}
    assert [p.name for p in (out / "weights").iterdir()] == ["v2"]

    # the trainer's rank 0 (a Ray actor) broadcasts to both servers over a gloo group
    broadcast = train(*TINY_RUN, "--num-rollout", "2", "--rollout-backend", "sglang-compat",
                      "--rollout-num-gpus", "2", "--weight-sync", "broadcast", "--output-dir",
                      str(tmp_path / "broadcast"), cwd=tmp_path)
    assert broadcast.returncode == 0, broadcast.stderr[-3000:]
    second = (tmp_path / "broadcast" / "trajectories" / "rollout_00001.jsonl").read_text().splitlines()
    assert {json.loads(line)["weight_version"] for line in second} == {"1"}
    assert not (tmp_path / "broadcast" / "weights").exists()

    # colocated: the server shares the trainer's bundle and releases its memory while it trains
    colocated = train(*TINY_RUN, "--num-rollout", "2", "--rollout-backend", "sglang-compat", "--colocate",
                      "--output-dir", str(tmp_path / "colocated"), cwd=tmp_path)
    assert colocated.returncode == 0, colocated.stderr[-3000:]
    second = (tmp_path / "colocated" / "trajectories" / "rollout_00001.jsonl").read_text().splitlines()
    assert {json.loads(line)["weight_version"] for line in second} == {"1"}

    bad = train(*TINY_RUN, "--rollout-backend", "sglang-compat", "--sglang-mem-fraction-static", "0.8",
                "--rollout-num-gpus", "1", cwd=tmp_path)
    assert bad.returncode == 2 and "--sglang-mem-fraction-static" in bad.stderr
    bad = train(*TINY_RUN, "--rollout-backend", "sglang", cwd=tmp_path)
    assert bad.returncode == 2 and "--rollout-num-gpus" in bad.stderr


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # the process ended meanwhile
        return b""


def test_vllm_backend_with_two_servers(tmp_path):
    """--rollout-backend vllm: two real vLLM servers as Ray actors; each version is reloaded from
    disk into both after every rollout, and every sample records the version that produced it."""
    from tests.support.vllm import require_vllm

    require_vllm()
    out = tmp_path / "run"
    done = train(*TINY_RUN, "--num-rollout", "2", "--rollout-backend", "vllm", "--rollout-num-gpus", "2",
                 "--output-dir", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    first = (out / "trajectories" / "rollout_00000.jsonl").read_text().splitlines()
    second = (out / "trajectories" / "rollout_00001.jsonl").read_text().splitlines()
    assert len(second) == 4 and {json.loads(line)["weight_version"] for line in first} == {"0"}
    assert {json.loads(line)["weight_version"] for line in second} == {"1"}
    assert [p.name for p in (out / "weights").iterdir()] == ["v2"]
    # the servers and their engine cores stopped with the run (their models lived in its work dir)
    left = [p for p in Path("/proc").glob("[0-9]*")
            if b"agentrl-vllm-" in _read(p / "cmdline") and b"api_server" in _read(p / "cmdline")]
    assert left == []
    bad = train(*TINY_RUN, "--rollout-backend", "vllm", "--rollout-num-gpus", "1", "--weight-sync", "tensor",
                cwd=tmp_path)
    assert bad.returncode == 2 and "use --weight-sync disk" in bad.stderr


def test_a_plugin_that_fails_every_sample_stops_the_run_and_says_why(tmp_path):
    """Regression: a custom generate that raised failed 100% of the samples, and the run still
    trained on nothing and exited 0 with only rollout/failed=N to show for it."""
    plugin = tmp_path / "broken_generate.py"
    plugin.write_text("async def custom_generate(args, samples, evaluation=False):\n"
                      "    raise KeyError('tool_result')\n")
    done = train(*TINY_RUN, "--num-rollout", "2", "--custom-generate-function-path", str(plugin),
                 "--output-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "custom_generate raised KeyError: 'tool_result'" in done.stderr
    assert "train.py: error: 4 of 4 samples failed (every sample); the first, sample 0/0" in done.stderr
    assert "PluginError: custom_generate: KeyError: 'tool_result'" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_lora_run_trains_resumes_and_exports_a_peft_adapter(tmp_path):
    """`train.py --lora-rank 8`: the embedded engine samples from the merged weights after each
    step and the run resumes with --load. Without --save-hf the last lines say how to export;
    with it each save is exported as merged/ (the model) and adapter/ (PEFT's format) with the
    built-in base beside it; `agentrl export` writes the same export from the checkpoint; and
    peft puts the adapter on the base, not on merged/, to get merged/'s model."""
    import peft
    import torch
    import transformers
    from safetensors.torch import load_file

    rm = tmp_path / "rm.py"  # a reward with spread, so the adapters get real gradients
    rm.write_text("def rm(args, sample):\n    return float(len(sample.response) % 3 == 0)\n")
    command = [*TINY_RUN, "--lora-rank", "8", "--lora-alpha", "16", "--lr", "1e-3", "--no-use-ray",
               "--custom-rm-path", str(rm), "--rollout-temperature", "1.0", "--n-samples-per-prompt", "4",
               "--no-progress", "--output-dir", str(tmp_path / "run")]
    first = train(*command, "--num-rollout", "1", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"`agentrl export {tmp_path / 'run'} --hf DIR` writes the newest" in first.stdout
    more = train(*command, "--num-rollout", "2", "--load", str(tmp_path / "run"),
                 "--save-hf", str(tmp_path / "hf"), cwd=tmp_path)
    assert more.returncode == 0, more.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [0, 1] and any(r["train/grad_norm"] > 0 for r in rows)
    saved = tmp_path / "hf" / "rollout_00002"
    assert f"exported (Hugging Face folders, --save-hf): {saved} (the model: merged/" in more.stdout
    assert sorted(p.name for p in saved.iterdir()) == ["README.md", "adapter", "base", "merged"]
    assert not (saved / "merged" / "adapter_config.json").exists()  # nothing invites a second application
    config = json.loads((saved / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["peft_type"] == "LORA"
    assert config["base_model_name_or_path"] == "../base"  # the built-in model, saved beside it
    assert "do not load `adapter/` onto it" in (saved / "README.md").read_text()

    done = subprocess.run([sys.executable, "-m", "agentrl", "export", str(tmp_path / "run"),
                           "--hf", str(tmp_path / "exported")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "agentrl export: " in done.stdout and "README.md says which folder is which" in done.stdout
    exported = tmp_path / "exported"
    for part in ("merged/model.safetensors", "adapter/adapter_model.safetensors"):
        ours, theirs = load_file(str(exported / part)), load_file(str(saved / part))
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)

    ids = torch.tensor([[5, 17, 42, 7, 99, 3]])
    def logits(model):
        with torch.no_grad():
            return model.eval()(input_ids=ids).logits
    load = transformers.AutoModelForCausalLM.from_pretrained
    merged = logits(load(exported / "merged", dtype=torch.float32))
    on_base = logits(peft.PeftModel.from_pretrained(load(exported / "base", dtype=torch.float32),
                                                    str(exported / "adapter")))
    assert torch.allclose(on_base, merged, atol=1e-4)
    twice = logits(peft.PeftModel.from_pretrained(load(exported / "merged", dtype=torch.float32),
                                                  str(exported / "adapter")))
    assert not torch.allclose(twice, merged, atol=1e-4)  # what the layout keeps users from doing
    refused = subprocess.run([sys.executable, "-m", "agentrl", "eval", "--env", "calc", "--policy", "model",
                              "--hf-checkpoint", str(exported)], cwd=tmp_path, capture_output=True,
                             text=True, timeout=600)
    assert refused.returncode != 0 and f"its model (the adapters merged in) is {exported / 'merged'}" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_vllm_serves_lora_adapters_pushed_alone(tmp_path):
    """--rollout-backend vllm --weight-sync adapter --lora-rank 8: the server (a Ray actor) starts
    with --enable-lora, each version sends only the adapters (PEFT's format), and the second
    rollout is sampled with them."""
    from tests.support.vllm import require_vllm

    require_vllm()
    out = tmp_path / "run"
    done = train(*TINY_RUN, "--num-rollout", "2", "--rollout-backend", "vllm", "--rollout-num-gpus", "1",
                 "--lora-rank", "8", "--weight-sync", "adapter", "--output-dir", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    second = (out / "trajectories" / "rollout_00001.jsonl").read_text().splitlines()
    assert {json.loads(line)["weight_version"] for line in second} == {"1"}
    assert sorted(p.name for p in (out / "weights").iterdir()) == ["adapter-v1", "adapter-v2"]
    assert (out / "weights" / "adapter-v2" / "adapter_config.json").is_file()


def test_a_mixture_of_experts_trains_resumes_exports_and_plays(tmp_path):
    """`train.py --hf-checkpoint <tiny Qwen3-MoE from scripts/make-tiny-moe.py> --routing-replay`:
    the embedded engine samples from it and reports each token's experts, the trainer replays
    them and trains with the load-balancing loss, the run resumes with --load, and the export is
    a Qwen3-MoE folder that transformers and the embedded engine run alike."""
    import torch
    import transformers

    made = subprocess.run([sys.executable, str(REPO / "scripts" / "make-tiny-moe.py"), "--out",
                           str(tmp_path / "moe")], capture_output=True, text=True, timeout=600)
    assert made.returncode == 0 and made.stdout.strip() == str(tmp_path / "moe"), made.stderr[-2000:]
    rm = tmp_path / "rm.py"  # a reward with spread, so the experts and router get gradients
    rm.write_text("def rm(args, sample):\n    return float(len(sample.response) % 3 == 0)\n")
    command = [*TINY_RUN, "--hf-checkpoint", str(tmp_path / "moe"), "--moe-aux-loss-coeff", "0.01",
               "--routing-replay",
               "--lr", "1e-3", "--no-use-ray", "--custom-rm-path", str(rm), "--n-samples-per-prompt", "4",
               "--no-progress", "--output-dir", str(tmp_path / "run")]
    first = train(*command, "--num-rollout", "1", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    more = train(*command, "--num-rollout", "2", "--load", str(tmp_path / "run"),
                 "--save-hf", str(tmp_path / "hf"), cwd=tmp_path)
    assert more.returncode == 0, more.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [0, 1] and all(r["train/grad_norm"] > 0 for r in rows)
    assert all(r["train/logprob_abs_diff"] < 1e-4 for r in rows)  # engine and trainer agree
    assert all(r["train/routing_replayed"] == 1.0 for r in rows)  # every forward replayed
    saved = tmp_path / "hf" / "rollout_00002"
    model = transformers.AutoModelForCausalLM.from_pretrained(saved)
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    # the embedded engine serves the export (what a second run, or agentrl eval, starts from)
    ids = [5, 17, 42, 7, 99, 3]
    served = asyncio.run(_greedy_embedded(saved, ids))
    with torch.no_grad():
        expected = model.eval().generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                                         eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
    assert served == expected


async def _greedy_embedded(model: Path, prompt: list[int]) -> list[int]:
    from agentrl.engine import EmbeddedEngine, SamplingParams

    engine = EmbeddedEngine.from_pretrained(model)
    try:
        out = await engine.generate(prompt, SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True))
        return out.output_ids
    finally:
        await engine.close()

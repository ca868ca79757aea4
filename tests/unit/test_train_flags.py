"""``train.py``'s flags as parse_args sees them: bad values exit with status 2 and a message that
names the flag; flags that only work together are checked together; nothing is written to a
config once the flags are parsed."""

from __future__ import annotations

import dataclasses
import datetime
import os
from pathlib import Path

import pytest

from agentrl.run.checkpoints import checkpoint_folder, mark_latest
from agentrl.run.config import Args
from agentrl.run.flags import parse_args
from agentrl.run.run_folder import choose_run_folder, point_latest
from agentrl.trainer.config import TrainerConfig, batch_shape

ENV = ["--env", "calc"]  # 4 prompts x 4 samples = 16 samples per rollout by default


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the default --output-dir (a new folder under runs/) is relative: keep it in this test's folder
    monkeypatch.chdir(tmp_path)


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """parse_args(argv)'s error message; fails unless it exits with status 2."""
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def sealed_checkpoint(root: Path) -> Path:
    folder = checkpoint_folder(root, 1)
    folder.mkdir(parents=True)
    (folder / "common.pt").write_bytes(b"x")
    (folder / "data.json").write_text("{}")
    mark_latest(root, folder)
    return folder


# ---- no config is written after parsing ----------------------------------------------------


def test_the_batch_equation_is_solved_into_the_parsed_config() -> None:
    trainer = parse_args([*ENV, "--num-steps-per-rollout", "4"]).trainer
    assert (trainer.global_batch_size, trainer.num_steps_per_rollout) == (4, 4)
    assert parse_args(ENV).trainer.num_steps_per_rollout == 1


def test_gateway_segments_all_leaves_the_step_size_to_the_rollout(capsys) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "openai_sdk_agent.py"
    agent = [*ENV, "--agent-function-path", f"{example}:run",
             "--gateway-segments", "all"]
    trainer = parse_args([*agent, "--num-steps-per-rollout", "2"]).trainer
    assert (trainer.global_batch_size, trainer.num_steps_per_rollout) == (None, 2)
    assert "--global-batch-size: with --gateway-segments all" in refused(
        [*agent, "--global-batch-size", "4"], capsys)
    assert "keep one" in refused([*agent, "--agent-command", "true"], capsys)


def test_parsed_configs_are_frozen() -> None:
    args = parse_args(ENV)
    for config in (args.trainer, args.run, args.cluster, args):
        name = dataclasses.fields(config)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(config, name, getattr(config, name))


def test_batch_shape_reads_the_config_without_writing_it() -> None:
    config = TrainerConfig(num_steps_per_rollout=2)
    assert batch_shape(config, 32) == (16, 2)
    assert config.global_batch_size is None


# ---- bad values name the flag ------------------------------------------------------------


@pytest.mark.parametrize(("flags", "message"), [
    (["--global-batch-size", "0"], "--global-batch-size must be >= 1, got 0"),
    (["--global-batch-size", "-4"], "--global-batch-size must be >= 1, got -4"),
    (["--num-steps-per-rollout", "0"], "--num-steps-per-rollout must be >= 1, got 0"),
    (["--micro-batch-size", "0"], "--micro-batch-size must be >= 1, got 0"),
    (["--max-tokens-per-gpu", "-1"], "--max-tokens-per-gpu must be >= 1, got -1"),
    (["--lr", "-1"], "--lr must be > 0, got -1.0"),
    (["--critic-lr", "0"], "--critic-lr must be > 0, got 0.0"),
    (["--min-lr", "-0.1"], "--min-lr must be >= 0, got -0.1"),
    (["--weight-decay", "-1"], "--weight-decay must be >= 0"),
    (["--adam-beta1", "1"], "--adam-beta1 must be in [0, 1), got 1.0"),
    (["--adam-beta2", "-0.5"], "--adam-beta2 must be in [0, 1)"),
    (["--adam-eps", "0"], "--adam-eps must be > 0"),
    (["--clip-grad", "-1"], "--clip-grad must be >= 0"),
    (["--lr-warmup-iters", "-1"], "--lr-warmup-iters must be >= 0"),
    (["--lr-decay-iters", "0"], "--lr-decay-iters must be >= 1"),
    (["--eps-clip", "1.5"], "--eps-clip must be in [0, 1), got 1.5"),
    (["--eps-clip-high", "-0.1"], "--eps-clip-high must be >= 0"),
    (["--value-clip", "0"], "--value-clip must be > 0"),
    (["--gamma", "1.5"], "--gamma must be in [0, 1], got 1.5"),
    (["--lambd", "-1"], "--lambd must be in [0, 1]"),
    (["--kl-coef", "-1", "--advantage-estimator", "ppo"], "--kl-coef must be >= 0"),
    (["--tis-clip-low", "3"], "--tis-clip-low 3.0 is above --tis-clip 2.0"),
    (["--seq-length", "0"], "--seq-length must be >= 1"),
])
def test_bad_numeric_trainer_flags_name_the_flag(flags: list[str], message: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert message in refused([*ENV, *flags], capsys)


# ---- flags that do nothing on their own --------------------------------------------------


def test_kl_loss_coef_without_use_kl_loss_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused([*ENV, "--kl-loss-coef", "0.1"], capsys)
    assert "--kl-loss-coef 0.1 has no effect without --use-kl-loss" in err
    assert parse_args([*ENV, "--kl-loss-coef", "0.1", "--use-kl-loss"]).trainer.use_kl_loss


@pytest.mark.parametrize("estimator", ["grpo", "gspo", "reinforce_plus_plus_baseline"])
def test_group_relative_estimators_need_two_samples_per_prompt(
        estimator: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = refused([*ENV, "--advantage-estimator", estimator, "--n-samples-per-prompt", "1"],
                  capsys)
    assert f"--advantage-estimator {estimator}" in err and "--n-samples-per-prompt 1" in err


def test_one_sample_per_prompt_is_fine_for_sft_and_reinforce_plus_plus() -> None:
    sft = parse_args([*ENV, "--loss-type", "sft_loss", "--n-samples-per-prompt", "1"])
    assert sft.rollout.n_samples_per_prompt == 1
    rpp = parse_args([*ENV, "--advantage-estimator", "reinforce_plus_plus",
                      "--n-samples-per-prompt", "1"])
    assert rpp.trainer.advantage_estimator == "reinforce_plus_plus"


# ---- off-policy correction ----------------------------------------------------------------


def test_off_policy_correction_defaults_to_tis_when_staleness_can_be_positive() -> None:
    def correction(*flags: str) -> str:
        return parse_args([*ENV, *flags]).trainer.off_policy_correction

    assert correction("--update-weights-interval", "2") == "tis"  # rollouts from older weights
    assert correction("--update-weights-interval", "1") == "none"
    assert correction() == "none"
    assert correction("--use-tis") == "tis"  # the old flag still means tis
    assert correction("--off-policy-correction", "mis", "--update-weights-interval", "2") == "mis"
    assert correction("--off-policy-correction", "none", "--update-weights-interval", "2") == "none"
    assert correction("--async-training") == "tis"  # one-step-off by default
    assert correction("--async-training", "--max-staleness", "0") == "none"


def test_use_tis_with_an_explicit_other_correction_is_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    for other in ("mis", "none"):
        err = refused([*ENV, "--use-tis", "--off-policy-correction", other], capsys)
        assert "--use-tis" in err and f"--off-policy-correction {other}" in err
    assert parse_args([*ENV, "--use-tis", "--off-policy-correction", "tis"]).trainer.use_tis
    err = refused([*ENV, "--off-policy-correction", "truncated"], capsys)
    assert "--off-policy-correction must be one of auto, tis, mis, none" in err


# ---- asynchronous training ----------------------------------------------------------------


def test_async_training_is_refused_with_colocate_and_says_why(
        capsys: pytest.CaptureFixture[str]) -> None:
    err = refused([*ENV, "--async-training", "--colocate"], capsys)
    assert "--async-training overlaps rollouts and training" in err and "drop --colocate" in err


def test_async_refuses_a_staleness_below_the_weight_interval(
        capsys: pytest.CaptureFixture[str]) -> None:
    err = refused([*ENV, "--async-training", "--update-weights-interval", "3"], capsys)
    assert "--max-staleness 1 with --update-weights-interval 3" in err
    assert "raise --max-staleness to 2" in err
    args = parse_args([*ENV, "--async-training", "--update-weights-interval", "3",
                       "--max-staleness", "2"])
    assert args.run.async_training and args.run.max_staleness == 2
    err = refused([*ENV, "--max-staleness", "-1"], capsys)
    assert "--max-staleness must be >= 0" in err


def test_async_refuses_sft_loss(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused([*ENV, "--async-training", "--loss-type", "sft_loss"], capsys)
    assert "--loss-type sft_loss trains on demonstrations" in err


# ---- GSPO's default aggregation -----------------------------------------------------------


@pytest.mark.parametrize(("flags", "aggregation"), [
    (["--advantage-estimator", "gspo"], "seq_mean_token_mean"),
    (["--advantage-estimator", "gspo", "--loss-aggregation", "token_mean"], "token_mean"),
    (["--advantage-estimator", "grpo"], "token_mean"),
])
def test_gspo_aggregates_per_sequence_unless_told_otherwise(flags: list[str],
                                                            aggregation: str) -> None:
    assert parse_args([*ENV, *flags]).trainer.loss_aggregation == aggregation


# ---- files the flags name -----------------------------------------------------------------


def test_a_second_run_into_an_output_dir_is_refused(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"rollout_id": 0}\n')
    err = refused([*ENV, "--output-dir", str(out)], capsys)
    assert f"--output-dir {out}: an earlier run wrote metrics.jsonl there" in err
    assert f"Pass --load {out} to continue that run" in err and "choose another --output-dir" in err


def test_a_continuation_may_append_to_its_output_dir(tmp_path: Path) -> None:
    out = tmp_path / "run"
    sealed_checkpoint(out / "checkpoints")
    (out / "metrics.jsonl").write_text('{"rollout_id": 0}\n')
    args: Args = parse_args([*ENV, "--output-dir", str(out), "--load", str(out / "checkpoints")])
    assert args.trainer.load == str(out / "checkpoints")


def test_each_run_without_an_output_dir_gets_a_folder_of_its_own(tmp_path: Path) -> None:
    args = parse_args(ENV)
    assert args.fresh_output_dir and Path(args.run.output_dir).parent == Path("runs")
    assert args.namespace.output_dir == args.run.output_dir  # what plug-ins see
    now = datetime.datetime(2026, 12, 4, 10, 15, 0)
    names = []
    for _ in range(3):  # the same command three times in one second: the next free name
        folder = choose_run_folder(None, None, now=now)
        Path(folder.path).mkdir(parents=True)  # as the run's log makes it
        names.append(folder.path)
    assert names == ["runs/20261204-101500", "runs/20261204-101500-2", "runs/20261204-101500-3"]


def test_load_of_a_run_folder_continues_it_in_place(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "20261204-101500"
    sealed_checkpoint(out / "checkpoints")
    (out / "metrics.jsonl").write_text('{"rollout_id": 0}\n')
    for load in (out, out / "checkpoints"):
        args: Args = parse_args([*ENV, "--load", str(load)])
        assert (args.run.output_dir, args.trainer.load) == (str(out), str(out / "checkpoints"))
        assert not args.fresh_output_dir


def test_runs_latest_points_at_the_newest_fresh_run(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for name in ("20261204-101500", "20261204-101501"):
        (runs / name).mkdir(parents=True)
        assert point_latest(runs / name) is None
        assert (runs / "latest").resolve() == (runs / name).resolve()
    assert os.readlink(runs / "latest") == "20261204-101501"  # relative: the folder can move
    (runs / "latest").unlink()
    (runs / "latest").mkdir()  # an older agentrl's default folder: never replaced
    assert "left as it is" in point_latest(runs / "20261204-101501")
    assert (runs / "latest").is_dir() and not (runs / "latest").is_symlink()


def test_an_hf_checkpoint_config_that_is_not_json_names_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen2", "hidden')
    err = refused([*ENV, "--hf-checkpoint", str(model)], capsys)
    assert f"--hf-checkpoint {model}: {model / 'config.json'} is not valid JSON" in err


@pytest.mark.parametrize("backend", [[], ["--rollout-backend", "vllm", "--rollout-engine-urls",
                                           "http://127.0.0.1:9"]])
def test_a_model_nothing_here_can_train_is_refused_once_whatever_serves_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], backend: list[str]) -> None:
    """gpt2: no backend helps, since every run trains it: one refusal at start-up naming the
    families that work, not a server's refusal later (or the trainer's, after the engines)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "gpt2"}')
    err = refused([*ENV, "--hf-checkpoint", str(model), *backend], capsys)
    assert "is a 'gpt2' model; train.py trains qwen2, qwen3, qwen3_moe, llama models" in err
    assert "sglang or vllm" not in err


def test_a_run_without_a_reward_is_refused_unless_it_learns_demonstrations(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "conversations.jsonl"
    data.write_text('{"prompt": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n')
    err = refused(["--prompt-data", str(data)], capsys)
    assert "no reward: without --env, pass --custom-rm-path" in err
    # a supervised warm start on conversations learns the demonstrations: no reward needed
    assert parse_args(["--prompt-data", str(data), "--loss-type", "sft_loss"]).trainer.loss_type == "sft_loss"


def test_eval_interval_and_eval_sets_go_together(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused([*ENV, "--eval-interval", "2"], capsys)
    assert "--eval-interval 2 evaluates nothing" in err
    err = refused([*ENV, "--eval-env", "calc"], capsys)
    assert "--eval-env / --eval-prompt-data need --eval-interval" in err


def test_a_damaged_load_is_refused_before_the_run_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = sealed_checkpoint(tmp_path / "ckpt")
    (folder / "data.json").write_text("{")
    err = refused([*ENV, "--load", str(tmp_path / "ckpt")], capsys)
    assert "no complete checkpoint there" in err and "rollout_00001: data.json is 1 bytes" in err


def test_the_model_flags_exist() -> None:
    # values the built-in tiny model has: flags the checkpoint contradicts are refused
    trainer = parse_args([*ENV, "--vocab-size", "4096", "--no-untie-embeddings-and-output-weights",
                          "--normalization", "RMSNorm", "--rotary-base", "1e4"]).trainer
    assert (trainer.vocab_size, trainer.untie_embeddings_and_output_weights) == (4096, False)
    assert (trainer.normalization, trainer.rotary_base) == ("RMSNorm", 1e4)


def test_a_flag_prefix_is_not_a_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """Regression: --num-roll 0 was read as --num-rollout 0."""
    err = refused([*ENV, "--num-roll", "0"], capsys)
    assert "unrecognized arguments: --num-roll 0" in err and "did you mean --num-rollout?" in err


def test_a_misspelled_flag_gets_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused([*ENV, "--rollout-batchsize", "2"], capsys)
    assert "--rollout-batchsize: did you mean --rollout-batch-size?" in err


def test_max_failed_fraction_must_be_a_share(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused([*ENV, "--max-failed-fraction", "1.5"], capsys)
    assert "--max-failed-fraction must be in [0, 1), got 1.5" in err


def _tiny_model_copy(tmp_path: Path) -> Path:
    import shutil

    from agentrl.models import build_tiny_model

    model = tmp_path / "model"
    shutil.copytree(build_tiny_model(), model)
    return model


def test_weights_that_are_not_safetensors_are_refused_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _tiny_model_copy(tmp_path)
    (model / "model.safetensors").write_bytes(b"\xff" * 5000)
    err = refused([*ENV, "--hf-checkpoint", str(model)], capsys)
    assert f"--hf-checkpoint {model}: {model / 'model.safetensors'} is not a safetensors file" in err


def test_cut_short_weights_are_refused_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _tiny_model_copy(tmp_path)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100_000])
    err = refused([*ENV, "--hf-checkpoint", str(model)], capsys)
    assert f"{weights} is cut short" in err


def test_a_checkpoint_without_weights_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _tiny_model_copy(tmp_path)
    (model / "model.safetensors").unlink()
    assert f"no *.safetensors weights in {model}" in refused([*ENV, "--hf-checkpoint", str(model)], capsys)


@pytest.mark.parametrize("checkpoint", [False, True])
def test_a_model_flag_the_checkpoint_contradicts_is_refused_at_parse_time(
        checkpoint: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--hf-checkpoint", str(_tiny_model_copy(tmp_path))] if checkpoint else []  # or tiny
    err = refused([*ENV, *flags, "--num-layers", "7"], capsys)
    assert "--num-layers is 7 but the checkpoint has num_hidden_layers = 4" in err


def test_a_plugin_that_does_not_import_is_refused_at_parse_time(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plugin = tmp_path / "rm.py"
    plugin.write_text("def reward(:\n")
    err = refused([*ENV, "--custom-rm-path", str(plugin)], capsys)
    assert f"--custom-rm-path: importing '{plugin}' failed: SyntaxError" in err


def test_a_custom_generate_of_the_wrong_form_is_refused_at_parse_time(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plugin = tmp_path / "gen.py"
    plugin.write_text("def custom_generate(args, samples):\n    return samples\n")
    err = refused([*ENV, "--custom-generate-function-path", str(plugin)], capsys)
    assert "must be `async def custom_generate(args, samples, evaluation=False)`" in err


def test_a_filter_that_is_not_callable_is_refused_at_parse_time(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plugin = tmp_path / "f.py"
    plugin.write_text("threshold = 0.5\n")
    err = refused([*ENV, "--dynamic-sampling-filter-path", f"{plugin}:threshold"], capsys)
    assert f"--dynamic-sampling-filter-path '{plugin}:threshold' is not callable" in err


def test_a_flag_error_is_one_line_and_where_to_look(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused([*ENV, "--rollout-batch-size", "0"], capsys)
    assert err.splitlines() == ["train.py: error: --rollout-batch-size must be >= 1, got 0",
                                "(all flags: train.py --help)"]



def test_routing_replay_needs_a_mixture_of_experts_and_an_engine_that_reports_routes(
        capsys: pytest.CaptureFixture[str]) -> None:
    err = refused([*ENV, "--routing-replay"], capsys)
    assert "--routing-replay is for mixture-of-experts models; the checkpoint is a dense qwen2 model" in err
    err = refused([*ENV, "--routing-replay", "--rollout-backend", "vllm", "--rollout-engine-urls",
                   "http://127.0.0.1:9"], capsys)
    assert "only the embedded engine reports them" in err
    err = refused([*ENV, "--routing-replay", "--recompute-activations"], capsys)
    assert "it does not work with --recompute-activations or --sequence-parallel" in err


def test_expert_parallelism_needs_as_many_data_parallel_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused([*ENV, "--expert-model-parallel-size", "2"], capsys)
    assert "--expert-model-parallel-size 2 must divide the trainer's data-parallel ranks" in err

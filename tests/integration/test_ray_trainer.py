"""The trainer's ranks as Ray actors: two CPU ranks at TP=2 train like one in-process rank."""

from __future__ import annotations

import pytest
import torch

from agentrl.models import build_tiny_model
from agentrl.placement.cluster import ClusterConfig, TrainerGroup, start_ray
from agentrl.records.sample import Sample, Status, Turn
from agentrl.trainer.actor import MegatronActor
from agentrl.trainer.config import TrainerConfig


def samples() -> list[Sample]:
    generator = torch.Generator().manual_seed(0)
    out = []
    for i in range(8):
        prompt = torch.randint(10, 4000, (8,), generator=generator).tolist()
        response = torch.randint(10, 4000, (12,), generator=generator).tolist()
        out.append(Sample(group_id=i // 4, index=i % 4, tokens=prompt + response,
                          response_length=12, loss_mask=[1] * 12, rollout_log_probs=[-8.0] * 12,
                          reward=float(i % 2), status=Status.COMPLETED,
                          turns=[Turn("assistant", 0, 12)]))
    return out


@pytest.fixture(scope="module")
def ray_session():
    import ray

    start_ray(ClusterConfig(actor_num_gpus_per_node=2))
    yield
    ray.shutdown()


def test_two_ray_ranks_at_tp2_equal_one_local_rank(ray_session, tmp_path):
    kwargs = {"hf_checkpoint": build_tiny_model(), "rollout_temperature": 1.0}
    cluster = ClusterConfig(actor_num_gpus_per_node=2)
    cluster.validate()
    group = TrainerGroup(cluster, TrainerConfig(lr=1e-4, tensor_model_parallel_size=2,
                                                micro_batch_size=4), **kwargs)
    try:
        remote_metrics = group.train(samples())
        remote_weights = group.hf_state_dict()
        group.save_checkpoint(tmp_path / "ckpt", extra={"next_rollout": 1})
        assert group.load_checkpoint(tmp_path / "ckpt") == {"next_rollout": 1}
    finally:
        group.shutdown()
    local = MegatronActor(TrainerConfig(lr=1e-4, micro_batch_size=4), **kwargs)
    local_metrics = local.train(samples())
    for key in ("loss", "pg_loss", "grad_norm"):
        # (the TP=2 == TP=1 test holds 1e-5; here thread counts differ too: 1 per rank vs 2)
        assert remote_metrics[key] == pytest.approx(local_metrics[key], abs=1e-5, rel=1e-4), key
    local_weights = local.hf_state_dict()
    assert remote_weights.keys() == local_weights.keys()
    for name, tensor in local_weights.items():
        assert torch.allclose(remote_weights[name], tensor, atol=1e-4), name


def test_cluster_flags_are_checked():
    from agentrl.errors import ConfigError

    with pytest.raises(ConfigError, match="--no-use-ray runs one trainer rank"):
        ClusterConfig(use_ray=False, actor_num_gpus_per_node=2).validate()


def _copy_of_tiny_model(tmp_path, weights: bytes | None = None, wrong_shape: bool = False):
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "model"
    shutil.copytree(build_tiny_model(), folder)
    if weights is not None:
        (folder / "model.safetensors").write_bytes(weights)
    if wrong_shape:
        tensors = load_file(str(folder / "model.safetensors"))
        tensors["model.layers.0.mlp.gate_proj.weight"] = torch.zeros(3, 3)
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_a_rank_that_raises_our_error_reports_it_without_colour_codes_or_remote_traceback(
        ray_session, tmp_path):
    from agentrl.trainer.hf_weights import WeightMappingError

    group = TrainerGroup(ClusterConfig(), TrainerConfig(), rollout_temperature=1.0,
                         hf_checkpoint=_copy_of_tiny_model(tmp_path, wrong_shape=True))
    try:
        with pytest.raises(WeightMappingError) as raised:
            group.ready()
    finally:
        group.shutdown()
    message = str(raised.value)
    assert "gate_proj.weight: (3, 3), expected (384, 128)" in message
    assert "\x1b[" not in message and "Traceback" not in message and "ray::" not in message


@pytest.mark.parametrize("debug", [False, True])
def test_a_rank_failing_with_a_foreign_error_is_one_line_and_its_traceback_needs_debug(
        ray_session, tmp_path, debug):
    from agentrl.placement.remote_errors import RemoteError

    garbage = _copy_of_tiny_model(tmp_path, weights=b"\xff" * 4096)  # safetensors refuses it
    group = TrainerGroup(ClusterConfig(), TrainerConfig(), rollout_temperature=1.0,
                         hf_checkpoint=garbage, debug=debug)
    try:
        with pytest.raises(RemoteError) as raised:
            group.ready()
    finally:
        group.shutdown()
    first, *rest = str(raised.value).splitlines()
    assert first.startswith("the trainer's set-up (building the model on every rank) failed: ")
    assert "SafetensorError" in first and "\x1b[" not in str(raised.value)
    if debug:
        assert any('File "' in line and ", line " in line for line in rest)  # the remote frames
    else:
        assert rest == [] and first.endswith("(--debug shows the remote traceback)")

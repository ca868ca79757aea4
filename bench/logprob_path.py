"""Peak memory of the trainer's log-prob path at Qwen2.5's vocabulary (151,936), on CPU.

The path from the last hidden states to the per-token log-probs and entropies the loss reads
(LM head, log-softmax over the vocabulary, entropy, and their backward), on an RL-shaped batch:
``--samples`` sequences of ``--seq-len`` tokens of which the last ``--response-len`` are the
model's (loss mask 1; the rest is prompt and tool output). Two ways, each in a child process of
its own (RSS never shrinks within a process):

* ``every_position`` (the trainer before this change): the head and the log-softmax at every
  position, the mask applied afterwards;
* ``trained_positions`` (``agentrl.trainer.trained_positions``, the trainer now): only at the
  positions that predict a trained token.

The model is Qwen2-shaped and small everywhere but the vocabulary (hidden 128, 2 layers), so
the vocabulary's share dominates as it does in a real rollout batch. Prints one JSON line
``logprob_path_peak_mb`` with both peaks (MiB over the child's RSS after building the model and
the batch) and their ratio (target: >= 4x lower).

    python bench/logprob_path.py [--samples 2] [--seq-len 768] [--response-len 192]

The ratio is close to (all positions) / (trained positions): a batch whose tokens are a quarter
the model's own gives about 4x. The every-position child needs several GiB at these defaults
(``--samples 4 --seq-len 1024``: 19 GiB): mind the machine's memory before raising them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from _memory import peak_rss_mib

CONFIG = {
    "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 151936,
    "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "torch_dtype": "float32", "hidden_act": "silu",
}


def child(args: argparse.Namespace) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agentrl.trainer.actor import LOGPROB_CHUNK, MegatronActor
    from agentrl.trainer.config import TrainerConfig
    from agentrl.trainer.trained_positions import trained_token_logprobs

    folder = Path(tempfile.mkdtemp(prefix="agentrl-bench-"))
    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(**CONFIG)).save_pretrained(folder)
    actor = MegatronActor(TrainerConfig(lr=1e-5), hf_checkpoint=folder, rollout_temperature=1.0)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(10, CONFIG["vocab_size"], (args.samples, args.seq_len), generator=generator)
    mask = torch.zeros(args.samples, args.seq_len - 1)
    mask[:, -args.response_len:] = 1.0
    def work() -> None:
        logp, entropy = trained_token_logprobs(
            actor.model, tokens, mask, vocab_size=CONFIG["vocab_size"], temperature=1.0,
            chunk_size=LOGPROB_CHUNK, entropy=True, every_position=args.child == "every_position")
        (logp.sum() + entropy.sum()).backward()

    print(json.dumps({"peak_mib": peak_rss_mib(work)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=768)
    parser.add_argument("--response-len", type=int, default=192)
    parser.add_argument("--child", choices=["every_position", "trained_positions"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    peaks = {}
    for way in ("every_position", "trained_positions"):
        done = subprocess.run([sys.executable, __file__, "--child", way, "--samples", str(args.samples),
                               "--seq-len", str(args.seq_len), "--response-len", str(args.response_len)],
                              capture_output=True, text=True, check=True)
        peaks[way] = json.loads(done.stdout.strip().splitlines()[-1])["peak_mib"]
        print(f"{way}: peak {peaks[way]:.0f} MiB over the model and batch "
              f"({args.samples} x {args.seq_len} tokens, {args.response_len} trained each)")
    ratio = peaks["every_position"] / max(peaks["trained_positions"], 1e-9)
    print(json.dumps({"name": "logprob_path_peak_mb", "value": {k: round(v) for k, v in peaks.items()},
                      "ratio": round(ratio, 2), "target": ">= 4x lower"}))


if __name__ == "__main__":
    main()

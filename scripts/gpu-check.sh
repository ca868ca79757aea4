#!/usr/bin/env bash
# The GPU checks, for a CUDA machine (one GPU is enough), in under 10 minutes: the embedded engine
# and the trainer in bf16, then both server backends (SGLang and vLLM) through the same tests
# (tests/gpu/). Each figure is printed as one JSON line, e.g.
#   {"name": "vllm_vs_trainer_logprob_abs_diff", "value": 0.01}
#
# Set-up, once, in a venv with a CUDA torch (2.x): `pip install -e '.[dev,gpu]' vllm`. A backend
# that is not installed is skipped with the reason; the others still run.
#   scripts/gpu-check.sh [VENV_PYTHON]     (default: .venv/bin/python)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${1:-.venv/bin/python}"

"$PY" -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print("gpu-check:", torch.cuda.get_device_name(0))' || exit 2
for backend in sglang vllm; do
    "$PY" -c "import $backend" >/dev/null 2>&1 && echo "gpu-check: $backend installed" || echo "gpu-check: $backend missing (its tests skip)"
done
timeout 570 "$PY" -m pytest tests/gpu -m gpu -s -q -rs -p no:cacheprovider
status=$?
[ "$status" = 124 ] && echo "gpu-check: stopped at the 10-minute limit"
exit "$status"

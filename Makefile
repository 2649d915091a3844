# The two front-door commands: `make demo` and `make test`. Both set everything
# up on a fresh Debian machine (system packages, venv, torch CPU first) and are
# fast the second time (stamp files).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch first and pinned: this version is the CPU build here; anything else
# would pull gigabytes of CUDA packages.
TORCH := torch==2.13.0
APT_PKGS := libavutil57 libavcodec59 libavformat59 libavdevice59 libavfilter8 chromium
SRC := $(shell find stagebench conf -type f \( -name '*.py' -o -name '*.yaml' -o -name '*.j2' -o -name '*.css' -o -name '*.js' \) 2>/dev/null) pyproject.toml stagebench_activate.pth

.PHONY: setup demo test check bench clean

.stamp-apt:
	@if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  missing=$$(for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	  if [ -n "$$missing" ]; then \
	    echo "installing system packages: $$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  fi; \
	else echo "note: not root or no apt-get; install $(APT_PKGS) yourself"; fi
	@touch $@

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

.stamp-torch: $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	@touch $@

# A real (non-editable) install: tests run against what a wheel ships.
.stamp-install: .stamp-torch $(SRC)
	$(BIN)/pip install -q ".[test]"
	@touch $@

setup: .stamp-apt .stamp-install

demo: setup
	$(BIN)/stagebench demo

# The instrument's known-answer tests run first, in a fresh interpreter: threads,
# pools and hooks left by other tests in the same process perturb GIL timings.
ACCURACY := test_stats.py test_measure.py test_sweep.py test_fit.py test_gil.py test_predict.py
# TESTS: files or -k expressions to narrow the run, e.g. `make test TESTS=test_measure.py`
TESTS ?=
# Static checks first: a lint, format or type error fails in seconds, not after the suite.
check: setup
	$(BIN)/ruff check stagebench tests benchmarks docs/generate.py
	$(BIN)/ruff format --check stagebench tests benchmarks docs/generate.py
	$(BIN)/mypy
	$(BIN)/python docs/generate.py --check

test: setup check
ifeq ($(strip $(TESTS)),)
	cd tests && ../$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) $(ACCURACY)
	cd tests && ../$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) $(addprefix --ignore=,$(ACCURACY)) .
else
	cd tests && ../$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) $(TESTS)
endif

bench: setup
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) .stamp-* build dist

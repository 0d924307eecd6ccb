# Quick start: `make demo` and `make test` set everything up on a fresh clone
# (a .venv with torch from this machine's disk, sglang without its GPU
# dependencies plus its CPU import closure, this project editable), then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The base release: the one matrix.txt installs in the venv itself (its line says "-").
SGLANG_VERSION ?= $(shell awk '$$1 !~ /^#/ && $$2 == "-" {print $$1}' matrix.txt)
STAMP := $(VENV)/.setup-$(SGLANG_VERSION)
# `make test` runs the suite once per release in matrix.txt (tools/matrix.py), with the
# CI hypothesis profile (2,000 examples per property). For a quicker local loop:
#   make test HYPOTHESIS_PROFILE=dev RELEASES=0.5.23
export HYPOTHESIS_PROFILE ?= ci
RELEASES ?=
PIP := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: setup demo test lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements/sglang-$(SGLANG_VERSION)-cpu.txt requirements/test.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.14.1 torchvision==0.29.1
	$(PIP) --no-deps sglang==$(SGLANG_VERSION)
	$(PIP) -r requirements/sglang-$(SGLANG_VERSION)-cpu.txt -r requirements/test.txt
	$(PIP) --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/sglang-dsv4-guard demo

test: $(STAMP)
	$(PY) tools/matrix.py $(if $(RELEASES),--releases $(RELEASES))

lint: $(STAMP)
	$(PY) -m ruff check sglang_dsv4_guard tests benchmarks tools
	$(PY) -m mypy
	$(PY) -m mypy --strict tools/matrix.py tools/fingerprint.py

bench: $(STAMP)
	$(PY) tools/matrix.py --script benchmarks/bench_overhead.py $(if $(RELEASES),--releases $(RELEASES))

clean:
	rm -rf $(VENV) .matrix .pytest_cache .mypy_cache .ruff_cache .hypothesis

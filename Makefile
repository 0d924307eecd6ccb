# Quick start: `make demo` and `make test` set everything up on a fresh clone
# (a .venv with torch from this machine's disk, sglang without its GPU
# dependencies plus its CPU import closure, this project editable), then run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SGLANG_VERSION ?= 0.5.23
STAMP := $(VENV)/.setup-$(SGLANG_VERSION)
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
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check sglang_dsv4_guard tests benchmarks
	$(PY) -m mypy

bench: $(STAMP)
	$(PY) benchmarks/bench_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# Quick start: `make demo` and `make test` set everything up on a fresh clone
# (a .venv with torch from this machine's disk, sglang without its GPU
# dependencies plus its CPU import closure, this project editable), then run.
# Each step prints one line; what pip and the test runners print goes to a log file,
# named (with its last lines) when a step fails.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The base release: the one matrix.txt installs in the venv itself (its line says "-").
SGLANG_VERSION ?= $(shell awk '$$1 !~ /^#/ && $$2 == "-" {print $$1}' matrix.txt)
ifneq ($(words $(SGLANG_VERSION)),1)
$(error matrix.txt: exactly one release line must have "-" as its second field (the base release, installed in $(VENV)); found "$(SGLANG_VERSION)")
endif
STAMP := $(VENV)/.setup-$(SGLANG_VERSION)
SETUP_LOG := .setup.log
comma := ,
REPORTS := .matrix/reports
# Three tiers (docs/releases.md#the-test-matrix):
#   make check-fast  the in-process tests on the base release, dev profile: the edit loop
#   make test        what CI runs: every test on the base release (traced), and on every
#                    other release of matrix.txt the tests whose SGLang code differs there
#   make matrix      every test on every release, and every file under SGLang's CI harness
export HYPOTHESIS_PROFILE ?= ci
RELEASES ?=
RELEASES_ARG := $(if $(RELEASES),--releases $(RELEASES))
PIP := $(PY) -m pip install --disable-pip-version-check --no-input --progress-bar off

# $(call step,WHAT,LOG,COMMAND): print WHAT, append COMMAND's output to LOG; on failure
# show LOG's last lines and name it.
define step
	@echo "$(1)"
	@mkdir -p $(dir $(2)) && echo "===== $(1)" >> $(2)
	@( $(3) ) >> $(2) 2>&1 || { status=$$?; echo "   failed (exit $$status); the last lines of $(2):"; \
	  tail -n 25 $(2) | sed 's/^/   | /'; echo "   full output: $(2)"; exit $$status; }
endef

.PHONY: setup demo test matrix check-fast durations lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements/sglang-$(SGLANG_VERSION)-cpu.txt requirements/test.txt
	@: > $(SETUP_LOG)
	$(call step,setup 1/5: virtual environment $(VENV),$(SETUP_LOG),test -x $(PY) || $(PYTHON) -m venv $(VENV))
	$(call step,setup 2/5: torch 2.14.1 and torchvision 0.29.1,$(SETUP_LOG),$(PIP) torch==2.14.1 torchvision==0.29.1)
	$(call step,setup 3/5: sglang $(SGLANG_VERSION) without its GPU dependencies,$(SETUP_LOG),$(PIP) --no-deps sglang==$(SGLANG_VERSION))
	$(call step,setup 4/5: the CPU import closure of sglang and the test tools,$(SETUP_LOG),$(PIP) -r requirements/sglang-$(SGLANG_VERSION)-cpu.txt -r requirements/test.txt)
	$(call step,setup 5/5: sglang-dsv4-guard itself (editable),$(SETUP_LOG),$(PIP) --no-deps -e .)
	@touch $(STAMP)
	@echo "setup: done (pip's output is in $(SETUP_LOG))"

demo: $(STAMP)
	@echo "demo: SGLang's real setup_state_kv_args on a built-in scenario"
	@$(VENV)/bin/sglang-dsv4-guard demo

# $(call matrix,WHAT,ARGS): tools/matrix.py ARGS, its output in a log, its summary shown.
define matrix
	$(call step,$(1) 1/2: fetch the releases in matrix.txt,$(REPORTS)/prepare.log,$(PY) tools/matrix.py --prepare-only $(RELEASES_ARG))
	@echo "$(1) 2/2: $(3); logs in $(REPORTS)/"
	@mkdir -p $(REPORTS); rm -f .matrix/summary.md; $(PY) tools/matrix.py $(2) > $(REPORTS)/matrix.log 2>&1; \
	  status=$$?; if [ -s .matrix/summary.md ]; then cat .matrix/summary.md; \
	  else tail -n 25 $(REPORTS)/matrix.log | sed 's/^/   | /'; fi; \
	  [ $$status -eq 0 ] || { echo "   failed; full output: $(REPORTS)/matrix.log"; exit $$status; }
endef

test: $(STAMP)
	$(call matrix,test,--select $(RELEASES_ARG),every test on $(SGLANG_VERSION) (traced)$(comma) then on each other release the tests whose SGLang code differs)

matrix: $(STAMP)
	$(call matrix,matrix,--sglang-ci $(RELEASES_ARG),every test on every release$(comma) and every file under SGLang's CI harness on $(SGLANG_VERSION))

check-fast: $(STAMP)
	@HYPOTHESIS_PROFILE=dev $(PY) tools/matrix.py --fast

durations: $(STAMP)
	@$(PY) tools/matrix.py --durations

lint: $(STAMP)
	$(PY) -m ruff check sglang_dsv4_guard tests benchmarks tools examples
	$(PY) -m mypy
	$(PY) -m mypy --strict tools/matrix.py tools/release_env.py tools/selection.py tools/release_code.py tools/trace_drives.py tools/suite.py tools/durations.py tools/judging.py tools/imports.py tools/patched_tree.py tools/make_patches.py tools/patch_texts.py tools/sglang_ci.py tools/digests.py

bench: $(STAMP)
	$(PY) tools/matrix.py --script benchmarks/bench_overhead.py $(RELEASES_ARG)
	$(PY) benchmarks/bench_memory.py

clean:
	rm -rf $(VENV) .matrix .pytest_cache .mypy_cache .ruff_cache .hypothesis $(SETUP_LOG)

# Two commands set everything up on a fresh machine with only Python and pip:
#   make demo   -> .venv, torch, memprofiler, then the demo run on CPU
#   make test   -> the same with dev extras, then pytest (the fast set, on every core; make test-slow: the rest)
#   make docs   -> the documentation site in site/, built offline with warnings as errors
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
PY := $(BIN)/python

.PHONY: venv install install-dev install-docs demo test docs lint typecheck bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# torch goes in first and pinned: a bare `torch` requirement would pull the CUDA build.
$(VENV)/.torch: | $(PY)
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	touch $@

# setup.py builds the one C extension (the saved-tensor pack hook) in place.
PACKER := setup.py src/memprofiler/_packer.c

$(VENV)/.installed: pyproject.toml $(PACKER) $(VENV)/.torch
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(PACKER) $(VENV)/.torch
	$(PY) -m pip install -q -e ".[dev]"
	touch $@ $(VENV)/.installed

$(VENV)/.installed-docs: pyproject.toml $(PACKER) $(VENV)/.torch
	$(PY) -m pip install -q -e ".[docs]"
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev
install-docs: $(VENV)/.installed-docs

demo: install
	$(PY) examples/demo.py fit --config configs/demo.yaml

# The demo GPT sharded with FSDP2 over 2 CPU processes (gloo), FSDPMemTracker reports and
# the cross-rank memory_summary.yaml. Lightning starts the second process itself.
.PHONY: demo-fsdp
demo-fsdp: install
	$(PY) examples/demo.py fit --config configs/fsdp_cpu.yaml

# The tests are spread over every core by pytest-xdist (the dev extra) when it imports, else run
# one by one. `make test` leaves out the tests marked `slow` (each starts more processes: ranks,
# a pytest inside pytest, a browser, the README's examples as scripts); `make test-slow` runs
# those, and `make test-all` both. CI (.ci/run) runs `make test` and `make test-slow`.
XDIST = $(shell $(PY) -c "import xdist" >/dev/null 2>&1 && echo "-n auto")

test: install-dev
	$(PY) -m pytest -q $(XDIST) -m "not slow"

.PHONY: test-slow test-all
test-slow: install-dev
	$(PY) -m pytest -q $(XDIST) -m slow

test-all: install-dev
	$(PY) -m pytest -q $(XDIST)

# The config reference and each subcommand's usage are generated from the code at build time
# (tools/mkdocs_hooks.py); mkdocs.yml sets strict, so a broken link or anchor fails the build.
docs: install-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

lint: install-dev
	$(BIN)/ruff check src tests benchmarks examples tools
	$(BIN)/ruff format --check src tests benchmarks examples tools
	$(BIN)/mypy

bench: install
	$(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) build site *.egg-info src/*.egg-info lightning_logs src/memprofiler/*.so

# docs/img/report.png, the README's picture: the report of `make demo`'s own run, shot in headless
# Chromium (Playwright with Debian's chromium; the network refused).
.PHONY: screenshot
screenshot: install-dev
	$(PY) tools/report_screenshot.py --out docs/img/report.png

.PHONY: bench-snapshot
bench-snapshot: install
	$(PY) benchmarks/snapshot_analysis.py --out benchmarks/results

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

# setup.py builds the saved-tensor pack hook's extensions in place: the C hook, and the C++ part
# that reads tensors against the torch just installed. That one needs torch while building, so the
# build is not isolated, and setuptools comes first.
PACKER := setup.py src/memprofiler/_packer.c src/memprofiler/_tensor_facts.cpp src/memprofiler/_tensor_facts.h
PIP_E := $(PY) -m pip install -q --no-build-isolation -e

$(VENV)/.build-deps: | $(PY)
	$(PY) -m pip install -q "setuptools>=77"
	touch $@

$(VENV)/.installed: pyproject.toml $(PACKER) $(VENV)/.torch $(VENV)/.build-deps
	$(PIP_E) .
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(PACKER) $(VENV)/.torch $(VENV)/.build-deps
	$(PIP_E) ".[dev]"
	touch $@ $(VENV)/.installed

$(VENV)/.installed-docs: pyproject.toml $(PACKER) $(VENV)/.torch $(VENV)/.build-deps
	$(PIP_E) ".[docs]"
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

# The hooks of .pre-commit-config.yaml (ruff check and format, mypy, clang-format on _packer.c), every
# one the dev extra's own tool: nothing is downloaded.
lint: install-dev
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pre-commit run --all-files --show-diff-on-failure

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

# convbench: `make bench` measures, `make test` checks. Both set up .venv from nothing.
# On a machine that already has its Python environment (a GPU machine with CUDA torch and CuPy
# and no package registry), USE_ENV=1 runs in it instead: no .venv, nothing installed, e.g.
#   make gpu-first USE_ENV=1 OUT=$OUT        (a first GPU visit: one command, < 8 minutes)
#   make gpu-check USE_ENV=1 && make gpu-check-tests USE_ENV=1
PYTHON ?= python3
VENV   := .venv
# torch is pinned to the CPU build the CI machine carries; on a GPU machine install torch first.
TORCH  ?= torch==2.13.0
BENCH_ARGS ?=
CHECK_ARGS ?=
FIRST_ARGS ?=
OUT ?= gpu-first
PHASES_ARGS ?=
# processes `make test` runs the tests in (pytest-xdist); the CI machine has 2 cores
TEST_WORKERS ?= 2

ifdef USE_ENV
PY     := $(PYTHON)
STAMP  :=
else
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
endif

.PHONY: test bench phases gpu-first gpu-check gpu-check-tests lint docs clean install

$(VENV)/.installed: pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q "$(TORCH)"
	$(VENV)/bin/python -m pip install -q -e ".[dev,plot,cuda,docs]"
	touch $@

install: $(STAMP)

# With pytest-xdist (the dev extra) the tests run in TEST_WORKERS processes, a file to a
# process, then the `serial` ones (they load the machine or need it quiet) alone; without it
# (a GPU machine's own environment) in one process.
test: $(STAMP)
	@if $(PY) -c "import xdist" 2>/dev/null; then \
	  echo "$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile -m 'not serial'"; \
	  $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile -m "not serial" && \
	  echo "$(PY) -m pytest -q -p no:cacheprovider -m serial" && \
	  $(PY) -m pytest -q -p no:cacheprovider -m serial; \
	else \
	  echo "$(PY) -m pytest -q -p no:cacheprovider"; \
	  $(PY) -m pytest -q -p no:cacheprovider; \
	fi

bench: $(STAMP)
	$(PY) -m convbench bench $(BENCH_ARGS)

# Each CPU algorithm's phases, a baseline commit's convbench/algos against the working tree's,
# side by side (python -m convbench.tools.phases_bench --help), e.g.
#   make phases PHASES_ARGS="--baseline main --layers alexnet:conv2 --algos fft"
phases: $(STAMP)
	$(PY) -m convbench.tools.phases_bench $(PHASES_ARGS)

# A first GPU visit in one command within 7 minutes of wall time (convbench gpu-first --help):
# the gpu tests that pin the reviews' predictions, env and the GPU's ceilings, AlexNet's layers
# (conv2, conv3, conv4, conv5, conv1) with every algo x pass x layout until the deadline, and
# the summary, packed into OUT as summary.md, tests.log and gpu-first.tar.gz. Refuses in one
# line where CUDA cannot be used.
gpu-first: $(STAMP)
	$(PY) -m convbench gpu-first --out $(OUT) $(FIRST_ARGS)

# The first GPU check in two commands, each within ten minutes, into one folder,
# results/<date>-<gpu>-alexnet-gpu-check/ (convbench gpu-check --help): env, every algo x pass x
# layout of AlexNet at batch 256 and the ratios; then the gpu tests' log and their summary line.
gpu-check: $(STAMP)
	$(PY) -m convbench gpu-check $(CHECK_ARGS)

gpu-check-tests: $(STAMP)
	$(PY) -m convbench gpu-check --tests $(CHECK_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check convbench tests

# The documentation site (MkDocs + Material, docs/mkdocs.yml, pages in docs/pages/) into
# DOCS_SITE, warnings as errors: a broken link, a cross-reference that finds no target or a
# docstring the API pages cannot read fails. tests/test_docs.py runs this very target.
DOCS_SITE ?= docs/site
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -f docs/mkdocs.yml -d $(abspath $(DOCS_SITE))

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache docs/site

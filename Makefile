# convbench: `make bench` measures, `make test` checks. Both set up .venv from nothing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# torch is pinned to the CPU build the CI machine carries; on a GPU machine install torch first.
TORCH  ?= torch==2.13.0
BENCH_ARGS ?=

.PHONY: test bench lint clean install

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev,plot,cuda]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

bench: $(STAMP)
	$(VENV)/bin/convbench bench $(BENCH_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check convbench tests

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

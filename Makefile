# Two entry points do all set-up on a fresh machine:
#   make run   -> create .venv, install streamtree, replay the bundled corpus and print the trees
#   make test  -> create .venv, install streamtree with test extras, run the whole test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-fast bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m streamtree.demo

test: $(STAMP)
	$(PY) -m pytest -m "" -q

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow and not ray" -q

bench: $(STAMP)
	$(PY) bench/bench_zsweep.py

clean:
	rm -rf $(VENV) build *.egg-info

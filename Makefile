# Two entry points do all set-up on a fresh machine:
#   make run   -> create .venv, install streamtree, replay the bundled corpus and print the trees
#   make test  -> create .venv, install streamtree with test extras, run the whole test suite
#   make browser -> install Debian's chromium for the report's browser tests (root; CI does it)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-fast bench browser clean

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

browser:
	command -v chromium >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-dejavu-core >/dev/null; }

bench: $(STAMP)
	$(PY) bench/bench_zsweep.py

clean:
	rm -rf $(VENV) build *.egg-info

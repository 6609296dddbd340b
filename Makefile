# Two entry points do all set-up on a fresh machine:
#   make run   -> create .venv, install streamtree, replay the bundled corpus and print the trees
#   make test  -> create .venv, install streamtree with test extras, run the whole test suite
#   make browser -> install Debian's chromium for the report's browser tests (root; CI does it)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-fast bench browser clean

# the environment: Python 3.11+ with pip. A half-made one (an interrupted or failed venv) is
# reported, not reused or deleted.
USABLE := import sys, pip; sys.exit(sys.version_info < (3, 11))

$(STAMP): pyproject.toml
	@$(PY) -c '$(USABLE)' 2>/dev/null || { \
	  if [ -e $(VENV) ]; then echo "$(VENV) is not a Python 3.11+ environment with pip (left by an interrupted set-up?): remove it (rm -rf $(VENV)) and run make again" >&2; exit 1; fi; \
	  $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "streamtree needs Python 3.11 or newer: run make with PYTHON=python3.11 (or newer)" >&2; exit 1; }; \
	  $(PYTHON) -m venv $(VENV) && $(PY) -c '$(USABLE)' || { echo "could not create $(VENV) with $(PYTHON) (on Debian or Ubuntu: apt-get install python3-venv); remove $(VENV) and run make again" >&2; exit 1; }; }
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

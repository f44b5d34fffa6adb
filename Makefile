# The two commands of the README:
#   make demo   install, then run the whole pipeline on the embedded corpus (CPU, ~10 minutes)
#   make test   install, then run the test suite (CPU)
VENV ?= .venv
PY := $(VENV)/bin/python
export DS_ACCELERATOR ?= cpu

.PHONY: install test demo bench clean

install:
	bash scripts/install.sh

test: install
	$(PY) -m pytest -q

demo: install
	$(VENV)/bin/bertdist demo

bench: install
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) runs .pytest_cache

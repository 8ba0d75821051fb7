# The two commands of the README: `make demo` and `make test`. Both set everything up first.
VENV ?= .venv
PY := $(VENV)/bin/python
JOBS ?= 2

.PHONY: setup demo test lint bench docs clean

setup:
	@scripts/bootstrap.sh

demo: setup
	$(VENV)/bin/unveil demo

test: setup
	$(PY) -m pytest -q -p no:cacheprovider

lint: setup
	$(VENV)/bin/ruff check ingest analytics jobs knowledge_base remediation tests benchmarks
	$(VENV)/bin/mypy

bench: setup
	$(PY) benchmarks/agent_overhead.py
	$(PY) benchmarks/simulate.py
	$(PY) benchmarks/analytics_speed.py

docs: setup
	$(VENV)/bin/unveil schema --format markdown > docs/schema.md

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

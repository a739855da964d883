# The two commands a newcomer needs: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: setup demo test lint serve clean

setup: $(VENV)/.installed

# Re-runs only when pyproject.toml changes; an existing .venv is reused.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

demo: setup
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py seed_demo
	$(BIN)/python manage.py runserver $(HOST):$(PORT)

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/python manage.py makemigrations --check --dry-run

clean:
	rm -rf $(VENV) var .pytest_cache

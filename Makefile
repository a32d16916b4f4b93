# specmesh: `make run` and `make test` set everything up themselves (see README.md).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.specmesh-setup
PORT ?= auto
ROLE ?= drafter

.PHONY: setup run test test-all bench fuzz train flash chaos clean

setup: $(STAMP)

# Re-runs only when the dependency list changes; otherwise `make setup` returns at once.
# torch==2.13.0 is the CPU build: tests exercise the torch verifier back-end on the CPU.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]' 'torch==2.13.0'
	@touch $(STAMP)

run: setup
	$(VENV)/bin/specmesh run

test: setup
	$(PY) -m pytest -q

test-all: setup
	$(PY) -m pytest -q -m ''

bench: setup
	$(PY) -m tools.bench

fuzz: setup
	$(PY) -m tools.fuzz

train: setup
	$(PY) -m tools.train_all

chaos: setup
	$(VENV)/bin/specmesh chaos

flash: setup
	$(VENV)/bin/specmesh flash --port $(PORT) --role $(ROLE)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

# labkit: two commands on a fresh machine -- `make lab` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NBVAL  := -p no:hypothesispytest --nbval-lax --nbval-current-env
TOKEN  ?= $(shell $(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(24))')
PORT   ?= 8888
ROOTOK := $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: lab test exercises bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

lab: $(STAMP)
	@echo "JupyterLab on http://127.0.0.1:$(PORT)/lab?token=$(TOKEN)"
	$(BIN)/jupyter lab --ip=127.0.0.1 --port=$(PORT) --IdentityProvider.token=$(TOKEN) \
	    --ServerApp.root_dir=$(CURDIR) $(ROOTOK) notebooks/00-start-here.ipynb

test: $(STAMP)
	$(BIN)/ruff format --check labkit
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q tests
	$(BIN)/python -m pytest -q $(NBVAL) notebooks solutions

exercises: $(STAMP)
	$(BIN)/python -m labkit.grading.notebooks build

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) build

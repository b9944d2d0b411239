# labkit: two commands on a fresh machine -- `make lab` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NBVAL  := -p no:hypothesispytest --nbval-lax --nbval-current-env
# both cores: each test file (each notebook) runs whole on one worker, so module fixtures stay one.
# The tests run on three workers: much of their time is waiting (servers starting, paced replays,
# the browser, the judge's processes), which a third worker fills; the notebooks are busy: two
XDIST  := -n 2 --dist loadfile
TESTS_XDIST := -n 3 --dist loadfile
# `make lab TOKEN=... PORT=...` to choose; otherwise a new token and the first free port from 8888,
# each computed once in the recipe's shell, so the URL printed is the one the server accepts.
FREEPORT := import socket; print(next(p for p in range(8888, 8999) if socket.socket().connect_ex(("127.0.0.1", p))))
NOBROWSER := $(if $(DISPLAY)$(WAYLAND_DISPLAY),,--no-browser)
ROOTOK := $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: lab test exercises bench classroom release clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

lab: $(STAMP)
	@token="$(TOKEN)"; [ -n "$$token" ] || token=$$($(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(24))'); \
	port="$(PORT)"; [ -n "$$port" ] || port=$$($(PYTHON) -c '$(FREEPORT)'); \
	$(if $(NOBROWSER),echo "No display here: no browser opens; open the URL below yourself.";) \
	echo "JupyterLab on http://127.0.0.1:$$port/lab?token=$$token"; \
	exec $(BIN)/jupyter lab --ip=127.0.0.1 --port=$$port --ServerApp.port_retries=0 \
	    --IdentityProvider.token=$$token --ServerApp.root_dir=$(CURDIR) $(ROOTOK) $(NOBROWSER) \
	    --ServerApp.kernel_websocket_connection_class=labkit.course.lab.Connection \
	    notebooks/00-start-here.ipynb

test: $(STAMP)
	$(BIN)/ruff format --check labkit
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q $(TESTS_XDIST) --durations=25 tests
	$(BIN)/python -m pytest -q $(XDIST) $(NBVAL) notebooks solutions

exercises: $(STAMP)
	$(BIN)/python -m labkit.grading.notebooks build

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

# one PostgreSQL for a room of laptops (127.0.0.1; add ARGS="--lan ADDRESS" to open it to a LAN)
classroom: $(STAMP)
	$(BIN)/python -m labkit.classroom serve $(ARGS)

# a student's copy in build/release/ and build/release.zip (OUT=... elsewhere): lessons, exercises,
# labkit, the README; no solutions, keys or tests
release: $(STAMP)
	rm -rf $(or $(OUT),build/release) $(or $(OUT),build/release).zip
	$(BIN)/python -m labkit.release $(or $(OUT),build/release)

clean:
	rm -rf $(VENV) build

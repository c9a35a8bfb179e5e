# The two commands a newcomer needs: `make run` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench soak lint install settings-doc clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The embedded stack plus the seed-graph demo; keeps serving until Ctrl-C.
run: $(STAMP)
	$(BIN)/graphledger dev --demo

test: $(STAMP)
	$(BIN)/ruff check libs services tests bench
	$(BIN)/python -m pytest -q

# Regenerate the README's settings table from graphledger.Settings (a test fails when it is stale).
settings-doc: $(STAMP)
	$(BIN)/python -m graphledger_server.commands.settings_doc --write README.md

bench: $(STAMP)
	$(BIN)/python -m bench

# Ten minutes of mixed traffic with a projector SIGKILL every minute; checks nothing was lost.
soak: $(STAMP)
	$(BIN)/python -m bench.soak

lint: $(STAMP)
	$(BIN)/ruff check libs services tests bench
	$(BIN)/ruff format --check libs services tests bench

clean:
	rm -rf $(VENV) .pytest_cache

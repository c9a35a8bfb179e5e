# The two commands a newcomer needs: `make run` and `make test` (`make test-unit` for the fast part).
# All create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# LangGraph's Agent Server (the agent-server extra) has pins the dev extra cannot share: its own venv,
# for examples/agent-server and its test.
AGENT_SERVER_VENV := .venv-agent-server
AGENT_SERVER_STAMP := $(AGENT_SERVER_VENV)/.installed

.PHONY: run test test-unit bench soak lint install agent-server-env settings-doc clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(AGENT_SERVER_STAMP): pyproject.toml
	test -x $(AGENT_SERVER_VENV)/bin/python || $(PYTHON) -m venv $(AGENT_SERVER_VENV)
	$(AGENT_SERVER_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(AGENT_SERVER_VENV)/bin/python -m pip install --quiet -e '.[agent-server]'
	touch $(AGENT_SERVER_STAMP)

install: $(STAMP)

agent-server-env: $(AGENT_SERVER_STAMP)

# The embedded stack plus the seed-graph demo; keeps serving until Ctrl-C.
run: $(STAMP)
	$(BIN)/graphledger dev --demo

test: $(STAMP) $(AGENT_SERVER_STAMP)
	$(BIN)/ruff check libs services tests bench
	$(BIN)/python -m pytest -q

# tests/unit alone: pure code, no broker, Postgres or dev stack (tests/conftest.py refuses a unit test
# that asks for one); about 20 seconds.
test-unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

# Regenerate the README's settings table from graphledger.Settings (a test fails when it is stale).
settings-doc: $(STAMP)
	$(BIN)/python -m graphledger_server.commands.settings_doc --write README.md

bench: $(STAMP)
	$(BIN)/python -m bench

# Ten minutes of mixed traffic with a projector SIGKILL every minute; checks nothing was lost. Then
# five minutes of turns hopping between agent processes with the projector stopped, under chat load.
soak: $(STAMP)
	$(BIN)/python -m bench.soak
	GRAPHLEDGER_READ_THROUGH_STOPPED_S=300 $(BIN)/python -m pytest -q -s tests/acceptance/test_read_through_hops.py

lint: $(STAMP)
	$(BIN)/ruff check libs services tests bench
	$(BIN)/ruff format --check libs services tests bench

clean:
	rm -rf $(VENV) $(AGENT_SERVER_VENV) .pytest_cache

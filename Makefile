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

.PHONY: run test test-unit bench soak langgraph-suite lint install agent-server-env settings-doc clean

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

# Two workers: most of the suite waits on the broker and the projector rather than on a core, so two
# files at a time (each worker with its own Postgres and broker) take about 11 minutes on 2 cores, where
# one at a time took 19.
test: $(STAMP) $(AGENT_SERVER_STAMP)
	$(BIN)/ruff check libs services tests bench
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

# tests/unit alone: pure code, no broker, Postgres or dev stack (tests/conftest.py refuses a unit test
# that asks for one); about 20 seconds.
test-unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

# Regenerate the settings table of docs/settings.md from graphledger.Settings (a test fails when it is stale).
settings-doc: $(STAMP)
	$(BIN)/python -m graphledger_server.commands.settings_doc --write docs/settings.md

# BENCH_ARGS picks sections and sizes: `make bench BENCH_ARGS="--only conversations"` runs the
# conversation rows alone (about 7 minutes on 2 cores, a fresh stack per row); `$(BIN)/python -m bench --help` lists the rest.
bench: $(STAMP)
	$(BIN)/python -m bench $(BENCH_ARGS)

# Ten minutes of mixed traffic with a projector SIGKILL every minute; checks nothing was lost. Then the
# long runs of the checks `make test` runs short: the model-based test at 10,000 operations against the
# reference (about 15 minutes), a 2,000-turn conversation held by one process, ten minutes of writes
# through an outage of the read API and Postgres, the README's two longest bench commands, and five
# minutes of turns hopping between agent processes with the projector stopped, under chat load, and 50
# rounds of two agent processes starting a turn on one thread at once (one counts, the other is refused).
MODEL_OPS ?= 10000
soak: $(STAMP)
	$(BIN)/python -m bench.soak
	GRAPHLEDGER_MODEL_OPS=$(MODEL_OPS) $(BIN)/python -m pytest -q -s -p no:cacheprovider tests/acceptance/test_model_based.py
	GRAPHLEDGER_LONG_CONVERSATION_TURNS=2000 $(BIN)/python -m pytest -q tests/acceptance/test_thread_state.py -k long_conversation
	GRAPHLEDGER_OUTAGE_S=600 GRAPHLEDGER_OUTAGE_PACE_S=1 GRAPHLEDGER_CLIENT_FRESH_KEYS=2048 $(BIN)/python -m pytest -q --timeout 1200 tests/acceptance/test_outage_writes.py
	GRAPHLEDGER_README_BENCHES=all $(BIN)/python -m pytest -q tests/acceptance/test_readme_commands.py -k bench
	GRAPHLEDGER_READ_THROUGH_STOPPED_S=300 $(BIN)/python -m pytest -q -s --timeout 1200 tests/acceptance/test_read_through_hops.py
	GRAPHLEDGER_CONCURRENT_STARTS=50 $(BIN)/python -m pytest -q tests/acceptance/test_one_writer.py

# LangGraph's own test suite, at the installed version, on KafkaSaver (rule refusing, rule recording) beside
# InMemorySaver: its 913 checkpointer tests, about 8 minutes (a virtualenv of its own, .venv-langgraph-suite,
# for the suite's test dependencies; SUITE_ARGS="--modes kafka -- -k time_travel" narrows it).
langgraph-suite: $(STAMP)
	$(BIN)/python tests/langgraph_repository/run.py $(SUITE_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check libs services tests bench
	$(BIN)/ruff format --check libs services tests bench
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(AGENT_SERVER_VENV) .venv-langgraph-suite .langgraph-suite .pytest_cache

"""The embedded stack behind `graphledger dev` and the test fixtures: Postgres, a Kafka-compatible
broker and graphledger's own services, all from PyPI, on free loopback ports."""

KEEP_LOGS_ENV = "GRAPHLEDGER_DEV_KEEP_LOGS_IN"
"""A directory `DevStack.stop()` copies the services' logs into before it deletes its own."""

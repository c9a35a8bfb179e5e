"""The embedded stack behind `graphledger dev` and the test fixtures: Postgres, a Kafka-compatible
broker and graphledger's own services, all from PyPI, on free loopback ports."""

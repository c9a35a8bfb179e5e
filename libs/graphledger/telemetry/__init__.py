"""OpenTelemetry of the client library: the spans it emits and how trace context travels.

- `names`: tracer, meter and attribute names, shared with the services' telemetry;
- `propagation`: trace context across the client's threads and in Kafka headers;
- `client`: the producer and HTTP client spans of `KafkaSaver` and `KafkaStore`.

The client never configures an SDK: the application's providers (or none) receive its spans. The
services' SDK setup, metrics and spans are in `graphledger_server.telemetry`. Nothing here records
checkpoint or store content: spans and attributes carry positions, counts, names and types only.
"""

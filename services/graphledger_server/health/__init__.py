"""Liveness and readiness of the projector and the sweeper: their state (`state.py`) and the small HTTP
endpoint that reports it to Kubernetes probes (`server.py`)."""

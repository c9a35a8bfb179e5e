"""The read API's FastAPI handlers: `checkpoints` (get, list, delta-history), `key_filter`, `store` (batch),
`keys` (keys and erasure) and `health`. Each parses its request, calls the reads (`api/reads/`) and encodes
the answer as the request accepts it (`api/codec.py`)."""

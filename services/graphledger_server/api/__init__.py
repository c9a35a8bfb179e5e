"""The HTTP read API (docs/architecture.md, "Read API (/v1)" and "Consistency").

A request goes down through three rooms:
- `routes/`: the FastAPI handlers, one module per family of paths; each parses its body and headers, calls
  its reads and encodes the answer;
- `reads/`: what each read does: the checkpoint reads on the official saver and the fold onto them
  (`checkpoints.py`, its statements in `checkpoint_sql.py`), the store's (`store_batch.py` on
  `store_reader.py` and `store_sql.py`);
- `consistency/`: what a read must reflect and how it gets there: the log's end against the projection's
  applied offsets (`read_barrier.py`), the unprojected records the read API holds and folds
  (`unprojected.py`, `read_through.py`), the waits for the projector and their slots.
Beside them, the HTTP service itself: the app and its process (`app.py`, `main.py`, `state.py`), who may
call what (`auth.py`, `credentials.py`, `tenant.py`, `key_quota.py`), bodies and errors (`models.py`,
`store_models.py`, `codec.py`, `errors.py`, `handlers.py`), the bound on a request (`deadline.py`) and the
Postgres pools (`db.py`).
"""

"""What a read must reflect, and how it gets there (invariant 5): the log's end learned after the read
arrived against the projection's applied offsets (`read_barrier`), the consistency token (`tokens`), the
waits for the projector (`applied_wait`) in fair slots (`wait_slots`), and the unprojected records the read
API holds (`unprojected`) and opens for a read to fold (`read_through`)."""

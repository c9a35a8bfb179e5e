"""What each read of the projection does: the checkpoint reads on the official saver, with the fold of a
thread's unprojected records onto them (`checkpoints`, `checkpoint_sql`, `saver`), and the store's
(`store_batch`, `store_through`, `store_reader`, `store_sql`, `scope_verdicts`)."""

"""`graphledger replay`: rebuild every projection from the log into a fresh schema, verify it against
the live schema at the same offsets, and switch to it atomically (docs/replay.md)."""

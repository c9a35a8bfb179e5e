"""`graphledger encrypt-log`: copy a log written in the clear into new topics, every event sealed."""

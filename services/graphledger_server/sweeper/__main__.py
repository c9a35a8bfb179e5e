"""`python -m graphledger_server.sweeper`, the same as `graphledger sweeper`."""

from graphledger_server.cli import main

raise SystemExit(main(["sweeper"]))

"""`python -m graphledger_server`: the `graphledger` command (the dev stack starts its children so)."""

from graphledger_server.cli import main

raise SystemExit(main())

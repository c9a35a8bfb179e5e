"""`python -m graphledger_server.api`: the read API, configured from `GRAPHLEDGER_*` variables."""

from graphledger_server.api.main import main

main()

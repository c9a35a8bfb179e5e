"""`python -m graphledger_server.projector`: the projector, configured from `GRAPHLEDGER_*` variables."""

from graphledger_server.projector.main import main

main()

"""`python -m graphledger_server.sweeper`: the sweeper, configured from `GRAPHLEDGER_*` variables."""

from graphledger_server.sweeper.main import main

main()

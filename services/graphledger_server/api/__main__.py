"""`python -m graphledger_server.api`: the read API, configured from `GRAPHLEDGER_*` variables."""

import logging

from graphledger.settings import Settings
from graphledger_server.api.main import main

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
main(Settings())

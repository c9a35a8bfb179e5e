"""`python -m graphledger_server.projector`: the projector with settings from `GRAPHLEDGER_*`.

`graphledger projector` (the CLI) is the documented way; this module needs nothing but the package.
"""

from __future__ import annotations

import logging

from graphledger.settings import Settings
from graphledger_server.projector.main import main

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    main(Settings())

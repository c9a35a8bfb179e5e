"""`graphledger import`: move an existing langgraph-checkpoint-postgres database into the log.

`plan` turns source rows into events, `source` reads them, `progress` records how far an import got,
`run` drives it; the command line is `graphledger_server.commands.importer`.
"""

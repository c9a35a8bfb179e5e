"""Copying a log into new topics: `graphledger encrypt-log` (every event in the clear sealed) and
`graphledger repartition` (every event as it is, into another partition count).

`run` drives the copy and states its rules; `source` reads each source partition into whole events and
merges them, `target` reads what earlier runs wrote, `copier` seals (or routes) and writes, `report`
counts. The command lines are `graphledger_server.commands.encrypt_log` and `.repartition`.
"""

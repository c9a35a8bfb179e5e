"""`graphledger encrypt-log`: copy a log written in the clear into new topics, every event sealed.

`run` drives the copy and states its rules; `source` reads each source partition into whole events and
merges them, `target` reads what earlier runs wrote, `copier` seals and writes, `report` counts. The
command line is `graphledger_server.commands.encrypt_log`.
"""

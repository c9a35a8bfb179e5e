"""`graphledger dlq`: dead letters inspected, and re-published after a fix.

`show` presents them (from `graphledger_dead_letters`, whose statements are in
`projection/dead_letters.py`), `editable` is the JSON form of their payloads an operator edits,
`republish` sends one back to its source partition, `decided` reads what the projector decided at its new
position. The command line is `graphledger_server.commands.dlq`.
"""

"""`graphledger dlq`: dead letters inspected, and re-published after a fix."""

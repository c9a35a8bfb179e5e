"""Operator commands of `graphledger`: each module registers its subcommand on the parser and runs it.

Service dependencies are imported inside the command that needs them, so `graphledger --help` works
from the client install.
"""

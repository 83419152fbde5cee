"""Authentication and authorization: who is calling (gate.py, accounts.py; the
signature itself is broker/format/signature.py, shared with the clients that sign) and what each operation
may touch (operations.py, one table for every protocol front; requirements.py maps each front's methods to it)."""

"""Authentication and authorization: who is calling (gate.py, signature.py, accounts.py) and what each operation
may touch (operations.py, one table for every protocol front; requirements.py maps each front's methods to it)."""

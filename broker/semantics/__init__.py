"""Broker semantics on top of the message store: delay levels, retry and dead letters, transactions, queue locks.

Each service operates on a started ``MessageStore`` through its public API and keeps its own state in the store's
``config/`` directory; every service is thread-safe. The gRPC server wires them in (see each module's docstring).
"""

"""Sluice broker: the message store, the gRPC server, the Python client and the `sluice` command line."""

"""Sluice broker: the message store, the gRPC server, the Python client and the `sluice` command line."""

from broker.grpc_stack import choose_tcp_stack

choose_tcp_stack()  # before any module of the package imports grpc (grpc_stack.py says why)

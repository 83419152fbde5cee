"""Sluice's benchmarks, ``python -m bench.NAME``; each module's docstring says what it measures and how."""

# First, before any benchmark imports grpc: the floors and the peers' gRPC measurements run on the gRPC TCP stack
# Sluice's own processes choose (broker/grpc_stack.py), so that they compare like with like.
import broker  # noqa: F401

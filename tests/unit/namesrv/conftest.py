"""Name servers with brokers registering to them, as real processes (tests/support/cluster.py)."""

from tests.support.cluster import cluster

__all__ = ["cluster"]

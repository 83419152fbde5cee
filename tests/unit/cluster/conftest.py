"""Clusters of real processes: a name server and brokers on port 0 of 127.0.0.1, each in its own store directory
(see tests/support/cluster.py for the timings)."""

from tests.support.cluster import cluster

__all__ = ["cluster"]

"""Which of gRPC core's two TCP stacks a process that imports Sluice uses for the connections its gRPC servers
accept: the one built on gRPC core's own pollers (``iomgr``) rather than its newer EventEngine, chosen before
``grpc`` is first imported. Client channels stay on the EventEngine.

Why the listener: in current grpcio releases, server listeners run on the EventEngine, which reads and writes
sockets on a pool of its own threads and hands each completion to the thread that polls the completion queue; the
older stack does the socket work on the polling thread itself. For a Python process, whose Python threads take
turns on one GIL, every extra hand-off between threads is a wake-up on the path of each call: a bare call is
faster both back to back and paced on iomgr (docs/decisions.md, "Servers on gRPC core's iomgr stack").

Why not the client channels too, though they gain as much: an iomgr channel reads its socket only while a call
waits on it, so a broker that died between two sends is noticed only when the next send writes to the dead
connection. That send fails as "the request may have reached the broker", which a producer must not move to
another broker (it could be stored twice); it retries the dead broker until its timeout instead of failing over
at once. On the EventEngine the closed connection is seen when it closes and the next send fails as "never
connected", which moves (docs/decisions.md, "Client channels on gRPC core's iomgr stack").

The choice goes through gRPC core's documented ``GRPC_EXPERIMENTS`` variable, which core reads once, when ``grpc``
is first imported; so it is made when ``broker`` is imported (``broker/__init__.py``), and only when it still can
be and nobody chose: a process that set ``GRPC_EXPERIMENTS`` itself (to anything, even empty) keeps its own
choice, and one that imported ``grpc`` before Sluice keeps the stack it already runs. The variable is inherited by
child processes, which is what a broker process started from a test or a benchmark should run on too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping

EXPERIMENTS_VAR = "GRPC_EXPERIMENTS"
IOMGR_LISTENER = "-event_engine_listener"  # server listeners off the EventEngine; client channels stay on it


def choose_tcp_stack(
    environ: MutableMapping[str, str] = os.environ, modules: Mapping[str, object] = sys.modules
) -> bool:
    """Ask gRPC core for the iomgr TCP stack (for server listeners) when it is still possible and nobody chose;
    True if this call did. ``environ`` and ``modules`` are the process's own; tests pass others."""
    if "grpc" in modules or EXPERIMENTS_VAR in environ:
        return False
    environ[EXPERIMENTS_VAR] = IOMGR_LISTENER
    return True

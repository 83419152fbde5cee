"""Which of gRPC core's two TCP stacks a process that imports Sluice uses: the one built on gRPC core's own pollers
(``iomgr``) rather than its newer EventEngine, chosen before ``grpc`` is first imported.

Why: in current grpcio releases, client channels and server listeners run on the EventEngine, which reads and writes
sockets on a pool of its own threads and hands each completion to the thread that polls the completion queue; the
older stack does the socket work on the polling thread itself. For a Python process, whose Python threads take
turns on one GIL, every extra hand-off between threads is a wake-up on the path of each call. Measured with
grpcio 1.85.3 on the 2-CPU development machine (2026-11-27; a unary call of 100 B to a service in another process
that answers at once, both sides on the same stack, three alternating runs of each):

    ==========================================  ===================  ===================
    a bare call                                 EventEngine          iomgr (chosen)
    ==========================================  ===================  ===================
    back to back, p50                           0.47-0.49 ms         0.30 ms
    one every 2 ms, p50                         0.48-0.55 ms         0.38-0.42 ms
    one every 2 ms, p99                         0.71-1.02 ms         0.57-0.90 ms
    ==========================================  ===================  ===================

and through Sluice (``python -m bench.peers --systems sluice --scale 0.3``, two alternating runs of each): SendBatch
1 KiB 116-135k -> 136-145k msgs/s, decoded pull 1 KiB 273-317k -> 375-392k msgs/s, end-to-end latency at 1,000
msgs/s p50 0.86-0.92 -> 0.80-0.81 ms.

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
IOMGR_TCP = "-event_engine_client,-event_engine_listener"  # client channels and server listeners off EventEngine


def choose_tcp_stack(
    environ: MutableMapping[str, str] = os.environ, modules: Mapping[str, object] = sys.modules
) -> bool:
    """Ask gRPC core for the iomgr TCP stack when it is still possible and nobody chose; True if this call did.
    ``environ`` and ``modules`` are the process's own; tests pass others."""
    if "grpc" in modules or EXPERIMENTS_VAR in environ:
        return False
    environ[EXPERIMENTS_VAR] = IOMGR_TCP
    return True

"""The soak: every feature through every fault at once, checked at the end (``python -m tests.soak``, ``make soak``).

It lives under ``tests/`` rather than ``bench/`` because it is a correctness run, not a measurement: it reuses the
fault pieces of the replication tests (``broker.ha.local_group.ReplicaGroup``, ``tests/unit/ha/jepsen.py``'s
ordered workload and checker, ``tests/unit/store/small_fs.py``'s tmpfs and filler); ``make test`` runs a short one
(``tests/unit/test_soak.py``: every kind of fault once).

What runs (``topology.py``): an etcd, a name server, a replicated group ``broker-a`` of three replicas in controller
mode, and two more brokers (``broker-b``, and ``broker-c`` whose store is on a small tmpfs when run as root). Run as
root, the soak runs inside network namespaces of its own (``network.py``): each replica of broker-a in one of its
own, everything else (this process too) in an outside one, joined by a bridge.
Producers (``workload.py``) of every Sluice gRPC send: plain (spread over the three broker groups), ordered (jepsen's
writers, one sharding key each), batch, transactional (commit, rollback, and left to the check-back), delayed
(delay levels) and timer (an absolute delivery time). Consumers: pull (committing offsets), push clustering, push
broadcasting, orderly push, pop (acknowledging), a pop consumer in a child process that is SIGKILLed with
messages in flight, and a Spark job (``spark_job.py``: topic_mirror through the exactly-once sink, its driver a child
process that a fault SIGKILLs). Faults (``faults.py``) are drawn from the seed: master SIGKILL, master
SIGSTOP/SIGCONT for longer than its lease, a restart of broker-b, a full disk on broker-c, the kill of the child
consumer and of the Spark driver, and a partition cutting one replica of broker-a (usually the master) off for
longer than its lease.

At the end everything is healed, consumers drain, and ``checker.py`` reads every topic on every broker and reports
per feature what the promises forbid. The seed, the schedule and the report go to one JSON file; the same seed
draws the same schedule (the timing of a run under load is not reproducible, the choice of faults is).
"""

import sys
from pathlib import Path

# jepsen.py and small_fs.py are modules of their test directories (imported there by a sys.path entry, as the
# replication suite's conftest does): the soak finds them the same way.
for _suite in ("ha", "store"):
    _dir = str(Path(__file__).resolve().parents[1] / "unit" / _suite)
    if _dir not in sys.path:
        sys.path.append(_dir)

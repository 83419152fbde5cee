"""CPU placement for the standalone broker: every Python thread on one CPU under SCHED_BATCH, every native thread
free.

Why: the broker's Python threads (gRPC workers, dispatcher, flush and group commit, schedule and transaction
services) share one GIL, so together they never use more than one CPU's worth of Python. Where they may run on
any CPU, each GIL hand-off moves the interpreter's working set between CPUs and wakes a CPU that may be idle (an
expensive wake-up on a virtual machine): on one CPU the broker spends less CPU per message and answers sooner
(docs/decisions.md, "Python threads on one CPU").

The native threads (gRPC's HTTP/2 and socket work, which runs without the GIL) keep every CPU, so the broker
still uses the other CPUs for what can run in parallel. A native thread inherits the affinity of the thread that
creates it, so placement is re-applied periodically (``reconcile``): new Python threads are pinned, new native
threads are freed.

The pinned Python threads also run under the SCHED_BATCH policy, which keeps a woken thread from preempting the
running one. Preempting would not let it run anyway: it needs the GIL, which the running thread holds, so it
would switch in, find the GIL taken, sleep on it and switch out again, two context switches for nothing. Under
SCHED_BATCH it runs once the holder blocks, when the GIL is free. Native threads keep the normal policy.

Some Python threads run apart, on the other CPUs under the normal policy. The SYNC_FLUSH flusher
(``broker/store/flush.py``, GroupCommitService): its work is one fdatasync after another, whose kernel CPU would
take the writers' CPU, and the disk's answer must wake it promptly, not wait behind writers that may not be
preempted; it takes the GIL twice per sync, not per message, so its hand-offs cost little. A slave's fetcher
(``broker/ha/slave_fetcher.py``) and the master's replication endpoint threads: most of their work runs without the GIL
(gRPC's C core receiving a 4 MiB chunk, the CRC kernel, the ``pwrite``), yet pinned the fetcher took turns with
the slave's dispatcher on one CPU, and a SYNC_MASTER waits for it. docs/decisions.md has the measurements of each.

``python_cpus`` (broker config / ``--python-cpus``): ``auto`` pins the Python threads to the lowest CPU this
process may use when it may use two or more; ``off`` leaves every thread where the kernel puts it; a
comma-separated list such as ``2`` or ``2,3`` names the CPUs. Only ``sluice broker`` applies it: an embedded
broker (tests, the demo, a Spark driver) leaves its host process's threads alone.
"""

from __future__ import annotations

import logging
import os
import threading

from broker.errors import InvalidArgumentError
from broker.ha.manager import HA_SERVER_THREAD_PREFIX
from broker.ha.slave_fetcher import SLAVE_FETCHER_THREAD_NAME
from broker.store.flush import GroupCommitService

log = logging.getLogger(__name__)

TASK_DIR = "/proc/self/task"  # one entry per thread of this process, named by its native thread id
RECONCILE_INTERVAL_S = 1.0  # how long a new thread may run unplaced; each pass costs one syscall per thread
PYTHON_POLICY = os.SCHED_BATCH  # no wake-up preemption among GIL sharers (module docstring)
NATIVE_POLICY = os.SCHED_OTHER  # a native thread created by a Python one inherits SCHED_BATCH: undone
# Python threads that run apart from the others, on the CPUs not given to Python (module docstring): the SYNC_FLUSH
# flusher, whose work is one fdatasync after another, a slave's fetcher, whose work is mostly outside the GIL, and
# the threads of the master's replication endpoint (by name prefix: a thread pool numbers them).
APART_THREADS = frozenset({GroupCommitService.name, SLAVE_FETCHER_THREAD_NAME})
APART_PREFIXES = (f"{HA_SERVER_THREAD_PREFIX}_",)


def parse_python_cpus(spec: str, allowed: frozenset[int]) -> frozenset[int] | None:
    """The CPUs for Python threads named by ``spec`` (see the module docstring); None: leave threads alone."""
    spec = spec.strip().lower()
    if spec == "off":
        return None
    if spec == "auto":
        return frozenset({min(allowed)}) if len(allowed) >= 2 else None
    try:
        cpus = frozenset(int(part) for part in spec.split(","))
    except ValueError:
        raise InvalidArgumentError(
            f"python_cpus {spec!r} is not 'auto', 'off' or a comma-separated list of CPU numbers such as '0' or '2,3'"
        ) from None
    if not cpus <= allowed:
        raise InvalidArgumentError(
            f"python_cpus {spec!r} names CPUs {sorted(cpus - allowed)} this process may not use "
            f"(allowed: {sorted(allowed)}); pick from those or use 'auto'"
        )
    return cpus


class ThreadPlacement:
    """Pins Python threads to ``python_cpus`` under PYTHON_POLICY, puts the Python threads named in
    ``apart_names`` (or with a name starting with one of ``apart_prefixes``) on the other CPUs (all of them when
    there are none) under NATIVE_POLICY, and lets every other thread of the process use ``all_cpus`` under
    NATIVE_POLICY."""

    def __init__(
        self, python_cpus: frozenset[int], all_cpus: frozenset[int], apart_names: frozenset[str] = APART_THREADS,
        apart_prefixes: tuple[str, ...] = APART_PREFIXES,
    ) -> None:
        assert python_cpus and python_cpus <= all_cpus, (python_cpus, all_cpus)
        self.apart_names = apart_names
        self.apart_prefixes = apart_prefixes
        self._where = {  # thread kind -> (CPUs, scheduling policy)
            "python": (python_cpus, PYTHON_POLICY),
            "apart": ((all_cpus - python_cpus) or all_cpus, NATIVE_POLICY),
            "native": (all_cpus, NATIVE_POLICY),
        }
        self._placed: dict[int, str] = {}  # native thread id -> its kind as last placed: python / apart / native
        self.failed = ""

    def _kinds(self) -> dict[int, str]:
        return {
            t.native_id: "apart" if t.name in self.apart_names or t.name.startswith(self.apart_prefixes) else "python"
            for t in threading.enumerate()
            if t.native_id is not None
        }

    def reconcile(self) -> int:
        """Place every thread not yet placed (and re-place one whose kind changed); return how many moved."""
        if self.failed:
            return 0
        kinds = self._kinds()
        try:
            present = {int(name) for name in os.listdir(TASK_DIR)}
        except OSError as e:
            return self._give_up(f"cannot list {TASK_DIR}: {e}")
        self._placed = {tid: kind for tid, kind in self._placed.items() if tid in present}
        moved = 0
        for tid in present:
            kind = kinds.get(tid, "native")
            if self._placed.get(tid) == kind:
                continue
            cpus, policy = self._where[kind]
            try:
                os.sched_setaffinity(tid, cpus)
                os.sched_setscheduler(tid, policy, os.sched_param(0))
            except ProcessLookupError:
                continue  # the thread ended since the listing
            except OSError as e:
                return self._give_up(f"placing thread {tid} (sched_setaffinity / sched_setscheduler) failed: {e}")
            self._placed[tid] = kind
            moved += 1
        return moved

    def _give_up(self, why: str) -> int:
        self.failed = why
        log.warning("%s; threads stay where the kernel puts them", why)
        return 0


def start_placement(spec: str, stop: threading.Event) -> ThreadPlacement | None:
    """Place the threads now and every RECONCILE_INTERVAL_S until ``stop`` is set, from a daemon thread."""
    allowed = frozenset(os.sched_getaffinity(0))
    cpus = parse_python_cpus(spec, allowed)
    if cpus is None:
        return None
    placement = ThreadPlacement(cpus, allowed)

    def run() -> None:
        while not placement.failed:
            placement.reconcile()
            if stop.wait(RECONCILE_INTERVAL_S):
                return

    threading.Thread(target=run, name="thread-placement", daemon=True).start()
    log.info("Python threads on CPUs %s under SCHED_BATCH, native threads on %s", sorted(cpus), sorted(allowed))
    return placement

"""OS names for the standalone broker's Python threads, so that ``top -H``, ``ps -L``, ``perf`` and
``/proc/PID/task/*/comm`` tell the dispatcher from a gRPC worker or the flusher, instead of showing ``python`` for
every one of them.

Python (3.11) gives its threads no OS name; Linux lets a process name its own threads by writing
``/proc/self/task/TID/comm``, at most COMM_BYTES bytes (longer names are cut, as the kernel cuts them). New threads
appear while the broker runs (gRPC's pool starts workers on demand), so ``sluice broker`` names them again each time
it looks for a stop signal; a thread already named costs nothing. Only ``sluice broker`` does this: an embedded
broker (tests, the demo, a Spark driver) leaves its host process's threads alone, as thread placement does.

Operators read CPU a thread from these names (``bench.hops`` sums CPU a paced message by them): gRPC's server loop
thread, which polls for every call's events, is ``grpc-poller`` (grpcio names it ``Thread-N (_serve)``). The main
thread keeps its name: it is the process's name in ``top`` and ``ps -e`` (``python``), which operators and their
scripts look for.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)

COMM_BYTES = 15  # the kernel's TASK_COMM_LEN (16) less the closing NUL
TASK_DIR = "/proc/self/task"
GRPC_POLLER = "grpc-poller"
GRPC_SERVE_SUFFIX = "(_serve)"  # grpcio's server thread: threading.Thread(target=_serve) gets "Thread-N (_serve)"


def os_name(python_name: str) -> str:
    """The OS name a Python thread called ``python_name`` gets."""
    if python_name.endswith(GRPC_SERVE_SUFFIX):
        return GRPC_POLLER
    return python_name.encode("utf-8")[:COMM_BYTES].decode("utf-8", "ignore")


class ThreadNames:
    def __init__(self) -> None:
        self._named: set[int] = set()  # native ids named already; a finished thread's id is dropped (ids are reused)
        self.failed = ""

    def apply(self) -> int:
        """Name every Python thread not named yet; how many were named. A failure other than a thread that ended
        meanwhile is logged once, and naming stops: names help operators, the broker runs without them."""
        if self.failed:
            return 0
        main = threading.main_thread()
        threads = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None and t is not main}
        self._named &= threads.keys()
        named = 0
        for tid, name in threads.items():
            if tid in self._named:
                continue
            try:
                with open(f"{TASK_DIR}/{tid}/comm", "w", encoding="utf-8") as comm:
                    comm.write(os_name(name))
            except FileNotFoundError:
                continue  # the thread ended since the listing
            except OSError as e:
                self.failed = f"naming thread {tid} ({name}) failed: {e}"
                log.warning("%s; threads keep the name 'python'", self.failed)
                return named
            self._named.add(tid)
            named += 1
        return named

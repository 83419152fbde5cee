"""glibc malloc settings for a process that moves megabyte messages: keep large freed blocks for reuse.

Why: each SendBatch of about 1 MiB allocates several buffers of about its size, on both ends (the client's request
bytes and gRPC's copy of them; the broker's receive slices, the request bytes, the protobuf copy). By default glibc
serves blocks that large with fresh ``mmap`` calls and hands freed heap tops back to the kernel, so every call
touches brand-new pages, and on a virtual machine each first touch of a page is a fault the host handles too.
With these settings the pages are reused: fewer page faults and less kernel time per message, in the broker and
in a producer's process alike (docs/decisions.md, "glibc malloc thresholds").

The cost: up to TRIM_THRESHOLD_BYTES of freed memory stays mapped in the process. ``sluice broker`` applies them
to its own process. A client leaves its host process's allocator alone unless the application asks: a producer
process that sends large batches calls ``broker.client.tune_malloc()`` once (an embedded broker, a Spark driver or
executor, a test process keep glibc's defaults).
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

# mallopt parameter numbers, from glibc's <malloc.h>
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

# Blocks below this come from the heap, not from mmap: 32 MiB is glibc's own ceiling for its dynamic threshold
# and above the largest gRPC message a broker accepts by default.
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
# Free memory at the top of a heap is returned to the kernel only beyond this.
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024
# Each time a heap grows, it grows by this much more than asked, so growth is rare.
TOP_PAD_BYTES = 16 * 1024 * 1024

SETTINGS = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES), (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
            (M_TOP_PAD, TOP_PAD_BYTES))


def tune_malloc() -> bool:
    """Apply SETTINGS through glibc's ``mallopt``; False (and nothing changed) on a C library without it."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        log.info("no mallopt in this C library; malloc left at its defaults")
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    refused = [param for param, value in SETTINGS if mallopt(param, value) != 1]
    if refused:
        log.warning("mallopt refused parameters %s; large SendBatch calls will cost more kernel time", refused)
    return not refused

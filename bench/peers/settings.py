"""The benchmark's sizes, counts, rates and time limits, shared by every system, the floors and the report.

Apart so that each system's module and ``bench.timeline`` read one set of figures."""

from __future__ import annotations

from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent.parent / "results"
SIZES_B = (100, 1024)
COUNT_BY_SIZE = {100: 200_000, 1024: 100_000}  # at scale 1.0
WARMUP_FRACTION = 10  # each measured run follows an uncounted one of a tenth of its size (caches, first routes)
BATCH_MSGS = 1000  # pipeline depth / batch / fetch size, the same for every system
HOPS_CALLS = 2000  # samples per hop of bench.hops
LATENCY_RATES_PER_S = (5000, 250)  # a broker's load, and a rate every system's single sends sustain here
LATENCY_DURATION_S = 3.0
LATENCY_SIZE_B = 100
LATENCY_WARMUP_MSGS = 500  # dropped from the percentiles: connection set-up, first topic route
LATENCY_MIN_SAMPLES = 2000  # at low rates the run lasts longer, so that p99 rests on enough samples
LATENCY_MAX_WALL_S = 12.0  # a sender that can't keep the rate stops after this long (reported as achieved rate)
MAX_ROUNDS = 10  # each round stores every message count again: disk and time grow with it
IDLE_AFTER_DONE_S = 1.0
RECEIVE_TIMEOUT_S = 60.0  # a consumer that sees nothing new for this long fails the run
SERVER_START_TIMEOUT_S = 30.0
DISK_PROBE_BYTES = 512 * 1024 * 1024
DISK_BLOCK_BYTES = 1024 * 1024
DISK_SYNC_EVERY_BYTES = 16 * 1024 * 1024
GRPC_PROBE_MSG_BYTES = 1024 * 1024
GRPC_PROBE_CALLS = 512
MB = 1_000_000

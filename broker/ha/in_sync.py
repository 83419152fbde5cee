"""The master's view of its replicas: who is in sync, how far each holds the log, and the confirmed offset.

* Every connected slave reports the offset below which it holds the log (``written``). A replica is *caught up*
  to a moment when it holds everything the master had written then (Kafka's lastCaughtUpTime, measured against
  the log end at the replica's previous report). Kafka's one look back is not enough when more than a fetch is in
  flight: 16 writers of 1 MiB batches waiting on a SYNC_MASTER keep about 16 MiB unconfirmed while a fetch
  brings 4 MiB, so each report reached the log end of four reports before, never of the last one, and the
  replica, keeping pace, left the set after ``max_lag_ms`` and writes were refused. So the set also remembers the
  log end at reports, at most every END_SAMPLE_MS, over ``max_lag_ms``, and a report counts as caught up to the
  newest remembered moment it covers.
* The **in-sync set** holds the master and the replicas caught up within ``max_lag_ms``. A replica that falls
  further behind (or is gone) leaves it; a connected one that holds at least the confirmed offset and is caught up
  joins it again.
* The **confirmed offset** (Kafka's high watermark) is the lowest ``written`` over the in-sync set, the master's
  log end included. It never goes back. Consumers read below it only (read_limit.py).
* A write that waits for replicas (SYNC_MASTER, controller mode) is acknowledged once the confirmed offset passes
  its end: every member of the in-sync set holds it. Writes are refused before anything is stored while the set is
  smaller than ``min_insync_replicas`` (``admit_write``).

Why every member, not ``min_insync_replicas`` of them: the controller elects a new master from the in-sync set,
any member of it. Were a write acknowledged by two of three members, the third could be elected without it (Kafka
acks=all; RocketMQ 5's allAckInSyncStateSet). ``min_insync_replicas`` is the floor under which writes stop rather
than be acknowledged by too few (Jepsen's 2013 Kafka finding: acks=all with the set shrunk to the leader alone).

Order of changes, so that the in-sync set recorded for elections (etcd, in controller mode) is never larger than
what acknowledgements waited for: a replica leaves the recorded set first (``shrink`` must succeed) and the local
one after; it joins the local set first (acknowledgements wait for it from then on) and the recorded one after.
Config changes (offset commits, metadata_sync.py) waited only for the members of their time too: a replica that
joins is recorded once it has applied the master's metadata version of the moment it joined (``metadata_version``),
so that it holds every commit acknowledged before it joined, as every one after waits for it.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.errors import NotEnoughReplicasError

log = logging.getLogger(__name__)

# Fired with the new in-sync set (ids); True when it is recorded. Shrinks must be recorded before they count.
RecordSet = Callable[[frozenset[int]], bool]


# The log end at a report is remembered at most every END_SAMPLE_MS, and at most MAX_END_SAMPLES of them (a long
# max_lag_ms spaces them further): a replica's caught-up time is at most one spacing older than it could be.
END_SAMPLE_MS = 10
MAX_END_SAMPLES = 10_000


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclass
class Replica:
    broker_id: int
    store_id: str
    address: str
    written: int = -1  # -1: nothing reported yet
    flushed: int = -1
    metadata_version: int = 0
    caught_up_ms: int = 0
    connected: bool = False
    session: int = 0  # which connection reports for it (a replica reconnecting replaces its older stream)
    _end_at_report: int = 0  # the master's log end at this replica's previous report
    _report_ms: int = 0
    extra: dict[str, object] = field(default_factory=dict)


class InSyncSet:
    def __init__(
        self, master_id: int, log_end: Callable[[], int], *, min_insync: int, max_lag_ms: int,
        members: frozenset[int] = frozenset(), confirmed: int = 0, record_shrink: RecordSet | None = None,
        record_expand: RecordSet | None = None, clock_ms: Callable[[], int] = monotonic_ms,
        on_confirmed: Callable[[], None] | None = None, metadata_version: Callable[[], int] = lambda: 0,
    ) -> None:
        self.master_id = master_id
        self.log_end = log_end
        self.min_insync = min_insync
        self.max_lag_ms = max_lag_ms
        self.clock_ms = clock_ms
        self.record_shrink = record_shrink or (lambda s: True)
        self.record_expand = record_expand or (lambda s: True)
        self.on_confirmed = on_confirmed or (lambda: None)  # told (outside the lock) when the offset moved
        self.metadata_version = metadata_version  # the master's current config version (metadata_sync.py)
        # joined locally, not recorded yet: broker id -> the metadata version it must apply first (module docstring)
        self._unrecorded: dict[int, int] = {}
        self._cond = threading.Condition()
        self._changing = threading.Lock()  # one membership change (and its etcd write) at a time
        self._members: set[int] = {master_id, *members}
        self._replicas: dict[int, Replica] = {}
        now = clock_ms()
        for rid in self._members - {master_id}:  # members recorded before this master took office: given max_lag
            self._replicas[rid] = Replica(rid, "", "", caught_up_ms=now)
        self._confirmed = confirmed
        # (clock ms, master's log end) at reports, oldest first, covering at least max_lag_ms (module docstring)
        self._sample_ms = max(END_SAMPLE_MS, -(-max_lag_ms // MAX_END_SAMPLES))
        self._ends: deque[tuple[int, int]] = deque(maxlen=max_lag_ms // self._sample_ms + 2)
        self._sessions = 0
        self.closed = False
        with self._cond:
            self._recompute()

    # ------------------------------------------------------------------------------------------ reading
    @property
    def members(self) -> frozenset[int]:
        with self._cond:
            return frozenset(self._members)

    @property
    def confirmed(self) -> int:
        return self._confirmed

    def replicas(self) -> list[Replica]:
        with self._cond:
            return [Replica(**{k: getattr(r, k) for k in ("broker_id", "store_id", "address", "written", "flushed",
                                                          "metadata_version", "caught_up_ms", "connected")})
                    for r in self._replicas.values()]

    def in_sync(self, broker_id: int) -> bool:
        with self._cond:
            return broker_id in self._members

    def admit_write(self) -> None:
        """NotEnoughReplicasError unless the in-sync set has at least min_insync members (nothing is written)."""
        with self._cond:
            size = len(self._members)
        if size < self.min_insync:
            raise NotEnoughReplicasError(
                f"only {size} replica(s) in sync (this master included), fewer than min_insync_replicas="
                f"{self.min_insync}: nothing was written; retry once a replica has caught up"
            )

    # ------------------------------------------------------------------------------------------ reports
    def connect(self, broker_id: int, store_id: str, address: str) -> int:
        """A slave's stream was accepted; returns its session (a newer one replaces an older stream's reports)."""
        with self._cond:
            self._sessions += 1
            r = self._replicas.get(broker_id)
            if r is None:
                r = self._replicas[broker_id] = Replica(broker_id, store_id, address, caught_up_ms=0)
            r.store_id, r.address, r.connected, r.session = store_id, address, True, self._sessions
            r.written = -1  # until it reports: a restarted replica may hold less than it did
            r.metadata_version = 0  # the new session counts from 0 (metadata_sync.py)
            return self._sessions

    def disconnect(self, broker_id: int, session: int) -> None:
        with self._cond:
            r = self._replicas.get(broker_id)
            if r is not None and r.session == session:
                r.connected = False

    def report(self, broker_id: int, session: int, written: int, flushed: int, metadata_version: int) -> None:
        now = self.clock_ms()
        end = self.log_end()
        with self._cond:
            r = self._replicas.get(broker_id)
            if r is None or r.session != session:
                return
            if written >= end:
                r.caught_up_ms = now
            else:
                if written >= r._end_at_report and r._report_ms:
                    r.caught_up_ms = max(r.caught_up_ms, r._report_ms)
                r.caught_up_ms = max(r.caught_up_ms, self._caught_up_to(written))
            r._end_at_report, r._report_ms = end, now
            if not self._ends or now - self._ends[-1][0] >= self._sample_ms:
                self._ends.append((now, end))
            r.written, r.flushed = written, flushed
            r.metadata_version = max(r.metadata_version, metadata_version)
            moved = self._recompute()
            if metadata_version:
                self._cond.notify_all()  # wait_metadata
        if moved:
            self.on_confirmed()
        if broker_id not in self._members:
            self.review()

    def _caught_up_to(self, written: int) -> int:
        """The newest remembered moment whose log end ``written`` covers; 0 when none is (caller holds _cond). The
        ends never go back while this set lives (one master's term), so they are searched in order."""
        i = bisect.bisect_right(self._ends, written, key=lambda sample: sample[1])
        return self._ends[i - 1][0] if i else 0

    def log_grew(self) -> None:
        """The master wrote: with no replica in the set, the confirmed offset is its log end."""
        with self._cond:
            moved = self._recompute()
        if moved:
            self.on_confirmed()

    def _recompute(self) -> bool:
        """Confirmed offset = min written over the set (the master: its log end); wakes waiters when it moves."""
        low = self.log_end()
        for rid in self._members:
            if rid == self.master_id:
                continue
            r = self._replicas.get(rid)
            low = min(low, r.written if r is not None and r.written >= 0 else self._confirmed)
        if low > self._confirmed:
            self._confirmed = low
            self._cond.notify_all()
            return True
        return False

    # ------------------------------------------------------------------------------------------ waiting
    def wait_confirmed(self, end_offset: int, timeout_s: float) -> bool:
        """Block until every in-sync replica holds the log up to ``end_offset``; False on timeout or close."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._confirmed < end_offset:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.closed:
                    return False
                self._cond.wait(remaining)
            return True

    def wait_metadata(self, version: int, timeout_s: float) -> bool:
        """Block until every in-sync replica applied metadata ``version``; False on timeout or close."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                lagging = [rid for rid in self._members if rid != self.master_id and self._metadata_of(rid) < version]
                if not lagging:
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.closed:
                    return False
                self._cond.wait(min(remaining, 0.05))

    def _metadata_of(self, broker_id: int) -> int:
        r = self._replicas.get(broker_id)
        return r.metadata_version if r is not None else 0

    def close(self) -> None:
        """Fenced or shutting down: every waiter returns False (its outcome is unknown) and none waits again."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    # ------------------------------------------------------------------------------------------ membership
    def review(self) -> None:
        """Drop replicas not caught up within max_lag_ms; take back connected ones that caught up. Called
        periodically and on reports; changes are recorded (etcd) in the order the module docstring gives."""
        if not self._changing.acquire(blocking=False):
            return  # another thread is changing the set; it reviews with fresher reports anyway
        try:
            now = self.clock_ms()
            with self._cond:
                lagging = {rid for rid in self._members if rid != self.master_id
                           and now - self._replicas[rid].caught_up_ms > self.max_lag_ms}
                joining = {r.broker_id for r in self._replicas.values() if r.broker_id not in self._members
                           and r.connected and r.written >= self._confirmed
                           and now - r.caught_up_ms <= self.max_lag_ms}
                members = frozenset(self._members)
            if lagging:
                smaller = members - lagging
                if not self.record_shrink(smaller - self._unrecorded.keys()):
                    log.warning("could not record the in-sync set %s (leaving %s); waiting for them still",
                                sorted(smaller), sorted(lagging))
                    return
                with self._cond:
                    self._members -= lagging
                    for rid in lagging:
                        self._unrecorded.pop(rid, None)
                    moved = self._recompute()
                    self._cond.notify_all()
                if moved:
                    self.on_confirmed()
                log.warning("replica(s) %s left the in-sync set (not caught up within %d ms); in sync: %s",
                            sorted(lagging), self.max_lag_ms, sorted(self._members))
                members = smaller
            if joining:
                with self._cond:
                    self._members |= joining
                    self._recompute()
                    members = frozenset(self._members)
                version = self.metadata_version()  # read after joining: later versions wait for them
                for rid in joining:
                    self._unrecorded[rid] = version
                log.info("replica(s) %s joined the in-sync set; in sync: %s", sorted(joining), sorted(members))
            if self._unrecorded:
                with self._cond:
                    ready = {rid for rid, version in self._unrecorded.items() if self._metadata_of(rid) >= version}
                if ready:
                    waiting = self._unrecorded.keys() - ready
                    if self.record_expand(members - waiting):
                        for rid in ready:
                            del self._unrecorded[rid]
        finally:
            self._changing.release()

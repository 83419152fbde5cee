"""Reading the half and op queues of transactions: raw halves by queue offset, and runs of them for a commit.

Apart because puts, decisions, check-back and recovery all read the system queues through it."""

from __future__ import annotations

from collections.abc import Iterator

from broker.format.message import I64, POS_PHYSICAL_OFFSET, StoredMessage, decode_entry
from broker.format.system_topics import TRANS_HALF_TOPIC, TRANS_READER_GROUP
from broker.format.transaction_codec import RawHalf
from broker.semantics.half_run import HalfRun
from broker.semantics.transaction_table import (
    DISPATCH_WAIT_S,
    SCAN_BATCH,
    HalvesGoneError,
    TransactionError,
    TransactionTable,
    offset_runs,
)
from broker.store import GetStatus


class HalfScans(TransactionTable):
    """Scans of the system queues, over the transaction table."""

    def _scan_raw(self, topic: str, queue_id: int, start: int, end: int | None = None, *,
                  confirmed_only: bool = True) -> Iterator[RawHalf]:
        """Entries of a queue from ``start`` (corrected up to the minimum) to ``end`` (default: the current max),
        undecoded. ``confirmed_only=False``: past the read limit too (a new master's confirmed offset may lag the
        entries its log already holds)."""
        offset = max(start, self.store.min_offset(topic, queue_id))
        if end is not None:
            stop = end
        else:
            stop = self.store.max_offset(topic, queue_id) if confirmed_only else self.store.queue_end(topic, queue_id)
        while offset < stop:
            res = self.store.get_message(TRANS_READER_GROUP, topic, queue_id, offset, min(SCAN_BATCH, stop - offset),
                                         confirmed_only=confirmed_only)
            if res.status is GetStatus.FOUND:
                buf = res.buffer
                ends = [*res.entry_positions[1:], len(buf)]
                for qoff, a, b in zip(res.queue_offsets, res.entry_positions, ends, strict=True):
                    if qoff >= stop:
                        return
                    entry = buf[a:b]
                    yield RawHalf(qoff, I64.unpack_from(entry, POS_PHYSICAL_OFFSET)[0], entry)
                offset = res.next_begin_offset
            elif res.next_begin_offset > offset:
                offset = res.next_begin_offset  # expired or removed range: skip it
            else:
                return

    def _scan(self, topic: str, queue_id: int, start: int, end: int | None = None, *,
              confirmed_only: bool = True) -> Iterator[StoredMessage]:
        for raw in self._scan_raw(topic, queue_id, start, end, confirmed_only=confirmed_only):
            msg = decode_entry(raw.entry)
            msg.queue_offset = raw.queue_offset
            yield msg

    def _read_half_runs(self, queue_offsets: list[int]) -> list[HalfRun]:
        """The half messages at these half-queue offsets (sorted), as the store's gets return them: one buffer of
        raw entries per get, over contiguous runs of offsets. HalvesGoneError if any is missing."""
        return list(self._iter_half_runs(queue_offsets))

    def _iter_half_runs(self, queue_offsets: list[int]) -> Iterator[HalfRun]:
        """``_read_half_runs`` one get at a time, HalvesGoneError after the last: a caller that is done with each
        run before the next keeps one run in memory, not the transaction (hundreds of MB for a million halves,
        all of it fresh pages to fault in)."""
        if queue_offsets and self.store.queue_end(TRANS_HALF_TOPIC, 0) <= queue_offsets[-1]:
            self._wait_for_dispatch()  # halves just put may not have their consume-queue units yet
        found: list[list[int]] = []
        for first, last in offset_runs(queue_offsets):
            offset = max(first, self.store.min_offset(TRANS_HALF_TOPIC, 0))
            while offset <= last:
                # past the read limit too: a new master commits halves its replicas have not confirmed yet
                res = self.store.get_message(TRANS_READER_GROUP, TRANS_HALF_TOPIC, 0, offset,
                                             min(SCAN_BATCH, last + 1 - offset), confirmed_only=False)
                if res.status is not GetStatus.FOUND:
                    break
                found.append(res.queue_offsets)
                yield HalfRun(res.buffer, res.queue_offsets, res.entry_positions)
                offset = res.next_begin_offset
        if sum(len(f) for f in found) != len(queue_offsets):
            have = {q for f in found for q in f}
            missing = [q for q in queue_offsets if q not in have]
            raise HalvesGoneError(
                f"{len(missing)} half messages are gone from {TRANS_HALF_TOPIC} (expired?), first at queue offset "
                f"{missing[0]}; the transaction cannot be committed"
            )

    def _wait_for_dispatch(self) -> None:
        """Scans read consume queues: let the dispatcher reach the end of the commit log first."""
        if not self.store.wait_dispatched(DISPATCH_WAIT_S):
            raise TransactionError(f"the store's dispatcher did not reach the commit-log end in {DISPATCH_WAIT_S} s")

"""Admission control: how far one trigger may read, from Spark's ReadLimit and the source's options.

PySpark 4.3 passes one ReadLimit per call (no composite limit), so ``getDefaultReadLimit`` reports the main
configured limit and, whenever Spark passes anything but ``ReadAllAvailable``, every configured limit applies:

- ``maxMessagesPerTrigger``: shared over queues in proportion to backlog, at least one message for each queue with
  a backlog (``planning.share_budget``);
- ``maxBytesPerTrigger``: each queue gets a share of the bytes in proportion to its backlog, and the driver measures
  where that share ends by pulling the entries' sizes (the broker has no RPC for consume-queue sizes yet; this
  reads the batch's bytes once more on the driver, bounded by the limit itself);
- ``minMessagesPerTrigger`` + ``maxTriggerDelay``: no batch until enough messages are waiting or the delay since the
  last batch passed (ignored under Trigger.AvailableNow, which must terminate).

``ReadAllAvailable`` (what Spark passes when the trigger semantics demand everything) ignores the options.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxBytes, ReadMaxRows, ReadMinRows

from connector.offsets import QueueKey
from connector.options import SourceOptions
from connector.planning import share_budget

log = logging.getLogger(__name__)

# (queue, start, cap, byte budget) -> the end offset (exclusive) such that [start, end) fits the budget.
ByteProbe = Callable[[QueueKey, int, int, int], int]


def default_read_limit(options: SourceOptions) -> ReadLimit:
    if options.max_messages_per_trigger is not None:
        return ReadMaxRows(options.max_messages_per_trigger)
    if options.max_bytes_per_trigger is not None:
        return ReadMaxBytes(options.max_bytes_per_trigger)
    if options.min_messages_per_trigger is not None:
        return ReadMinRows(options.min_messages_per_trigger)
    return ReadAllAvailable()


class AdmissionControl:
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.last_trigger_s = time.monotonic()  # as Kafka's source: the delay counts from the query's start

    def end_offsets(
        self,
        start: Mapping[QueueKey, int],
        latest: Mapping[QueueKey, int],
        limit: ReadLimit,
        probe: ByteProbe,
        *,
        available_now: bool,
    ) -> dict[QueueKey, int]:
        """End offsets for the next batch; equal to ``start`` when the batch should wait."""
        end = {k: max(latest[k], start.get(k, 0)) for k in latest}
        if isinstance(limit, ReadAllAvailable):
            return self._fired(start, end)
        max_msgs = self._limit(self.options.max_messages_per_trigger, limit, ReadMaxRows, "max_rows")
        max_bytes = self._limit(self.options.max_bytes_per_trigger, limit, ReadMaxBytes, "max_bytes")
        min_msgs = self._limit(self.options.min_messages_per_trigger, limit, ReadMinRows, "min_rows")
        backlog = sum(end[k] - start.get(k, 0) for k in end)
        if min_msgs is not None and not available_now and 0 < backlog < min_msgs:
            waited_ms = (time.monotonic() - self.last_trigger_s) * 1000
            if waited_ms < self.options.max_trigger_delay_ms:
                log.debug("waiting: %d messages < minMessagesPerTrigger %d", backlog, min_msgs)
                return {k: start.get(k, 0) for k in end}
        if max_msgs is not None and backlog > 0:
            end = share_budget(start, end, max_msgs)
        if max_bytes is not None and backlog > 0:
            end = _bytes_limited(start, end, max_bytes, probe)
        return self._fired(start, end)

    def _fired(self, start: Mapping[QueueKey, int], end: dict[QueueKey, int]) -> dict[QueueKey, int]:
        if any(end[k] > start.get(k, 0) for k in end):
            self.last_trigger_s = time.monotonic()
        return end

    @staticmethod
    def _limit(option: int | None, limit: ReadLimit, kind: type, attr: str) -> int | None:
        """The option's value, made stricter by the ReadLimit Spark passed when it is of the same kind."""
        if not isinstance(limit, kind):
            return option
        given = int(getattr(limit, attr))
        if option is None:
            return given
        return max(option, given) if attr == "min_rows" else min(option, given)  # a minimum is stricter when larger


def _bytes_limited(
    start: Mapping[QueueKey, int], end: dict[QueueKey, int], max_bytes: int, probe: ByteProbe
) -> dict[QueueKey, int]:
    """Each queue with a backlog gets a share of ``max_bytes`` by its backlog, and moves by at least one message
    even when that message is larger than its share: a soft limit (as Delta's maxBytesPerTrigger), so a queue
    whose next message is large is never starved while the others keep the budget busy."""
    backlog = {k: end[k] - start.get(k, 0) for k in end if end[k] > start.get(k, 0)}
    total = sum(backlog.values())
    out = dict(end)
    for key, n in sorted(backlog.items()):
        share = max_bytes * n // total
        s = start.get(key, 0)
        out[key] = max(s + 1, probe(key, s, end[key], share) if share > 0 else s)
    return out

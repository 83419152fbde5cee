"""Which due timer messages were delivered already, read from the log itself: a timer message is delivered once.

A delivery stores the timer message again in its real topic (timer.py) and only then records it, in the timer
journal and, every ``SAVE_INTERVAL_S``, in ``timerProgress.json``, which the metadata sync carries to the slaves
(timer_progress.py). A master that dies between a delivery and those records leaves its successor (or itself,
restarted) records that miss the last deliveries, and those would be stored again: twice in the topic.

The delivered copy is in the commit log, and so in every in-sync replica's log and message index (each replica
indexes the log it holds, broker/server/send_dedup.py relies on the same): it is its own record. It carries the
timer message's UNIQ_KEY and TIMER_DELIVER_MS and lies after the timer message in the log. So a starting timer
service asks the index, for each message already due and not recorded as delivered, whether such a copy is in its
real topic (and for those due within ``CLOCK_SLACK_MS``), and records the ones found as delivered instead of storing
them again. This uses no new state and no new channel: a copy that reached the new master's log is there to be
found; one that did not was never confirmed, never read by a consumer, and is stored now, once.

Which to ask about. Deliveries are made in order of time (the timer heap), so the ones the records miss are the
earliest due messages the records call pending: the walk goes in that order and stops after ``MAX_MISSES`` in a
row without a copy (deliveries out of order, a message scanned late, are far fewer). The cost is one index lookup
per delivery the records missed plus ``MAX_MISSES``, not one per pending message. A timer message the start-up
scan did not see yet (past the read limit of a new master, whose confirmed offset catches up with its log end only
as its replicas report) is asked about when it comes due, if it lies below the log end at start.

Not covered: a timer message sent without UNIQ_KEY (every Sluice and RocketMQ producer sets one), and a broker
with the message index disabled: their deliveries are at least once, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from broker.errors import InvalidArgumentError
from broker.format.message import Prop
from broker.store import MessageStore

log = logging.getLogger(__name__)

# Due messages in a row without a delivered copy after which the walk stops (see above): each costs an index lookup
MAX_MISSES = 256
# The copy's store time is the delivering master's clock, at or after the due time: this much earlier is looked at
# too, and messages due this much later than now, for a clock that differed between the replicas
CLOCK_SLACK_MS = 60_000


def delivered(store: MessageStore, due: Iterable[tuple[int, int, int]]) -> list[int]:
    """Of ``due`` ((deliver ms, timer-queue offset, commit-log offset), in delivery order), the timer-queue offsets
    whose delivered copy is in the log."""
    if store.index is None:
        return []
    found: list[int] = []
    misses = 0
    for deliver_ms, offset, clo in due:
        if misses >= MAX_MISSES:
            break
        if has_copy(store, deliver_ms, clo):
            found.append(offset)
            misses = 0
        else:
            misses += 1
    if found:
        log.warning("timer: %d due messages were delivered before the last records of it (a crash or failover); "
                    "not delivered again", len(found))
    return found


def has_copy(store: MessageStore, deliver_ms: int, clo: int) -> bool:
    """Whether the timer message at ``clo``, due at ``deliver_ms``, has a delivered copy in the log."""
    msg = store.lookup_message(clo)
    if msg is None:
        return False
    uniq = msg.properties.get(Prop.UNIQ_KEY)
    topic = msg.properties.get(Prop.REAL_TOPIC)
    if not uniq or not topic:
        return False
    try:
        copies = store.query_by_key(topic, uniq, max_num=4, begin_ms=deliver_ms - CLOCK_SLACK_MS,
                                    confirmed_only=False)
    except InvalidArgumentError:  # not a topic name the index knows: nothing was delivered there
        return False
    when = msg.properties.get(Prop.TIMER_DELIVER_MS)
    return any(c.commitlog_offset > clo and c.properties.get(Prop.TIMER_DELIVER_MS) == when for c in copies)

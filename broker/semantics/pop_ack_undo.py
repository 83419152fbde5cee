"""An ack the pop service refused after making it is undone: the message stays in flight and comes back.

An ack removes the delivery's record from the book (pop_book.py) and appends that change to the journal; in a
replicated group the answer then waits until every in-sync replica holds the record (pop_log.py ``settle``). Two
refusals come after the change: the store refuses the journal record (``append`` raises), or the replicas do not
confirm it in ``ha_ack_timeout_ms`` (FLUSH_SLAVE_TIMEOUT). Kept, such an ack stood on the master (and on every replica
its record reached): the consumer was told the ack failed, and the message was never delivered again. A consumer
relies on the opposite: a message whose ack failed is delivered again after its invisible time (RocketMQ's contract).

So a refused ack is undone before it is answered: its records are put back as they were (same invisible time,
attempts and sequence), in memory, and, when the ack's record is in the log, by a record after it, which the log
replicates like any other. The message is due again at the time its consumer was told, and the consumer's handle
stays current meanwhile, so an ack tried again with it is taken.

What remains: a new master that holds the ack's record but not the undo after it keeps the ack. The soak makes
that happen: its master, sent SIGSTOP after the ack's record reached the replicas and before it answered, answers
FLUSH_SLAVE_TIMEOUT once fenced. So an ack answered FLUSH_SLAVE_TIMEOUT is of unknown outcome, as a send so answered
is; the consumer's handle settles it: an ack tried again with it on the group's master is taken, or refused as
already acked.
"""

from __future__ import annotations

import logging

from broker.errors import BrokerError
from broker.semantics.journal import Journal
from broker.semantics.pop_book import PopBook, QueueKey, Record
from broker.semantics.pop_log import PopLog

log = logging.getLogger(__name__)

Taken = dict[QueueKey, dict[int, Record]]  # the records an ack removes, by queue and offset, as they were


def remove(book: PopBook, journal: Journal | PopLog, taken: Taken) -> None:
    """Remove the records and append each queue's removal; when an append fails, what was removed is put back
    (by a record in the log for the queues already appended) and the failure is raised: nothing is acked."""
    logged: Taken = {}
    for key, records in taken.items():
        record = book.remove(key, list(records))
        try:
            journal.append(record)
        except (BrokerError, OSError):
            book.put_back(key, records)  # its removal is not in the log: in memory only
            undo(book, journal, logged)
            raise
        logged[key] = records


def undo(book: PopBook, journal: Journal | PopLog, taken: Taken) -> None:
    """Put back records whose removal is in the log (its acknowledgement was refused)."""
    for key, records in taken.items():
        record = book.put_back(key, records)
        if record is None:
            continue
        try:
            journal.append(record)
        except (BrokerError, OSError) as e:  # the book holds them again; the next snapshot records it
            log.error("pop %s: a refused ack was undone in memory, but its record was not stored (%s); until the "
                      "next snapshot a failover keeps the ack of %s", key, e, sorted(records))

"""Batch transactions written in place: each message stored once, in its real queue, and shown by a marker.

A SendBatch in a transaction whose entries are encoded for their real topics (the Spark sink's, and the Python
client's ``send_encoded(..., transaction_id=...)``) takes this path instead of the half/op one:

1. **Slice record.** The first batch of a writer attempt (``TRAN_ATTEMPT``) of a transaction on this broker stores
   a slice record: an empty half message in ``RMQ_SYS_TRANS_HALF_TOPIC`` carrying the transaction id, the producer
   group, the attempt, the coordinator broker (a transaction over several brokers) and ``TRAN_SLICE``. The
   commit-log offset just past it is the slice's *handle* (never 0, as the first entry's own offset can be).
   The transaction service reads slice records at start-up as any half, so a restarted broker knows the
   transaction, its attempts and its producer group, checks it back and times it out as any other.
2. **Entries.** Stored as sent, but for two header fields: SYSFLAG's transaction type PREPARED and PREPARED
   TRANSACTION OFFSET = the handle (broker/store/txn_visibility.py: from the first of them, readers see nothing
   of their queue until the marker).
3. **Decision.** The op message with tag ``d`` it always was (the commit point, flushed; it names the slice
   records and, with ``TRAN_IN_PLACE``, says the transaction wrote in place, with ``TRAN_MESSAGES`` how many
   messages the commit shows), then one marker committing the slices of the kept attempts and rolling back the
   others (all of them on a rollback), then the ``f`` op message. A decision without its ``f`` is finished at
   start-up or by the check thread: the marker is written again unless the store has applied it.

The commit's count check (``expected_messages``) counts the entries the store registered for the kept slices,
after the dispatcher has passed every one: what readers will be shown, whatever crashed in between.

Why slice records in the half topic: a transaction's existence, group, coordinator and attempts then survive a
restart through the scan that already finds half messages, with one small record per attempt instead of one
half per message. Why single messages keep the half/op path (RocketMQ's TransactionProducer, the v2 protocol's
TRANSACTION messages): a slice record costs what their one half costs, so writing in place would save nothing,
and their check-back hands the producer the half message itself.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from broker.errors import InvalidArgumentError
from broker.format.message import Prop
from broker.format.transaction_codec import ATTEMPT, COORDINATOR

SLICE = "TRAN_SLICE"  # "1" on a slice record
IN_PLACE = "TRAN_IN_PLACE"  # "true" on the decision of a transaction that wrote in place
MESSAGES = "TRAN_MESSAGES"  # on such a decision: how many messages it commits
# A writer attempt travels in a property of each slice record and in the list of committed attempts
MAX_ATTEMPT_CHARS = 256


def slice_record_properties(txn_id: str, producer_group: str, attempt: str, coordinator: str) -> dict[str, str]:
    props = {Prop.TRANSACTION_ID: txn_id, Prop.PGROUP: producer_group, ATTEMPT: attempt, SLICE: "1"}
    if coordinator:
        props[COORDINATOR] = coordinator
    return props


def check_attempt(attempt: str) -> None:
    """An attempt id joins a comma-separated list of committed attempts: no comma nor property separator."""
    if len(attempt) > MAX_ATTEMPT_CHARS or any(c in attempt for c in ",\x01\x02"):
        raise InvalidArgumentError(
            f"attempt id {attempt[:40]!r}: at most {MAX_ATTEMPT_CHARS} characters, without ',' or control separators"
        )


def split_slices(
    slices: Mapping[int, str], commit: bool, attempts: Collection[str] | None
) -> tuple[list[int], list[int]]:
    """(handles committed, handles rolled back): on a commit, the slices of the listed attempts (all when
    ``attempts`` is None); on a rollback, none."""
    keep = sorted(h for h, a in slices.items() if commit and (attempts is None or a in attempts))
    kept = set(keep)
    return keep, sorted(h for h in slices if h not in kept)

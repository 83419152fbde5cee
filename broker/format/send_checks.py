"""One validation of what a client sends, for every send path.

SendMessage and SendBatch, plain or in a transaction, entries for their real topics or already in half form: each
is refused exactly where the others are. The store checks framing, sizes, CRCs and queue ids
(``MessageStore.validate_batch``, run on the buffer as the client sent it, never on a rewritten copy); these
checks add what the broker's own semantics need of every message:

* SYSFLAG transaction bits are the broker's to set (a plain message marked PREPARED was acknowledged and never
  delivered);
* RECONSUME_TIMES is not negative (a negative count skipped retry delays and bought extra retries);
* PROPERTIES are canonical (``format.properties``: decoded and encoded again they are the same bytes), so a message
  that was accepted can always be read, sent back, delayed and committed as it was sent;
* a producer group names a transaction's producers (check-backs go to it): one is required, as a group name.

A message joining a transaction is checked further where its half is made
(``transaction_codec.half_property_conflict``: the properties the broker writes into a half are not the client's
to give).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from broker.errors import InvalidArgumentError, MessageIllegalError, shown
from broker.format.batch import SmallBatch, ValidatedBatch, gather
from broker.format.message import (
    BODY_START,
    I32,
    POS_BODY_LENGTH,
    POS_RECONSUME_TIMES,
    POS_SYS_FLAG,
    PROPS_LEN,
    TOPIC_PATTERN,
    SysFlag,
    encode_properties,
)
from broker.format.properties import check_sections, not_canonical, section_fault

MAX_PRODUCER_GROUP_CHARS = 255  # RocketMQ's CHARACTER_MAX_LENGTH for group names


def validate_producer_group(group: str) -> None:
    """A transaction's producer group: check-backs are sent to its producers, and halves record it (PGROUP)."""
    if not group or len(group) > MAX_PRODUCER_GROUP_CHARS or not TOPIC_PATTERN.fullmatch(group):
        raise InvalidArgumentError(
            f"producer group {shown(group)}: a transactional send needs 1..{MAX_PRODUCER_GROUP_CHARS} characters of "
            "letters, digits, '%', '|', '_' or '-' (the broker checks the transaction back with this group)"
        )


def _refuse_transaction_bits(sys_flags: list[int] | np.ndarray, what: str) -> None:
    """Transaction types in SYSFLAG are the broker's to set: a plain send marked PREPARED or ROLLBACK would be
    stored but never reach a consume queue (acknowledged, never delivered), and one marked COMMIT would pass for
    the end of a transaction that never was. A transactional send is marked by the request, not by these bits."""
    bad = np.flatnonzero(np.asarray(sys_flags, np.int64) & SysFlag.TRANSACTION_MASK)
    if bad.size:
        i = int(bad[0])
        raise MessageIllegalError(
            f"{what} refused, nothing stored: message {i} sets transaction type bits in SYSFLAG "
            f"({int(sys_flags[i]):#x}); sends must leave them 0 (send transactional messages as halves: "
            "TransactionProducer, or Producer.send_encoded(transaction_id=...))"
        )


def _refuse_negative_reconsume_times(times: list[int] | np.ndarray, what: str) -> None:
    """A count is how often consumers failed the message: a negative one made its send-back skip the retry delay
    and allowed extra attempts before the dead-letter queue."""
    bad = np.flatnonzero(np.asarray(times, np.int64) < 0)
    if bad.size:
        i = int(bad[0])
        raise MessageIllegalError(
            f"{what} refused, nothing stored: message {i}: reconsume_times={int(times[i])} is negative; send 0 "
            "(the broker counts redeliveries itself)"
        )


def _header_fields(validated: SmallBatch | ValidatedBatch) -> tuple[np.ndarray, np.ndarray]:
    """(SYSFLAG, RECONSUME_TIMES) of every entry."""
    if isinstance(validated, ValidatedBatch):
        run = validated.run
        arr = np.frombuffer(validated.data, np.uint8)
        times = gather(arr, run.positions.astype(np.int64) + POS_RECONSUME_TIMES, 4, ">i4")
        del arr
        return run.sys_flags, times
    data, positions = validated.data, validated.positions
    flags = np.array([I32.unpack_from(data, p + POS_SYS_FLAG)[0] for p in positions], np.int64)
    counts = np.array([I32.unpack_from(data, p + POS_RECONSUME_TIMES)[0] for p in positions], np.int64)
    return flags, counts


def _property_sections(validated: SmallBatch | ValidatedBatch) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of every entry's PROPERTIES in ``validated.data``."""
    if isinstance(validated, ValidatedBatch):
        return validated.run.props_starts, validated.run.props_lengths
    data = validated.data
    starts, lengths = [], []
    for p in validated.positions:
        topic_len_at = p + BODY_START + I32.unpack_from(data, p + POS_BODY_LENGTH)[0]
        props_len_at = topic_len_at + 1 + data[topic_len_at]
        starts.append(props_len_at + PROPS_LEN.size)
        lengths.append(PROPS_LEN.unpack_from(data, props_len_at)[0])
    return np.asarray(starts, np.int64), np.asarray(lengths, np.int64)


def check_entries(validated: SmallBatch | ValidatedBatch, what: str = "SendBatch") -> None:
    """The checks of the module docstring every entry of a batch (plain or half) must pass; the store has already
    validated its framing (``validate_batch``)."""
    sys_flags, times = _header_fields(validated)
    _refuse_transaction_bits(sys_flags, what)
    _refuse_negative_reconsume_times(times, what)
    starts, lengths = _property_sections(validated)
    try:
        check_sections(validated.data, starts, lengths, "entry")
    except MessageIllegalError as e:
        raise MessageIllegalError(f"{what} refused, nothing stored: {e.message}") from None


def check_message(
    sys_flag: int, reconsume_times: int, properties: Mapping[str, str] | None = None, what: str = "SendMessage"
) -> None:
    """check_entries for a message sent with its fields (SendMessage): its properties are a map, so no name comes
    twice; encoded, they must be canonical all the same (no separator inside a name or value, no empty name)."""
    if sys_flag & SysFlag.TRANSACTION_MASK:  # tested first: the refusals' arrays cost 10 us a send
        _refuse_transaction_bits([sys_flag], what)
    if reconsume_times < 0:
        _refuse_negative_reconsume_times([reconsume_times], what)
    if properties:
        try:
            why = section_fault(encode_properties(properties))
        except MessageIllegalError as e:
            why = e.message
        if why:
            raise MessageIllegalError(f"{what} refused, nothing stored: {not_canonical('the message', why)}")

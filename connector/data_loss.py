"""What happens when messages the query still had to read are gone: fail, or skip ahead and say so.

Both the driver (planning a trigger) and the executors (pulling a range) meet lost data: a consume-queue offset
that expired (the broker answers OFFSET_TOO_SMALL / OFFSET_ILLEGAL with a larger min offset) or a queue that
vanished (its topic was deleted). ``failOnDataLoss=true`` (the default, as Kafka's source) fails the query with a
message naming topic, queue, requested and available offsets; ``false`` logs a warning and counts the lost range.

In a cluster a whole broker may go: it leaves the name servers' lists (stopped, or its registration expired) or stops
answering. Its messages are not lost, but the query cannot read them: ``failOnDataLoss=true`` stops the query naming
the broker (``broker_gone``); ``false`` logs it and goes on with the other brokers, the gone broker's queues keeping
their offsets, so the query reads on from there when it returns (Kafka's source, for partitions whose leader is
away, waits in the same way rather than skip them).
"""

from __future__ import annotations

import logging
import threading

from connector.connector_errors import BrokerGoneError, DataLossError
from connector.offsets import QueueKey, describe
from connector.options import SourceOptions

log = logging.getLogger(__name__)

_lock = threading.Lock()
_lost_messages = 0  # this process's running total of messages skipped with failOnDataLoss=false


def data_lost(options: SourceOptions, key: QueueKey, requested: int, available: str, lost: int) -> None:
    """Raise DataLossError, or (failOnDataLoss=false) log the loss of ``lost`` messages and carry on."""
    where = f"topic {key[0]!r} queue {key[1]}:{key[2]}"
    text = f"{where}: requested offset {requested}, available {available}; {lost} message(s) are no longer readable"
    if options.fail_on_data_loss:
        raise DataLossError(
            text + ". The query stops (failOnDataLoss=true); restart it with failOnDataLoss=false to skip the "
            "lost range, or from a newer checkpoint / startingOffsets."
        )
    global _lost_messages
    with _lock:
        _lost_messages += max(lost, 0)
        total = _lost_messages
    log.warning("data loss skipped (failOnDataLoss=false): %s; %d lost in this process so far", text, total)


def lost_messages() -> int:
    with _lock:
        return _lost_messages


def broker_gone(options: SourceOptions, broker: str, why: str, held: list[QueueKey]) -> None:
    """Raise BrokerGoneError, or (failOnDataLoss=false) log that ``held`` queues of ``broker`` wait for it."""
    shown = ", ".join(describe(k) for k in held[:4]) + (", ..." if len(held) > 4 else "")
    text = f"broker {broker!r} {why}" + (f"; the query reads {len(held)} queue(s) of it ({shown})" if held else "")
    if options.fail_on_data_loss:
        raise BrokerGoneError(
            text + ". The query stops (failOnDataLoss=true): bring the broker back and restart the query, or restart "
            "it with failOnDataLoss=false to go on with the other brokers (this broker's queues keep their offsets "
            "and are read on when it returns)."
        )
    log.warning("(failOnDataLoss=false) %s: those queues keep their offsets until it answers again", text)

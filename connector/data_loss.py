"""What happens when messages the query still had to read are gone: fail, or skip ahead and say so.

Both the driver (planning a trigger) and the executors (pulling a range) meet lost data: a consume-queue offset
that expired (the broker answers OFFSET_TOO_SMALL / OFFSET_ILLEGAL with a larger min offset) or a queue that
vanished (its topic was deleted). ``failOnDataLoss=true`` (the default, as Kafka's source) fails the query with a
message naming topic, queue, requested and available offsets; ``false`` logs a warning and counts the lost range.
"""

from __future__ import annotations

import logging
import threading

from connector.errors import DataLossError
from connector.options import SourceOptions

log = logging.getLogger(__name__)

_lock = threading.Lock()
_lost_messages = 0  # this process's running total of messages skipped with failOnDataLoss=false


def data_lost(options: SourceOptions, topic: str, queue_id: int, requested: int, available: str, lost: int) -> None:
    """Raise DataLossError, or (failOnDataLoss=false) log the loss of ``lost`` messages and carry on."""
    where = f"topic {topic!r} queue {options.broker_name}:{queue_id}"
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

"""The timer service's progress as a config file, ``config/timerProgress.json``: the copy its slaves hold.

The timer journal (``config/timer/``) is each broker's own and is not replicated; the timer messages are, in the
commit log. Without a copy of the progress a promoted slave would read the timer queue from its start and deliver
again every timer message still in the log. So the master saves which offsets of the timer queue were delivered
(or recalled) at most every ``SAVE_INTERVAL_S`` while they change, and the replication's metadata sync
(broker/ha/metadata_sync.py) carries the file to the slaves with the other config files. A timer service that
starts takes the newer of its journal and this file (``merge``), and what the old master delivered in its last
``SAVE_INTERVAL_S`` plus one metadata sync is found in the log at start (timer_delivered.py), not delivered again.

The file may reach a slave before the log bytes of the deliveries it names (a slave behind by more than a fetch
gets the config files with the first chunk). So the file also holds the commit-log end when it was saved, which
is past every delivery it names; a starting service uses the copy only when its own log reaches that far, and its
journal alone otherwise (deliveries repeat, none is lost).

Format (JSON object): ``{"low": N, "done": [[start, end], ...], "log_end": B}``: every offset below ``low`` is
delivered, and so is every offset in each half-open range ``[start, end)``; their deliveries lie below commit-log
offset ``B``. Ranges keep the file small when deliveries come in order
(the usual case: one range); at most ``MAX_RANGES`` are written, the lowest first, so a file never passes a few
MB: a promoted slave delivers the offsets of dropped ranges again (at least once, as any copy older than the
journal).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from typing import NamedTuple

from broker.ha.metadata_sync import LOG_END_KEY
from broker.json_file import write_json_atomic

log = logging.getLogger(__name__)

PROGRESS_FILE = "timerProgress.json"
SAVE_INTERVAL_S = 0.5  # the most deliveries a promoted slave repeats: this long's worth, plus one metadata sync
MAX_RANGES = 100_000  # ~2 MB of JSON; past it the highest ranges are left out (delivered again after a failover)
# As many delivered offsets above ``low`` as the service could hold in memory (some 60 B each in its set); a file
# that names more is damaged
MAX_DONE_OFFSETS = 20_000_000


def to_ranges(offsets: Iterable[int]) -> list[list[int]]:
    """Sorted half-open ``[start, end)`` ranges covering ``offsets`` exactly."""
    ranges: list[list[int]] = []
    for o in sorted(offsets):
        if ranges and ranges[-1][1] == o:
            ranges[-1][1] = o + 1
        else:
            ranges.append([o, o + 1])
    return ranges


def from_ranges(ranges: Iterable[Iterable[int]]) -> set[int]:
    """The offsets of the ranges; ValueError for a range that is reversed, or past ``MAX_DONE_OFFSETS`` in all (a
    damaged file must not fill the memory)."""
    out: set[int] = set()
    for start, end in ranges:
        start, end = int(start), int(end)
        if end < start or len(out) + (end - start) > MAX_DONE_OFFSETS:
            raise ValueError(f"range [{start}, {end}) is reversed or takes the offsets past {MAX_DONE_OFFSETS:,}")
        out.update(range(start, end))
    return out


class Progress(NamedTuple):
    low: int
    done: set[int]  # delivered offsets at or above low
    log_end: int  # the commit log's end when saved: every delivery named lies below it


def save(path: str, low: int, done: Iterable[int], log_end: int) -> None:
    ranges = to_ranges(o for o in done if o >= low)
    if len(ranges) > MAX_RANGES:
        log.warning("timer progress: %d ranges of delivered offsets, over %d; the highest are left out of %s (a "
                    "promoted slave delivers them again)", len(ranges), MAX_RANGES, path)
        ranges = ranges[:MAX_RANGES]
    write_json_atomic(path, {"low": low, "done": ranges, LOG_END_KEY: log_end})


def load(path: str) -> Progress | None:
    """The file's record; None when there is none or it cannot be read (said in the log: the journal alone then
    decides)."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
        low, log_end = int(data["low"]), int(data[LOG_END_KEY])
        done = {o for o in from_ranges(data.get("done", ())) if o >= low}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as e:
        log.error("timer progress %s cannot be read (%s); the timer journal alone decides what was delivered", path, e)
        return None
    if low < 0:
        log.error("timer progress %s has a negative low offset %d; ignored", path, low)
        return None
    return Progress(low, done, log_end)


def merge(low: int, done: set[int], other: Progress | None, log_end: int) -> tuple[int, set[int]]:
    """The newer of two records of deliveries: the higher ``low``, and every offset either says is delivered at or
    above it (both are records of deliveries that happened: the journal's own, and the last master's copy). The
    copy only when this store's log (ending at ``log_end``) holds every delivery it names."""
    if other is None:
        return low, done
    if other.log_end > log_end:
        log.warning("timer progress: the copy names deliveries up to commit-log offset %d, past this store's end %d; "
                    "using the journal alone (deliveries since it may repeat)", other.log_end, log_end)
        return low, done
    merged_low = max(low, other.low)
    return merged_low, {o for o in done | other.done if o >= merged_low}


def path_in(config_dir: str) -> str:
    return os.path.join(config_dir, PROGRESS_FILE)

"""Argument types of the command line: bounded integers and points in time, each refused with a usage error that
says what was expected (argparse turns ``ArgumentTypeError`` into exit status 2 and one ``error:`` line)."""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Callable

MAX_TIMESTAMP_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: a larger number is a typo, not a time


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= minimum, else a usage error saying so (not a silent 1 or 0 messages)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}; give an integer >= {minimum}")
        return value

    return parse


def int_between(minimum: int, maximum: int) -> Callable[[str], int]:
    """An argparse type: an integer in [minimum, maximum], else a usage error naming the range."""
    at_least = int_at_least(minimum)

    def parse(text: str) -> int:
        value = at_least(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"{value} is above {maximum}; give an integer in {minimum}..{maximum}")
        return value

    return parse


def timestamp_ms(text: str) -> int:
    """Milliseconds since the epoch, as an integer."""
    value = int_at_least(0)(text)
    if value > MAX_TIMESTAMP_MS:
        raise argparse.ArgumentTypeError(f"{value} is past the year 9999; give milliseconds since the epoch")
    return value


def datetime_ms(text: str) -> int:
    """An ISO 8601 date or time (``2026-11-26``, ``2026-11-26T10:00``, ``2026-11-26T10:00:00.5+01:00``, ``...Z``)
    as milliseconds since the epoch. Without a zone it is local time, as Kafka's ``--to-datetime`` reads it."""
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 time; write e.g. 2026-11-26T10:00:00 (local time), 2026-11-26T10:00:00Z "
            "or 2026-11-26T10:00:00+01:00"
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()  # a naive time is the machine's local time
    return round(when.timestamp() * 1000)


def time_ms(text: str) -> int:
    """Either form: milliseconds since the epoch (digits only) or an ISO 8601 time (``datetime_ms``)."""
    return timestamp_ms(text) if text.strip().isdecimal() else datetime_ms(text)

"""Numbers read from text: property values (DELAY, REAL_QID), file and directory names, configured hours.

ASCII decimal digits and nothing else. ``str.isdigit`` and ``int()`` also take '\\u0663' (Arabic-Indic three, which
int() reads as 3), full-width digits, '\\u00b2' (isdigit says yes, int() raises), surrounding spaces and a sign, and
int() refuses more than 4300 digits: a REAL_QID that one reader took and another refused once left a transaction
that could never be committed, and a value that made int() raise answered a request with INTERNAL.
"""

from __future__ import annotations

# A number a client may write in a property is a Java int on RocketMQ's side (Integer.parseInt): 10 digits at most.
MAX_NUMBER_DIGITS = 10


def is_ascii_digits(text: str | bytes) -> bool:
    """Whether ``text`` is one or more ASCII digits 0-9 (module docstring says why not ``str.isdigit``)."""
    return bool(text) and text.isascii() and text.isdigit()

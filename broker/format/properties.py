"""PROPERTIES sections as the broker takes them from clients, and the numbers their values hold.

A section is a list of ``name\\x01value\\x02`` pairs (RocketMQ's ``messageProperties2String``, here
``message.encode_properties``). Every send path (SendMessage, SendBatch, plain or transactional, plain entries or
half entries) takes a section only in the form ``encode_properties`` writes, its *canonical* form: UTF-8; each pair a
non-empty name, one \\x01, a value without \\x01, then \\x02; no name twice. A canonical section decodes
(``decode_properties``) to a dict that encodes to the same bytes again.

Why one form: the broker reads a message's properties again after storing it. Queries answer the stored bytes, but a
send-back, a delayed delivery and a transaction commit store the message anew from its decoded properties, and the
dispatcher, the client and the Spark connector each pick a value by name. A section in another form read
differently in each place (invalid UTF-8 came back as U+FFFD, a pair without \\x01 gained one, a repeated name
resolved to its first value here and its last there), or could not be encoded again at all: a message the broker
had accepted whose send-back then failed on every try.

Numbers in property values (DELAY, REAL_QID) follow ``numbers``: ASCII digits only, read by ``property_number``.
"""

from __future__ import annotations

import numpy as np

from broker.errors import MessageIllegalError, shown
from broker.format import scan_kernel
from broker.format.numbers import MAX_NUMBER_DIGITS, is_ascii_digits

NAME_END = 1  # \x01 ends a name
PAIR_END = 2  # \x02 ends a value
MAX_PROPERTY_NUMBER = 2**31 - 1  # a Java int, as RocketMQ reads these values (Integer.parseInt)


def property_number(name: str, value: str | bytes, max_value: int = MAX_PROPERTY_NUMBER) -> int:
    """The non-negative integer a numeric property holds; MessageIllegalError unless it is 1..10 ASCII digits no
    larger than ``max_value``."""
    if not is_ascii_digits(value) or len(value) > MAX_NUMBER_DIGITS or int(value) > max_value:
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        raise MessageIllegalError(
            f"property {name}={shown(text)} is not a number: give ASCII digits 0-9 only (no sign, space or other "
            f"script), at most {max_value}"
        )
    return int(value)


# ------------------------------------------------------------------------------------------- canonical sections


def section_fault(raw: bytes | bytearray) -> str:
    """Why a PROPERTIES section is not canonical (module docstring); "" when it is. The definition: the bulk check
    ``first_bad_section`` must agree with it on every input."""
    if not raw:
        return ""
    if raw[-1] != PAIR_END:
        return "they do not end with \\x02 (each name\\x01value pair ends with it)"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"byte {e.start} is not UTF-8 ({bytes(raw[e.start : e.start + 4])!r})"
    seen: set[str] = set()
    for i, pair in enumerate(text[:-1].split("\x02")):
        name, sep, value = pair.partition("\x01")
        if not sep:
            return f"pair {i} ({shown(pair)}) has no \\x01 between a name and a value"
        if not name:
            return f"pair {i} has an empty name"
        if "\x01" in value:
            return f"the value of {shown(name)} holds a \\x01, which only ends a name"
        if name in seen:
            return f"{shown(name)} is named twice"
        seen.add(name)
    return ""


def first_bad_section(buf: bytes | bytearray | memoryview, starts: np.ndarray, lengths: np.ndarray) -> tuple[int, str]:
    """(index, why) of the first section ``buf[starts[i] : starts[i] + lengths[i]]`` that is not canonical;
    (-1, "") when all are. ``section_fault`` on each section (about 3 us a section) in a buffer under
    scan_kernel.COMPILED_MIN_BYTES, as the walk decides (numba's start-up would cost more); in a bigger one its
    compiled twin (a few ns a byte), which hands back to the definition the sections it cannot decide alone
    (many pairs) and names the bad one."""
    data = bytes(buf) if isinstance(buf, memoryview) else buf
    starts = np.asarray(starts, np.int64)
    lengths = np.asarray(lengths, np.int64)
    if len(data) < scan_kernel.COMPILED_MIN_BYTES:
        for i, (a, n) in enumerate(zip(starts.tolist(), lengths.tolist(), strict=True)):
            why = section_fault(data[a : a + n]) if n else ""
            if why:
                return i, why
        return -1, ""
    arr = np.frombuffer(data, np.uint8)
    begin = 0
    while True:
        index, code = scan_kernel.first_bad_properties(arr, starts, lengths, begin)
        if code == scan_kernel.PROPS_OK:
            return -1, ""
        a = int(starts[index])
        why = section_fault(data[a : a + int(lengths[index])])
        if why:
            return index, why
        assert code == scan_kernel.PROPS_ASK, f"the compiled check refused section {index}, the definition did not"
        begin = index + 1


def check_sections(
    buf: bytes | bytearray | memoryview, starts: np.ndarray, lengths: np.ndarray, what: str = "batch entry"
) -> None:
    """MessageIllegalError naming the first section that is not canonical."""
    i, why = first_bad_section(buf, starts, lengths)
    if i >= 0:
        raise MessageIllegalError(not_canonical(f"{what} {i}", why))


def not_canonical(which: str, why: str) -> str:
    """The refusal of a section that is not canonical (``why``: section_fault's answer)."""
    return f"{which}: its PROPERTIES are not name\\x01value\\x02 pairs as encode_properties writes them: {why}"


__all__ = [
    "MAX_PROPERTY_NUMBER",
    "check_sections",
    "first_bad_section",
    "not_canonical",
    "property_number",
    "section_fault",
]

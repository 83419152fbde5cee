"""RocketMQ's properties string as remoting clients write it, read the way RocketMQ reads it.

The encoding is Sluice's own (``broker.format.message.encode_properties``: ``name \\x01 value \\x02`` per pair): a
message stored from a remoting send reads the same to every reader. What differs is what clients send:

* the Java client writes no ``\\x02`` after the last pair; the Go client does. Both are read alike;
* RocketMQ's parser (``MessageDecoder.string2messageProperties``) drops a pair with an empty name or an empty value
  and an item without ``\\x01``; a value that holds another ``\\x01`` is dropped too (the Java 4.x parser splits an
  item on ``\\x01`` and keeps it only when that gives exactly a name and a value);
* a name given twice keeps its last value (Java's ``HashMap.put``).

The dictionary read here is then stored in the canonical form (``broker.format.properties``), which every send path
requires: what was dropped is what a RocketMQ broker would have dropped too, so a client sees no difference.
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.format.message import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR, encode_properties

# A properties string is one header field; RocketMQ stores it with a 2-byte length, so a longer one can never be
# stored (broker.format.message.MAX_PROPERTIES_BYTES refuses it where it is encoded).


def parse_properties(text: str | None) -> dict[str, str]:
    """The pairs a RocketMQ broker would keep from ``text`` (module docstring); ``{}`` for None or ""."""
    if not text:
        return {}
    props: dict[str, str] = {}
    for item in text.split(PROPERTY_SEPARATOR):
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep and name and value and NAME_VALUE_SEPARATOR not in value:
            props[name] = value
    return props


def format_properties(props: Mapping[str, str]) -> str:
    """The string a remoting client is given (and a remoting sender writes): Sluice's canonical encoding, which
    every RocketMQ parser reads (a trailing ``\\x02`` is allowed by all of them)."""
    return encode_properties(props).decode("utf-8")


def parse_properties_bytes(raw: bytes) -> dict[str, str]:
    """``parse_properties`` of a batch entry's PROPERTIES bytes; invalid UTF-8 reads as U+FFFD, as Java's
    ``new String(bytes, UTF_8)`` does."""
    return parse_properties(raw.decode("utf-8", "replace")) if raw else {}

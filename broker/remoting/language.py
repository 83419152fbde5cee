"""RocketMQ's ``LanguageCode``: the sender's language, a name in JSON headers and a byte in binary ones.

New languages keep being added (NODE_JS came with 5.x, RUST after), so any name or byte is accepted: a binary byte
this table does not know reads as ``OTHER``, a JSON name is kept as sent, and a name this table does not know is
written as ``OTHER``'s byte.
"""

from __future__ import annotations

LANGUAGE_CODES = {
    "JAVA": 0, "CPP": 1, "DOTNET": 2, "PYTHON": 3, "DELPHI": 4, "ERLANG": 5, "RUBY": 6, "OTHER": 7, "HTTP": 8,
    "GO": 9, "PHP": 10, "OMS": 11, "RUST": 12, "NODE_JS": 13,
}
LANGUAGE_NAMES = {code: name for name, code in LANGUAGE_CODES.items()}
OTHER = "OTHER"


def language_byte(name: str) -> int:
    return LANGUAGE_CODES.get(name, LANGUAGE_CODES[OTHER])


def language_name(code: int) -> str:
    return LANGUAGE_NAMES.get(code, OTHER)

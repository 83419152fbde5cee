"""JSON bodies as RocketMQ's Java side (fastjson) writes and reads them.

fastjson sorts an object's fields by name and leaves out null ones; a map with integer keys (``brokerAddrs``,
broker id -> address) is written with *bare* keys, ``{0:"10.0.0.1:10911"}``, which is not JSON. RocketMQ's name
server writes standard JSON (``{"0":...}``, non-ASCII as ``\\uXXXX``) only to clients that ask for it: a request
of version 401 (4.9.4) or later, or one with ``acceptStandardJsonOnly=true``; older clients' parsers (the Go
client's before 2.1) split the bare form by hand and break on quotes. :func:`wants_standard_json` says which form
a request gets, :func:`dumps` writes either, and :func:`loads` reads both.
"""

from __future__ import annotations

import json
from typing import Any

from broker.remoting.command import RemotingCommand

STANDARD_JSON_SINCE_VERSION = 401  # MQVersion.V4_9_4: the first client that asks for quoted integer keys


def wants_standard_json(request: RemotingCommand) -> bool:
    return (
        request.version >= STANDARD_JSON_SINCE_VERSION
        or request.ext_fields.get("acceptStandardJsonOnly", "").lower() == "true"
    )


def dumps(value: Any, *, standard: bool) -> bytes:
    """``value`` with sorted keys and no spaces; dicts with int keys are written bare unless ``standard``."""
    return _write(value, standard).encode("utf-8")


def _write(value: Any, standard: bool) -> str:
    if isinstance(value, dict):
        parts = []
        for key in sorted(value, key=lambda k: (isinstance(k, str), k)):
            item = value[key]
            if item is None:
                continue
            if isinstance(key, int) and not isinstance(key, bool):
                name = json.dumps(str(key)) if standard else str(key)
            else:
                name = json.dumps(str(key), ensure_ascii=standard)
            parts.append(f"{name}:{_write(item, standard)}")
        return "{" + ",".join(parts) + "}"
    if isinstance(value, list | tuple | set | frozenset):
        return "[" + ",".join(_write(v, standard) for v in value) + "]"
    return json.dumps(value, ensure_ascii=standard)


def loads(data: bytes | str) -> Any:
    """A fastjson body: standard JSON, or with bare integer keys outside strings."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    try:
        return json.loads(text)
    except ValueError:
        return json.loads(_quote_bare_keys(text))


def _quote_bare_keys(text: str) -> str:
    """Quote ``{0:`` and ``,12:`` outside JSON strings."""
    out: list[str] = []
    i, n, in_string = 0, len(text), False
    while i < n:
        ch = text[i]
        if in_string:
            out.append(ch)
            if ch == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 1
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
            out.append(ch)
        elif ch in "{,":
            out.append(ch)
            j = i + 1
            while j < n and text[j] in " \t\r\n":
                j += 1
            k = j + (1 if j < n and text[j] == "-" else 0)
            m = k
            while m < n and text[m].isdigit():
                m += 1
            if m > k and m < n and text[m] == ":":
                out.append(f'"{text[j:m]}"')
                i = m - 1
        else:
            out.append(ch)
        i += 1
    return "".join(out)

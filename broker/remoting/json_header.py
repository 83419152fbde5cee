"""The JSON header (serialization type 0): what RocketMQ's Java client writes by default, and the Go client always.

Written as the Java side writes it: keys ``code, extFields, flag, language, opaque, remark,
serializeTypeCurrentRPC, version`` in that (sorted) order, enums by name (``"PYTHON"``, ``"JSON"``), a null remark
and empty extFields left out, every extFields value a JSON string (the Go client decodes them into
``map[string]string``), and the property separators 0x01/0x02 escaped as ``\\u0001``/``\\u0002`` (JSON escapes
every control character).

Read leniently where clients differ (the Go client sends ``remark: ""`` and no ``serializeTypeCurrentRPC``; some
send numbers as strings or the language as its number) and strictly where the frame cannot be trusted: a header
that is not a JSON object, or lacks ``code``, or carries a field of the wrong kind, is a :class:`RemotingFrameError`.
"""

from __future__ import annotations

import json
from typing import Any

from broker.errors import RemotingFrameError
from broker.remoting.command import RemotingCommand, SerializeType
from broker.remoting.language import OTHER, language_name

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1  # Java ints: code, version, opaque and flag


def encode_json_header(command: RemotingCommand) -> bytes:
    header: dict[str, Any] = {"code": command.code}
    if command.ext_fields:
        header["extFields"] = {k: str(v) for k, v in command.ext_fields.items()}
    header["flag"] = command.flag
    header["language"] = command.language
    header["opaque"] = command.opaque
    if command.remark is not None:
        header["remark"] = command.remark
    header["serializeTypeCurrentRPC"] = SerializeType.JSON.name
    header["version"] = command.version
    return json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _int(header: dict[str, Any], key: str, default: int | None = None) -> int:
    value = header.get(key)
    if value is None:
        if default is None:
            raise RemotingFrameError(f"JSON header has no {key!r}")
        return default
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise RemotingFrameError(f"JSON header field {key!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, int) or not INT32_MIN <= value <= INT32_MAX:
        raise RemotingFrameError(f"JSON header field {key!r} is not a 32-bit integer")
    return value


def _text(value: Any) -> str | None:
    """An extFields value as Java's ``toString()`` would have written it; None for a JSON null."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    raise RemotingFrameError("JSON header extFields hold a value that is not a string, number or boolean")


def decode_json_header(data: bytes) -> RemotingCommand:
    try:
        header = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise RemotingFrameError(f"JSON header does not parse ({type(e).__name__})") from None
    if not isinstance(header, dict):
        raise RemotingFrameError("JSON header is not an object")
    language = header.get("language", OTHER)
    if isinstance(language, int) and not isinstance(language, bool):
        language = language_name(language)
    if not isinstance(language, str):
        raise RemotingFrameError("JSON header field 'language' is not a name")
    remark = header.get("remark")
    if remark is not None and not isinstance(remark, str):
        raise RemotingFrameError("JSON header field 'remark' is not a string")
    raw_ext = header.get("extFields") or {}
    if not isinstance(raw_ext, dict):
        raise RemotingFrameError("JSON header field 'extFields' is not an object")
    ext: dict[str, str] = {}
    for key, value in raw_ext.items():
        text = _text(value)
        if text is not None:
            ext[key] = text
    return RemotingCommand(
        code=_int(header, "code"), opaque=_int(header, "opaque", 0), flag=_int(header, "flag", 0),
        language=language, version=_int(header, "version", 0), remark=remark, ext_fields=ext,
        serialize_type=SerializeType.JSON,
    )

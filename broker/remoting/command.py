"""One remoting command: a request or a response as its frame carries it, already decoded.

The header's ``extFields`` are strings on the wire (RocketMQ writes every custom header field with ``toString()``);
they stay strings here, and each request code's translator parses the fields it reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

# flag bits (RemotingCommand's RPC_TYPE and RPC_ONEWAY): bit 0 set = a response, bit 1 set = a one-way request.
FLAG_RESPONSE = 0b01
FLAG_ONEWAY = 0b10

# The language code Sluice writes in the commands it sends (RocketMQ's LanguageCode.PYTHON).
LANGUAGE_PYTHON = "PYTHON"


class SerializeType(IntEnum):
    """How the header is written: the high byte of the frame's second word."""

    JSON = 0
    ROCKETMQ = 1


@dataclass
class RemotingCommand:
    """A decoded frame. ``serialize_type`` is the header's encoding, answered in kind."""

    code: int
    opaque: int = 0
    flag: int = 0
    language: str = LANGUAGE_PYTHON
    version: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    serialize_type: SerializeType = SerializeType.JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def response(
        self, code: int, *, remark: str | None = None, ext_fields: dict[str, str] | None = None, body: bytes = b""
    ) -> RemotingCommand:
        """The answer to this request: same ``opaque`` and serialization, the response flag set."""
        return RemotingCommand(
            code=code,
            opaque=self.opaque,
            flag=FLAG_RESPONSE,
            version=self.version,
            remark=remark,
            ext_fields=ext_fields or {},
            body=body,
            serialize_type=self.serialize_type,
        )

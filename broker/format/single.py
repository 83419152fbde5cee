"""One message encoded as a commit-log entry from its fields: what a put of a single message (a plain send, a
retry, a delayed or committed message stored again) writes.

The checks come in the order a client sees them: topic, queue id and properties (MESSAGE_ILLEGAL), the properties'
size (PROPERTIES_SIZE_EXCEEDED), the body's size, IPv6 hosts, then the range of each numeric field. A message
refused by one of them comes back as a ``Refusal`` (not an exception: refusals are an ordinary answer of a put and
cost no traceback). The store adds what only it knows (whether the entry fits one commit-log file).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

from broker.errors import MessageIllegalError
from broker.format.batch import MAX_QUEUE_ID
from broker.format.message import (
    MAX_PROPERTIES_BYTES,
    SysFlag,
    encode_entry,
    encode_properties,
    pack_ipv4,
    validate_topic,
)

_I32_MIN, _I32_MAX, _I64_MIN, _I64_MAX = -(2**31), 2**31 - 1, -(2**63), 2**63 - 1
# The range of each numeric put argument: its entry field's width (ENTRY_HEADER), no narrower, because a batch
# entry may carry any value of that width, and such a message must be as storable again by put_message (a
# transaction commit, a retry or a delay re-puts stored fields).
_PUT_FIELD_RANGES = {
    "flag": (_I32_MIN, _I32_MAX),
    "sys_flag": (_I32_MIN, _I32_MAX),
    "born_timestamp": (_I64_MIN, _I64_MAX),
    "born_port": (_I32_MIN, _I32_MAX),
    "reconsume_times": (_I32_MIN, _I32_MAX),
    "prepared_transaction_offset": (_I64_MIN, _I64_MAX),
}


def _out_of_range(**values: int) -> str:
    """The message naming the first put argument outside its _PUT_FIELD_RANGES range."""
    for name, value in values.items():
        lo, hi = _PUT_FIELD_RANGES[name]
        if not lo <= value <= hi:
            return f"{name} {value} is outside {lo}..{hi}; send a value in that range"
    raise AssertionError(f"no argument is out of range: {values}")


class Refusal(NamedTuple):
    """Why a message cannot be encoded: answered MESSAGE_ILLEGAL, or PROPERTIES_SIZE_EXCEEDED when
    ``properties_too_large``."""

    reason: str
    properties_too_large: bool = False


class SingleEncoder:
    """Encodes single messages; keeps the encoded form of the topics and born hosts it has seen, so each is
    validated or packed once (a store puts to few of them)."""

    def __init__(self) -> None:
        self._topic_cache: dict[str, bytes] = {}
        self._born_ip_cache: dict[str, bytes] = {}

    def encode(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: Mapping[str, str] | None,
        *,
        flag: int,
        sys_flag: int,
        born_timestamp: int,
        born_host: tuple[str, int],
        reconsume_times: int,
        prepared_transaction_offset: int,
        store_ip: bytes,
        store_port: int,
        max_message_size: int,
        now_ms: Callable[[], int],
    ) -> bytearray | Refusal:
        """The encoded entry (queue offset, physical offset, store time still zero), or the Refusal saying why not.
        ``now_ms`` gives the born timestamp of a message sent without one (0)."""
        try:
            topic_raw = self._topic_cache.get(topic) or self._topic_cache.setdefault(topic, validate_topic(topic))
            if not 0 <= queue_id < MAX_QUEUE_ID:
                raise MessageIllegalError(f"queue id {queue_id} is outside 0..{MAX_QUEUE_ID - 1}")
            props_raw = encode_properties(properties) if properties else b""
        except MessageIllegalError as e:
            return Refusal(e.message)
        if len(props_raw) > MAX_PROPERTIES_BYTES:
            return Refusal(
                f"properties are {len(props_raw)} bytes, over {MAX_PROPERTIES_BYTES}; move big values to the body",
                properties_too_large=True,
            )
        if len(body) > max_message_size:
            return Refusal(
                f"MESSAGE_SIZE_EXCEEDED: body is {len(body)} bytes, over maxMessageSize {max_message_size}; split it "
                "or raise the limit"
            )
        if sys_flag & (SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6):
            return Refusal("IPv6 host flags are not supported by this store")
        if not (
            _I32_MIN <= flag <= _I32_MAX
            and _I32_MIN <= sys_flag <= _I32_MAX
            and _I64_MIN <= born_timestamp <= _I64_MAX
            and _I32_MIN <= born_host[1] <= _I32_MAX
            and _I32_MIN <= reconsume_times <= _I32_MAX
            and _I64_MIN <= prepared_transaction_offset <= _I64_MAX
        ):  # one chained test on the hot path; the field by field message only when it fails
            return Refusal(_out_of_range(
                flag=flag, sys_flag=sys_flag, born_timestamp=born_timestamp, born_port=born_host[1],
                reconsume_times=reconsume_times, prepared_transaction_offset=prepared_transaction_offset,
            ))
        born_ip = self._born_ip_cache.get(born_host[0])
        if born_ip is None:
            born_ip = self._born_ip_cache.setdefault(born_host[0], pack_ipv4(born_host[0]))
        return bytearray(
            encode_entry(
                topic_raw, queue_id, body, props_raw, flag=flag, sys_flag=sys_flag,
                born_timestamp=born_timestamp or now_ms(), born_ip=born_ip, born_port=born_host[1],
                reconsume_times=reconsume_times, prepared_transaction_offset=prepared_transaction_offset,
                store_ip=store_ip, store_port=store_port, max_message_size=max_message_size,
            )
        )

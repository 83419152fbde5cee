"""The frame and both header serializations against bytes written out by hand from RocketMQ's layout
(research notes §1-§2): a round trip alone would pass with both sides equally wrong."""

from __future__ import annotations

import json
import struct

import pytest

from broker.errors import BrokerError, RemotingFrameError
from broker.remoting.binary_header import decode_binary_header, encode_binary_header
from broker.remoting.codes import RequestCode, WireCode, wire_code
from broker.remoting.command import FLAG_ONEWAY, FLAG_RESPONSE, RemotingCommand, SerializeType
from broker.remoting.frame import MAX_FRAME_BYTES, body_length, decode_frame, encode_frame
from broker.remoting.json_header import decode_json_header, encode_json_header


def route_request(serialize_type: SerializeType = SerializeType.JSON) -> RemotingCommand:
    return RemotingCommand(code=105, opaque=7, language="JAVA", version=401, ext_fields={"topic": "T"},
                           serialize_type=serialize_type)


# code 105, JAVA, version 401, opaque 7, flag 0, no remark, extFields {"topic": "T"}: fields in sorted order, enums by
# name, null remark left out, no spaces (what fastjson writes)
JSON_HEADER = (b'{"code":105,"extFields":{"topic":"T"},"flag":0,"language":"JAVA","opaque":7,'
               b'"serializeTypeCurrentRPC":"JSON","version":401}')
BINARY_HEADER = bytes.fromhex(
    "0069"  # code 105 (int16)
    "00"  # language JAVA
    "0191"  # version 401 (int16)
    "00000007"  # opaque
    "00000000"  # flag
    "00000000"  # remark length 0: no remark
    "0000000c"  # extFields block: 12 bytes
    "0005" + b"topic".hex() + "00000001" + b"T".hex()  # key length int16, key, value length int32, value
)


def test_json_header_is_written_as_fastjson_writes_it() -> None:
    assert encode_json_header(route_request()) == JSON_HEADER


def test_binary_header_is_rocketmqs_21_fixed_bytes_then_the_blocks() -> None:
    assert encode_binary_header(route_request(SerializeType.ROCKETMQ)) == BINARY_HEADER
    assert len(encode_binary_header(RemotingCommand(code=0))) == 21


@pytest.mark.parametrize(("kind", "header"),
                         [(SerializeType.JSON, JSON_HEADER), (SerializeType.ROCKETMQ, BINARY_HEADER)])
def test_frame_is_length_then_type_and_header_length_then_header_then_body(kind: SerializeType, header: bytes) -> None:
    command = route_request(kind)
    command.body = b"\x00body"
    frame = encode_frame(command)
    expected = struct.pack(">i", 4 + len(header) + 5) + bytes([kind]) + len(header).to_bytes(3, "big") + header
    assert frame == expected + b"\x00body"
    decoded = decode_frame(frame[4:])
    assert (decoded.code, decoded.opaque, decoded.language, decoded.version) == (105, 7, "JAVA", 401)
    assert decoded.ext_fields == {"topic": "T"} and decoded.body == b"\x00body" and decoded.serialize_type == kind


def test_go_clients_json_header_is_read() -> None:
    """Go writes its own key order, remark "" and no serializeTypeCurrentRPC (research §2, §9.2)."""
    header = b'{"code":10,"language":"GO","version":317,"opaque":3,"flag":0,"remark":"","extFields":{"a":"b"}}'
    command = decode_json_header(header)
    assert (command.code, command.language, command.version, command.opaque, command.remark) == (10, "GO", 317, 3, "")
    assert command.ext_fields == {"a": "b"}


def test_json_ext_values_are_strings_and_separators_are_escaped() -> None:
    command = RemotingCommand(code=10, ext_fields={"i": "TAGS\x01a\x02KEYS\x01k"}, remark="r")
    header = encode_json_header(command)
    assert b'"i":"TAGS\\u0001a\\u0002KEYS\\u0001k"' in header and b'"remark":"r"' in header
    # numbers and booleans a client sends in extFields read as Java's toString() wrote them
    read = decode_json_header(b'{"code":11,"extFields":{"queueId":3,"unitMode":false,"n":null}}')
    assert read.ext_fields == {"queueId": "3", "unitMode": "false"}


def test_binary_zero_length_strings_are_null_and_a_repeated_key_keeps_its_last_value() -> None:
    block = (b"\x00\x01a" + struct.pack(">i", 1) + b"1"  # a=1
             + b"\x00\x01e" + struct.pack(">i", 0)  # e="" : absent
             + b"\x00\x01a" + struct.pack(">i", 1) + b"2")  # a again: last wins
    header = struct.pack(">hBhii", 34, 9, 317, 5, 0) + struct.pack(">i", 0) + struct.pack(">i", len(block)) + block
    command = decode_binary_header(header)
    assert command.remark is None and command.ext_fields == {"a": "2"} and command.language == "GO"


def test_binary_header_refuses_codes_that_do_not_fit_int16() -> None:
    with pytest.raises(RemotingFrameError, match="JSON"):
        encode_binary_header(RemotingCommand(code=RequestCode.POP_MESSAGE))
    assert decode_json_header(encode_json_header(RemotingCommand(code=RequestCode.POP_MESSAGE))).code == 200050


def test_unknown_language_byte_reads_as_other() -> None:
    header = struct.pack(">hBhii", 10, 200, 0, 1, 0) + struct.pack(">i", 0) + struct.pack(">i", 0)
    assert decode_binary_header(header).language == "OTHER"


def frame_word(kind: int, header_len: int) -> bytes:
    return struct.pack(">I", (kind << 24) | header_len)


MALFORMED = {
    "header length past the frame": frame_word(0, 100) + b"{}",
    "unknown serialization type": frame_word(2, 2) + b"{}",
    "JSON that does not parse": frame_word(0, 5) + b"{code",
    "JSON that is not an object": frame_word(0, 2) + b"[]",
    "JSON without a code": frame_word(0, 2) + b"{}",
    "JSON code not an int32": frame_word(0, 20) + b'{"code":99999999999}',
    "binary header too short": frame_word(1, 4) + b"\x00" * 4,
    "binary remark past the header": frame_word(1, 21) + struct.pack(">hBhiiii", 1, 0, 0, 0, 0, 9, 0),
    "binary bytes after the ext block": frame_word(1, 22) + struct.pack(">hBhiiii", 1, 0, 0, 0, 0, 0, 0) + b"x",
    "no header word": b"\x00\x00",
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_frames_raise_one_error_type(case: str) -> None:
    with pytest.raises(RemotingFrameError) as raised:
        decode_frame(MALFORMED[case])
    assert isinstance(raised.value, BrokerError)


@pytest.mark.parametrize("length", [-1, 0, 3, MAX_FRAME_BYTES - 3, 0x7FFFFFFF])
def test_length_prefixes_no_frame_has_are_refused_before_reading_on(length: int) -> None:
    with pytest.raises(RemotingFrameError):
        body_length(struct.pack(">i", length))
    assert body_length(struct.pack(">i", MAX_FRAME_BYTES - 4)) == MAX_FRAME_BYTES - 4


def test_flags_and_response_mirror_the_request() -> None:
    request = RemotingCommand(code=30, opaque=41, serialize_type=SerializeType.ROCKETMQ, flag=FLAG_ONEWAY)
    assert request.is_oneway and not request.is_response
    answer = request.response(WireCode.SUCCESS, ext_fields={"offset": "5"})
    assert answer.flag == FLAG_RESPONSE and answer.opaque == 41 and answer.serialize_type == SerializeType.ROCKETMQ


def test_sluice_refusal_codes_map_to_codes_rocketmq_clients_know() -> None:
    from broker.errors import ResponseCode as Sluice

    assert wire_code(Sluice.TOPIC_NOT_EXIST) == WireCode.TOPIC_NOT_EXIST
    assert wire_code(Sluice.UNAUTHENTICATED) == WireCode.NO_PERMISSION
    assert wire_code(Sluice.NOT_MASTER) == WireCode.SERVICE_NOT_AVAILABLE
    assert all(int(wire_code(code)) < 900 for code in Sluice)
    assert json.loads(JSON_HEADER)["extFields"] == {"topic": "T"}

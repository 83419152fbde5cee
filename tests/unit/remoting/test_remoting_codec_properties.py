"""Property tests of both header serializations: whatever a command holds, what is written reads back the same
(the binary header dropping empty strings, as RocketMQ reads them), and the frame carries any body."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.remoting import fastjson
from broker.remoting.command import RemotingCommand, SerializeType
from broker.remoting.frame import decode_frame, encode_frame
from broker.remoting.language import LANGUAGE_CODES

INT16 = st.integers(-(1 << 15), (1 << 15) - 1)
INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
TEXT = st.text(max_size=40)  # any unicode, control characters (0x01/0x02 separators) included
commands = st.builds(
    RemotingCommand, code=INT32, opaque=INT32, flag=INT32, language=st.sampled_from(sorted(LANGUAGE_CODES)),
    version=INT32, remark=st.none() | TEXT, ext_fields=st.dictionaries(TEXT, TEXT, max_size=8),
    body=st.binary(max_size=200),
)


@settings(max_examples=300, deadline=None)
@given(commands)
def test_json_round_trip(command: RemotingCommand) -> None:
    command.serialize_type = SerializeType.JSON
    assert decode_frame(encode_frame(command)[4:]) == command


@settings(max_examples=300, deadline=None)
@given(commands, INT16, INT16)
def test_binary_round_trip_drops_only_empty_strings(command: RemotingCommand, code: int, version: int) -> None:
    command.serialize_type = SerializeType.ROCKETMQ
    command.code, command.version = code, version
    decoded = decode_frame(encode_frame(command)[4:])
    assert decoded.remark == (command.remark or None)
    assert decoded.ext_fields == {k: v for k, v in command.ext_fields.items() if k and v}
    decoded.remark, decoded.ext_fields = command.remark, command.ext_fields
    assert decoded == command


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT | st.integers(0, 1 << 20), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(json_values, st.booleans())
def test_fastjson_bodies_read_back_in_both_key_forms(value: object, standard: bool) -> None:
    def normal(v: object) -> object:  # JSON keys are strings; null fields are left out as fastjson does
        if isinstance(v, dict):
            return {str(k): normal(x) for k, x in v.items() if x is not None}
        if isinstance(v, list):
            return [normal(x) for x in v]
        return v

    assert fastjson.loads(fastjson.dumps(value, standard=standard)) == normal(value)

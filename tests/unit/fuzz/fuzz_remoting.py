"""The fuzz oracle's part for the broker's RocketMQ remoting port (broker/remoting), and the frames it is fed.

Rules (the issue's, for malformed frames, and the standards'): a frame that is no frame (a length over the limit
or below the header word, a header length past the frame, an unknown serialization type, a header that does not
parse, a frame cut short) ends its own connection, answered or not, and nothing else: after every request a fresh
connection is answered at once. A well-framed request is answered (unless one-way) within the call's deadline,
with the request's opaque, never with the answer of an unexpected failure (``SYSTEM_ERROR`` whose remark says
"internal broker error"), and a refusal says why (a remark). Every message a send carries gets a unique body;
after each family the queues of every topic a send named are read whole over gRPC: each message acknowledged to be
stored plainly is there, and no message of a refused or malformed frame is (a refused request stores nothing).
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

from hypothesis import strategies as st

from broker.errors import BrokerError, RemotingFrameError
from broker.format.message import SysFlag
from broker.format.system_topics import is_system_topic
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, WireCode
from broker.remoting.command import FLAG_ONEWAY, RemotingCommand, SerializeType
from broker.remoting.frame import MAX_FRAME_BYTES, PREFIX_BYTES, body_length, decode_frame, encode_frame
from broker.remoting.message_batch import BatchItem, decode_batch, encode_batch
from broker.remoting.message_properties import parse_properties
from broker.remoting.send_request import V2_NAMES
from tests.unit.fuzz.fuzz_oracle import Fuzzer
from tests.unit.fuzz.fuzz_strategies import BAD_TOPICS, HUGE_TEXT, INT32_EDGES, INT64_EDGES, KEPT_TOPICS, numbers
from tests.unit.fuzz.fuzz_strategies import properties as raw_property_bytes

ANSWER_TIMEOUT_S = 30.0  # generous: a busy 2-core machine can take seconds over an fsync
# How long a malformed frame's connection is watched for its end (or an answer) before the client closes it: a
# frame whose length promises more bytes than were sent waits for them, as a stream reader must.
MALFORMED_WAIT_S = 0.05
BODY_PREFIX = b"rm-"
# Properties that make a send something other than a plain message now (a delay, a timer, a transaction's half):
# acknowledged, such a message need not be readable in its queue yet.
NOT_PLAIN = ("DELAY", "TIMER", "STARTDELIVER", "TRAN_MSG", "__transactionId__", "REAL_TOPIC", "REAL_QID")
SEND_CODES = (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)
INTERNAL_REMARK = "internal broker error"
_LONG_NAMES = {v: k for k, v in V2_NAMES.items()}


@dataclass
class Sent:
    """A message a frame carried, by its unique body: whether it must be in its topic, may be, or must not."""

    topic: str
    body: bytes
    must: bool
    may: bool


def _plain(props: dict[str, str], sys_flag: int) -> bool:
    return SysFlag.transaction_type(sys_flag) == 0 and not any(k in name for name in props for k in NOT_PLAIN)


def _int(text: str | None) -> int:
    try:
        return int((text or "").strip())
    except ValueError:
        return 0


@dataclass
class Remoting:
    """Frames to the broker's remoting port, judged; the messages their sends stored, checked at every read-back."""

    fuzzer: Fuzzer
    sent: list[Sent] = field(default_factory=list)
    serial: int = 0
    answered: int = 0
    closed: int = 0
    _probe: RemotingClient | None = None

    def __post_init__(self) -> None:
        self.fuzzer.checks.append(self.check)

    @property
    def address(self) -> str:
        assert self.fuzzer.broker is not None
        return self.fuzzer.broker.remoting_endpoint

    def unique(self, body: bytes) -> bytes:
        self.serial += 1
        return BODY_PREFIX + f"{self.serial}|".encode() + body

    # ------------------------------------------------------------------------------------------ frames
    def frame(self, data: bytes, intended: RemotingCommand | None = None) -> None:
        """Bytes as they are on a fresh connection: the answer (if any) judged, what a send carried remembered
        (``intended``: the command the bytes were made from, before any damage)."""
        command = first_frame(data)
        # Bytes after a whole first frame are a second frame, broken: the server closes the connection on it, and
        # may do so before the first frame's answer is written (the first request may have been carried out).
        trailing = command is not None and len(data) > PREFIX_BYTES + body_length(data[:PREFIX_BYTES])
        answer, ended = self._exchange(data, command)
        what = f"remoting frame {data[:24].hex()}..."
        problem = ""
        if command is None:
            self.closed += ended
            if answer is not None and answer.code == WireCode.SUCCESS and intended is not None and \
                    intended.code in SEND_CODES:
                problem = "a frame that is no frame was answered SUCCESS"
        elif not (trailing and answer is None):
            problem = self._judge_answer(command, answer)
        self.fuzzer.record(what, refused=answer is None or answer.code != WireCode.SUCCESS, problem=problem)
        self._remember(command or intended, answer, malformed=command is None, lost=trailing and answer is None)
        self.serves()

    def request(self, command: RemotingCommand) -> None:
        """A well-framed request."""
        self.frame(encode_frame(command), command)

    def _exchange(self, data: bytes, command: RemotingCommand | None) -> tuple[RemotingCommand | None, bool]:
        """(the answer to ``data``, whether the server ended the connection); None when no answer came."""
        sock = socket.create_connection(_split(self.address), ANSWER_TIMEOUT_S)
        try:
            sock.sendall(data)
            wait = ANSWER_TIMEOUT_S if command is not None and not command.is_oneway else MALFORMED_WAIT_S
            sock.settimeout(wait)
            prefix = _read(sock, PREFIX_BYTES)
            if prefix is None:
                return None, True
            rest = _read(sock, body_length(prefix))
            if rest is None:
                return None, True
            return decode_frame(rest), False
        except TimeoutError:
            return None, False
        except ConnectionResetError:
            return None, True
        finally:
            sock.close()

    def _judge_answer(self, command: RemotingCommand, answer: RemotingCommand | None) -> str:
        if command.is_oneway:
            return "" if answer is None else f"a one-way request was answered (code {answer.code})"
        if answer is None:
            return f"request code {command.code} got no answer within {ANSWER_TIMEOUT_S} s"
        self.answered += 1
        if not answer.is_response or answer.opaque != command.opaque:
            return f"answer flag {answer.flag} / opaque {answer.opaque} for request opaque {command.opaque}"
        if answer.code == WireCode.SYSTEM_ERROR and (answer.remark or "").startswith(INTERNAL_REMARK):
            return f"request code {command.code} failed inside the broker: {answer.remark}"
        quiet = {WireCode.SUCCESS, WireCode.PULL_NOT_FOUND, WireCode.PULL_RETRY_IMMEDIATELY,
                 WireCode.PULL_OFFSET_MOVED, WireCode.QUERY_NOT_FOUND}
        if answer.code not in quiet and not answer.remark:
            return f"request code {command.code} refused with code {answer.code} and no remark"
        return ""

    def serves(self) -> None:
        """The broker answers a fresh request at once (a malformed frame ended only its own connection)."""
        if self._probe is None or self._probe.closed or self._probe.address != self.address:
            if self._probe is not None:
                self._probe.close()
            self._probe = RemotingClient(self.address)
        probe = RemotingCommand(RequestCode.GET_MAX_OFFSET, ext_fields={"topic": KEPT_TOPICS[0], "queueId": "0"})
        answer = self._probe.invoke(probe, ANSWER_TIMEOUT_S)
        assert answer.code == WireCode.SUCCESS, f"the broker stopped serving remoting: {answer}"

    def close(self) -> None:
        if self._probe is not None:
            self._probe.close()

    # ------------------------------------------------------------------------------------------ what was sent
    def _remember(self, command: RemotingCommand | None, answer: RemotingCommand | None, *, malformed: bool,
                  lost: bool = False) -> None:
        if command is None or command.code not in SEND_CODES:
            return
        ext = command.ext_fields if command.code == RequestCode.SEND_MESSAGE else {
            V2_NAMES.get(k, k): v for k, v in command.ext_fields.items()
        }
        topic, sys_flag = ext.get("topic", ""), _int(ext.get("sysFlag"))
        ok = answer is not None and answer.code in (WireCode.SUCCESS, WireCode.FLUSH_DISK_TIMEOUT)
        # unknown: a one-way send well framed (never answered), or one whose answer the broken bytes after it lost
        unknown = not malformed and (command.is_oneway or lost)
        batch = command.code == RequestCode.SEND_BATCH_MESSAGE or ext.get("batch", "").lower() == "true"
        if batch:
            try:
                items = [(i.body, i.properties) for i in decode_batch(command.body)]
            except BrokerError:
                items = []
        else:
            try:
                props = parse_properties(ext.get("properties"))
            except BrokerError:
                props = {"DELAY": "?"}  # unreadable: the oracle asks nothing of it if acknowledged
            items = [(command.body, props)]
        for body, props in items:
            if body.startswith(BODY_PREFIX):
                plain = _plain(props, sys_flag)
                self.sent.append(Sent(topic, body, ok and plain and not malformed, ok or unknown))

    # ------------------------------------------------------------------------------------------ after a family
    def check(self, when: str) -> str:
        topics = sorted({s.topic for s in self.sent if s.topic and not is_system_topic(s.topic)})
        found: set[bytes] = set()
        for topic in topics:
            found |= self.fuzzer.bodies(topic, BODY_PREFIX, when)
        missing = [s for s in self.sent if s.must and s.body not in found]
        assert not missing, f"{when}: {len(missing)} acknowledged remoting messages not found, first {missing[:3]}"
        stored = [s for s in self.sent if not s.may and s.body in found]
        assert not stored, f"{when}: {len(stored)} messages of refused remoting frames were stored: {stored[:3]}"
        return (f"{sum(s.must for s in self.sent)} acknowledged remoting messages found, none of "
                f"{sum(not s.may for s in self.sent)} refused ones stored; {self.answered} frames answered, "
                f"{self.closed} malformed ones closed")


def first_frame(data: bytes) -> RemotingCommand | None:
    """The command the server reads first from ``data``: its first frame when the bytes hold a whole one (what
    follows it is another, broken frame), None when they hold none."""
    try:
        if len(data) < PREFIX_BYTES:
            return None
        n = body_length(data[:PREFIX_BYTES])
        return decode_frame(data[PREFIX_BYTES : PREFIX_BYTES + n]) if n <= len(data) - PREFIX_BYTES else None
    except (RemotingFrameError, BrokerError, ValueError, UnicodeDecodeError, struct.error):
        return None


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _read(sock: socket.socket, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# ---------------------------------------------------------------------------------------------------- strategies

CODES = [RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE,
         RequestCode.PULL_MESSAGE, RequestCode.QUERY_CONSUMER_OFFSET, RequestCode.UPDATE_CONSUMER_OFFSET,
         RequestCode.GET_MAX_OFFSET, RequestCode.GET_MIN_OFFSET, RequestCode.GET_EARLIEST_MSG_STORETIME,
         RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, RequestCode.HEART_BEAT, RequestCode.UNREGISTER_CLIENT,
         RequestCode.GET_CONSUMER_LIST_BY_GROUP, RequestCode.GET_ROUTEINFO_BY_TOPIC,
         RequestCode.CONSUMER_SEND_MSG_BACK]
FIELDS = ["topic", "queueId", "consumerGroup", "producerGroup", "queueOffset", "maxMsgNums", "sysFlag",
          "commitOffset", "suspendTimeoutMillis", "subscription", "expressionType", "subVersion", "bornTimestamp",
          "flag", "properties", "reconsumeTimes", "maxReconsumeTimes", "batch", "defaultTopic", "timestamp",
          "offset", "delayLevel", "originMsgId", "autoCreate", "maxMsgBytes", "unitMode",
          *V2_NAMES]
text_values = st.one_of(
    st.sampled_from(KEPT_TOPICS), st.sampled_from(BAD_TOPICS), numbers, st.sampled_from(HUGE_TEXT),
    st.sampled_from([str(i) for i in INT64_EDGES]), st.sampled_from(["true", "false", "TAG", "SQL92", "*", "a > 1"]),
    st.text(max_size=30),
)
fields = st.dictionaries(st.sampled_from(FIELDS), text_values, max_size=12)


@st.composite
def plausible_sends(draw: st.DrawFn) -> RemotingCommand:
    """A send whose fields are mostly right: stored unless one of them is wrong."""
    code = draw(st.sampled_from(SEND_CODES))
    props = draw(raw_property_bytes).decode("utf-8", "replace")
    ext = {"producerGroup": "fz-remoting", "topic": draw(st.sampled_from([*KEPT_TOPICS, *KEPT_TOPICS, "FzRemoNew",
                                                                          *BAD_TOPICS[:3]])),
           "queueId": str(draw(st.sampled_from([0, 1, 7, *INT32_EDGES]))), "sysFlag": str(draw(st.sampled_from(
               [0, 0, 0, 1, 4, 8, 2**31 - 1, -1]))), "bornTimestamp": "1700000000000", "flag": str(draw(st.sampled_from(
                   INT32_EDGES))), "properties": props, "reconsumeTimes": "0"}
    if draw(st.booleans()):
        ext.update(draw(fields))
    if code != RequestCode.SEND_MESSAGE:
        ext = {_LONG_NAMES.get(k, k): v for k, v in ext.items()}
    if code == RequestCode.SEND_BATCH_MESSAGE:
        n = draw(st.integers(0, 4))
        body = encode_batch([BatchItem(b"", draw(st.sampled_from(INT32_EDGES)), {}) for _ in range(n)])
    else:
        body = draw(st.binary(max_size=64))
    kind = draw(st.sampled_from([SerializeType.JSON, SerializeType.ROCKETMQ]))
    return RemotingCommand(code, ext_fields=ext, body=body, serialize_type=kind, version=draw(st.sampled_from(
        [0, 317, 401])), flag=draw(st.sampled_from([0, 0, 0, FLAG_ONEWAY])))


@st.composite
def garbage_requests(draw: st.DrawFn) -> RemotingCommand:
    """A well-framed request of a served code (or none) whose fields and body are anything."""
    code = draw(st.one_of(st.sampled_from(CODES), st.integers(-(2**15), 2**15 - 1)))
    kind = draw(st.sampled_from([SerializeType.JSON, SerializeType.ROCKETMQ]))
    return RemotingCommand(code, ext_fields=draw(fields), body=draw(st.binary(max_size=96)), serialize_type=kind,
                           remark=draw(st.one_of(st.none(), st.text(max_size=20))),
                           flag=draw(st.sampled_from([0, 0, FLAG_ONEWAY])))


def with_unique_bodies(remoting: Remoting, command: RemotingCommand) -> RemotingCommand:
    """The send's message bodies made unique (the oracle finds them by it); other requests as they are."""
    if command.code not in SEND_CODES:
        return command
    try:
        items = decode_batch(command.body)
    except BrokerError:
        items = []
    if command.code == RequestCode.SEND_BATCH_MESSAGE and items:
        command.body = encode_batch([BatchItem(remoting.unique(i.body), i.flag, i.properties) for i in items])
    else:
        command.body = remoting.unique(command.body)
    return command


@st.composite
def malformed_frames(draw: st.DrawFn) -> bytes:
    """Bytes that are no frame: each way the issue names, with garbage around."""
    garbage = draw(st.binary(max_size=40))
    kind = draw(st.sampled_from(["over", "under", "negative", "header_past", "type", "json", "binary", "cut",
                                 "noise"]))
    if kind == "over":
        return struct.pack(">i", MAX_FRAME_BYTES + draw(st.integers(0, 2**20))) + garbage
    if kind in ("under", "negative"):
        return struct.pack(">i", draw(st.integers(-(2**31), 3))) + garbage
    if kind == "header_past":
        header_len = len(garbage) + draw(st.integers(1, 2**24 - 1 - len(garbage)))
        return struct.pack(">iI", 4 + len(garbage), header_len) + garbage
    if kind == "type":
        return struct.pack(">iI", 4 + len(garbage), draw(st.integers(2, 255)) << 24 | len(garbage)) + garbage
    if kind in ("json", "binary"):
        header = garbage if kind == "binary" else draw(st.sampled_from([b"{", b"[]", b"null", b'{"code":"x"}',
                                                                       b'{"code":10,"extFields":[1]}', b"\xff\xfe",
                                                                       b'{"code":1e400}', garbage]))
        tag = 0 if kind == "json" else 1
        return struct.pack(">iI", 4 + len(header), tag << 24 | len(header)) + header
    if kind == "cut":
        whole = encode_frame(RemotingCommand(RequestCode.GET_MAX_OFFSET, ext_fields={"topic": KEPT_TOPICS[0],
                                                                                     "queueId": "0"}))
        return whole[: draw(st.integers(1, len(whole) - 1))]
    return garbage


@st.composite
def mutations(draw: st.DrawFn) -> tuple[int, str, bytes]:
    """A valid frame's damage (where, what, the bytes put there), applied by ``mutate``: anywhere, or (a negative
    place) within the last 64 bytes, the body and the header's last fields, so that some damaged frames still
    parse and carry other values than were meant."""
    where = draw(st.one_of(st.integers(0, 10_000), st.integers(-64, -1)))
    return (
        where,
        draw(st.sampled_from(["flip", "set", "cut", "insert", "drop"])),
        draw(st.binary(min_size=1, max_size=8)),
    )


def mutate(frame: bytes, where: int, how: str, piece: bytes) -> bytes:
    at = where % len(frame) if where >= 0 else max(len(frame) + where, 0)
    if how == "flip":
        return frame[:at] + bytes([frame[at] ^ (piece[0] or 1)]) + frame[at + 1 :]
    if how == "set":
        return frame[:at] + piece + frame[at + len(piece) :]
    if how == "cut":
        return frame[: max(at, 1)]
    if how == "insert":
        return frame[:at] + piece + frame[at:]
    return frame[:at] + frame[at + len(piece) :]

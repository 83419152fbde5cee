"""LazyMessage: a pulled message that decodes its fields from the pull answer when they are first read.

Why: a pull answer of 1000 entries decoded eagerly (``decode_entry`` per entry: a 17-field header NamedTuple, the
properties split into a dict, two host strings and the message id formatted, a 16-field dataclass built) costs
about 10 us a message in CPython, eight times what the gRPC call and the broker take for the same answer. Most
consumers read the body and the offsets and little else, so the rest is decoded only when asked.

How:

- ``decode_pulled`` checks the framing of every entry of the answer at once (numpy over the 88-byte headers, the
  same rules as ``parse_layout``; below ``VECTOR_MIN_ENTRIES`` entries a Python loop is cheaper than numpy's fixed
  cost) and builds one LazyMessage per entry with only the body (one bytes slice), queue id, queue offset and
  commit-log offset set. An answer with any entry that fails a check is decoded eagerly by ``decode_entry``, the
  definition, which raises CorruptionError naming the entry, exactly as before.
- LazyMessage is a StoredMessage (same slots, same properties ``tags`` and ``keys``); the fields not set yet are
  empty slots, and Python calls ``__getattr__`` only when a slot is empty: it decodes the field's group (the
  header's numbers and the hosts and message id; the topic; the properties) into the slots, so every later read
  is a plain slot read, and assignments work as on a StoredMessage.
- A group is decoded for every message of the answer at once, the first time any of them reads a field of it:
  a consumer reads the same fields of each message, and the columns of broker/format/pulled_columns.py cost a
  fraction of a decode per message (and a fraction of ``__getattr__``'s own cost, paid once an answer instead of
  once a message and group). The messages find their answer through ``PulledMessages``, the list ``decode_pulled``
  returns, by a weak reference (no reference cycle, so an answer is freed as soon as nothing uses it): a message
  kept after its list is gone decodes its groups on its own. So a field assigned before any message of the answer
  has read its group is replaced when one does (as is one assigned before its own message reads a field of the
  same group): assign a field after reading it.
- Once every group of an answer is decoded, each of its messages becomes a ``DecodedMessage`` (its class is
  swapped, nothing copied) and lets go of the answer: a class without ``__getattr__``, whose field reads CPython
  specializes, so a consumer that reads every field pays for the reads what it pays on a StoredMessage (a third of
  what they cost on a LazyMessage). A message decoded on its own becomes one when ``materialize`` is called.
- Equality is field by field with any StoredMessage, ``repr`` is StoredMessage's, and pickling or copying gives
  an eagerly decoded StoredMessage (a plain list of them for the list): nothing an application sees tells the
  two apart but ``type()``.

Memory: a LazyMessage keeps a reference to its pull answer until every group of the answer has been decoded
(``materialize`` reads them all); an answer is at most the pull's byte limit, so a kept message pins at most one answer.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from broker.format.batch import HEADER_DTYPE, gather, headers
from broker.format.message import (
    BODY_START,
    ENTRY_HEADER,
    MESSAGE_MAGIC,
    PROPS_LEN,
    StoredMessage,
    SysFlag,
    decode_entry,
    decode_properties,
    make_msg_id,
    quick_layout,
)
from broker.format.pulled_columns import header_columns, host_text, properties_column, topic_column

# Below this many entries the per-entry Python check (about 1 us each) costs less than numpy's fixed cost of about
# 30 us an answer; above it numpy checks an entry in well under 100 ns. The same holds for decoding a group of
# fields for every message of an answer (broker/format/pulled_columns.py against a loop of the decoders below).
VECTOR_MIN_ENTRIES = 32
_V6_FLAGS = SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6
_FIELDS = tuple(f.name for f in dataclasses.fields(StoredMessage))
_SLOT = {name: StoredMessage.__dict__[name] for name in _FIELDS}  # the member descriptors: read without fallback
_SETTLING = threading.Lock()
assert HEADER_DTYPE.itemsize == ENTRY_HEADER.size


class PulledMessages(list[StoredMessage]):
    """The messages of one pull answer (a list): where its messages find one another to decode a group of fields
    for all of them at once. Pickled or copied, it is a plain list."""

    __slots__ = ("__weakref__", "_core", "_done", "_members", "_settled")
    _core: _Answer
    _settled: bool  # its members are DecodedMessages (_settle)
    _members: tuple[LazyMessage, ...]  # its messages in answer order, whatever the list holds later
    _done: set[str]  # the groups decoded for every member

    def __reduce__(self) -> tuple[type[list[StoredMessage]], tuple[list[StoredMessage]]]:
        return list, (list(self),)


class _Answer:
    """What the messages of one pull answer share (each holds it and its index): the answer's bytes, where each
    entry and its TOPIC LEN byte are, and a weak reference to their list (a strong one would be a cycle)."""

    __slots__ = ("buf", "messages", "positions", "tails", "vectors")

    def __init__(
        self, buf: bytes, positions: Sequence[int], tails: Sequence[int],
        messages: Callable[[], PulledMessages | None], vectors: tuple[np.ndarray, np.ndarray] | None,
    ) -> None:
        self.buf, self.positions, self.tails, self.messages = buf, positions, tails, messages
        self.vectors = vectors  # (positions, tails) as int64 arrays, for an answer of VECTOR_MIN_ENTRIES or more


class DecodedMessage(StoredMessage):
    """A pulled message whose fields are all decoded: what a LazyMessage becomes once every group of its answer is
    (its class is swapped; no field is copied). A plain class of slots, so that CPython specializes reads of its
    fields: on a class with ``__getattr__`` it cannot, and reading the 19 fields of a decoded LazyMessage cost
    1.71 us against 0.54 us for the same message as a DecodedMessage (2026-12-07, ``touch_message`` of
    bench/peers/every_field.py, best of 100 answers)."""

    __slots__ = ("_core", "_i")
    _core: _Answer  # its pull answer (while it is a LazyMessage)
    _i: int  # its index there

    def materialize(self) -> DecodedMessage:
        """Decode every field now and drop the reference to the pull answer."""
        for name in _FIELDS:
            getattr(self, name)
        if hasattr(self, "_core"):
            del self._core
        self.__class__ = DecodedMessage
        return self

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StoredMessage):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in _FIELDS)

    __hash__ = None  # type: ignore[assignment]  # mutable, like StoredMessage

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in _FIELDS)
        return f"{StoredMessage.__qualname__}({fields})"

    def __reduce__(self) -> tuple[type[StoredMessage], tuple[Any, ...]]:
        # A pickled or copied message is a StoredMessage: it must not carry the whole pull answer along.
        return StoredMessage, tuple(getattr(self, name) for name in _FIELDS)


class LazyMessage(DecodedMessage):
    """A StoredMessage whose fields other than body, queue id and offsets are decoded on first read."""

    __slots__ = ()  # DecodedMessage's layout, so that a message's class can be swapped to it

    def __getattr__(self, name: str) -> Any:
        # Called only for an empty slot (or an unknown name): decode that field's group, then read the slot.
        group = _GROUP.get(name)
        if group is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        try:
            core = _CORE_SLOT.__get__(self)
        except AttributeError:  # another thread settled this message's answer meanwhile: every field is set
            return _SLOT[name].__get__(self)
        answer = core.messages()
        if answer is not None and group not in answer._done:
            _FILL[group](answer)
            answer._done.add(group)
            if len(answer._done) == len(_FILL):
                _settle(answer)
        else:
            _DECODE[group](self, core)
        return _SLOT[name].__get__(self)


_CORE_SLOT = DecodedMessage.__dict__["_core"]  # read without LazyMessage's fallback


# ------------------------------------------------------------------------------------------ one message, a group


def _decode_header(m: LazyMessage, core: _Answer) -> None:
    h = ENTRY_HEADER.unpack_from(core.buf, core.positions[m._i])
    (total, _, _, _, m.flag, _, physical, m.sys_flag, m.born_timestamp, born_ip, born_port, m.store_timestamp,
     store_ip, store_port, m.reconsume_times, m.prepared_transaction_offset, _) = h
    m.store_size = total
    m.born_host = host_text(born_ip, born_port)
    m.store_host = host_text(store_ip, store_port)
    m.msg_id = make_msg_id(store_ip, store_port, physical)


def _decode_topic(m: LazyMessage, core: _Answer) -> None:
    buf, tail = core.buf, core.tails[m._i]
    m.topic = buf[tail + 1 : tail + 1 + buf[tail]].decode("ascii", "replace")


def _decode_properties(m: LazyMessage, core: _Answer) -> None:
    buf, tail = core.buf, core.tails[m._i]
    props_len_at = tail + 1 + buf[tail]
    start = props_len_at + PROPS_LEN.size
    m.properties = decode_properties(buf[start : start + PROPS_LEN.unpack_from(buf, props_len_at)[0]])


# ----------------------------------------------------------------------------------- every message of an answer


def _fill_header(answer: PulledMessages) -> None:
    members, core = answer._members, answer._core
    if core.vectors is None:
        for m in members:
            _decode_header(m, core)
        return
    columns = header_columns(core.buf, core.vectors[0])
    for m, flag, sys_flag, born_ts, born_host, store_ts, store_host, reconsume, prepared, size, msg_id in zip(
        members, *columns, strict=True
    ):
        m.flag, m.sys_flag, m.born_timestamp, m.born_host = flag, sys_flag, born_ts, born_host
        m.store_timestamp, m.store_host, m.reconsume_times = store_ts, store_host, reconsume
        m.prepared_transaction_offset, m.store_size, m.msg_id = prepared, size, msg_id


def _fill_topic(answer: PulledMessages) -> None:
    members, core = answer._members, answer._core
    if core.vectors is None:
        for m in members:
            _decode_topic(m, core)
        return
    for m, topic in zip(members, topic_column(core.buf, core.vectors[1]), strict=True):
        m.topic = topic


def _fill_properties(answer: PulledMessages) -> None:
    members, core = answer._members, answer._core
    if core.vectors is None:
        for m in members:
            _decode_properties(m, core)
        return
    for m, props in zip(members, properties_column(core.buf, core.vectors[1]), strict=True):
        m.properties = props


_HEADER_FIELDS = ("flag", "sys_flag", "born_timestamp", "born_host", "store_timestamp", "store_host",
                  "reconsume_times", "prepared_transaction_offset", "store_size", "msg_id")
_GROUP: dict[str, str] = {**dict.fromkeys(_HEADER_FIELDS, "header"), "topic": "topic", "properties": "properties"}
_DECODE: dict[str, Callable[[LazyMessage, _Answer], None]] = {
    "header": _decode_header, "topic": _decode_topic, "properties": _decode_properties,
}
_FILL: dict[str, Callable[[PulledMessages], None]] = {
    "header": _fill_header, "topic": _fill_topic, "properties": _fill_properties,
}


def _settle(answer: PulledMessages) -> None:
    """Every group decoded for every member: each becomes a DecodedMessage and lets go of the answer. Once: two
    threads reading messages of one answer may both find its last group decoded."""
    with _SETTLING:
        if answer._settled:
            return
        answer._settled = True
    decoded: type[LazyMessage] = DecodedMessage  # type: ignore[assignment]  # the same layout: swapped in place
    for m in answer._members:
        m.__class__ = decoded
        del m._core


_EAGER_FIELDS = ("body", "queue_id", "queue_offset", "commitlog_offset")
assert set(_GROUP) | set(_EAGER_FIELDS) == set(_FIELDS), set(_FIELDS) - set(_GROUP) - set(_EAGER_FIELDS)


def decode_pulled(buffer: bytes, positions: Sequence[int]) -> list[StoredMessage]:
    """The messages of a pull answer (``positions``: where each entry starts, in order), as LazyMessages in a
    PulledMessages; an answer with a badly framed entry goes through ``decode_entry``, which raises
    CorruptionError naming it."""
    if not positions:
        return []
    if len(positions) < VECTOR_MIN_ENTRIES:
        found = _small_answer(buffer, positions)
    else:
        found = _large_answer(buffer, positions)
    return found if found is not None else _eager(buffer, positions)


def _eager(buffer: bytes, positions: Sequence[int]) -> list[StoredMessage]:
    ends = [*positions[1:], len(buffer)]
    return [decode_entry(buffer, p, e) for p, e in zip(positions, ends, strict=True)]


def _answer_of(out: PulledMessages, core: _Answer) -> PulledMessages:
    out._core, out._done, out._settled = core, set(), False
    out._members = cast("tuple[LazyMessage, ...]", tuple(out))  # only LazyMessages were appended
    return out


def _small_answer(buf: bytes, positions: Sequence[int]) -> PulledMessages | None:
    out = PulledMessages()
    tails: list[int] = []
    core = _Answer(buf, positions, tails, weakref.ref(out), None)
    new = LazyMessage.__new__
    ends = [*positions[1:], len(buf)]
    for i, (p, end) in enumerate(zip(positions, ends, strict=True)):
        lay = quick_layout(buf, p, end) if p >= 0 else None
        if lay is None:
            return None
        h, topic_at = lay[0], lay[1]
        m = new(LazyMessage)
        m._core, m._i = core, i
        m.body = buf[p + BODY_START : topic_at - 1]
        m.queue_id, m.queue_offset, m.commitlog_offset = h[3], h[5], h[6]
        out.append(m)
        tails.append(topic_at - 1)
    return _answer_of(out, core)


def _large_answer(buf: bytes, positions: Sequence[int]) -> PulledMessages | None:
    """parse_layout's framing rules over every entry at once; None when any entry breaks one."""
    arr = np.frombuffer(buf, np.uint8)
    pos = np.asarray(positions, np.int64)
    ends = np.empty_like(pos)
    ends[:-1], ends[-1] = pos[1:], len(buf)
    if not ((pos >= 0) & (pos + BODY_START <= ends)).all():
        return None
    h = headers(arr, pos)
    total = h["total_size"].astype(np.int64)
    body_len = h["body_length"].astype(np.int64)
    entry_end = pos + total
    tail = pos + BODY_START + body_len  # the TOPIC LEN byte
    ok = (h["magic"] == MESSAGE_MAGIC) & (h["sys_flag"] & _V6_FLAGS == 0) & (body_len >= 0)
    ok &= (entry_end <= ends) & (tail + 1 <= entry_end)
    if not ok.all():
        return None
    topic_len = arr[tail].view(np.int8).astype(np.int64)
    props_len_at = tail + 1 + topic_len
    ok = (topic_len > 0) & (props_len_at + PROPS_LEN.size <= entry_end)
    if not ok.all():
        return None
    props_len = gather(arr, props_len_at, PROPS_LEN.size, ">i2")
    if not ((props_len >= 0) & (props_len_at + PROPS_LEN.size + props_len == entry_end)).all():
        return None
    out = PulledMessages()
    tails = tail.tolist()
    core = _Answer(buf, positions, tails, weakref.ref(out), (pos, tail))
    new = LazyMessage.__new__
    body_at = (pos + BODY_START).tolist()
    columns = zip(range(len(tails)), body_at, tails, h["queue_id"].tolist(), h["queue_offset"].tolist(),
                  h["physical_offset"].tolist(), strict=True)
    for i, b, t, queue_id, queue_offset, commitlog_offset in columns:
        m = new(LazyMessage)
        m._core, m._i = core, i
        m.body = buf[b:t]
        m.queue_id, m.queue_offset, m.commitlog_offset = queue_id, queue_offset, commitlog_offset
        out.append(m)
    return _answer_of(out, core)

"""Consume with every field of every message read, Sluice beside Redis Streams, like for like.

    python -m bench.peers.every_field [--scale 0.05] [--rounds 3] [--out bench/results/peers_every_field.json]

(``python -m bench.peers`` runs these rows too, after its own, when it runs Sluice and Redis.)

The throughput rows of ``bench.peers`` read the body alone, which Sluice decodes lazily; an application reads more.
Here both sides carry the same message (a body of the row's size, a tag, one key, one application property and
the client's unique id: Sluice's ``Producer.send_batch`` adds UNIQ_KEY, Redis gets it as a field) and both hand
the application every field it exposes, as text where the application gets text:

- **Sluice**: every field of each message: body, tags, keys, properties (one of them by name), message id,
  topic, queue id, queue and commit-log offsets, born and store timestamps and hosts, flag, sys flag, reconsume
  times, store size, prepared transaction offset. Read through ``PullConsumer.pull`` carrying the offset commit
  (one a pull, as the ``bench.peers`` rows), and through a ``PushConsumer`` listener (pulls and listener calls of
  ``BATCH_MSGS`` messages, its offsets committed with its pulls, as it does by default).
- **Redis Streams** (redis-py with hiredis): every field of each entry: the id as text and as its millisecond
  timestamp and sequence, the body, and the tag, key list, property and unique id decoded to text. Read with
  ``XREAD`` (no acknowledgement at all), and with ``XREADGROUP ... NOACK`` (a consumer group's position kept by
  the server, without an ``XACK`` an entry): the acknowledgement work closest to Sluice's commit of one offset a
  pull.

Two more rows say where the floor lies: **sluice pull, body only** (the same pulls reading the body alone, which
Sluice decodes lazily: what the pull itself costs) and **python floor** (StoredMessages built from values already
in hand and every field read, in this process without I/O: what handing an application such objects costs in
CPython before anything is received or decoded). Sluice's every-field pull cannot beat the sum of the two: the
**serial floor** (``serial_floor``), given round by round beside Redis's XREAD and beside Sluice's pull.

In-process figures follow (``decode_costs``: this thread's CPU time, the best of several answers, so less
sensitive to other load): what making the pulled messages of one answer and reading their body, or every field,
costs a message, beside ``decode_entry`` reading every field and the python floor.

Each row is timed ``--rounds`` times (at least three) in turn with the others, so a burst of other load falls on
all of them; a figure is the median of its rounds, with the slowest and fastest round beside it, and each ratio is
the median of the per-round ratios (round ``i`` of Sluice over round ``i`` of Redis). The stream and the topic are
written once a size, read by every round (a new consumer group each). Other load on the machine skews every
figure: the load average at start and end goes into the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.peers.redis_streams import RedisStreams
from bench.peers.settings import BATCH_MSGS, COUNT_BY_SIZE, RECEIVE_TIMEOUT_S, RESULTS_DIR, SIZES_B
from bench.peers.sluice import SluiceBroker

MIN_ROUNDS = 3  # a median needs three rounds to say anything a best round does not
WARMUP_MSGS = 2 * BATCH_MSGS  # read once by every reader before its rounds: connections, routes, first pulls
ROWS = ("sluice pull", "sluice push", "redis XREAD", "redis XREADGROUP NOACK", "sluice pull, body only",
        "python floor")
RATIOS = (("sluice pull", "redis XREAD"), ("sluice pull", "redis XREADGROUP NOACK"),
          ("sluice push", "redis XREAD"), ("sluice push", "redis XREADGROUP NOACK"))


def touch_message(m: Any) -> int:
    """Every field a pulled Sluice message exposes, each read once (summed so that nothing is optimised away)."""
    props = m.properties
    return (
        len(m.body) + len(m.tags or "") + len(m.keys) + len(props["app"]) + len(props) + len(m.msg_id) + len(m.topic)
        + m.queue_id + m.queue_offset + m.commitlog_offset + m.born_timestamp + m.store_timestamp + len(m.born_host)
        + len(m.store_host) + m.flag + m.sys_flag + m.reconsume_times + m.store_size + m.prepared_transaction_offset
    )


def touch_entry(entry_id: bytes, fields: dict[bytes, bytes]) -> int:
    """Every field of a Redis Streams entry, as text where Sluice gives text: the id (its timestamp and sequence,
    what Sluice's offsets and store timestamp are), the body, and the tag, keys, property and unique id."""
    text_id = entry_id.decode()
    ms, _, seq = text_id.partition("-")
    return (
        len(fields[b"body"]) + len(fields[b"tags"].decode()) + len(fields[b"keys"].decode().split(" "))
        + len(fields[b"app"].decode()) + len(fields[b"uniq"].decode()) + len(fields) + len(text_id) + int(ms)
        + int(seq)
    )


@dataclass
class RateRow:
    """One row's rounds, in msgs/s."""

    name: str
    size_b: int
    count: int
    rates: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    def to_json(self) -> dict[str, Any]:
        return {"size_b": self.size_b, "count": self.count, "median_msgs_s": round(self.median),
                "min_msgs_s": round(min(self.rates)), "max_msgs_s": round(max(self.rates)),
                "rounds_msgs_s": [round(r) for r in self.rates]}


def ratios_of(rows: dict[str, RateRow]) -> dict[str, dict[str, float]]:
    """Each Sluice row over each Redis row: the median of the per-round ratios, and their range."""
    out = {}
    for mine, theirs in RATIOS:
        if mine in rows and theirs in rows:
            per_round = [a / b for a, b in zip(rows[mine].rates, rows[theirs].rates, strict=True)]
            out[f"{mine} / {theirs}"] = {"median": round(statistics.median(per_round), 3),
                                         "min": round(min(per_round), 3), "max": round(max(per_round), 3)}
    return out


def serial_floor(rows: dict[str, RateRow]) -> dict[str, Any]:
    """What a Python client that pulls, then hands over the messages, can reach at best, round by round: a pull's
    own cost (``sluice pull, body only``) plus building and reading the objects (``python floor``), one after the
    other (1 / (1 / a + 1 / b) msgs/s). Beside it, that bound over Redis's XREAD (the most any pull could show
    against it) and Sluice's every-field pull over the bound (how close it gets)."""
    body, objects, redis, pull = (rows[n].rates for n in ("sluice pull, body only", "python floor", "redis XREAD",
                                                          "sluice pull"))
    bound = [1 / (1 / a + 1 / b) for a, b in zip(body, objects, strict=True)]

    def spread(values: list[float], digits: int) -> dict[str, float]:
        return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
                "max": round(max(values), digits)}

    return {"msgs_s": spread(bound, 0),
            "of_redis_xread": spread([f / x for f, x in zip(bound, redis, strict=True)], 3),
            "sluice_pull_of_it": spread([m / f for m, f in zip(pull, bound, strict=True)], 3)}


# ------------------------------------------------------------------------------------------------------- Sluice


def sluice_fill(endpoint: str, size_b: int, count: int) -> str:
    from broker.client import Admin, Message, Producer, PullConsumer

    topic = f"every-field-{size_b}"
    with Admin(endpoint) as admin:
        admin.create_topic(topic, queues=1)
    payload = os.urandom(size_b)
    with Producer(endpoint) as producer:
        for start in range(0, count, BATCH_MSGS):
            batch = [Message(topic, payload, tags="TagA", keys=[f"k{i}"], properties={"app": f"v{i}"})
                     for i in range(start, min(start + BATCH_MSGS, count))]
            producer.send_batch(batch, queue_id=0)
    with PullConsumer(endpoint, "every-field-index-wait") as consumer:  # every entry indexed before any round
        deadline = time.monotonic() + RECEIVE_TIMEOUT_S
        while consumer.queue_offsets(topic)[0][1] < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"sluice: fewer than {count} messages indexed after {RECEIVE_TIMEOUT_S} s")
            time.sleep(0.01)
    return topic


def sluice_pull(endpoint: str, topic: str, count: int, group: str,
                touch: Callable[[Any], int] = touch_message) -> float:
    """Seconds to read ``count`` messages with PullConsumer.pull (committing the offset with each pull), each
    message read by ``touch`` (by default every field)."""
    from broker.client import PullConsumer

    with PullConsumer(endpoint, group) as consumer:
        t0 = time.perf_counter()
        offset, touched = 0, 0
        while offset < count:
            result = consumer.pull(topic, 0, offset, min(BATCH_MSGS, count - offset), timeout_ms=1000,
                                   commit_offset=offset)
            if not result.messages:
                raise RuntimeError(f"sluice: {result.status.name} after {offset} of {count} messages")
            for m in result.messages:
                touched += touch(m)
            offset = result.next_begin_offset
        consumer.commit_offsets({(topic, 0): offset})
        return time.perf_counter() - t0


def sluice_pull_body(endpoint: str, topic: str, count: int, group: str) -> float:
    """``sluice_pull`` reading the body alone: the pull's own cost (transport, broker, a message object each)."""
    return sluice_pull(endpoint, topic, count, group, touch=lambda m: len(m.body))


def python_floor(count: int, size_b: int) -> float:
    """Seconds this Python takes to build ``count`` StoredMessages from values it already holds (no bytes read,
    nothing decoded, no I/O) and read every field of each as ``touch_message`` does: the least any Python client
    that hands an application such objects pays, before it receives or decodes anything."""
    values = floor_values(count, size_b)
    t0 = time.perf_counter()
    read_floor(values)
    return time.perf_counter() - t0


def floor_values(count: int, size_b: int) -> tuple[bytes, list[dict[str, str]], list[str]]:
    """What ``read_floor`` builds its messages from: a body, each message's properties and message id."""
    props = [{"TAGS": "TagA", "KEYS": f"k{i}", "app": f"v{i}", "UNIQ_KEY": uuid.uuid4().hex.upper()}
             for i in range(count)]
    return os.urandom(size_b), props, [f"7F00000100002A9F{i:016X}" for i in range(count)]


def read_floor(values: tuple[bytes, list[dict[str, str]], list[str]]) -> int:
    from broker.format.message import StoredMessage

    body, props, ids = values
    topic, host, touched = "every-field", "127.0.0.1:10911", 0
    for start in range(0, len(ids), BATCH_MSGS):
        batch = [StoredMessage(topic, 0, i, i * 200, body, props[i], 0, 0, 1, host, 2, host, 0, 0, 200, ids[i])
                 for i in range(start, min(start + BATCH_MSGS, len(ids)))]
        for m in batch:
            touched += touch_message(m)
    return touched


DECODE_REPEATS = 50  # in-process timings: the best of this many, each over one answer of BATCH_MSGS messages


def pull_answer(size_b: int) -> tuple[bytes, list[int]]:
    """A pull answer of BATCH_MSGS entries as ``sluice_fill``'s messages are stored (their store fields filled in
    as the broker fills them), made in this process."""
    import struct

    from broker.client.outgoing_message import Message, encode_messages
    from broker.format.message import POS_PHYSICAL_OFFSET, POS_QUEUE_OFFSET, POS_STORE_HOST, POS_STORE_TIMESTAMP

    payload = os.urandom(size_b)
    msgs = [Message("every-field", payload, tags="TagA", keys=[f"k{i}"], properties={"app": f"v{i}"})
            for i in range(BATCH_MSGS)]
    entries = encode_messages(msgs, [0] * BATCH_MSGS, int(time.time() * 1000), [uuid.uuid4().hex.upper()
                              for _ in msgs])
    out, positions, at = [], [], 0
    for i, raw in enumerate(entries):
        e = bytearray(raw)
        struct.pack_into(">q", e, POS_QUEUE_OFFSET, i)
        struct.pack_into(">q", e, POS_PHYSICAL_OFFSET, at)
        struct.pack_into(">q", e, POS_STORE_TIMESTAMP, int(time.time() * 1000))
        struct.pack_into(">4si", e, POS_STORE_HOST, b"\x7f\x00\x00\x01", 10911)
        positions.append(at)
        at += len(e)
        out.append(bytes(e))
    return b"".join(out), positions


def decode_costs(size_b: int) -> dict[str, float]:
    """Microseconds of this thread's CPU a message (the best of DECODE_REPEATS answers, so less sensitive to other
    load than the rows above): the pulled messages made and their body read; made and every field read; the same
    with ``decode_entry`` (every field decoded up front); and the python floor's objects built and read."""
    from broker.client.outgoing_message import decode_entries
    from broker.format.message import decode_entry

    buf, positions = pull_answer(size_b)
    ends = [*positions[1:], len(buf)]

    def body() -> None:
        for m in decode_entries(buf, positions):
            len(m.body)

    def every() -> None:
        for m in decode_entries(buf, positions):
            touch_message(m)

    def eager() -> None:
        for p, e in zip(positions, ends, strict=True):
            touch_message(decode_entry(buf, p, e))

    values = floor_values(BATCH_MSGS, size_b)

    def floor() -> None:
        read_floor(values)

    out = {}
    for name, fn in (("pull decode, body read", body), ("pull decode, every field read", every),
                     ("decode_entry, every field read", eager), ("python floor", floor)):
        times = []
        for _ in range(DECODE_REPEATS):
            t0 = time.thread_time()
            fn()
            times.append(time.thread_time() - t0)
        out[name] = round(min(times) / BATCH_MSGS * 1e6, 3)
    return out


def sluice_push(endpoint: str, topic: str, count: int, group: str, batch: int = BATCH_MSGS) -> float:
    """Seconds from the end of the listener's first call to the end of the call that brings ``count`` messages,
    per message after the first call's (the consumer's start-up, its first rebalance and pull, is not timed)."""
    from broker.client import FIRST, PushConsumer

    done = threading.Event()
    seen = [0, 0]  # messages, messages in the first call
    marks: list[float] = []

    def listener(messages: list[Any]) -> None:
        touched = 0
        for m in messages:
            touched += touch_message(m)
        seen[0] += len(messages)
        if not marks:
            seen[1] = len(messages)
        marks.append(time.perf_counter())
        if seen[0] >= count:
            done.set()

    with PushConsumer(endpoint, group, {topic: "*"}, listener, consume_from=FIRST, pull_batch_size=batch,
                      consume_batch_size=batch):
        if not done.wait(RECEIVE_TIMEOUT_S):
            raise RuntimeError(f"sluice push: {seen[0]} of {count} messages after {RECEIVE_TIMEOUT_S} s")
    if len(marks) < 2:
        raise RuntimeError("sluice push: every message came in one listener call; raise --scale")
    return (marks[-1] - marks[0]) * count / (seen[0] - seen[1])


# -------------------------------------------------------------------------------------------------------- Redis


def redis_fill(r: Any, size_b: int, count: int) -> str:
    key = f"every-field-{size_b}"
    payload = os.urandom(size_b)
    for start in range(0, count, BATCH_MSGS):
        pipe = r.pipeline(transaction=False)
        for i in range(start, min(start + BATCH_MSGS, count)):
            pipe.xadd(key, {"body": payload, "tags": "TagA", "keys": f"k{i}", "app": f"v{i}",
                            "uniq": uuid.uuid4().hex.upper()})
        pipe.execute()
    return key


def redis_xread(r: Any, key: str, count: int, group: str) -> float:
    """Seconds to read ``count`` entries with XREAD from the stream's start, every field of each touched."""
    del group  # XREAD keeps no position on the server
    t0 = time.perf_counter()
    last, received, touched = b"0-0", 0, 0
    while received < count:
        reply = r.xread({key: last}, count=min(BATCH_MSGS, count - received))
        entries = reply[0][1] if reply else []
        if not entries:
            raise RuntimeError(f"redis: stream ended after {received} of {count} entries")
        for entry_id, fields in entries:
            touched += touch_entry(entry_id, fields)
        last = entries[-1][0]
        received += len(entries)
    return time.perf_counter() - t0


def redis_xreadgroup_noack(r: Any, key: str, count: int, group: str) -> float:
    """Seconds to read ``count`` entries as a new consumer group with XREADGROUP NOACK, every field touched."""
    r.xgroup_create(key, group, id="0")
    t0 = time.perf_counter()
    received, touched = 0, 0
    while received < count:
        reply = r.xreadgroup(group, "c", {key: ">"}, count=min(BATCH_MSGS, count - received), noack=True)
        entries = reply[0][1] if reply else []
        if not entries:
            raise RuntimeError(f"redis: group read ended after {received} of {count} entries")
        for entry_id, fields in entries:
            touched += touch_entry(entry_id, fields)
        received += len(entries)
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------------------- run


def readers_of(
    endpoint: str, topic: str, r: Any, key: str, size_b: int
) -> dict[str, Callable[[int, str], float]]:
    """Each row's reader: (messages to read, a consumer group of its own) -> seconds."""
    return {
        "sluice pull": lambda n, g: sluice_pull(endpoint, topic, n, g),
        "sluice push": lambda n, g: sluice_push(endpoint, topic, n, g),
        "redis XREAD": lambda n, g: redis_xread(r, key, n, g),
        "redis XREADGROUP NOACK": lambda n, g: redis_xreadgroup_noack(r, key, n, g),
        "sluice pull, body only": lambda n, g: sluice_pull_body(endpoint, topic, n, g),
        "python floor": lambda n, g: python_floor(n, size_b),
    }


def run_every_field(workdir: Path, scale: float, rounds: int) -> dict[str, Any]:
    """Sluice and Redis started in ``workdir``, every row of every size measured ``max(rounds, MIN_ROUNDS)``
    times; the JSON form of the rows and ratios."""
    import redis

    rounds = max(rounds, MIN_ROUNDS)
    workdir = workdir / "every-field"  # apart from the stores of a run that used ``workdir`` before
    workdir.mkdir()
    sluice, peer = SluiceBroker(), RedisStreams()
    out: dict[str, Any] = {"rounds": rounds, "hiredis": bool(redis.utils.HIREDIS_AVAILABLE), "sizes": {}}
    try:
        out["sluice_version"], out["redis_version"] = sluice.start(workdir), peer.start(workdir)
        r = peer.client()
        for size_b in SIZES_B:
            count = max(4 * BATCH_MSGS, int(COUNT_BY_SIZE[size_b] * scale))
            topic, key = sluice_fill(sluice.endpoint, size_b, count), redis_fill(r, size_b, count)
            readers = readers_of(sluice.endpoint, topic, r, key, size_b)
            rows = {name: RateRow(name, size_b, count, []) for name in ROWS}
            for i, read in enumerate(readers.values()):
                read(WARMUP_MSGS, f"every-field-warmup-{i}")
            for round_no in range(rounds):
                for i, (name, read) in enumerate(readers.items()):
                    rows[name].rates.append(count / read(count, f"every-field-{i}-round-{round_no}"))
                print(f"  every field {size_b} B round {round_no + 1}: " + ", ".join(
                    f"{name} {rows[name].rates[-1]:,.0f}" for name in ROWS), flush=True)
            out["sizes"][str(size_b)] = {"rows": {name: row.to_json() for name, row in rows.items()},
                                         "ratios": ratios_of(rows), "serial_floor": serial_floor(rows),
                                         "decode_us": decode_costs(size_b)}
    finally:
        sluice.stop()
        peer.stop()
    return out


def print_every_field(found: dict[str, Any]) -> None:
    print(f"\nconsume, every field of every message read (median of {found['rounds']} rounds, slowest..fastest):")
    for size, part in found["sizes"].items():
        for name, row in part["rows"].items():
            print(f"  {size:>5} B {name:<24} {row['median_msgs_s']:>10,} msgs/s "
                  f"({row['min_msgs_s']:,}..{row['max_msgs_s']:,})")
        for name, ratio in part["ratios"].items():
            print(f"  {size:>5} B {name:<45} {ratio['median']:5.2f} ({ratio['min']:.2f}..{ratio['max']:.2f})")
        floor = part["serial_floor"]
        print(f"  {size:>5} B serial floor (pull body only, then the python floor) {floor['msgs_s']['median']:>10,.0f}"
              f" msgs/s: {floor['of_redis_xread']['median']:.2f} of Redis XREAD, Sluice's pull "
              f"{floor['sluice_pull_of_it']['median']:.2f} of it")
        for name, us in part["decode_us"].items():
            print(f"  {size:>5} B in process, {name:<40} {us:6.2f} us a message")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.every_field", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the message counts (default 1.0)")
    parser.add_argument("--rounds", type=int, default=MIN_ROUNDS, help=f"at least {MIN_ROUNDS}")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "peers_every_field.json")
    args = parser.parse_args(argv)
    load_at_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="sluice-every-field-") as tmp:
        found = run_every_field(Path(tmp), args.scale, args.rounds)
    found["load_avg_1m"] = {"start": round(load_at_start, 2), "end": round(os.getloadavg()[0], 2)}
    found["scale"] = args.scale
    print_every_field(found)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(found, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

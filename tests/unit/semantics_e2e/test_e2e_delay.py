"""Delay levels through a real broker: the message waits in SCHEDULE_TOPIC_XXXX and arrives when due."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from e2e_brokers import BrokerFactory
from e2e_util import read_topic, visible_count

from broker.client import Message, Producer, encode_message
from broker.errors import MessageIllegalError
from broker.format.message import Prop
from broker.format.system_topics import SCHEDULE_TOPIC
from tests.support.waiting import wait_until

LEVEL_2_MS = 5_000
LATE_TOLERANCE_MS = 2_500  # "late by at most ~1 s plus load": this machine runs other suites at the same time


def test_level_2_arrives_after_5_s_and_survives_a_restart_while_waiting(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    store_dir = tmp_path / "store"
    broker = broker_factory(store_dir)
    endpoint = f"127.0.0.1:{broker.port}"
    with Producer(endpoint) as producer:
        sent = producer.send(Message("Later", b"wait for me", keys=["k1"], properties={Prop.DELAY: "2", "u": "v"}))
        sent_ms = int(time.time() * 1000)
        plain = producer.send(Message("Later", b"now"))
    assert broker.store is not None and broker.store.wait_dispatched(10)
    assert visible_count(endpoint, "Later") == 1  # only the plain one
    assert broker.store.max_offset(SCHEDULE_TOPIC, 1) == 1 and sent.queue_id == 1  # level 2 = schedule queue 1
    (scheduled,) = broker.store.get_message("inspector", SCHEDULE_TOPIC, 1, 0, 1).messages()
    assert scheduled.properties[Prop.REAL_TOPIC] == "Later" and scheduled.properties[Prop.DELAY] == "2"
    broker.shutdown()  # restart while the message waits
    broker = broker_factory(store_dir)
    endpoint = f"127.0.0.1:{broker.port}"
    wait_until(lambda: visible_count(endpoint, "Later") == 2, "delivery", timeout_s=LEVEL_2_MS / 1000 + 10)
    got = [m for m in read_topic(endpoint, "Later") if m.body == b"wait for me"]
    assert len(got) == 1
    m = got[0]
    assert m.msg_id != sent.msg_id and m.msg_id != plain.msg_id  # re-stored: a new message id
    assert m.properties["u"] == "v" and m.keys == ["k1"] and m.properties[Prop.REAL_TOPIC] == "Later"
    delay_ms = m.store_timestamp - scheduled.store_timestamp  # due = stored + 5 s; never earlier, late by little
    assert LEVEL_2_MS <= delay_ms <= LEVEL_2_MS + LATE_TOLERANCE_MS, delay_ms
    assert int(time.time() * 1000) - sent_ms >= LEVEL_2_MS - 100


def test_short_levels_batch_and_clamping(broker_factory: BrokerFactory) -> None:
    broker = broker_factory()
    endpoint = f"127.0.0.1:{broker.port}"
    with Producer(endpoint) as producer:
        msgs = [Message("Soon", f"{i}".encode(), properties={Prop.DELAY: "3"} if i % 2 else {}) for i in range(100)]
        sent = producer.send_batch(msgs, queue_id=0)
        clamped = producer.send(Message("Soon", b"clamped", properties={Prop.DELAY: "99"}))  # above 18: level 18
    # delayed entries of the batch were stored in the schedule queue of level 3 (queue 2), the others in queue 0
    assert [r.queue_id for r in sent] == [2 if i % 2 else 0 for i in range(100)] and clamped.queue_id == 17
    wait_until(lambda: visible_count(endpoint, "Soon") == 101, "delayed batch delivery", timeout_s=10)
    bodies = sorted(m.body for m in read_topic(endpoint, "Soon"))
    assert bodies == sorted([f"{i}".encode() for i in range(100)] + [b"clamped"])


def test_batch_delay_is_read_from_properties_only_and_checked_before_the_rewrite(broker_factory: BrokerFactory) -> None:
    """DELAY is looked for in the entries' properties: bodies holding the bytes are stored as sent. A delayed entry
    is validated as sent (CRC included) before it is re-addressed: a damaged one refuses the batch."""
    broker = broker_factory()
    assert broker.store is not None
    endpoint = f"127.0.0.1:{broker.port}"
    fake = b"\x02DELAY\x013\x02"  # a body that looks like a DELAY property
    plain = b"".join(encode_message(Message("Body", fake + b"%d" % i, tags="t"), 0) for i in range(40))
    delayed = [encode_message(Message("Body", b"late%d" % i, properties={Prop.DELAY: "3"}), 0) for i in range(40)]
    damaged = bytearray(b"".join(delayed))
    damaged[len(damaged) // 2] ^= 0x20  # inside some delayed entry: its body CRC or its framing no longer holds
    with Producer(endpoint) as producer:
        sent = producer.send_encoded(plain, 40)
        assert [r.queue_id for r in sent] == [0] * 40  # not re-addressed to the schedule topic
        before = broker.store.max_offset(SCHEDULE_TOPIC, 2)
        with pytest.raises(MessageIllegalError, match="nothing stored"):
            producer.send_encoded(bytes(damaged), 40)
        assert broker.store.max_offset(SCHEDULE_TOPIC, 2) == before
        late = producer.send_encoded(b"".join(delayed), 40)
        assert [r.queue_id for r in late] == [2] * 40  # level 3: schedule queue 2
    wait_until(lambda: broker.store.max_offset(SCHEDULE_TOPIC, 2) == before + 40, "dispatch", timeout_s=10)
    wait_until(lambda: visible_count(endpoint, "Body") == 80, "delivery (level 3: 200 ms)", timeout_s=10)
    assert sorted(m.body for m in read_topic(endpoint, "Body")) == sorted(
        [fake + b"%d" % i for i in range(40)] + [b"late%d" % i for i in range(40)]
    )

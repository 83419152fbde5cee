"""A retried send of a timer message is stored once: the retry finds the first attempt in the timer topic, where a
timer message waits until it is due (the soak found a timer message delivered twice, at once, after a master paused
mid-send: the producer's retry was stored beside the first attempt, which a replica held, and both came due)."""

from __future__ import annotations

import time
from pathlib import Path

from broker.client import Admin
from broker.client.connection import Connection
from broker.format.message import Prop
from broker.format.system_topics import TIMER_TOPIC
from broker.proto import sluice_pb2 as pb
from tests.support.replicas import broker, brokers

TOPIC = "Timed"


def test_a_retried_timer_send_is_stored_once(tmp_path: Path) -> None:
    with brokers() as bs:
        b = broker(tmp_path / "b")
        bs.append(b)
        with Admin(b.address) as admin:
            admin.create_topic(TOPIC, 1)
        now = int(time.time() * 1000)
        props = {Prop.UNIQ_KEY: "0A0B0C0D0E0F00112233445566778899", Prop.TIMER_DELIVER_MS: str(now + 60_000)}
        request = pb.SendMessageRequest(producer_group="p", topic=TOPIC, queue_id=0, body=b"at a time",
                                        properties=props, born_timestamp=now)
        conn = Connection(b.address, 10)
        try:
            first = conn.call(conn.stub.SendMessage, request)
            request.retry = True  # the answer was lost: the producer asks again under the same UNIQ_KEY
            again = conn.call(conn.stub.SendMessage, request)
        finally:
            conn.close()
        assert b.store is not None and b.service.dedup is not None
        assert b.store.max_offset(TIMER_TOPIC, 0) == 1, "the timer message is stored once"
        assert b.service.dedup.deduplicated == 1
        assert again == first

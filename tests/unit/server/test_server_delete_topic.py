"""DeleteTopic against what runs beside it: pulls that commit offsets, a crash right after it returns, and held
pulls on other topics."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

from broker.client import Admin, Message, Producer, PullConsumer, PullStatus
from broker.client.results import PullResult
from broker.errors import BrokerError
from broker.server.broker_controller import BrokerController


def test_pulls_committing_offsets_during_delete_topic_bring_nothing_back(
    broker: BrokerController, endpoint: str
) -> None:
    """A pull checks (and commits to) a topic found in the store while DeleteTopic runs: it must not register the
    topic again, with an offset of the deleted generation that a new topic of the same name would start from."""
    with Producer(endpoint) as producer, Admin(endpoint) as admin:
        for round_ in range(5):
            topic = f"Doomed{round_}"
            producer.send_batch([Message(topic, b"x")] * 4, queue_id=0)
            stop = threading.Event()

            def pull_and_commit(topic: str = topic, stop: threading.Event = stop) -> None:
                with PullConsumer(endpoint, "G") as consumer:
                    while not stop.is_set():
                        try:
                            consumer.pull(topic, 0, 0, commit_offset=1)
                        except BrokerError:
                            pass  # the topic is gone: what is checked is what stays behind

            pullers = [threading.Thread(target=pull_and_commit) for _ in range(4)]
            for t in pullers:
                t.start()
            deadline = time.monotonic() + 10
            while ("G", topic) not in broker.offsets.groups():  # a pull's commit landed: the race is on
                assert time.monotonic() < deadline, "no pull committed"
                time.sleep(0.005)
            admin.delete_topic(topic)
            stop.set()
            for t in pullers:
                t.join(10)
            assert topic not in [t.topic for t in admin.list_topics()], f"round {round_}: {topic} is back"
            assert ("G", topic) not in broker.offsets.groups(), f"round {round_}: an offset of {topic} is back"


def test_delete_topic_has_removed_the_offsets_on_disk_when_it_returns(broker: BrokerController, endpoint: str) -> None:
    """Offsets are saved every 5 s; a crash in that window after DeleteTopic brought the deleted topic's offsets
    back, and a new topic of the same name was read from the old offset on (its first messages skipped)."""
    with Producer(endpoint) as producer, Admin(endpoint) as admin, PullConsumer(endpoint, "G") as consumer:
        producer.send_batch([Message("Gone", b"x")] * 10, queue_id=0)
        consumer.commit_offsets({("Gone", 0): 10})
        broker.offsets.persist()  # on disk, as the periodic save would have it
        admin.delete_topic("Gone")
    saved = json.loads(broker.offsets.path.read_text())["offsetTable"]
    assert not [key for key in saved if key.startswith("Gone@")], saved


def test_delete_topic_wakes_held_pulls_of_other_topics(broker_factory: Callable[..., BrokerController]) -> None:
    """DeleteTopic dispatches whatever is pending, for every topic: a pull held on another topic whose message
    it dispatched was left waiting for the 60 s re-check here (5 s by default)."""
    broker = broker_factory(long_polling_recheck_ms=60_000)
    endpoint = f"127.0.0.1:{broker.port}"
    with Producer(endpoint) as producer, Admin(endpoint) as admin, PullConsumer(endpoint, "G") as consumer:
        admin.create_topic("Other", 1)
        producer.send(Message("Victim", b"v"), queue_id=0)
        assert broker.store._dispatch_service is not None
        broker.store._dispatch_service.stop()  # from here only DeleteTopic's own pass dispatches
        results: list[PullResult] = []
        held = threading.Thread(target=lambda: results.append(consumer.pull("Other", 0, 0, timeout_ms=30_000)))
        held.start()
        producer.send(Message("Other", b"for the held pull"), queue_id=0)  # stored, not dispatched
        admin.delete_topic("Victim")
        held.join(10)
        assert not held.is_alive(), "the held pull was not woken by what DeleteTopic dispatched"
    (r,) = results
    assert r.status is PullStatus.FOUND and [m.body for m in r.messages] == [b"for the held pull"]

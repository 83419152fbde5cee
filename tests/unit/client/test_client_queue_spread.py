"""Producers spread messages over a topic's queues as RocketMQ's do: round-robin from a random first queue, for
single sends and for batches (contiguous runs on consecutive queues), and the `sluice send` command with them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

from broker.client import Admin, Message, Producer
from broker.server.broker_controller import BrokerController

QUEUES = 8


def test_a_batch_is_spread_over_every_queue_in_contiguous_runs(broker: BrokerController, endpoint: str) -> None:
    """Every message of a send_batch went to one queue (and every new Producer's first batch to queue 0)."""
    with Admin(endpoint) as admin:
        admin.create_topic("Spread", QUEUES)
    with Producer(endpoint) as p:
        qids = [r.queue_id for r in p.send_batch([Message("Spread", b"%d" % i) for i in range(80)])]
        runs = [qids[i * 10] for i in range(QUEUES)]
        assert qids == [q for q in runs for _ in range(10)]  # ten messages per queue, each run contiguous
        assert runs == [(runs[0] + i) % QUEUES for i in range(QUEUES)]  # on consecutive queues
        small = [r.queue_id for r in p.send_batch([Message("Spread", b"s")] * 3)]
        assert small == [(runs[0] + i) % QUEUES for i in range(3)]  # the next batch starts after the last run
        assert p.send(Message("Spread", b"one")).queue_id == (runs[0] + 3) % QUEUES  # and single sends go on
        assert {r.queue_id for r in p.send_batch([Message("Spread", b"k")] * 5, sharding_key="k")} == {
            p.select_queue("Spread", "k").queue_id
        }  # a key still pins every message to its queue
        assert {r.queue_id for r in p.send_batch([Message("Spread", b"q")] * 5, queue_id=6)} == {6}
    assert broker.store is not None and broker.store.wait_dispatched()
    with Admin(endpoint) as admin:
        assert all(hi >= 10 for _, hi in admin.queue_offsets("Spread").values())


def test_a_mixed_topic_batch_spreads_each_topic_over_its_own_queues(broker: BrokerController, endpoint: str) -> None:
    with Admin(endpoint) as admin:
        admin.create_topic("SpreadA", 4)
        admin.create_topic("SpreadB", 2)
    msgs = [Message("SpreadA" if i % 3 else "SpreadB", b"%d" % i) for i in range(60)]
    with Producer(endpoint) as p:
        results = p.send_batch(msgs)
    per_topic = Counter((m.topic, r.queue_id) for m, r in zip(msgs, results, strict=True))
    assert sorted(n for (t, _), n in per_topic.items() if t == "SpreadA") == [10, 10, 10, 10]
    assert sorted(n for (t, _), n in per_topic.items() if t == "SpreadB") == [10, 10]


def test_each_new_producer_starts_at_a_random_queue(broker: BrokerController, endpoint: str) -> None:
    """Each Producer began its round-robin at queue 0: short-lived producers (one `sluice send` each) all wrote
    queue 0. With a random start, 24 producers land on one queue with probability 8**-23."""
    with Admin(endpoint) as admin:
        admin.create_topic("Start", QUEUES)
    first = set()
    for _ in range(24):
        with Producer(endpoint) as p:
            first.add(p.send(Message("Start", b"x")).queue_id)
    assert len(first) > 1, first


def test_sluice_send_spreads_over_the_queues(broker: BrokerController, endpoint: str) -> None:
    """`sluice send --count 3000` documented round-robin but put all 3000 messages in queue 0."""
    with Admin(endpoint) as admin:
        admin.create_topic("CliSpread", QUEUES)
    env = {**os.environ, "SLUICE_ENDPOINT": endpoint}
    out = subprocess.run([sys.executable, "-m", "broker", "send", "CliSpread", "--count", "3000", "--size", "10"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and "sent 3000 messages" in out.stdout, out.stderr
    assert broker.store is not None and broker.store.wait_dispatched()
    with Admin(endpoint) as admin:
        counts = sorted(hi - lo for lo, hi in admin.queue_offsets("CliSpread").values())
    assert sum(counts) == 3000 and counts[0] >= 3000 // QUEUES - 3, counts  # 375 each, give or take a run


def test_batch_results_and_unique_keys_match_what_was_stored(broker: BrokerController, endpoint: str) -> None:
    """A batch's results, built in one pass, name each message where it was stored, whether the batch went in one
    call or was cut into several by batch_limit_bytes; a message's own UNIQ_KEY is kept, the others get fresh
    ones, and none repeats."""
    from broker.format.message import Prop

    with Admin(endpoint) as admin:
        admin.create_topic("Results", 1)
    with Producer(endpoint) as p:
        msgs = [Message("Results", b"%d" % i, properties={Prop.UNIQ_KEY: "mine"} if i == 7 else {}) for i in range(50)]
        whole = p.send_batch(msgs, queue_id=0)
        p.batch_limit_bytes = 1_000  # several calls for the same messages
        parts = p.send_batch(msgs, queue_id=0)
    assert [r.queue_offset for r in whole + parts] == list(range(100))
    assert whole[7].uniq_key == parts[7].uniq_key == "mine"
    fresh = [r.uniq_key for r in whole + parts if r.uniq_key != "mine"]
    assert len(set(fresh)) == len(fresh) == 98
    assert broker.store is not None and broker.store.wait_dispatched()
    for r in (whole[3], parts[49]):
        found = broker.store.query_by_key("Results", r.uniq_key)
        assert [m.queue_offset for m in found] == [r.queue_offset]
        assert found[0].msg_id == r.msg_id


def test_unique_key_blocks_never_overlap_across_threads() -> None:
    import threading

    from broker.client.producer import UniqKeys

    keys = UniqKeys()
    taken: list[list[str]] = [[] for _ in range(4)]

    def take(k: int) -> None:
        for n in range(200):
            taken[k] += keys.take(n % 7) if k % 2 else [keys.next()]

    threads = [threading.Thread(target=take, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [key for keys_of in taken for key in keys_of]
    assert len(every) == len(set(every)) == 2 * 200 + 2 * sum(n % 7 for n in range(200))

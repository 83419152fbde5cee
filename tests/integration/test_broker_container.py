"""The broker image as users run it: a host producer and consumer (broker.client) against the container, the
CLI inside the container, the health check, and a graceful stop that keeps everything."""

from __future__ import annotations

import random
import time

import docker
import pytest
from sluice_containers import BrokerFactory, check_store, exec_json, exec_text, run_in_volume

from broker.client import Admin, Message, Producer, PullConsumer, PullStatus, SendResult, SendStatus
from broker.testing import STORE_DIR, SluiceContainer
from tests.support.brokers import wait_dispatched

pytestmark = pytest.mark.integration

TOPIC = "orders"
QUEUES = 4
MESSAGES = 5000
HEALTHY_TIMEOUT_S = 60.0


def mixed_messages(rng: random.Random, count: int) -> list[Message]:
    """Bodies from 0 B to 8 KiB with random bytes, tags, keys and properties, each identifiable by its index."""
    messages = []
    for i in range(count):
        size = rng.choice((0, 1, 100, 1024, 8192, rng.randrange(1, 4096)))
        body = i.to_bytes(4, "big") + rng.randbytes(size)
        messages.append(
            Message(
                TOPIC,
                body,
                tags=rng.choice(("TagA", "TagB", None)),
                keys=(f"k{i}", f"order-{i % 97}"),
                properties={"index": str(i), "region": rng.choice(("eu", "us", "ap")), "unicode": "ü€😀"},
            )
        )
    return messages


def max_offsets(results: list[SendResult]) -> dict[int, int]:
    """Queue id -> the max offset (one past the last) these acknowledged sends imply."""
    out: dict[int, int] = {}
    for r in results:
        out[r.queue_id] = max(out.get(r.queue_id, 0), r.queue_offset + 1)
    return out


def pull_all(endpoint: str, group: str, topic: str, queues: int) -> dict[int, list]:
    """Every message of every queue, in queue order, from offset 0."""
    out: dict[int, list] = {}
    with PullConsumer(endpoint, group) as consumer:
        for qid in range(queues):
            offset, got = 0, []
            while True:
                result = consumer.pull(topic, qid, offset, max_msgs=1000)
                if result.status is not PullStatus.FOUND:
                    break
                got += result.messages
                offset = result.next_begin_offset
            out[qid] = got
    return out


def test_host_producer_and_consumer_round_trip_byte_exact(broker: SluiceContainer) -> None:
    rng = random.Random(7)
    sent = mixed_messages(rng, MESSAGES)
    with Admin(broker.get_endpoint()) as admin:
        admin.create_topic(TOPIC, queues=QUEUES)
    with Producer(broker.get_endpoint()) as producer:
        results = [producer.send(m) for m in sent[:100]]  # single sends
        for start in range(100, MESSAGES, 500):  # and batches, round-robin over the queues
            results += producer.send_batch(sent[start : start + 500])
    assert all(r.status is SendStatus.SEND_OK for r in results)
    where = {(r.queue_id, r.queue_offset): m for r, m in zip(results, sent, strict=True)}
    assert len(where) == MESSAGES, "two messages were given the same queue offset"
    wait_dispatched(broker.get_endpoint(), TOPIC, max_offsets(results))

    received = pull_all(broker.get_endpoint(), "it-roundtrip", TOPIC, QUEUES)
    assert sum(len(v) for v in received.values()) == MESSAGES
    for qid, messages in received.items():
        assert [m.queue_offset for m in messages] == list(range(len(messages))), f"queue {qid} has gaps"
        for got in messages:
            want = where[(qid, got.queue_offset)]
            assert got.body == want.body
            assert got.topic == TOPIC
            assert got.tags == want.tags
            assert list(got.keys) == list(want.keys)
            for name, value in want.properties.items():
                assert got.properties[name] == value


def test_committed_offsets_and_lag_seen_from_the_host(broker: SluiceContainer) -> None:
    with Producer(broker.get_endpoint()) as producer:
        producer.send_batch([Message("lagged", f"m{i}".encode()) for i in range(300)], queue_id=0)
    wait_dispatched(broker.get_endpoint(), "lagged", {0: 300})
    with PullConsumer(broker.get_endpoint(), "it-lag") as consumer:
        result = consumer.pull("lagged", 0, 0, max_msgs=100)
        assert len(result.messages) == 100
        consumer.commit_offsets({("lagged", 0): result.next_begin_offset})
        assert consumer.committed_offsets("lagged") == {0: 100}
    with Admin(broker.get_endpoint()) as admin:
        lag = {q.queue_id: q for q in admin.consumer_lag("it-lag", "lagged")}
    assert (lag[0].broker_offset, lag[0].consumer_offset, lag[0].lag) == (300, 100, 200)


def test_cli_inside_the_container(broker: SluiceContainer) -> None:
    endpoint = ["--endpoint", "127.0.0.1:10911"]
    code, out = exec_text(broker, "sluice", "topic", "create", "cli-topic", "--queues", "2", *endpoint)
    assert code == 0, out
    send = ("sluice", "send", "cli-topic", "--count", "25", "--size", "64", "--queue", "1", *endpoint)
    code, out = exec_text(broker, *send)
    assert code == 0, out
    wait_dispatched(broker.get_endpoint(), "cli-topic", {1: 25})
    topics = {t["topic"]: t for t in exec_json(broker, "sluice", "topic", "list", "--json", *endpoint)}
    assert topics["cli-topic"]["write_queue_nums"] == 2
    described = exec_json(broker, "sluice", "topic", "describe", "cli-topic", "--json", *endpoint)
    assert {q["queue_id"]: (q["min_offset"], q["max_offset"]) for q in described["queues"]} == {0: (0, 0), 1: (0, 25)}
    code, out = exec_text(
        broker, "sluice", "consume", "cli-topic", "--group", "cli-g", "--from", "earliest", "--max", "25", *endpoint
    )
    assert code == 0, out
    assert out.count("1:") >= 25, out  # one line per message, "queue:offset ..."
    lag = exec_json(broker, "sluice", "group", "lag", "cli-g", "--json", *endpoint)
    assert lag["total_lag"] == 0, lag
    stats = exec_json(broker, "sluice", "stats", "--json", *endpoint)
    assert stats["broker_put_messages"] >= 25
    # What the host sees agrees with what the CLI did.
    with Admin(broker.get_endpoint()) as admin:
        assert admin.queue_offsets("cli-topic")[1] == (0, 25)
        assert {q.queue_id: q.consumer_offset for q in admin.consumer_lag("cli-g", "cli-topic")}[1] == 25


def test_cli_bad_input_is_a_clear_error(broker: SluiceContainer) -> None:
    code, out = exec_text(broker, "sluice", "topic", "create", "bad topic!", "--endpoint", "127.0.0.1:10911")
    assert code != 0
    # the broker's validation, not any error (a connection failure also names the topic command)
    assert "topic 'bad topic!' has characters outside ^[%|a-zA-Z0-9_-]+$" in out, out
    assert "Traceback" not in out


def test_health_check_reports_healthy(broker: SluiceContainer) -> None:
    deadline = time.monotonic() + HEALTHY_TIMEOUT_S
    status = ""
    while time.monotonic() < deadline:
        broker.get_wrapped_container().reload()
        status = broker.get_wrapped_container().attrs["State"]["Health"]["Status"]
        if status == "healthy":
            break
        time.sleep(0.5)
    assert status == "healthy", broker.get_wrapped_container().attrs["State"]["Health"]


def test_runs_as_non_root_with_store_on_the_volume(broker: SluiceContainer) -> None:
    code, out = exec_text(broker, "id", "-un")
    assert (code, out.strip()) == (0, "sluice")
    mounts = {m["Destination"]: m for m in broker.get_wrapped_container().attrs["Mounts"]}
    assert mounts["/var/lib/sluice"]["Type"] == "volume"


def test_graceful_stop_and_restart_keep_everything(
    broker_factory: BrokerFactory, docker_client: docker.DockerClient, broker_image: str
) -> None:
    broker = broker_factory()
    bodies = [f"kept-{i}".encode() for i in range(1000)]
    with Producer(broker.get_endpoint()) as producer:
        producer.send_batch([Message("kept", b) for b in bodies], queue_id=0)
    wait_dispatched(broker.get_endpoint(), "kept", {0: len(bodies)})
    with PullConsumer(broker.get_endpoint(), "it-kept") as consumer:
        consumer.commit_offsets({("kept", 0): 600})
    broker.terminate()  # SIGTERM: the broker flushes and persists offsets
    assert broker.exit_code() == 0, broker.log_text()[-2000:]
    assert check_store(docker_client, broker_image, broker.volume) == []
    broker.restart()
    wait_dispatched(broker.get_endpoint(), "kept", {0: len(bodies)})
    received = pull_all(broker.get_endpoint(), "it-kept-2", "kept", 1)[0]
    assert [m.body for m in received] == bodies
    with PullConsumer(broker.get_endpoint(), "it-kept") as consumer:
        assert consumer.committed_offsets("kept") == {0: 600}


def test_second_broker_on_the_same_volume_is_refused(
    broker: SluiceContainer, docker_client: docker.DockerClient, broker_image: str
) -> None:
    """The store lock holds across containers: a second broker on a volume in use exits with a clear error,
    and the first one keeps serving."""
    code, output = run_in_volume(
        docker_client, broker_image, broker.volume,
        "sluice", "broker", "--store", STORE_DIR, "--listen", "0.0.0.0:10911", timeout_s=60,
    )
    assert code != 0, output
    assert "locked" in output and STORE_DIR in output, output
    assert "Traceback" not in output
    with Producer(broker.get_endpoint()) as producer:
        assert producer.send(Message("still-up", b"x")).status is SendStatus.SEND_OK

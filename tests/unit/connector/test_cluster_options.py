"""The connector's cluster parts that need no broker: options, offsets naming brokers, the coordinator's choice and
rows encoded per broker."""

from __future__ import annotations

import pyarrow as pa
import pytest

from broker.client.route import MessageQueue
from broker.errors import MessageIllegalError
from broker.format.message import iter_entries, java_string_hash
from connector.arrow_encoder import RowEncoder
from connector.cluster_commit import choose_coordinator, coordinator_of, query_prefix
from connector.connector_errors import SourceOptionError
from connector.offsets import SourceOffset, parse_positions
from connector.options import parse_options
from connector.sink_options import parse_sink_options


def test_namesrv_replaces_endpoints() -> None:
    o = parse_options({"namesrv": "ns1:9876, ns2", "topic": "t"}, streaming=True)
    assert o.cluster and o.namesrv == "ns1:9876,ns2:9876" and o.endpoints is None and o.broker_name is None
    assert not parse_options({"endpoints": "h:1", "topic": "t"}, streaming=True).cluster
    for bad, needle in (
        ({"namesrv": "ns:1", "endpoints": "h:1"}, "not both"),
        ({"namesrv": "ns:1", "brokerName": "broker-a"}, "drop 'brokerName'"),
        ({"namesrv": ""}, "namesrv"),
        ({"namesrv": "ns:0"}, "namesrv"),
        ({}, "namesrv"),  # neither: the message names both ways
    ):
        with pytest.raises(SourceOptionError, match=needle):
            parse_options({"topic": "t", **bad}, streaming=True)
    sink = parse_sink_options({"namesrv": "ns:9", "topic": "t"})
    assert sink.namesrv == "ns:9" and sink.endpoints is None
    with pytest.raises(SourceOptionError, match="not both"):
        parse_sink_options({"namesrv": "ns:9", "endpoints": "h:1", "topic": "t"})


def test_offsets_name_each_queue_s_broker() -> None:
    data = {"t": {"broker-a:0": 5, "broker-b:0": 7, "broker:with:colons:3": 1}}
    positions = parse_positions(None, data, what="offset")  # a cluster: any broker
    assert positions == {("t", "broker-a", 0): 5, ("t", "broker-b", 0): 7, ("t", "broker:with:colons", 3): 1}
    assert SourceOffset(positions).to_json() == data
    with pytest.raises(SourceOptionError, match="names queue broker-a:0 twice"):
        parse_positions(None, {"t": {"broker-a:0": 1, "broker-a:00": 2}}, what="offset")
    with pytest.raises(SourceOptionError, match="does not name a broker"):
        parse_positions(None, {"t": {":0": 1}}, what="offset")
    # One broker: a checkpoint written by a cluster query names other brokers and is refused, naming the option.
    with pytest.raises(SourceOptionError, match="brokerName"):
        SourceOffset.from_json("broker-a", data)


def test_the_coordinator_is_chosen_by_rendezvous_hashing() -> None:
    brokers = [f"broker-{c}" for c in "abcdef"]
    chosen = {q: choose_coordinator(q, brokers) for q in (f"query-{i}" for i in range(600))}
    assert set(chosen.values()) == set(brokers)  # queries spread over every broker
    assert chosen == {q: choose_coordinator(q, list(reversed(brokers))) for q in chosen}  # order does not matter
    for gone in brokers:  # a broker leaving moves only the queries it coordinated
        rest = [b for b in brokers if b != gone]
        assert all(choose_coordinator(q, rest) == c for q, c in chosen.items() if c != gone)
    grown = [*brokers, "broker-g"]  # one joining takes only queries it now wins
    assert all(choose_coordinator(q, grown) in (c, "broker-g") for q, c in chosen.items())
    txn = f"spark:q1:7:run-1@{chosen['query-1']}"
    assert coordinator_of(txn) == chosen["query-1"] and query_prefix(txn) == "spark:q1:"
    assert query_prefix("spark-batch:abc@broker-a") == "spark-batch:abc"


def test_rows_are_encoded_in_chunks_of_one_broker() -> None:
    queues = [MessageQueue("Out", b, q) for b in ("broker-a", "broker-b") for q in range(2)]
    enc = RowEncoder(default_topic="Out", queues=lambda t: queues, batch_messages=3)
    batch = pa.RecordBatch.from_pydict({"body": [f"r{i}" for i in range(10)], "sharding_key": [None] * 8 + ["k", "k"]})
    chunks = list(enc.encode(batch))
    placed: dict[str, list[tuple[str, int]]] = {}
    for chunk in chunks:
        assert chunk.count <= 3
        for e in iter_entries(chunk.buffer):
            placed.setdefault(e.body.decode(), []).append((chunk.broker, e.queue_id))
    assert sorted(placed) == sorted(f"r{i}" for i in range(10))
    assert {b for spots in placed.values() for b, _ in spots} == {"broker-a", "broker-b"}
    # A sharding key picks hash % len of the route-ordered queues, as Producer.send(sharding_key=...) does.
    k = queues[abs(java_string_hash("k")) % len(queues)]
    assert placed["r8"] == placed["r9"] == [(k.broker_name, k.queue_id)]
    with pytest.raises(MessageIllegalError, match="queue_id names no queue in a cluster"):
        list(enc.encode(pa.RecordBatch.from_pydict({"body": ["x"], "queue_id": [0]})))

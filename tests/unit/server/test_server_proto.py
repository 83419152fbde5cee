"""The committed gRPC stubs are exactly what `make proto` generates from broker/proto/sluice.proto."""

from __future__ import annotations

from pathlib import Path

from broker.proto import build


def test_committed_stubs_match_regenerated(tmp_path: Path) -> None:
    generated = build.generate(tmp_path)
    names = sorted(p.name for p in generated)
    assert "sluice_pb2.py" in names and "sluice_pb2_grpc.py" in names
    for fresh in generated:
        committed = build.PROTO_DIR / fresh.name
        assert committed.exists(), f"{fresh.name} is not committed; run `make proto`"
        assert committed.read_text() == fresh.read_text(), f"{fresh.name} is stale; run `make proto` and commit"


def test_every_rpc_of_the_contract_is_in_the_service() -> None:
    from broker.proto import sluice_pb2 as pb

    methods = set(pb.DESCRIPTOR.services_by_name["Broker"].methods_by_name)
    required = {
        "SendMessage", "SendBatch", "PullMessage", "QueryConsumerOffset", "UpdateConsumerOffsets", "GetQueueOffsets",
        "SearchOffsetByTimestamp", "QueryMessageByKey", "ViewMessageById", "CreateTopic", "DeleteTopic",
        "ListTopics", "Heartbeat", "GetConsumerList", "GetConsumerLag", "GetBrokerStats",
    }
    assert required <= methods, required - methods
    assert pb.DESCRIPTOR.package == "sluice.v1"

"""Fuzzing a running broker process through its raw gRPC API, one family of requests at a time: generated SendBatch
buffers (well made, lying, damaged; plain and transactional), SendMessage with any fields, a request of every
RPC built from the service's descriptors, and bytes that are no request at all.

After each family (fuzz_oracle.Fuzzer.end_family): the broker answers; every call was answered OK or refused
clearly (a Sluice response code, never INTERNAL); every acknowledged message reads back byte for byte, by msgId
and by pull; the family's transactions commit with exactly their acknowledged halves; the store passes check()
once the broker is stopped, and everything reads back again after the restart.

The default run is short (deterministic, about a minute here); ``make fuzz`` sets SLUICE_FUZZ_LONG=1: fifteen
times the examples, random ones, and a SIGKILL instead of a clean stop after every other family.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.client.half_batch import half_suffix
from broker.format.batch import scan
from broker.format.message import Prop, decode_entry
from broker.format.numbers import is_ascii_digits
from broker.format.transaction_codec import HALF_TOPIC_BYTES
from broker.proto import sluice_pb2 as pb
from tests.unit.fuzz.fuzz_oracle import FUZZ_SETTINGS, SCALE, STORE_SETTINGS, Fuzzer, started_fuzzer
from tests.unit.fuzz.fuzz_strategies import (
    BAD_TOPICS,
    GROUP,
    KEPT_TOPICS,
    batches,
    mutate,
    names,
    not_requests,
    numbers,
    pack_entry,
    requests,
    special,
    values,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fuzzer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzer]:
    with started_fuzzer(tmp_path_factory.mktemp("fuzz"), {"store": STORE_SETTINGS}) as f:
        yield f


def _entries_of(buffer: bytes) -> list[bytes]:
    run = scan(buffer, 0, len(buffer), verify_crc=False)
    return [buffer[p : p + s] for p, s in zip(run.positions.tolist(), run.sizes.tolist(), strict=True)]


def _delayed(entry: bytes) -> bool:
    delay = decode_entry(entry).properties.get(Prop.DELAY)
    return delay is not None and is_ascii_digits(delay) and int(delay) > 0


def test_send_batch_family(fuzzer: Fuzzer) -> None:
    serial = itertools.count()

    @settings(FUZZ_SETTINGS, max_examples=150 * SCALE)
    @given(batches())
    def one(b: dict[str, Any]) -> None:
        n = next(serial)
        txn = f"fz-batch-{n // 3}" if b["transaction"] else ""  # three batches in a row may join one transaction
        parts = []
        for e in b["entries"]:
            body = f"batch{n}.{len(parts)}|".encode() + e["body"]  # unique: committed messages are found by body
            fields = {k: e[k] for k in ("flag", "sys_flag", "born", "reconsume")}
            if b["transaction"] == "half" and e["topic"].decode("utf-8", "replace").isascii():
                suffix = half_suffix(e["topic"], e["queue_id"] & 0xFFFF, GROUP, txn)
                parts.append(pack_entry(HALF_TOPIC_BYTES, 0, body, e["props"] + suffix, **fields))
            else:
                parts.append(pack_entry(e["topic"], e["queue_id"], body, e["props"], **fields))
        buffer = mutate(b"".join(parts), 0, b["mutation"], b["where"], b["garbage"])
        count = len(parts) + (1 if b["mutation"] == "lying count" else 0)
        request = pb.SendBatchRequest(entries=buffer, count=count, transaction_id=txn, producer_group=GROUP)
        a = fuzzer.call("SendBatch", request)
        if a.ok:
            stored = _entries_of(buffer)
            fuzzer.sent_batch(request, a, stored, [not txn and not _delayed(e) for e in stored])

    one()
    print(fuzzer.end_family("SendBatch buffers"))


def test_send_message_family(fuzzer: Fuzzer) -> None:
    serial = itertools.count()
    topics = st.one_of(st.sampled_from(KEPT_TOPICS), st.integers(0, 400).map(lambda i: f"FzNew{i}"),
                       st.sampled_from(BAD_TOPICS))
    props = st.dictionaries(st.one_of(names, special, st.just("DELAY")), st.one_of(values, numbers), max_size=5)

    @settings(FUZZ_SETTINGS, max_examples=100 * SCALE)
    @given(topics, st.one_of(st.integers(-1, 7), st.sampled_from([8, 65536, -(2**31)])), st.binary(max_size=200),
           props, st.sampled_from([0, 0, 1, 4, 8, -1]), st.sampled_from([0, 0, 5, -1]), st.sampled_from(["", "", "tx"]),
           st.sampled_from(["", GROUP, "bad group"]))
    def one(topic: str, queue_id: int, body: bytes, properties: dict[str, str], sys_flag: int, reconsume: int,
            txn: str, group: str) -> None:
        n = next(serial)
        delay = properties.get("DELAY", "")
        if is_ascii_digits(delay) and len(delay) <= 10 and int(delay) > 0:
            properties = {**properties, "DELAY": "0"}  # a delayed message is read back only once delivered
        request = pb.SendMessageRequest(
            topic=topic, queue_id=queue_id, body=f"msg{n}|".encode() + body, properties=properties,
            sys_flag=sys_flag, reconsume_times=reconsume, transactional=bool(txn),
            transaction_id=f"fz-msg-{n}" if txn else "", producer_group=group,
        )
        a = fuzzer.call("SendMessage", request)
        fuzzer.sent_message(request, a)
        if a.ok and txn:
            fuzzer.sent_half(a.response.transaction_id, topic, queue_id, request.body)

    one()
    print(fuzzer.end_family("SendMessage fields"))


def test_every_rpc_family(fuzzer: Fuzzer) -> None:
    @settings(FUZZ_SETTINGS, max_examples=400 * SCALE)
    @given(requests())
    def one(call: tuple[str, bool, Any]) -> None:
        method, streaming, request = call
        fuzzer.call_raw(method, request.SerializeToString(), streaming=streaming)

    one()
    print(fuzzer.end_family("a request of every RPC"))


def test_bytes_that_are_no_request_family(fuzzer: Fuzzer) -> None:
    methods = [(m.name, m.server_streaming) for m in pb.DESCRIPTOR.services_by_name["Broker"].methods]

    @settings(FUZZ_SETTINGS, max_examples=150 * SCALE)
    @given(st.sampled_from(methods), not_requests())
    def one(method: tuple[str, bool], data: bytes) -> None:
        fuzzer.call_raw(method[0], data, streaming=method[1])

    one()
    print(fuzzer.end_family("bytes that are no request"))


def test_the_families_saw_both_outcomes(fuzzer: Fuzzer) -> None:
    """A fuzz run that refused everything (or nothing) proves little: both must have happened, and messages been
    acknowledged and read back."""
    assert fuzzer.families == 4 and fuzzer.calls > fuzzer.refused > 0 and len(fuzzer.acked) > 10, (
        fuzzer.families, fuzzer.calls, fuzzer.refused, len(fuzzer.acked)
    )

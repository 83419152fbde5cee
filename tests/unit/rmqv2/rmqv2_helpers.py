"""Helpers of the RocketMQ 5 protocol tests: broker processes, the official client's objects, polling."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from rocketmq import ClientConfiguration, Credentials, Message, Producer, SimpleConsumer
from rocketmq import FilterExpression as RmqFilter

from broker.client import Admin
from broker.proto import sluice_pb2 as pb

T = TypeVar("T")

ROOT: dict[str, Any] = {"access_key": "root", "secret_key": "root-secret-value"}  # the secured brokers' root user
# A broker that authenticates every call: its root is ROOT; plaintext signatures allowed, as the official client signs
AUTH: dict[str, Any] = {"auth_enabled": True, "allow_plaintext_auth": True, "auth_root_access_key": ROOT["access_key"],
                        "auth_root_secret_key": ROOT["secret_key"]}

FAST: dict[str, Any] = {
    "pop_min_invisible_ms": 1000,  # RocketMQ's 10 s minimum would make every redelivery test wait 10 s
    "transaction_timeout_ms": 1000,
    "transaction_check_interval_ms": 200,
    "message_delay_level": " ".join(["1s"] * 18),  # a failed PushConsumer message comes back after 1 s
    "store": {"mapped_file_size_commit_log": 16 << 20, "mapped_file_size_consume_queue": 4000 * 20,
              "max_hash_slot_num": 4096, "max_index_num": 16384},
}


def create_user(endpoint: str, access_key: str, *grants: tuple[str, list[str]]) -> tuple[str, str]:
    """User ``access_key`` (secret ``<access_key>-secret``), created by ROOT, holding ``grants`` ((resource,
    actions) each); its (access key, secret key)."""
    with Admin(endpoint, **ROOT) as admin:
        conn = admin.router.direct
        conn.call(conn.stub.CreateUser, pb.UserRequest(access_key=access_key, secret_key=f"{access_key}-secret"))
        for resource, actions in grants:
            conn.call(conn.stub.GrantAcl, pb.GrantAclRequest(entry=pb.AclEntry(access_key=access_key,
                                                                               resource=resource, actions=actions)))
    return access_key, f"{access_key}-secret"


def name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def new_topic(endpoint: str, queues: int = 4) -> str:
    topic = name("t")
    with Admin(endpoint) as admin:
        admin.create_topic(topic, queues)
    return topic


def client_config(endpoint: str) -> ClientConfiguration:
    return ClientConfiguration(endpoint, Credentials(), request_timeout=10)


def message(topic: str, body: bytes, *, tag: str | None = None, keys: list[str] | None = None,
            group: str | None = None, deliver_s: int | None = None,
            properties: dict[str, str] | None = None) -> Message:
    m = Message()
    m.topic, m.body = topic, body
    if tag:
        m.tag = tag
    for k in keys or ():
        m.keys = k  # the client's setter adds one key per assignment
    if group:
        m.message_group = group
    if deliver_s:
        m.delivery_timestamp = deliver_s
    for k, v in (properties or {}).items():
        m.add_property(k, v)
    return m


@contextmanager
def producer(endpoint: str, *topics: str, checker: Any = None) -> Iterator[Producer]:
    p = Producer(client_config(endpoint), topics, checker)
    p.startup()
    try:
        yield p
    finally:
        p.shutdown()


@contextmanager
def simple_consumer(endpoint: str, group: str, topic: str, tag: str = "*", wait_s: int = 2) -> Iterator[SimpleConsumer]:
    c = SimpleConsumer(client_config(endpoint), group, {topic: RmqFilter(tag)}, await_duration=wait_s)
    c.startup()
    try:
        yield c
    finally:
        c.shutdown()


def receive_until(consumer: SimpleConsumer, count: int, invisible_s: int, timeout_s: float = 30.0,
                  ack: bool = True) -> list[Message]:
    """Receive (and ack) until ``count`` messages came, or fail after ``timeout_s``."""
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count:
        assert time.monotonic() < deadline, f"received {len(out)} of {count} in {timeout_s} s"
        for m in consumer.receive(32, invisible_s):
            out.append(m)
            if ack:
                consumer.ack(m)
    return out



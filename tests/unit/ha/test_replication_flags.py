"""The replication settings as ``sluice broker`` flags (--role, --controller, --ha-listen, --ha-secret-file,
--min-insync-replicas): brokers started with them and no config file replicate as configured."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from broker.client import Admin, Message, Producer, PullConsumer
from broker.client.route import DIRECT_BROKER, MessageQueue
from broker.errors import BrokerError, NotEnoughReplicasError
from broker.ha.etcd_process import EtcdProcess, free_port
from broker.namesrv.local_cluster import NameServerProcess
from broker.private_file import write_private
from broker.server.process import BrokerProcess
from tests.support.waiting import wait_until

FLAGS = ("--role", "--controller", "--ha-listen", "--ha-secret-file", "--min-insync-replicas")
SECRET = b"flags-test-group-secret-0123456789"


@pytest.fixture
def processes() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def _secret(tmp_path: Path) -> Path:
    path = tmp_path / "group.secret"
    write_private(path, SECRET)
    return path


def _replica(stack: ExitStack, store: Path, *flags: str) -> BrokerProcess:
    proc = BrokerProcess(store, extra_args=["--broker-name", "flags", "--register-interval-ms", "500", *flags])
    return stack.enter_context(proc)  # started on entry


def _stored(endpoint: str, topic: str) -> list[bytes]:
    """The bodies in queue 0 of ``topic`` as ``endpoint`` serves them ([] while it does not know the topic)."""
    with PullConsumer(endpoint=endpoint, group="flags-reader") as consumer:
        try:
            return [m.body for m in consumer.pull(MessageQueue(topic, DIRECT_BROKER, 0), 0).messages]
        except BrokerError:
            return []


def test_help_lists_the_replication_flags() -> None:
    out = subprocess.run([sys.executable, "-m", "broker", "broker", "--help"], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    for flag in FLAGS:
        assert flag in out, f"{flag} missing from sluice broker --help"


def test_classic_pair_from_flags_alone(tmp_path: Path, processes: ExitStack) -> None:
    """A SYNC_MASTER needing 2 in-sync replicas refuses a send alone; once a SLAVE (found through the name server,
    the same secret) joins, a send is acknowledged and the slave serves it."""
    namesrv = NameServerProcess(broker_expire_ms=3000).start()
    processes.callback(namesrv.stop)
    secret = str(_secret(tmp_path))
    common = ["--namesrv", namesrv.address, "--ha-secret-file", secret]
    master = _replica(processes, tmp_path / "m", *common, "--role", "SYNC_MASTER", "--broker-id", "0",
                      "--ha-listen", f"127.0.0.1:{free_port()}", "--min-insync-replicas", "2")
    with Admin(master.endpoint) as admin:
        admin.create_topic("Flags", 1)
    with Producer(endpoint=master.endpoint) as producer, pytest.raises(NotEnoughReplicasError):
        producer.send(Message("Flags", b"alone"), queue_id=0)
    assert _stored(master.endpoint, "Flags") == []  # refused before anything was written

    slave = _replica(processes, tmp_path / "s", *common, "--role", "slave", "--broker-id", "1",
                     "--ha-listen", f"127.0.0.1:{free_port()}")

    def send() -> bool:
        try:
            with Producer(endpoint=master.endpoint) as producer:
                producer.send(Message("Flags", b"replicated"), queue_id=0)
        except NotEnoughReplicasError:
            return False  # the slave is not in sync yet
        return True

    wait_until(send, "the master to take a send with its slave in sync", timeout_s=60)
    wait_until(lambda: _stored(slave.endpoint, "Flags") == [b"replicated"], "the slave to serve the message",
               timeout_s=30)


def test_controller_pair_from_flags_alone(tmp_path: Path, etcd: EtcdProcess, processes: ExitStack) -> None:
    """Two replicas started alike with --controller: etcd makes one master, a send is acknowledged by both (2
    in-sync replicas) and the other replica serves it."""
    secret = str(_secret(tmp_path))
    flags = ["--controller", etcd.url, "--ha-secret-file", secret, "--min-insync-replicas", "2"]
    replicas = [
        _replica(processes, tmp_path / f"r{i}", *flags, "--broker-id", str(i), "--ha-listen", f"127.0.0.1:{port}")
        for i, port in ((1, free_port()), (2, free_port()))
    ]
    stored: list[str] = []

    def send_to_master() -> bool:
        for r in replicas:
            try:
                with Admin(r.endpoint) as admin:
                    admin.create_topic("Flags", 1, if_not_exists=True)
                with Producer(endpoint=r.endpoint) as producer:
                    producer.send(Message("Flags", b"replicated"), queue_id=0)
            except BrokerError:
                continue  # not the master, or its peer not in sync yet
            stored.append(r.endpoint)
            return True
        return False

    wait_until(send_to_master, "a master elected through etcd to take a send with its peer in sync", timeout_s=60)
    other = next(r.endpoint for r in replicas if r.endpoint != stored[0])
    wait_until(lambda: b"replicated" in _stored(other, "Flags"), "the other replica to serve the message", timeout_s=30)

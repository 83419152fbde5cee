"""OS names of the standalone broker's threads (broker/server/thread_names.py), and bench.hops' reading of CPU by
thread role from them."""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.hops import cpu_by_role, thread_cpu_s, thread_role
from broker.client import Admin, Message, Producer
from broker.server.process import BrokerProcess
from broker.server.thread_names import COMM_BYTES, GRPC_POLLER, os_name


def test_os_names_are_the_python_names_cut_to_the_kernels_limit() -> None:
    assert os_name("reput-dispatch") == "reput-dispatch"
    assert os_name("Thread-1 (_serve)") == GRPC_POLLER  # grpcio's server loop, named by what it does
    assert os_name("consumequeue-flush") == "consumequeue-fl"
    assert len(os_name("x" * 40).encode()) == COMM_BYTES
    assert os_name("ééééééééé") == "ééééééé"  # cut on a character boundary: 14 bytes, not a broken 15th


def test_thread_roles_drop_pool_numbers_only() -> None:
    assert thread_role("grpc-worker_12") == "grpc-worker"
    assert thread_role("schedule-level-3") == "schedule-level"
    assert thread_role("reput-dispatch") == "reput-dispatch"
    assert thread_role("grpc-poller") == "grpc-poller"
    assert thread_role("ha-server_x") == "ha-server_x"  # not a number: kept


def test_cpu_by_role_sums_a_roles_threads_and_counts_new_threads_from_zero() -> None:
    before = {1: ("grpc-worker_0", 1.0), 2: ("grpc-worker_1", 2.0), 3: ("reput-dispatch", 0.5)}
    after = {**before, 1: ("grpc-worker_0", 1.2), 2: ("grpc-worker_1", 2.1), 4: ("grpc-worker_2", 0.1)}
    roles = cpu_by_role(before, after, calls=1000)
    assert list(roles) == ["grpc-worker"]  # an idle thread adds no row
    assert abs(roles["grpc-worker"] - 400.0) < 1e-6  # (0.2 + 0.1 + 0.1) s over 1,000 messages


def test_sluice_broker_names_its_threads(tmp_path: Path) -> None:
    """A broker process after a send: its dispatcher, gRPC's server loop and a worker carry their names,
    and bench.hops reads their CPU by those names."""
    broker = BrokerProcess(tmp_path / "store").start()
    try:
        assert broker.proc is not None
        with Admin(broker.endpoint) as admin:
            admin.create_topic("names", queues=1)
        with Producer(broker.endpoint) as producer:
            producer.send(Message("names", b"x"), queue_id=0)  # a gRPC worker exists from here on
        wanted = {"reput-dispatch", GRPC_POLLER, "grpc-worker_0"}
        deadline = time.monotonic() + 10
        names = {name for name, _ in thread_cpu_s(broker.proc.pid).values()}
        while not wanted <= names and time.monotonic() < deadline:
            time.sleep(0.1)  # named once a second, at the main thread's look for a stop signal
            names = {name for name, _ in thread_cpu_s(broker.proc.pid).values()}
        assert wanted <= names, names
        assert "MainThread" not in names  # the process's own name stays
        assert Path(f"/proc/{broker.proc.pid}/comm").read_text().startswith("python"), "the process was renamed"
    finally:
        broker.stop()


def test_an_embedded_broker_leaves_its_hosts_thread_names_alone(tmp_path: Path) -> None:
    from broker.config import BrokerConfig
    from broker.server.broker_controller import BrokerController

    def own_names() -> set[str]:
        return {Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task")}

    before = own_names()
    controller = BrokerController(BrokerConfig.from_dict({}, store_path=str(tmp_path / "store"), listen="127.0.0.1:0"))
    controller.start()
    try:
        time.sleep(1.5)  # longer than sluice broker's naming interval
        assert "reput-dispatch" not in own_names() - before
    finally:
        controller.shutdown()

"""A network partition isolating the master from its replicas, etcd, the name server and the clients, then healed:
every process runs in a network namespace this test makes (one per replica, one for etcd, the name server and the
client), joined by veth pairs to a bridge in a hub namespace; the partition takes the master's cable down. Only
addresses inside those namespaces are used (10.231.7.0/24 exists nowhere else). The replication endpoints are not
on loopback, so the group shares a secret (ha_secret_file). Checked as the other fault tests (jepsen.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from jepsen import Outcome, check

from broker.ha.etcd_process import EtcdProcess
from broker.ha.local_group import SMALL_STORE
from broker.namesrv.local_cluster import NameServerProcess
from broker.private_file import write_private
from broker.server.process import BrokerProcess
from tests.support.waiting import wait_until

NET = "10.231.7"
OUTSIDE = "slx"  # etcd, name server, client
REPLICAS = {1: "slr1", 2: "slr2", 3: "slr3"}
ADDRESS = {OUTSIDE: f"{NET}.1", **{ns: f"{NET}.{rid + 1}" for rid, ns in REPLICAS.items()}}
HUB = "slhub"
CLIENT = Path(__file__).parent / "netns_client.py"
PREFIX = "/sluice/DefaultCluster/broker-a/"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _teardown() -> None:
    for ns in (HUB, OUTSIDE, *REPLICAS.values()):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


@pytest.fixture
def network() -> Iterator[None]:
    _teardown()
    _ip("netns", "add", HUB)
    _ip("-n", HUB, "link", "add", "br0", "type", "bridge")
    _ip("-n", HUB, "link", "set", "br0", "up")
    for ns, addr in ADDRESS.items():
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", HUB, "link", "add", f"h-{ns}", "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("-n", HUB, "link", "set", f"h-{ns}", "master", "br0", "up")
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
    try:
        yield
    finally:
        _teardown()


def _in(ns: str) -> list[str]:
    return ["ip", "netns", "exec", ns]


def _client(*args: str, timeout_s: float = 120) -> str:
    return subprocess.run([*_in(OUTSIDE), sys.executable, str(CLIENT), *args], check=True, capture_output=True,
                          text=True, timeout=timeout_s, cwd=str(CLIENT.parent)).stdout


def _state() -> dict[str, object]:
    out = json.loads(_client("state", "--etcd", f"{ADDRESS[OUTSIDE]}:2379", "--prefix", PREFIX))
    return out if isinstance(out, dict) else {}


def _master() -> int | None:
    st = _state()
    master, state = st.get("master"), st.get("state")
    return int(state["master"]) if master and isinstance(state, dict) else None  # type: ignore[index]


def _in_sync() -> set[int]:
    state = _state().get("state")
    return set(state["inSync"]) if isinstance(state, dict) else set()  # type: ignore[index]


def test_partition_isolating_the_master_then_healed(network: None, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    write_private(secret, os.urandom(24).hex().encode())
    etcd = EtcdProcess(tmp_path / "etcd", host=ADDRESS[OUTSIDE], prefix=_in(OUTSIDE))
    ns = NameServerProcess(listen=f"{ADDRESS[OUTSIDE]}:9876")
    ns.args = [*_in(OUTSIDE), *ns.args]
    brokers: dict[int, BrokerProcess] = {}
    workload: subprocess.Popen[str] | None = None
    try:
        etcd.start()
        ns.start()
        namesrv = f"{ADDRESS[OUTSIDE]}:9876"

        def start(rid: int) -> None:
            addr = ADDRESS[REPLICAS[rid]]
            cfg = tmp_path / f"replica-{rid}.json"
            cfg.write_text(json.dumps({
                "store": SMALL_STORE, "controller": f"etcd://{ADDRESS[OUTSIDE]}:2379", "ha_listen": f"{addr}:10912",
                "ha_secret_file": str(secret), "ha_lease_ttl_s": 2, "ha_max_lag_ms": 3000, "ha_ack_timeout_ms": 3000,
            }))
            b = BrokerProcess(tmp_path / f"replica-{rid}", listen=f"{addr}:10911", config=cfg, extra_args=[
                "--namesrv", namesrv, "--broker-name", "broker-a", "--broker-id", str(rid),
                "--register-interval-ms", "500"])
            b.args = [*_in(REPLICAS[rid]), *b.args]
            b.start()
            brokers[rid] = b

        for rid in REPLICAS:
            start(rid)
        wait_until(lambda: len(_in_sync()) == 3, "three replicas in sync", timeout_s=90)
        stop, out, progress = tmp_path / "stop", tmp_path / "outcomes.json", tmp_path / "progress"
        workload = subprocess.Popen([*_in(OUTSIDE), sys.executable, str(CLIENT), "workload", "--namesrv", namesrv,
                                     "--stop-file", str(stop), "--out", str(out), "--progress", str(progress)],
                                    cwd=str(CLIENT.parent), text=True)

        def acked() -> int:
            try:
                return int(progress.read_text() or 0)
            except (OSError, ValueError):
                return 0

        wait_until(lambda: acked() > 50, "acknowledged sends before the partition", timeout_s=90)
        old = _master()
        assert old is not None
        _ip("-n", HUB, "link", "set", f"h-{REPLICAS[old]}", "down")  # the master's cable is cut
        wait_until(lambda: _master() not in (None, old), "a new master on the majority side", timeout_s=90)
        before = acked()
        wait_until(lambda: acked() > before + 50, "acknowledged sends to the new master", timeout_s=90)
        _ip("-n", HUB, "link", "set", f"h-{REPLICAS[old]}", "up")  # healed
        wait_until(lambda: len(_in_sync()) == 3, "the old master back in sync as a replica", timeout_s=120)
        before = acked()
        wait_until(lambda: acked() > before + 20, "acknowledged sends after healing", timeout_s=90)
        stop.touch()
        workload.wait(timeout=120)
        outcomes = [Outcome(**o) for o in json.loads(out.read_text())]
        logs_file = tmp_path / "logs.json"
        endpoints = [f"{ADDRESS[REPLICAS[rid]]}:10911" for rid in REPLICAS]
        wait_until(lambda: _same_length(endpoints, logs_file), "every replica to hold the same log", timeout_s=120)
        raw = json.loads(logs_file.read_text())
        logs = {ep: {_position(k): v for k, v in log.items()} for ep, log in raw.items()}
        report = check("partition of the master, healed", outcomes, logs)
        print("\n" + report.table())
        assert report.ok, report.details()
        assert report.acknowledged > 100
    except AssertionError:
        for rid, b in brokers.items():
            print(f"--- replica {rid}\n" + "\n".join(list(b.output)[-40:]))
        raise
    finally:
        if workload is not None and workload.poll() is None:
            workload.kill()
        for b in brokers.values():
            if b.proc is not None and b.proc.poll() is None:
                b.kill()
        if ns.running:
            ns.kill()
        etcd.kill()


def _same_length(endpoints: list[str], out: Path) -> bool:
    _client("read", "--endpoints", ",".join(endpoints), "--out", str(out))
    lengths = {len(log) for log in json.loads(out.read_text()).values()}
    return len(lengths) == 1


def _position(key: str) -> tuple[int, int]:
    queue, offset = key.split(":")
    return int(queue), int(offset)

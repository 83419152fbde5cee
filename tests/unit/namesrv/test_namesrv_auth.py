"""Who may register with a name server, on real processes: ``sluice namesrv`` with the cluster's root user takes
RegisterBroker and UnregisterBroker only signed as that user, and a refused one changes no route; without a root
user it does not start unless given ``--allow-anonymous-registration``; and a broker with ``--auth`` does not
register with a name server that takes anyone.

The attacks are made as an attacker would, with raw calls on the name server's stubs: a registration of the real
master's name with a higher epoch (on a name server that takes anyone, it replaces the master in every route, as
the last test shows) and an unregistration naming the real broker's store id.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker.client import Admin
from broker.client.credentials import Credentials
from broker.client.namesrv_client import NameServerClient
from broker.errors import BrokerError, ResponseCode, TopicNotExistError
from broker.namesrv import RouteTable
from broker.namesrv.local_cluster import NameServerProcess
from broker.namesrv.name_server_service import NameServerService
from broker.proto import namesrv_pb2 as npb
from broker.proto import namesrv_pb2_grpc as npb_grpc
from broker.server.broker_controller import BrokerController
from broker.server.process import BrokerProcess
from tests.support.waiting import wait_until

ROOT = Credentials("root", "namesrv-root-secret-61c2")
ROOT_ENV = {"SLUICE_ROOT_ACCESS_KEY": ROOT.access_key, "SLUICE_ROOT_SECRET_KEY": ROOT.secret_key}
TOPIC = "NsAuthTopic"
BROKER = "broker-a"
WAIT_S = 30.0
# No periodic registration while a test runs: a route that an attack changed (an unregistration) would stay
# changed, rather than be restored by the real broker's next pass before the test looks.
QUIET_REGISTER_INTERVAL_MS = 600_000
SMALL_STORE = {"store": {"mapped_file_size_commit_log": 16 << 20, "mapped_file_size_consume_queue": 4000 * 20,
                         "max_hash_slot_num": 4096, "max_index_num": 16384}}
ATTACKERS = [  # no credentials, the root user's name with a wrong secret, a user the name server does not know
    None,
    Credentials(ROOT.access_key, "not-the-root-secret"),
    Credentials("mallory", "mallory-secret-0000"),
]


def route_or_none(ns: NameServerClient, topic: str) -> npb.TopicRouteData | None:
    try:
        return ns.route(topic)
    except TopicNotExistError:
        return None


def brokers_seen(ns: NameServerClient) -> list[tuple[str, int, str, int]]:
    """(name, id, address, epoch) of every live broker: what a takeover or an unregistration would change."""
    return [(b.broker_name, b.broker_id, b.address, b.epoch) for b in ns.cluster_info().brokers]


def takeover(name: str, epoch: int, store_id: str = "attacker-store", address: str = "127.0.0.1:1",
             require_authentication: bool = False) -> npb.RegisterBrokerRequest:
    """A master registration of ``name`` at the attacker's address, holding ``TOPIC``."""
    return npb.RegisterBrokerRequest(
        cluster="DefaultCluster", broker_name=name, broker_id=0, address=address, store_id=store_id, data_version=1,
        topics_included=True, topics=[npb.TopicQueues(topic=TOPIC, read_queue_nums=4, write_queue_nums=4, perm=6)],
        role="MASTER", epoch=epoch, require_authentication=require_authentication,
    )


def refusal(ns_address: str, credentials: Credentials | None, method: str, request: Any) -> BrokerError:
    """The error of one call signed with ``credentials`` (None: unsigned); fails the test if the call passed."""
    client = NameServerClient([ns_address], credentials=credentials)
    try:
        answer = client.call_one(ns_address, method, request)
    except BrokerError as e:
        return e
    finally:
        client.close()
    raise AssertionError(f"{method} signed with {credentials!r} was accepted: {answer}")


def namesrv_process(env: dict[str, str], *, anonymous: bool) -> NameServerProcess:
    """A name server process whose environment holds ``env`` and no other root user."""
    ns = NameServerProcess(allow_anonymous_registration=anonymous)
    with pytest.MonkeyPatch.context() as mp:
        for key in ROOT_ENV:
            mp.delenv(key, raising=False)
        for key, value in env.items():
            mp.setenv(key, value)
        return ns.start()


def auth_broker(root: Path, namesrv: str, register_interval_ms: int) -> BrokerProcess:
    """A broker process with --auth (plain text, on loopback) and the cluster's root user, registering with
    ``namesrv``."""
    root.mkdir(parents=True, exist_ok=True)
    config = root / "broker.json"
    config.write_text(json.dumps(SMALL_STORE))
    broker = BrokerProcess(root / "store", config=config, extra_args=[
        "--auth", "--allow-plaintext-auth", "--namesrv", namesrv, "--broker-name", BROKER,
        "--register-interval-ms", str(register_interval_ms),
    ])
    with pytest.MonkeyPatch.context() as mp:
        for key, value in ROOT_ENV.items():
            mp.setenv(key, value)
        return broker.start()


def store_id_of(broker_root: Path) -> str:
    return str(json.loads((broker_root / "store" / "config" / "brokerIdentity.json").read_text())["storeId"])


# ------------------------------------------------------------------------------------------ an authenticated one
def kill_what_runs(reader: NameServerClient, broker: BrokerProcess | None, ns: NameServerProcess) -> None:
    """A test's teardown after a failure: the processes it left running are killed (a passing test stopped them)."""
    reader.close()
    if broker is not None and broker.proc is not None and broker.proc.poll() is None:
        broker.kill()
    if ns.running:
        ns.kill()


@dataclass
class Secured:
    ns: NameServerProcess
    broker: BrokerProcess
    store_id: str
    reader: NameServerClient  # no credentials: route reads stay open


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    """A name server with the root user, and a broker with --auth registered there, holding TOPIC."""
    root = tmp_path_factory.mktemp("namesrv-auth")
    ns = namesrv_process(ROOT_ENV, anonymous=False)
    broker: BrokerProcess | None = None
    reader = NameServerClient([ns.address])
    try:
        broker = auth_broker(root / BROKER, ns.address, QUIET_REGISTER_INTERVAL_MS)
        with Admin(broker.endpoint, access_key=ROOT.access_key, secret_key=ROOT.secret_key) as admin:
            admin.create_topic(TOPIC, 4)  # wakes the registrar: the route follows at once
        wait_until(lambda: route_or_none(reader, TOPIC) is not None, f"{TOPIC}'s route on the name server")
        yield Secured(ns, broker, store_id_of(root / BROKER), reader)
        assert broker.stop() == 0, "\n".join(broker.output)
        assert ns.stop() == 0, "\n".join(ns.output)
    finally:
        kill_what_runs(reader, broker, ns)


def test_the_root_user_registers_and_unregisters_and_anyone_reads_routes(secured: Secured) -> None:
    route = route_or_none(secured.reader, TOPIC)
    assert route is not None
    routed = [(b.broker_name, dict(b.broker_addrs)) for b in route.broker_datas]
    assert routed == [(BROKER, {0: secured.broker.endpoint})]
    assert brokers_seen(secured.reader) == [(BROKER, 0, secured.broker.endpoint, 0)]
    root = NameServerClient([secured.ns.address], credentials=ROOT)
    try:
        answer = root.call_one(secured.ns.address, "RegisterBroker", takeover("broker-z", 0, address="127.0.0.1:2"))
        assert answer.accepted and answer.authenticated
        assert ("broker-z", 0, "127.0.0.1:2", 0) in brokers_seen(secured.reader)
        root.call_one(secured.ns.address, "UnregisterBroker", npb.UnregisterBrokerRequest(
            cluster="DefaultCluster", broker_name="broker-z", broker_id=0, store_id="attacker-store"))
    finally:
        root.close()
    assert brokers_seen(secured.reader) == [(BROKER, 0, secured.broker.endpoint, 0)]


@pytest.mark.parametrize("credentials", ATTACKERS, ids=["unsigned", "wrong-secret", "unknown-user"])
def test_a_registration_not_signed_by_the_root_user_takes_over_nothing(
    secured: Secured, credentials: Credentials | None
) -> None:
    before = (route_or_none(secured.reader, TOPIC), brokers_seen(secured.reader))
    error = refusal(secured.ns.address, credentials, "RegisterBroker", takeover(BROKER, epoch=7))
    assert error.code is ResponseCode.UNAUTHENTICATED, error.message
    another = refusal(secured.ns.address, credentials, "RegisterBroker", takeover("broker-new", epoch=1))
    assert another.code is ResponseCode.UNAUTHENTICATED, another.message
    assert (route_or_none(secured.reader, TOPIC), brokers_seen(secured.reader)) == before
    assert before[1] == [(BROKER, 0, secured.broker.endpoint, 0)]


@pytest.mark.parametrize("credentials", ATTACKERS, ids=["unsigned", "wrong-secret", "unknown-user"])
def test_an_unregistration_not_signed_by_the_root_user_removes_nothing(
    secured: Secured, credentials: Credentials | None
) -> None:
    before = (route_or_none(secured.reader, TOPIC), brokers_seen(secured.reader))
    request = npb.UnregisterBrokerRequest(cluster="DefaultCluster", broker_name=BROKER, broker_id=0,
                                          store_id=secured.store_id)  # the real one, as if read off the wire
    error = refusal(secured.ns.address, credentials, "UnregisterBroker", request)
    assert error.code is ResponseCode.UNAUTHENTICATED, error.message
    assert (route_or_none(secured.reader, TOPIC), brokers_seen(secured.reader)) == before
    assert before[0] is not None and before[1] == [(BROKER, 0, secured.broker.endpoint, 0)]


# ------------------------------------------------------------------------------------------ starting one
def test_a_name_server_without_a_root_user_does_not_start() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ROOT_ENV}
    done = subprocess.run([sys.executable, "-m", "broker", "namesrv", "--listen", "127.0.0.1:0"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "ready" not in done.stdout
    assert "SLUICE_ROOT_ACCESS_KEY" in done.stderr and "--allow-anonymous-registration" in done.stderr, done.stderr


def test_with_the_flag_it_starts_and_takes_anyone(tmp_path: Path) -> None:
    """What --allow-anonymous-registration permits: the takeover refused above works here."""
    ns = namesrv_process({}, anonymous=True)
    reader = NameServerClient([ns.address])
    try:
        wait_until(lambda: any("NOT authenticated" in line for line in ns.output), "the name server's warning")
        victim = takeover(BROKER, epoch=1, store_id="victim-store", address="127.0.0.1:3")
        answer = reader.call_one(ns.address, "RegisterBroker", victim)
        assert answer.accepted and not answer.authenticated
        reader.call_one(ns.address, "RegisterBroker", takeover(BROKER, epoch=2))  # unsigned, as above
        assert brokers_seen(reader) == [(BROKER, 0, "127.0.0.1:1", 2)]
        reader.call_one(ns.address, "UnregisterBroker", npb.UnregisterBrokerRequest(
            cluster="DefaultCluster", broker_name=BROKER, broker_id=0, store_id="attacker-store"))
        assert brokers_seen(reader) == [] and route_or_none(reader, TOPIC) is None
        assert ns.stop() == 0
    finally:
        reader.close()
        if ns.running:
            ns.kill()


# ------------------------------------------------------------------------------------------ an --auth broker
def test_a_broker_with_auth_does_not_register_with_a_name_server_that_takes_anyone(tmp_path: Path) -> None:
    ns = namesrv_process({}, anonymous=True)
    reader = NameServerClient([ns.address])
    broker: BrokerProcess | None = None
    try:
        broker = auth_broker(tmp_path / BROKER, ns.address, register_interval_ms=300)
        with Admin(broker.endpoint, access_key=ROOT.access_key, secret_key=ROOT.secret_key) as admin:
            admin.create_topic(TOPIC, 4)
        running = broker

        def said_why() -> bool:
            return sum(f"name server {ns.address} refused this broker's registration" in line
                       and "--allow-anonymous-registration" in line for line in running.output) >= 2

        wait_until(said_why, "the broker's log saying, at two passes, why it did not register")
        assert brokers_seen(reader) == [] and route_or_none(reader, TOPIC) is None
        # the name server refuses such a registration itself, before storing anything
        error = refusal(ns.address, None, "RegisterBroker", takeover(BROKER, 1, require_authentication=True))
        assert error.code is ResponseCode.NO_PERMISSION, error.message
        assert brokers_seen(reader) == []
        assert broker.stop() == 0
        assert ns.stop() == 0
    finally:
        kill_what_runs(reader, broker, ns)


class _OlderNameServer(NameServerService):
    """A name server from before ``require_authentication`` and ``authenticated``: it takes anyone, ignores the
    request's field, and its answer never says it authenticated."""

    def RegisterBroker(self, request: npb.RegisterBrokerRequest, context: grpc.ServicerContext) -> Any:
        request.require_authentication = False
        return super().RegisterBroker(request, context)


def test_a_broker_with_auth_leaves_a_name_server_that_does_not_say_it_authenticated(
    broker_factory: Callable[..., BrokerController], caplog: pytest.LogCaptureFixture
) -> None:
    table = RouteTable(120_000)
    server = grpc.server(futures.ThreadPoolExecutor(4))
    npb_grpc.add_NameServerServicer_to_server(_OlderNameServer(table, authenticated=False), server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    registered: list[str] = []
    original = table.register

    def register(reg: Any, now_ms: int) -> bool:  # records that the registration did reach the table
        registered.append(reg.broker_name)
        return original(reg, now_ms)

    table.register = register  # type: ignore[method-assign]
    try:
        with caplog.at_level("ERROR", logger="broker.server.registration"):
            broker_factory(namesrv_addr=address, broker_name=BROKER, auth_enabled=True, allow_plaintext_auth=True,
                           auth_root_access_key=ROOT.access_key, auth_root_secret_key=ROOT.secret_key)
        assert registered == [BROKER]  # the older name server took it...
        assert table.brokers(int(time.time() * 1000)) == []  # ...and the broker unregistered at once
        assert any(address in r.getMessage() and "did not say it authenticated" in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]
    finally:
        server.stop(None)

"""The replication port as an attacker without the group's secret reaches it: raw calls on the Replication stubs
against real brokers (gRPC servers, stores, replication, a real etcd in controller mode). Before the peer proved the
secret, nothing it says is acted on: a made-up newer epoch fences no master, and a flood of handshakes from one
address takes no replica slot and does not keep a real replica out."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from broker.client import Message, Producer
from broker.client.results import SendStatus
from broker.config import BrokerConfig
from broker.errors import InvalidArgumentError, ResponseCode
from broker.ha import auth, unproven
from broker.ha.controller import GroupState
from broker.ha.etcd_client import Etcd
from broker.ha.etcd_process import EtcdProcess
from broker.ha.master_endpoint import PROTOCOL_VERSION
from broker.proto import ha_pb2 as hpb
from broker.proto import ha_pb2_grpc as hpb_grpc
from broker.proto.status import error_from_rpc
from tests.support.replicas import SMALL_STORE, broker, brokers, caught_up, slave_of
from tests.support.waiting import wait_until

HUGE_EPOCH = 1 << 62
FLOOD = 80  # more than the master's 64 replica slots (master.MAX_SESSIONS)


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    with EtcdProcess(tmp_path / "etcd") as e:
        yield e


def _secret(tmp_path: Path) -> str:
    path = tmp_path / "ha-secret"
    path.write_text(os.urandom(24).hex())
    path.chmod(0o600)
    return str(path)


def secret_bytes(path: str) -> bytes:
    return Path(path).read_bytes().strip()


def _hello(known_epoch: int = 0, broker_id: int = 99) -> hpb.Hello:
    """What a stranger who knows the group's names sends: everything a replica's Hello holds, but no secret."""
    return hpb.Hello(protocol_version=PROTOCOL_VERSION, cluster="DefaultCluster", broker_name="g",
                     broker_id=broker_id, store_id="attacker", address="127.0.0.1:1", max_offset=0,
                     commit_log_file_size=SMALL_STORE["mapped_file_size_commit_log"], known_epoch=known_epoch,
                     client_nonce=auth.nonce())


def _code(call: grpc.RpcError) -> ResponseCode:
    return error_from_rpc(call).code


class Relay:
    """A TCP relay that connects onward from another loopback address (127.0.0.2), as a peer on another host would:
    the master sees the attacker's calls come from a source address of their own."""

    def __init__(self, target: tuple[str, int], source: str = "127.0.0.2") -> None:
        self.target, self.source = target, source
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            up = socket.socket()
            up.bind((self.source, 0))
            up.connect(self.target)
            self._sockets += [down, up]
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
            b.shutdown(socket.SHUT_WR)
        except OSError:
            return

    def close(self) -> None:
        self.listener.close()
        for s in self._sockets:
            s.close()


def test_an_unproven_open_with_a_newer_epoch_does_not_fence_the_master(tmp_path: Path, etcd: EtcdProcess) -> None:
    secret = _secret(tmp_path)
    with brokers() as bs:
        m = broker(tmp_path / "r1", controller=etcd.url, broker_id=1, ha_lease_ttl_s=2, min_insync_replicas=1,
                   ha_secret_file=secret)
        bs.append(m)
        r = m.replication
        assert r is not None
        wait_until(r.is_master, "replica 1 elected")
        epoch = r.epoch
        with grpc.insecure_channel(f"127.0.0.1:{r.ha_port}") as channel:
            stub = hpb_grpc.ReplicationStub(channel)
            wrong = b"not-the-group-secret-0123456789"
            for forged in ("empty", "wrong secret", "spent handshake"):
                hello = _hello(HUGE_EPOCH)
                opened = stub.Open(hello, timeout=5)  # a handshake only: nothing the Hello says is acted on
                proof = b"" if forged == "empty" else auth.slave_proof(wrong, opened.server_nonce, hello.client_nonce,
                                                                       hello.SerializeToString())
                if forged == "spent handshake":  # a second Join of a handshake already refused once
                    with pytest.raises(grpc.RpcError):
                        stub.Join(hpb.JoinRequest(session=opened.session, proof=proof), timeout=5)
                    proof = auth.slave_proof(secret_bytes(secret), opened.server_nonce, hello.client_nonce,
                                             hello.SerializeToString())
                with pytest.raises(grpc.RpcError) as refused:
                    stub.Join(hpb.JoinRequest(session=opened.session, proof=proof), timeout=5)
                spent = forged == "spent handshake"
                expected = ResponseCode.INVALID_ARGUMENT if spent else ResponseCode.UNAUTHENTICATED
                assert _code(refused.value) == expected, forged
            time.sleep(1.0)  # several controller ticks (controller.TICK_S): a fence would have happened by now
            assert r.is_master() and r.epoch == epoch and r.known_epoch() < HUGE_EPOCH
            endpoint = r.master_endpoint
            assert endpoint is not None and endpoint.session_count() == 0 and len(endpoint.unproven) == 0
            client = Etcd([("127.0.0.1", etcd.client_port)])
            try:
                kv = client.get("/sluice/DefaultCluster/g/state")
                assert kv is not None
                state = GroupState.from_kv(kv)
                assert (state.epoch, state.master) == (epoch, 1)
            finally:
                client.close()
            with Producer(endpoint=m.address, timeout_s=5) as p:
                assert p.send(Message("PortT", b"still the master")).status is SendStatus.SEND_OK
            # the same Hello with the group's proof is acted on: the port tells proven replicas from strangers
            hello = _hello(epoch + 1)
            opened = stub.Open(hello, timeout=5)
            proof = auth.slave_proof(secret_bytes(secret), opened.server_nonce, hello.client_nonce,
                                     hello.SerializeToString())
            with pytest.raises(grpc.RpcError) as stale:
                stub.Join(hpb.JoinRequest(session=opened.session, proof=proof), timeout=5)
            assert _code(stale.value) == ResponseCode.NOT_MASTER
            wait_until(lambda: not (m.replication is not None and m.replication.is_master()
                                    and m.replication.epoch == epoch),
                       "the proven newer epoch fencing the master")


def test_a_flood_of_unproven_opens_from_one_address_does_not_keep_a_replica_out(tmp_path: Path) -> None:
    secret = _secret(tmp_path)
    with brokers() as bs:
        m = broker(tmp_path / "m", role="SYNC_MASTER", min_insync_replicas=2, ha_secret_file=secret)
        bs.append(m)
        r = m.replication
        assert r is not None and r.master_endpoint is not None
        servicer = r.master_endpoint
        relay = Relay(("127.0.0.1", r.ha_port))
        stop = threading.Event()
        outcomes: dict[str, int] = {"opened": 0, "busy": 0, "other": 0}
        most_unproven = [0]

        def flood() -> None:  # Opens back to back, none ever joined, for as long as the test runs
            with grpc.insecure_channel(f"127.0.0.1:{relay.port}") as channel:
                stub = hpb_grpc.ReplicationStub(channel)
                while not stop.is_set():
                    try:
                        stub.Open(_hello(HUGE_EPOCH), timeout=5)
                        outcomes["opened"] += 1
                    except grpc.RpcError as e:
                        outcomes["busy" if _code(e) == ResponseCode.SYSTEM_BUSY else "other"] += 1
                    most_unproven[0] = max(most_unproven[0], len(servicer.unproven))

        attacker = threading.Thread(target=flood, daemon=True)
        attacker.start()
        try:
            wait_until(lambda: sum(outcomes.values()) >= FLOOD, f"{FLOOD} unproven Opens")
            assert servicer.session_count() == 0  # no replica slot taken
            assert outcomes["opened"] == unproven.MAX_UNPROVEN_PER_SOURCE and outcomes["other"] == 0
            s = slave_of(m, tmp_path / "s", ha_secret_file=secret)  # joins while the flood goes on
            bs.append(s)
            assert r.in_sync is not None
            wait_until(lambda: len(r.in_sync.members) == 2,  # type: ignore[union-attr]
                       "the real slave in sync despite the flood")
            with Producer(endpoint=m.address, timeout_s=10) as p:
                sent = p.send(Message("FloodT", b"acknowledged by both", keys="after-flood"))
            assert sent.status is SendStatus.SEND_OK  # a SYNC_MASTER acknowledges once the slave holds it
            # readable on the slave once the confirmed offset, which comes with the master's next chunk or
            # heartbeat, passes it (holding it, caught_up, can come a moment before)
            wait_until(lambda: caught_up(m, s) and s.store is not None
                       and len(s.store.query_by_key("FloodT", "after-flood")) == 1, "the slave showing the send")
            assert outcomes["busy"] > 0 and outcomes["other"] == 0
            assert most_unproven[0] <= unproven.MAX_UNPROVEN_PER_SOURCE + 1  # the attacker's, plus the replica's
            assert r.is_master() and servicer.session_count() == 1  # the real replica's only
        finally:
            stop.set()
            attacker.join(timeout=10)
            relay.close()


def test_a_replicated_broker_with_auth_needs_the_group_secret(tmp_path: Path) -> None:
    base = {"listen": "127.0.0.1:0", "store_path": str(tmp_path / "s"), "role": "SYNC_MASTER", "auth_enabled": True,
            "allow_plaintext_auth": True, "auth_root_access_key": "root",
            "auth_root_secret_key": "root-secret-0123"}
    with pytest.raises(InvalidArgumentError, match="ha_secret_file"):
        BrokerConfig(**base)  # type: ignore[arg-type]
    assert BrokerConfig(**base, ha_secret_file=_secret(tmp_path)).replication() is not None  # type: ignore[arg-type]

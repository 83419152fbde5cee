"""ReplicationManager: one broker's part in its group's replication: its role, its epoch, and the pieces each role
runs. The broker controller builds it once the store runs; everything else in broker/ha is driven from here.

Roles:

* **master** (classic ASYNC_MASTER / SYNC_MASTER, or elected in controller mode): takes writes; its replication
  endpoint (master_endpoint.py) streams the log to the slaves; its in-sync set (in_sync.py) tracks them, gives the
  confirmed offset, and holds acknowledgements when it waits for replicas (replication_gate.py); its config files go
  to the slaves (metadata_sync.py); the broker's delay and transaction services run.
* **slave**: the slave fetcher (slave_fetcher.py) copies the master's log; writes are refused (replication_gate.py);
  reads stop at the master's confirmed offset (read_limit.py); the delay and transaction services do not run (they would
  write).
* **none yet** (controller mode, until etcd says): as a slave, without a master to follow.

Taking office (``_become_master``): stop following, let the dispatcher finish (the index is then complete, so
retried sends are recognised), rebuild the queue-offset table from the consume queues (a slave's appends never
used it), record ``(epoch, log end)`` in the epoch file before the first write, start the in-sync set (in
controller mode: as etcd recorded it), and only then start the services that write and accept writes.

Leaving office (fenced: a newer epoch exists, or the lease ran out): stop acknowledging at once (waiting writes
answer FLUSH_SLAVE_TIMEOUT: their outcome is unknown), then restart the broker in place. Start-up is the path every
replica already trusts after a crash: recovery, then following the new master, truncating to the divergence
point first when the logs disagree. A slave told to truncate restarts in place the same way (store/truncation.py
records the intent before the restart, so a crash in between changes nothing).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc

from broker.errors import ServiceNotAvailableError
from broker.ha import replication_gate as gate_rules
from broker.ha.changes import Changes
from broker.ha.controller import Controller, ControllerHooks, GroupState
from broker.ha.epoch_file import EpochFile
from broker.ha.etcd_client import Etcd
from broker.ha.in_sync import InSyncSet, monotonic_ms
from broker.ha.master_endpoint import QUEUE_KEY_SEPARATOR, MasterEndpoint
from broker.ha.metadata_sync import MetadataSink, MetadataSource
from broker.ha.read_limit import ReadLimit
from broker.ha.replication_settings import MAX_REPLICAS, SLAVE, ReplicationSettings
from broker.ha.slave_fetcher import SlaveFetcher
from broker.json_file import load_json, write_json_atomic
from broker.proto import ha_pb2_grpc as hpb_grpc
from broker.server.broker_identity import BrokerIdentity
from broker.server.server_tls import add_port
from broker.store import truncation
from broker.store.message_store import MessageStore
from broker.store.truncation import Truncation

log = logging.getLogger(__name__)

MASTER, SLAVE_ROLE = "MASTER", "SLAVE"
REVIEW_INTERVAL_S = 0.1  # how often a master reviews its in-sync set
QUEUE_STARTS_FILE = "queueStarts.json"  # in ha/: see save_queue_starts
CLASSIC_EPOCH = 1  # classic mode has no elections: every byte is of epoch 1
HA_GRPC_MAX_MESSAGE_BYTES = 80 * 1024 * 1024  # slave.CHANNEL_MAX_MESSAGE_BYTES
# The replication endpoint's worker threads are named HA_SERVER_THREAD_PREFIX_<n>; sluice broker runs them apart
# from the other Python threads (server/thread_placement.py).
HA_SERVER_THREAD_PREFIX = "ha-grpc"


@dataclass
class BrokerHooks:
    """What the manager asks of the broker around it."""

    start_master_services: Callable[[], None]  # the delay and transaction services (they write)
    restart: Callable[[str], None]  # restart the broker in place (in another thread), saying why
    replace_config: Callable[[str, dict[str, Any]], bool]  # a config file the master sent (see MetadataSink)
    role_changed: Callable[[], None]  # registration should say so now
    master_from_namesrv: Callable[[], str] = lambda: ""  # classic slave: the master's HA endpoint as registered
    save_config: Callable[[], None] = lambda: None  # write what changed in memory only (consumer offsets)


@dataclass(frozen=True)
class Status:
    """What the name servers, `sluice cluster list` and metrics show of this replica."""

    role: str  # MASTER | SLAVE | "" (none yet)
    epoch: int
    in_sync: bool
    lag_bytes: int
    confirmed_offset: int
    registered_id: int  # broker id it registers under (controller mode: 0 while master)


class ReplicationManager:
    def __init__(self, settings: ReplicationSettings, identity: BrokerIdentity, store: MessageStore,
                 hooks: BrokerHooks, downstream: Callable[[str, int, int], None]) -> None:
        self.settings = settings
        self.identity = identity
        self.own_broker_id = identity.broker_id
        self.store = store
        self.hooks = hooks
        ha_dir = self._ha_dir = os.path.join(store.config.store_path, "ha")
        os.makedirs(ha_dir, exist_ok=True)
        self.epochs = EpochFile(ha_dir)
        self.epochs.clamp_to(store.max_phys_offset())  # a cut finished by start-up, before the file followed
        self.read_limit = ReadLimit(store, downstream)
        self.read_limit.install()
        store.replica = True  # until it takes office
        self.changes = Changes()
        self.metadata = MetadataSource(str(store.config.config_dir), hooks.save_config)
        self.sink = MetadataSink(str(store.config.config_dir), hooks.replace_config, store.max_phys_offset)
        self.slave_fetcher = SlaveFetcher(self)
        self.role = ""
        self.epoch = 0
        self._known_epoch = self.epochs.last_epoch
        self.in_sync: InSyncSet | None = None
        self.controller: Controller | None = None
        self._follow_state: GroupState | None = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.server: grpc.Server | None = None
        self.ha_port = 0
        self.ha_host = settings.ha_listen[0]
        self.truncation_requested = False
        self.elections = 0

    # ------------------------------------------------------------------------------------------ life
    def bind(self) -> int:
        """Open the replication endpoint (before start: its port goes into the registration)."""
        server = grpc.server(futures.ThreadPoolExecutor(MAX_REPLICAS * 2 + 2, HA_SERVER_THREAD_PREFIX), options=[
            ("grpc.max_receive_message_length", HA_GRPC_MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", HA_GRPC_MAX_MESSAGE_BYTES), ("grpc.so_reuseport", 0),
        ])
        self.master_endpoint = MasterEndpoint(self)
        hpb_grpc.add_ReplicationServicer_to_server(self.master_endpoint, server)
        host, port = self.settings.ha_listen
        try:
            self.ha_port = add_port(server, f"{host}:{port}", self.settings.tls, "the replication endpoint")
        except RuntimeError as e:
            raise ServiceNotAvailableError(f"cannot listen for replication on {host}:{port} ({e})") from None
        self.server = server
        return self.ha_port

    def start(self, ha_advertised: str) -> None:
        assert self.server is not None
        self.ha_advertised = ha_advertised
        self.server.start()
        s = self.settings
        if s.controller_mode:
            self.controller = Controller(
                Etcd(s.controller, security=s.etcd), cluster=self.identity.cluster,
                broker_name=self.identity.broker_name,
                broker_id=self.own_broker_id, address=self.identity.address, ha_address=ha_advertised,
                store_id=self.identity.store_id, lease_ttl_s=s.lease_ttl_s, allow_unclean=s.allow_unclean_election,
                hooks=ControllerHooks(follow=self._follow, elected=self._elected, fenced=self._fenced),
            )
            self.controller.start()
        elif s.role == SLAVE:
            self.role = SLAVE_ROLE
            self.slave_fetcher.start()
        else:
            if self.epochs.last_epoch < CLASSIC_EPOCH:
                self.epochs.append(CLASSIC_EPOCH, self.store.max_phys_offset())
            self._become_master(CLASSIC_EPOCH, frozenset())
        self._spawn(self._metadata_loop, "ha-metadata")
        log.info("replication endpoint on %s (%s)", ha_advertised,
                 "controller mode" if s.controller_mode else s.role)

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        def run() -> None:
            try:
                target()
            except Exception:  # a replication thread must not die silently: the broker would look healthy
                log.exception("%s failed; restarting the broker in place", name)
                self.hooks.restart(f"{name} failed")

        t = threading.Thread(target=run, name=name, daemon=True)
        self._threads.append(t)
        t.start()

    def shutdown(self) -> None:
        self._stop.set()
        with self._lock:
            self.role = ""
            if self.in_sync is not None:
                self.in_sync.close()
        self.slave_fetcher.stop()
        if self.controller is not None:
            self.controller.stop()
        if self.server is not None:
            self.server.stop(0).wait()
        self.changes.notify()
        for t in self._threads:
            t.join(timeout=5)

    # ------------------------------------------------------------------------------------------ roles
    def _become_master(self, epoch: int, members: frozenset[int]) -> None:
        self.slave_fetcher.stop()  # outside the lock: the fetcher's thread may be waiting for it
        with self._lock:
            if self._stop.is_set():
                return
            store = self.store
            if not store.wait_dispatched(60):
                log.error("the dispatcher did not reach the log's end in 60 s; taking office anyway")
            store.rebuild_queue_table(self._queue_starts())
            store.replica = False
            if self.epochs.last_epoch < epoch:
                self.epochs.append(epoch, store.max_phys_offset())
            self.epoch = self._known_epoch = max(self._known_epoch, epoch)
            record = self.controller.record_in_sync if self.controller is not None else None
            self.in_sync = InSyncSet(
                self.own_broker_id, store.max_phys_offset, min_insync=self.settings.min_insync_replicas,
                max_lag_ms=self.settings.max_lag_ms, members=members - {self.own_broker_id},
                confirmed=self.read_limit.confirmed_offset(), record_shrink=record, record_expand=record,
                on_confirmed=self._confirmed_moved, metadata_version=lambda: self.metadata.version,
            )
            in_sync = self.in_sync
            self.read_limit.source = lambda: in_sync.confirmed
            self.read_limit.grew = in_sync.log_grew
            self.role = MASTER
        self._spawn(self._review_loop, "ha-review")
        self.hooks.start_master_services()
        self.hooks.role_changed()
        log.warning("master of %s/%s, epoch %d, from commit-log offset %d", self.identity.cluster,
                    self.identity.broker_name, epoch, self.store.max_phys_offset())

    def _review_loop(self) -> None:
        while not self._stop.is_set():
            in_sync = self.in_sync
            if self.role != MASTER or in_sync is None:
                return
            in_sync.review()
            self.master_endpoint.sweep()
            self._stop.wait(REVIEW_INTERVAL_S)

    def _follow(self, state: GroupState) -> None:
        with self._lock:
            if self._stop.is_set() or self.role == MASTER:
                return
            changed = self._follow_state is None or (self._follow_state.epoch, self._follow_state.master) != (
                state.epoch, state.master)
            self._follow_state = state
            self._known_epoch = max(self._known_epoch, state.epoch)
            first = self.role != SLAVE_ROLE
            self.role = SLAVE_ROLE
        if first:
            self.slave_fetcher.start()
            self.hooks.role_changed()
        elif changed:
            log.warning("the group's master is now broker %d (epoch %d); following it", state.master, state.epoch)
            self.slave_fetcher.reconnect()

    def _elected(self, state: GroupState) -> None:
        """From the controller's thread, which must go on refreshing the lease: taking office (the dispatcher's
        catch-up, the transaction service's recovery) runs in a thread of its own."""
        self.elections += 1
        self._spawn(lambda: self._become_master(state.epoch, state.in_sync), "ha-take-office")

    def _fenced(self, reason: str) -> None:
        with self._lock:
            if self.role != MASTER:
                return
            self.role = ""
            if self.in_sync is not None:
                self.in_sync.close()
        self.changes.notify()
        self.hooks.restart(f"no longer master ({reason}); restarting as a replica")

    def saw_newer_epoch(self, epoch: int, why: str) -> None:
        if self.role == MASTER and epoch > self.epoch:
            if self.controller is not None:
                self.controller._fence(why)
            else:
                log.error("%s, newer than this classic master's epoch %d: check the group's configuration", why,
                          self.epoch)

    # ------------------------------------------------------------------------------------------ for the endpoint
    def master_state(self) -> tuple[int, InSyncSet] | None:
        with self._lock:
            if self.role != MASTER or self.in_sync is None or self.in_sync.closed:
                return None
            return self.epoch, self.in_sync

    def identity_text(self) -> str:
        return f"broker {self.identity.broker_name}/{self.own_broker_id} at {self.identity.address}"

    # ------------------------------------------------------------------------------------------ for the slave fetcher
    def known_epoch(self) -> int:
        return max(self._known_epoch, self.epochs.last_epoch)

    def learned_epoch(self, epoch: int) -> None:
        self._known_epoch = max(self._known_epoch, epoch)

    def master_ha_address(self) -> str:
        if self.controller is not None:
            state = self._follow_state
            return state.master_ha_address if state is not None and state.master != self.own_broker_id else ""
        return self.settings.ha_master_address or self.hooks.master_from_namesrv()

    def request_truncation(self, what: Truncation) -> None:
        with self._lock:
            if self.truncation_requested:
                return
            self.truncation_requested = True
        truncation.request(self.store.config.store_path, what)
        if what.reset:
            self.epochs.reset()
        else:
            self.epochs.truncate_from(what.offset)
        self.hooks.restart(f"the master asks to {'start again' if what.reset else f'truncate at {what.offset}'}")

    def save_queue_starts(self, raw: dict[str, int]) -> None:
        """A slave starting again from its master's first file: where each of the master's queues continues
        (Handshake.queue_starts), kept for when it takes office."""
        write_json_atomic(os.path.join(self._ha_dir, QUEUE_STARTS_FILE), {"queueStarts": raw})

    def _queue_starts(self) -> dict[tuple[str, int], int]:
        raw = load_json(os.path.join(self._ha_dir, QUEUE_STARTS_FILE), lambda d: dict(d["queueStarts"])) or {}
        out: dict[tuple[str, int], int] = {}
        for key, offset in raw.items():
            topic, _, qid = str(key).partition(QUEUE_KEY_SEPARATOR)
            if qid.isdigit():
                out[(topic, int(qid))] = int(offset)
        return out

    def apply_metadata(self, version: int, files: dict[str, bytes]) -> None:
        self.sink.apply(version, files)

    def metadata_version(self) -> int:
        return self.sink.version

    def slave_progress(self, confirmed: int) -> None:
        self.read_limit.set_confirmed(confirmed)
        self.sink.catch_up()

    # ------------------------------------------------------------------------------------------ for the gate
    def is_master(self) -> bool:
        return self.role == MASTER

    def admit_write(self) -> None:
        in_sync = self.in_sync
        if in_sync is not None and self.settings.waits_for_replicas:
            in_sync.admit_write()

    def log_end(self) -> int:
        return self.store.max_phys_offset()

    def entry_end(self, commitlog_offset: int) -> int:
        return gate_rules.entry_end(self.store.commit_log.read, commitlog_offset, self.log_end())

    def wrote(self, end_offset: int) -> bool:
        in_sync = self.in_sync
        self.changes.notify()
        if in_sync is None:
            return False
        in_sync.log_grew()
        if not self.settings.waits_for_replicas:
            return True
        confirmed = in_sync.wait_confirmed(end_offset, self.settings.ack_timeout_ms / 1000)
        # Held by every in-sync replica, but the set may have shrunk below the minimum meanwhile (Kafka's
        # NOT_ENOUGH_REPLICAS_AFTER_APPEND): then it is not held by as many as promised, and not acknowledged.
        return confirmed and len(in_sync.members) >= self.settings.min_insync_replicas

    def metadata_changed(self) -> bool:
        version = self.metadata.refresh()
        self.changes.notify()
        in_sync = self.in_sync
        if in_sync is None:
            return False
        if not self.settings.waits_for_replicas:
            return True
        return in_sync.wait_metadata(version, self.settings.ack_timeout_ms / 1000)

    def _confirmed_moved(self) -> None:
        self.read_limit.advanced()
        self.changes.notify()

    def _metadata_loop(self) -> None:
        interval = self.settings.metadata_sync_ms / 1000
        seen = self.metadata.version
        while not self._stop.wait(interval):
            if self.role != MASTER:
                continue
            version = self.metadata.refresh()
            if version != seen:
                seen = version
                self.changes.notify()

    # ------------------------------------------------------------------------------------------ status
    def status(self) -> Status:
        in_sync = self.in_sync
        if self.role == MASTER and in_sync is not None:
            return Status(MASTER, self.epoch, True, 0, in_sync.confirmed,
                          0 if self.controller is not None else self.own_broker_id)
        f = self.slave_fetcher
        lag = max(0, f.master_max_offset - self.store.max_phys_offset()) if f.connected_to else -1
        return Status(self.role, self.known_epoch(), f.in_sync and bool(f.connected_to), lag,
                      self.read_limit.confirmed_offset(), self.own_broker_id)

    def stats(self) -> dict[str, float]:
        """Figures for GetBrokerStats (``sluice stats``): this replica's role and, on a master, each replica's."""
        st = self.status()
        out: dict[str, float] = {"ha_master": float(st.role == MASTER), "ha_epoch": float(st.epoch),
                                 "ha_confirmed_offset": float(st.confirmed_offset), "ha_lag_bytes": float(st.lag_bytes),
                                 "ha_elections": float(self.elections)}
        in_sync = self.in_sync
        if st.role == MASTER and in_sync is not None:
            members = in_sync.members
            out["ha_in_sync_replicas"] = float(len(members))
            for rid, lag_bytes, lag_ms in self.replica_lags():
                out[f"ha_replica_{rid}_lag_bytes"] = float(lag_bytes)
                out[f"ha_replica_{rid}_lag_ms"] = float(lag_ms)
                out[f"ha_replica_{rid}_in_sync"] = float(rid in members)
        return out

    def replica_lags(self) -> list[tuple[int, int, int]]:
        """Master only: (broker id, lag in bytes, ms since caught up) of each replica it knows."""
        in_sync = self.in_sync
        if self.role != MASTER or in_sync is None:
            return []
        end, now = self.store.max_phys_offset(), monotonic_ms()
        return [(r.broker_id, max(0, end - r.written) if r.written >= 0 else end,
                 now - r.caught_up_ms if r.caught_up_ms else -1) for r in in_sync.replicas()]

    def wait_for(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

"""Controller mode: a broker group's membership, master, master epoch and in-sync set live in etcd, and a new master
is elected from the in-sync set when the old one's lease runs out. Sluice implements no consensus of its own: etcd
(Raft, strictly serialisable transactions) does that, as RocketMQ 5's controller and Kafka's KRaft keep metadata
apart from data replication.

Keys, under ``/sluice/<cluster>/<broker name>/`` (values are JSON):

* ``members/<broker id>``: ``{address, haAddress, storeId}``, on the replica's lease: who is alive.
* ``master``: ``{brokerId, epoch}``, on the master's lease: while it exists, the master is alive.
* ``state``: ``{epoch, master, inSync, masterAddress, masterHaAddress}``: the group's current master epoch, who
  holds it and which replicas are in sync. Only the master of the state's epoch changes ``inSync``, by
  compare-and-set on the key's revision, so a stale master's change fails.

Each replica holds one lease of ``ha_lease_ttl_s``, refreshed by a thread of its own ``KEEPALIVES_PER_TTL``
times per TTL, and runs a loop every ``TICK_S``:

* Master: the state must still name it, at its epoch, and its ``master`` key must exist; otherwise, or when its
  lease could not be refreshed for ``FENCE_FRACTION`` of the TTL (etcd may expire it any moment after), it is
  fenced: it stops acknowledging at once and restarts in place as a replica (manager.py).
* Replica: while a ``master`` key exists it follows the state's master (and refuses any older epoch). When none
  exists it runs for election if it is in the state's in-sync set (or, with ``allow_unclean_election``, if it is
  a live member): one transaction, which succeeds only if no master key appeared and the state did not change since
  it was read, writes the state with epoch + 1, itself as master and the in-sync set less the old master, and
  creates the ``master`` key on its own lease. The first group member ever to run takes epoch 1.

A ``master`` key naming this replica but held by a lease it does not own belongs to its previous run (a quick
restart): it waits for that lease to expire like everyone else.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.errors import BrokerError
from broker.ha.etcd_client import (
    CoordinationError,
    Etcd,
    EtcdAuthError,
    EtcdPermissionError,
    EtcdTlsError,
    KeyValue,
    Put,
    RevisionCondition,
)

log = logging.getLogger(__name__)

TICK_S = 0.2
# A master whose lease was last refreshed this long (x TTL) ago stops acknowledging: etcd may expire the lease any
# moment after the TTL, counted from when it received the refresh, which is after this broker sent it.
FENCE_FRACTION = 0.75
KEEPALIVES_PER_TTL = 6  # refreshes per TTL: a few may be slow (a busy machine) before the fence is near
ERROR_LOG_INTERVAL_S = 10.0


@dataclass(frozen=True)
class GroupState:
    epoch: int
    master: int
    in_sync: frozenset[int]
    master_address: str
    master_ha_address: str
    revision: int = 0

    def to_json(self) -> dict[str, object]:
        return {"epoch": self.epoch, "master": self.master, "inSync": sorted(self.in_sync),
                "masterAddress": self.master_address, "masterHaAddress": self.master_ha_address}

    @staticmethod
    def from_kv(kv: KeyValue) -> GroupState:
        v = kv.value
        in_sync = frozenset(int(x) for x in v["inSync"])
        return GroupState(int(v["epoch"]), int(v["master"]), in_sync, str(v.get("masterAddress", "")),
                          str(v.get("masterHaAddress", "")), kv.mod_revision)


@dataclass
class ControllerHooks:
    """What the controller tells the replication manager."""

    follow: Callable[[GroupState], None]  # someone else is master of this state
    elected: Callable[[GroupState], None]  # this replica won the state's epoch
    fenced: Callable[[str], None]  # this master must stop (reason)
    extra: dict[str, object] = field(default_factory=dict)


class Controller:
    def __init__(
        self, etcd: Etcd, *, cluster: str, broker_name: str, broker_id: int, address: str, ha_address: str,
        store_id: str, lease_ttl_s: int, allow_unclean: bool, hooks: ControllerHooks,
    ) -> None:
        self.etcd = etcd
        self.prefix = f"/sluice/{cluster}/{broker_name}/"
        self.broker_id = broker_id
        self.member = {"address": address, "haAddress": ha_address, "storeId": store_id}
        self.lease_ttl_s = lease_ttl_s
        self.allow_unclean = allow_unclean
        self.hooks = hooks
        self.lease = 0
        self._lease_ok_at = 0.0  # monotonic time the last successful keep-alive was sent
        self._member_put = False
        self.state: GroupState | None = None  # as last read
        self.master_epoch = 0  # the epoch this replica is master of (0: not master)
        self.elections = 0  # won by this replica (a metric)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # state writes (in-sync set) vs the loop
        self._lease_lock = threading.Lock()
        self._last_error_log = 0.0

    @property
    def state_key(self) -> str:
        return self.prefix + "state"

    @property
    def master_key(self) -> str:
        return self.prefix + "master"

    def start(self) -> None:
        """Start the loop; first, a refusal of this broker's TLS or credentials by etcd stops the start with its
        error (EtcdTlsError, EtcdAuthError, EtcdPermissionError): a broker that could never be elected must not look
        healthy. An etcd that does not answer yet is waited for by the loop."""
        try:
            self.etcd.get(self.state_key)
        except (EtcdTlsError, EtcdAuthError, EtcdPermissionError):
            raise
        except CoordinationError as e:
            log.warning("etcd does not answer yet (%s); the group's state is read once it does", e.message)
        self._thread = threading.Thread(target=self._run, name="ha-controller", daemon=True)
        self._thread.start()
        self._keeper = threading.Thread(target=self._keep_alive_loop, name="ha-lease", daemon=True)
        self._keeper.start()

    def stop(self, revoke: bool = True) -> None:
        self._stop.set()
        for t in (self._thread, getattr(self, "_keeper", None)):
            if t is not None and t is not threading.current_thread():
                t.join(timeout=10)
        if revoke and self.lease:
            try:
                self.etcd.revoke(self.lease)  # the master key goes at once: the group elects without waiting a TTL
            except BrokerError as e:
                log.warning("could not revoke this replica's etcd lease (%s); it expires in %d s", e.message,
                            self.lease_ttl_s)
        self.etcd.close()

    # ------------------------------------------------------------------------------------------ loop
    def _keep_alive_loop(self) -> None:
        """The lease, refreshed apart from the loop: a slow election or etcd read must not let it lapse."""
        while not self._stop.is_set():
            try:
                with self._lease_lock:
                    self._keep_lease(time.monotonic())
            except BrokerError as e:
                self._log_error(e.message)
            if self.master_epoch and time.monotonic() - self._lease_ok_at > FENCE_FRACTION * self.lease_ttl_s:
                self._fence(f"its etcd lease was not refreshed for {FENCE_FRACTION * self.lease_ttl_s:.1f} s")
            self._stop.wait(min(self.lease_ttl_s / KEEPALIVES_PER_TTL, TICK_S * 2))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except BrokerError as e:
                self._log_error(e.message)
            self._stop.wait(TICK_S)

    def _log_error(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last_error_log >= ERROR_LOG_INTERVAL_S:
            log.warning("controller: %s", message)
            self._last_error_log = now

    def _keep_lease(self, now: float) -> None:
        if self.lease:
            if self.etcd.keep_alive(self.lease) > 0:
                self._lease_ok_at = now
                return
            log.warning("this replica's etcd lease expired; taking a new one")
            self.lease, self._member_put = 0, False
            if self.master_epoch:
                self._fence("its etcd lease expired")
        self.lease = self.etcd.grant(self.lease_ttl_s)
        self._lease_ok_at = now
        self.etcd.put(self.prefix + f"members/{self.broker_id}", self.member, self.lease)
        self._member_put = True

    def _tick(self) -> None:
        with self._lease_lock:
            lease = self.lease
        if not lease:
            return
        state_kv = self.etcd.get(self.state_key)
        master_kv = self.etcd.get(self.master_key)
        state = GroupState.from_kv(state_kv) if state_kv is not None else None
        self.state = state
        if self.master_epoch:
            if (state is None or state.epoch != self.master_epoch or state.master != self.broker_id
                    or master_kv is None or master_kv.lease != lease):
                self._fence(f"etcd names {'no master' if state is None else f'epoch {state.epoch}'} now")
            return
        if master_kv is not None and state is not None:
            if state.master == self.broker_id and master_kv.lease != lease:
                return  # this replica's previous run: its lease expires soon, then the group elects
            self.hooks.follow(state)
            return
        self._run_for_election(state, state_kv, lease)

    def _run_for_election(self, state: GroupState | None, state_kv: KeyValue | None, lease: int) -> None:
        """``lease``: the one this tick read, never ``self.lease`` again: the keeper thread sets that to 0 while it
        takes a new lease, and a master key put on lease 0 never expires (the group would keep a dead master's key,
        every replica waiting for it to go, for ever)."""
        if state is None:
            new = GroupState(1, self.broker_id, frozenset({self.broker_id}), self.member["address"],
                             self.member["haAddress"])
            compare = [RevisionCondition(self.state_key, "CREATE", 0), RevisionCondition(self.master_key, "CREATE", 0)]
        else:
            eligible = self.broker_id in state.in_sync
            if not eligible and self.allow_unclean:
                live = {kv.key.rsplit("/", 1)[-1] for kv in self.etcd.get_prefix(self.prefix + "members/")}
                eligible = str(self.broker_id) in live and not any(
                    str(m) in live for m in state.in_sync if m != state.master
                )
                if eligible:
                    log.error("unclean election: no in-sync replica is alive; this replica (outside the in-sync set) "
                              "takes over and acknowledged messages it lacks are lost")
            if not eligible:
                return
            in_sync = frozenset({self.broker_id} | (state.in_sync - {state.master}))
            new = GroupState(state.epoch + 1, self.broker_id, in_sync, self.member["address"],
                             self.member["haAddress"])
            assert state_kv is not None
            compare = [RevisionCondition(self.state_key, "MOD", state_kv.mod_revision),
                       RevisionCondition(self.master_key, "CREATE", 0)]
        won = self.etcd.transaction(compare, [
            Put(self.state_key, new.to_json()),
            Put(self.master_key, {"brokerId": self.broker_id, "epoch": new.epoch}, lease),
        ])
        if not won:
            return
        self.master_epoch = new.epoch
        self.elections += 1
        written = self.etcd.get(self.state_key)
        self.state = GroupState.from_kv(written) if written is not None else new
        log.warning("elected master of epoch %d (in sync: %s)", new.epoch, sorted(new.in_sync))
        self.hooks.elected(self.state)

    def _fence(self, reason: str) -> None:
        if not self.master_epoch:
            return
        epoch, self.master_epoch = self.master_epoch, 0
        log.error("master of epoch %d fenced: %s", epoch, reason)
        self.hooks.fenced(reason)

    # ------------------------------------------------------------------------------------------ in-sync set
    def record_in_sync(self, members: frozenset[int]) -> bool:
        """Write the in-sync set of this master's epoch (compare-and-set); False when it could not (etcd down, or
        this master is stale: then it is fenced)."""
        with self._lock:
            epoch = self.master_epoch
            if not epoch:
                return False
            for _ in range(3):
                try:
                    kv = self.etcd.get(self.state_key)
                    if kv is None:
                        return False
                    state = GroupState.from_kv(kv)
                    if state.epoch != epoch or state.master != self.broker_id:
                        self._fence(f"the group's state moved to epoch {state.epoch}")
                        return False
                    if state.in_sync == members:
                        return True
                    new = GroupState(epoch, self.broker_id, members, state.master_address, state.master_ha_address)
                    if self.etcd.transaction([RevisionCondition(self.state_key, "MOD", kv.mod_revision)],
                                             [Put(self.state_key, new.to_json())]):
                        self.state = new
                        return True
                except CoordinationError as e:
                    self._log_error(f"could not record the in-sync set: {e.message}")
                    return False
            return False

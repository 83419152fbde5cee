"""Replication's rules for the remoting message processors: the rules that
``broker.ha.replication_gate.ReplicationGate`` applies to gRPC calls (its module docstring), applied here since
remoting requests do not pass through gRPC's interceptors.

* A slave (or a fenced master) refuses sends and send-backs with NOT_MASTER before anything is done (answered
  SERVICE_NOT_AVAILABLE: a 4.x producer then tries the next broker), and drops a pull's piggy-backed commit offset.
* A master that waits for replicas refuses a write while its in-sync set is too small (NOT_ENOUGH_REPLICAS).
* After a send it holds the answer until the in-sync replicas hold the entries; when they do not in time, the send
  is answered FLUSH_SLAVE_TIMEOUT (12) with its usual fields (it is stored on the master), which a 4.x client
  reports as that send status, as a RocketMQ SYNC_MASTER answers. A send-back is refused so (the client then sends
  its copy itself).
"""

from __future__ import annotations

from broker.errors import FlushSlaveTimeoutError, NotMasterError
from broker.ha.replication_gate import GateTarget, ReplicationGate


class GroupReplication:
    def __init__(self, gate: ReplicationGate | None) -> None:
        self.gate = gate

    def _target(self) -> GateTarget | None:
        return self.gate.target if self.gate is not None else None

    def is_master(self) -> bool:
        target = self._target()
        return target is None or target.is_master()

    def before_write(self, what: str) -> GateTarget | None:
        """The replication manager to wait on after the write (None: no replication); raises when refused."""
        target = self._target()
        if target is None:
            return None
        if not target.is_master():
            raise NotMasterError(f"{target.identity_text()} is not its group's master; send {what} to the master "
                                 "(clients find it through the name servers)")
        target.admit_write()
        return target

    @staticmethod
    def replicated(target: GateTarget | None, commitlog_offsets: list[int]) -> bool:
        """Whether the in-sync replicas hold a send's entries (waits up to the broker's ack timeout)."""
        if target is None:
            return True
        end = target.entry_end(max(commitlog_offsets)) if commitlog_offsets else target.log_end()
        return target.wrote(end)

    @staticmethod
    def after_write(target: GateTarget | None, what: str) -> None:
        if target is not None and not target.wrote(target.log_end()):
            raise FlushSlaveTimeoutError(f"{what} was done on the master, but its in-sync replicas did not confirm "
                                         "it in time")

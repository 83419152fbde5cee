"""The exactly-once sink over a cluster's brokers (option ``namesrv``): one micro-batch, all of it visible on every
broker or none of it, even when the driver dies between two brokers' commits.

A micro-batch's rows go to queues of several brokers, each broker holding the batch's halves as its own
transaction under one id. Committing them one after another is not atomic, so the batch has one decision, kept
by one broker, the coordinator (the broker side is in broker/semantics/decision_log.py):

* Transaction id: ``spark:<queryId>:<batchId>:<runId>@<coordinator>``. The coordinator is chosen from the query
  id among the cluster's live masters as the driver saw them when the query (re)started, by rendezvous hashing
  (the broker maximising sha256(query id, broker name)): the writer carries the list to its tasks, so every task
  of a run picks the same broker; a broker joining does not move it unless it wins the hash, and one leaving moves
  only the queries it coordinated (Kafka chooses a transaction's coordinator by hashing the transactional id the
  same way, over its __transaction_state partitions). Every half carries the coordinator's name
  (``TRAN_COORDINATOR``) so that its broker knows whom to ask; the id carries it for the driver.
* Tasks: each first asks every live master whether an earlier run committed this batch (``earlier_commit``): a
  COMMIT decision with the batch's prefix, or a participant that committed a transaction of it. Then the task is
  skipped, naming that transaction for the driver. A transaction of an earlier run still open whose coordinator
  does not answer leaves the batch in doubt: the task fails (rather than write the batch a second time) until that
  broker is back. Otherwise the task sends its rows as halves, broker by broker, each tagged with its attempt id,
  and reports its message count per broker.
* Driver ``commit``: each broker that received rows is a participant, its share being the attempts that wrote to it
  and their message count. (1) ``RecordDecision(COMMIT, shares)`` on the coordinator: on its disk before it
  answers, this is the commit point; the first decision recorded stands, so if a participant gave up waiting and
  fenced ABORT first, the batch fails instead. (2) ``EndTransaction`` on each participant with its share (only the
  listed attempts' halves, exactly that many). (3) Open transactions of the query left on any broker (a dead run's,
  or this batch's halves of failed attempts on a broker no share names) are ended by their own coordinator's
  decision, ABORT when there is none: only a dead run can have left an undecided one.
* A driver that dies after (1) leaves the decision on the coordinator. Spark re-runs the batch: its tasks find the
  decision (step "Tasks"), and the new driver finishes the participants' commits (``finish``) instead of writing
  the batch again. A driver that never returns: each participant, its halves idle, asks the coordinator itself
  and commits its share (participant_resolver.py), and a participant whose batch was never decided fences ABORT
  once it has waited ``transaction_check_max`` checks. Every broker ends with the same outcome.

``SLUICE_SINK_PAUSE_BETWEEN_COMMITS`` (a file path; for crash tests only): after a batch's first participant
committed, the driver writes the transaction id there and waits until the file is removed (at most
``PAUSE_LIMIT_S``), so a test can kill it exactly between two brokers' commits.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from broker.client.coordinator import CoordinatorClient
from broker.client.router import Router
from broker.errors import (
    BrokerError,
    BrokerUnreachableError,
    FlushDiskTimeoutError,
    FlushSlaveTimeoutError,
    NotMasterError,
    ServiceNotAvailableError,
)
from broker.format.txn_decision import Share, TxnDecision, make_decision
from connector.auth_options import ANONYMOUS, AuthKeys
from connector.failover import FAILOVER_WAIT_S, group_without_master
from connector.tls_options import PLAIN, TlsFiles

log = logging.getLogger(__name__)

T = TypeVar("T")
PAUSE_ENV = "SLUICE_SINK_PAUSE_BETWEEN_COMMITS"
PAUSE_LIMIT_S = 300.0
# A participant's commit answers once its share is re-stored in the real topics (1M messages: 4-8 s here); a
# timed-out call would fail the batch though the broker finishes the commit.
COMMIT_TIMEOUT_S = 600.0
RETRY_DELAYS_S = (0.0, 0.5, 1.0, 3.0, 5.0)  # about 10 s: a coordinator or participant restarting is ridden out


def choose_coordinator(key: str, brokers: Sequence[str]) -> str:
    """The broker of ``brokers`` that coordinates ``key``'s transactions (rendezvous hashing)."""
    if not brokers:
        raise ServiceNotAvailableError("no live master broker in the cluster to coordinate the sink's transactions")
    return max(brokers, key=lambda b: hashlib.sha256(f"{key}\x00{b}".encode()).digest())


def coordinator_of(txn_id: str) -> str:
    """The coordinator named in a transaction id of this sink (query, batch and run ids hold no '@')."""
    _, at, coordinator = txn_id.partition("@")
    if not at or not coordinator:
        raise BrokerError(f"transaction {txn_id!r} names no coordinator broker; it is not this sink's")
    return coordinator


def query_prefix(txn_id: str) -> str:
    """``spark:<queryId>:`` (or ``spark-batch:<jobId>``) of a transaction id of this sink."""
    if txn_id.startswith("spark:"):
        return ":".join(txn_id.split(":", 2)[:2]) + ":"
    return txn_id.partition("@")[0]


def live_masters(namesrv: str, tls: TlsFiles = PLAIN, auth: AuthKeys = ANONYMOUS) -> list[str]:
    router = Router(namesrv=namesrv, tls=tls.settings(), credentials=auth.credentials())
    try:
        return sorted(CoordinatorClient(router).masters())
    finally:
        router.close()


def _retried(call: Callable[[], T], router: Router | None = None) -> T:
    """``call()`` (recording a decision, ending a participant's share, asking what was decided: each may be made
    again, the first decision recorded standing and an ended share reporting its outcome) retried while a broker
    cannot do it now: about 10 s for a broker that does not answer, and up to FAILOVER_WAIT_S

    * while a master is moving: ``router`` shows a broker group without its master, or a broker registered as
      master says it no longer is (NOT_MASTER; the name servers catch up with its successor's registration);
    * while a broker that answers refuses for now: its disk is full, too few replicas are in sync, its transactions
      are being recovered (SERVICE_NOT_AVAILABLE and its kinds, from a live broker);
    * after a call done on a master that its replicas or its disk did not confirm in time (FLUSH_SLAVE_TIMEOUT,
      FLUSH_DISK_TIMEOUT): asked again, that master (or the next) says the outcome.

    Past that the last error is raised: the broker is down, or its refusal is not for now."""
    started = time.monotonic()
    attempt = 0
    while True:
        time.sleep(RETRY_DELAYS_S[min(attempt, len(RETRY_DELAYS_S) - 1)])
        try:
            return call()
        except (ServiceNotAvailableError, FlushSlaveTimeoutError, FlushDiskTimeoutError) as e:
            attempt += 1
            waits = (not isinstance(e, BrokerUnreachableError) or isinstance(e, NotMasterError)
                     or (router is not None and group_without_master(router)))
            if attempt >= len(RETRY_DELAYS_S) and (not waits or time.monotonic() - started >= FAILOVER_WAIT_S):
                raise
            log.warning("broker call failed (%s); retrying", e.message)


class ClusterCommit:
    def __init__(self, namesrv: str, tls: TlsFiles = PLAIN, auth: AuthKeys = ANONYMOUS) -> None:
        self.router = Router(namesrv=namesrv, tls=tls.settings(), credentials=auth.credentials())
        self.client = CoordinatorClient(self.router)

    def _retried(self, call: Callable[[], T]) -> T:
        return _retried(call, self.router)

    def close(self) -> None:
        self.router.close()

    def __enter__(self) -> ClusterCommit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ tasks
    def earlier_commit(self, batch_prefix: str, own: str) -> str | None:
        """The transaction of an earlier run that committed this batch (ids starting with ``batch_prefix``), else
        None; BrokerError when an earlier run's transaction is open and its coordinator does not answer."""
        masters = self._retried(self.client.masters)
        statuses: dict[str, set[str]] = {}
        for broker in sorted(masters):
            # each try asks the name servers for the master again: after a failover the first answer can be stale
            for d in self._retried(functools.partial(self.client.query, broker, prefix=batch_prefix)):
                if d.commit:
                    return d.txn_id
            found = self._retried(functools.partial(self.client.transactions, broker, batch_prefix))
            for txn_id, status in found.items():
                if txn_id != own:
                    statuses.setdefault(txn_id, set()).add(status)
        for txn_id, seen in sorted(statuses.items()):
            if "COMMITTED" in seen:  # a participant commits only by a COMMIT decision (its coordinator is away)
                return txn_id
            if "ROLLED_BACK" in seen:  # ... and rolls back only by an ABORT one
                continue
            coordinator = coordinator_of(txn_id)
            if coordinator not in masters:
                raise BrokerError(
                    f"an earlier run's transaction {txn_id} of this batch is still open and its coordinator broker "
                    f"{coordinator!r} is not in the cluster: whether the batch was committed is known there only. "
                    "The batch is not written again until that broker is back"
                )
        return None  # every coordinator of an earlier run answered: none of them committed the batch

    # ------------------------------------------------------------------------------------------ driver
    def commit(self, txn_id: str, shares: list[Share], what: str) -> TxnDecision:
        """Decide COMMIT on the coordinator, then commit every participant's share."""
        coordinator = coordinator_of(txn_id)
        decision = make_decision(txn_id, True, shares)
        standing = self._retried(lambda: self.client.record(coordinator, decision))
        if not standing.commit:
            raise BrokerError(
                f"{what}: transaction {txn_id} was aborted: a broker holding its rows waited for the decision "
                f"longer than its transaction_check_max checks, and coordinator {coordinator!r} decided ABORT "
                "first. Nothing of the batch is visible; it is written again when the query restarts"
            )
        self.finish(standing, what, pause=True)
        return standing

    def finish(self, decision: TxnDecision, what: str, *, pause: bool = False) -> None:
        """Commit every participant's share of a COMMIT decision (ends already done report their outcome).
        ``pause``: the test hook may stop the driver after the first participant (PAUSE_ENV)."""
        for i, share in enumerate(decision.participants):
            status = self._retried(lambda share=share: self.client.end(  # type: ignore[misc]
                share.broker_name, decision.txn_id, True, share.committed_attempts,
                expected_messages=share.expected_messages, timeout_s=COMMIT_TIMEOUT_S,
            ))
            if status != "COMMITTED":
                raise BrokerError(f"{what}: transaction {decision.txn_id} ended as {status} on broker "
                                  f"{share.broker_name!r}, not COMMITTED")
            if pause and i == 0 and len(decision.participants) > 1:
                _pause_between_commits(decision.txn_id)

    def finish_earlier(self, txn_id: str, what: str) -> None:
        """An earlier run committed this batch: commit what its driver did not get to."""
        coordinator = coordinator_of(txn_id)
        try:
            found = self._retried(lambda: self.client.query(coordinator, [txn_id]))
        except ServiceNotAvailableError as e:
            log.warning("%s was committed by an earlier run (%s), whose coordinator %s does not answer (%s); its "
                        "brokers commit their parts by themselves when it is back", what, txn_id, coordinator,
                        e.message)
            return
        for d in found:
            if d.commit:
                self.finish(d, what)
                log.info("%s: finished the commit of an earlier run's transaction %s", what, txn_id)

    def resolve_leftovers(self, prefix: str) -> int:
        """End every open transaction starting with ``prefix`` on every live master by its coordinator's decision
        (ABORT when it has none); returns how many were ended. Best effort: what fails is logged, and the brokers
        resolve those by themselves."""
        masters = self._retried(self.client.masters)
        ended = 0
        for broker in sorted(masters):
            try:
                open_ids = self.client.transactions(broker, prefix, "OPEN", masters=masters)
            except BrokerError as e:
                log.warning("open transactions of %s on %s not listed (%s)", prefix, broker, e.message)
                continue
            for txn_id in sorted(open_ids):
                try:
                    [d] = self.client.query(coordinator_of(txn_id), [txn_id], abort_undecided=True, masters=masters)
                    share = d.share(broker) if d.commit else None
                    if share is None:
                        self.client.end(broker, txn_id, False)
                    else:
                        self.client.end(broker, txn_id, True, share.committed_attempts,
                                        expected_messages=share.expected_messages,
                                        timeout_s=COMMIT_TIMEOUT_S)
                    ended += 1
                except BrokerError as e:
                    log.warning("left-over transaction %s on %s not ended now (%s); the broker ends it by its "
                                "coordinator's decision later", txn_id, broker, e.message)
        return ended


def _pause_between_commits(txn_id: str) -> None:
    path = os.environ.get(PAUSE_ENV)
    if not path:
        return
    with open(path + ".tmp", "w") as f:
        f.write(txn_id)
    os.replace(path + ".tmp", path)
    log.warning("paused between two participants' commits of %s until %s is removed", txn_id, path)
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


__all__ = ["ClusterCommit", "choose_coordinator", "coordinator_of", "live_masters", "query_prefix"]

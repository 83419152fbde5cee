"""A participant broker ends its part of a transaction over several brokers by the coordinator's decision, with no
committer and no producer to ask: two real stores (participant and coordinator) in one process."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from store_box import StoreBox

from broker.errors import ServiceNotAvailableError
from broker.format.message import StoredMessage, encode_entry, encode_properties
from broker.format.transaction_codec import ATTEMPT
from broker.format.txn_decision import Share, TxnDecision, make_decision
from broker.semantics.decision_log import DecisionLog
from broker.semantics.participant_resolver import COORDINATOR_PROPERTY, ParticipantResolver
from broker.semantics.transaction import TransactionService, TxStatus
from tests.support.waiting import wait_until

CHECK_MAX = 3


class Participant:
    """A participant broker's TransactionService with its resolver, asking a coordinator ``C`` in-process."""

    def __init__(self, box: StoreBox, coordinator: DecisionLog) -> None:
        self.coordinator = coordinator
        self.reachable = True
        self.asked: list[tuple[str, list[str], bool]] = []
        self.checked: list[str] = []  # check-backs with a producer
        self.tx = TransactionService(
            box.s, os.path.join(box.path, "config"), checker=self._checker, transaction_timeout_ms=1,
            check_interval_ms=3_600_000, check_max=CHECK_MAX,
        )
        self.resolver = ParticipantResolver(self.tx, "P", self._ask)
        self.tx.resolver = self.resolver
        self.tx.start()

    def _checker(self, group: str, txn_id: str, half: StoredMessage) -> None:
        self.checked.append(txn_id)

    def _ask(self, coordinator: str, txn_ids: list[str], abort_undecided: bool) -> list[TxnDecision]:
        assert coordinator == "C"
        self.asked.append((coordinator, txn_ids, abort_undecided))
        if not self.reachable:
            raise ServiceNotAvailableError("coordinator C is down")
        return self.coordinator.query(txn_ids, abort_undecided=abort_undecided)

    def put(self, txn_id: str, attempt: str, bodies: list[bytes], coordinator: str | None = "C") -> None:
        props = {ATTEMPT: attempt} | ({COORDINATOR_PROPERTY: coordinator} if coordinator else {})
        raw = encode_properties(props)
        buffer = b"".join(encode_entry(b"Out", 0, b, raw) for b in bodies)
        assert self.tx.put_half_batch(buffer, "spark", txn_id).ok

    def check_pass(self) -> int:
        """One check pass (the 1 ms timeout passed), then the resolver's round; returns decisions applied."""
        time.sleep(0.01)
        self.tx.check_once()
        return self.resolver.resolve_pending()

    def status(self, txn_id: str) -> TxStatus:
        info = self.tx.transaction(txn_id)
        assert info is not None
        return info.status


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[DecisionLog]:
    b = StoreBox(str(tmp_path / "coordinator"))
    b.open()
    log = DecisionLog(b.s, os.path.join(b.path, "config"))
    log.start()
    yield log
    log.shutdown()
    b.close()


@pytest.fixture
def participant(box: StoreBox, coordinator: DecisionLog) -> Iterator[Participant]:
    p = Participant(box, coordinator)
    yield p
    p.tx.shutdown()


def test_a_decided_commit_is_applied_when_the_committer_never_returns(
    box: StoreBox, participant: Participant, coordinator: DecisionLog
) -> None:
    participant.put("T", "a1", [b"one", b"two"])
    participant.put("T", "a2", [b"failed attempt"])  # a writer attempt the commit does not keep
    coordinator.record(make_decision("T", True, [Share("P", ("a1",), 2), Share("Q", ("b1",), 7)]))
    # The committer died here: nobody ends T on P. Its check pass asks the coordinator instead of a producer.
    assert participant.check_pass() == 1
    assert participant.status("T") is TxStatus.COMMITTED and participant.checked == []
    assert participant.asked == [("C", ["T"], False)]
    assert [m.body for m in box.read_topic("Out")] == [b"one", b"two"]


def test_a_commit_that_does_not_name_this_broker_rolls_its_halves_back(
    box: StoreBox, participant: Participant, coordinator: DecisionLog
) -> None:
    participant.put("T", "a9", [b"only a failed attempt wrote here"])
    coordinator.record(make_decision("T", True, [Share("Q", ("b1",), 7)]))
    assert participant.check_pass() == 1
    assert participant.status("T") is TxStatus.ROLLED_BACK and box.read_topic("Out") == []


def test_an_undecided_transaction_waits_then_is_fenced_so_a_late_commit_cannot_win(
    box: StoreBox, participant: Participant, coordinator: DecisionLog
) -> None:
    participant.put("T", "a1", [b"x"])
    for _ in range(CHECK_MAX):  # asked at each check; no decision yet: left open
        assert participant.check_pass() == 0 and participant.status("T") is TxStatus.OPEN
    assert [final for _, _, final in participant.asked] == [False] * CHECK_MAX
    # Where a producer's transaction would be rolled back alone, the coordinator is asked to decide ABORT.
    assert participant.check_pass() == 1
    assert participant.asked[-1] == ("C", ["T"], True)
    assert participant.status("T") is TxStatus.ROLLED_BACK
    late = coordinator.record(make_decision("T", True, [Share("P", ("a1",), 1)]))
    assert not late.commit  # the committer, back late, learns the batch was aborted
    assert box.read_topic("Out") == [] and participant.checked == []


def test_a_coordinator_that_does_not_answer_leaves_the_halves_open(
    box: StoreBox, participant: Participant, coordinator: DecisionLog, caplog: pytest.LogCaptureFixture
) -> None:
    participant.put("T", "a1", [b"x", b"y"])
    coordinator.record(make_decision("T", True, [Share("P", ("a1",), 2)]))
    participant.reachable = False
    with caplog.at_level(logging.WARNING):
        for _ in range(CHECK_MAX + 3):  # past check_max: still never rolled back alone
            assert participant.check_pass() == 0
    assert participant.status("T") is TxStatus.OPEN and "did not answer" in caplog.text
    participant.reachable = True
    assert participant.check_pass() == 1
    assert participant.status("T") is TxStatus.COMMITTED
    assert [m.body for m in box.read_topic("Out")] == [b"x", b"y"]


def test_halves_without_a_coordinator_are_checked_back_as_before(
    box: StoreBox, participant: Participant, coordinator: DecisionLog
) -> None:
    participant.put("R", "a1", [b"plain"], coordinator=None)
    for _ in range(CHECK_MAX):
        participant.check_pass()
    assert participant.checked == ["R"] * CHECK_MAX and participant.asked == []
    participant.check_pass()
    assert participant.status("R") is TxStatus.ROLLED_BACK  # no answer after check_max: rolled back, as RocketMQ


def test_a_share_that_no_longer_matches_the_halves_stays_open_and_is_logged(
    box: StoreBox, participant: Participant, coordinator: DecisionLog, caplog: pytest.LogCaptureFixture
) -> None:
    participant.put("T", "a1", [b"x"])
    coordinator.record(make_decision("T", True, [Share("P", ("a1",), 2)]))  # 2 were sent; 1 is here
    with caplog.at_level(logging.ERROR):
        assert participant.check_pass() == 0
    assert participant.status("T") is TxStatus.OPEN and "cannot end so" in caplog.text
    assert box.read_topic("Out") == []


def test_the_resolver_thread_resolves_on_its_own(
    box: StoreBox, participant: Participant, coordinator: DecisionLog
) -> None:
    participant.put("T", "a1", [b"x"])
    coordinator.record(make_decision("T", True, [Share("P", ("a1",), 1)]))
    participant.resolver.start()
    try:
        time.sleep(0.01)
        participant.tx.check_once()  # the pass only notes T; the resolver's thread asks and commits
        wait_until(lambda: participant.status("T") is TxStatus.COMMITTED, "the resolver's commit", interval_s=0.005)
    finally:
        participant.resolver.shutdown()
    assert [m.body for m in box.read_topic("Out")] == [b"x"]

"""Every operation asks for the caller's rights first: each public method of the processors every protocol front
calls begins with ``authorize(...)`` (broker/auth/operations.py), before it reads, creates or changes anything,
unless it is listed below with the reason it decides otherwise. A new operation added without its check fails here;
the authorization matrix (test_auth_matrix.py) then shows, through every front, that the check is the right one."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from broker.server.admin_processor import AdminProcessor
from broker.server.broker_service import BrokerService
from broker.server.pop_processor import PopProcessor
from broker.server.pull_processor import PullProcessor
from broker.server.retry_processor import RetryProcessor
from broker.server.send_processor import SendProcessor
from broker.server.transaction_processor import TransactionProcessor

PROCESSORS = (AdminProcessor, PullProcessor, PopProcessor, SendProcessor, RetryProcessor, TransactionProcessor)
# BrokerService is the Sluice front; these of its methods are operations other fronts call too.
SHARED_SERVICE_OPERATIONS = ("heartbeat", "leave", "lock_batch", "unlock_batch")

DECIDED_OTHERWISE = {
    # decided on what they resolve, once they found it (operations.py's resolved rules)
    "SendProcessor.send_batch": "the topics inside the batch's entries, once validated (PUBLISH_BATCH)",
    "RetryProcessor.send_back": "the topic of the stored message it copies (SEND_BACK)",
    "TransactionProcessor.end": "the transaction's recorded producer group, by the transaction service",
    "AdminProcessor.view_by_id": "the topic of the entry read (VIEW_MESSAGE)",
    # the rights checks themselves
    "SendProcessor.authorize_deduplicated_send": "is the check of a send the deduplicator may answer",
    "SendProcessor.authorize_deduplicated_batch": "is the check of a retried batch the deduplicator may answer",
    # the broker's own work, which no caller asks for
    "AdminProcessor.lags": "the metrics gauge's per (group, topic) lag; consumer_lag asks before it calls it",
    "PullProcessor.validate": "part of pull, after its check",
    "PullProcessor.commit": "part of pull, after its check",
    "PullProcessor.check_commit": "the offset table's bound on every commit, after the commit's own check",
    "PopProcessor.release": "a delivery the caller's own pop made that never reached it, given back",
    "PopProcessor.release_client": "a client that left: its renewals end (its group's leave is checked)",
    "RetryProcessor.ensure_retry_topic": "part of a heartbeat, after its check",
    "RetryProcessor.admit_pull": "part of pull, after its check",
    "RetryProcessor.admit_commit": "part of a commit or reset, after its check",
    "RetryProcessor.admit_broadcast": "part of a heartbeat, after its check",
    "RetryProcessor.message_filter": "builds a filter; reads nothing",
}


def operations() -> list[tuple[str, object]]:
    found = []
    for cls in PROCESSORS:
        for name, member in vars(cls).items():
            if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, staticmethod)):
                found.append((f"{cls.__name__}.{name}", getattr(cls, name)))
    for name in SHARED_SERVICE_OPERATIONS:
        found.append((f"BrokerService.{name}", getattr(BrokerService, name)))
    return found


def first_statement(function: object) -> ast.stmt:
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))  # type: ignore[arg-type]
    body = tree.body[0].body  # type: ignore[attr-defined]
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):  # the docstring
        body = body[1:]
    return body[0]


def asks(statement: ast.stmt) -> bool:
    """Whether ``statement`` is a call of ``authorize`` or of a ``self.authorize_*`` check."""
    if not isinstance(statement, ast.Expr) or not isinstance(statement.value, ast.Call):
        return False
    func = statement.value.func
    return (isinstance(func, ast.Name) and func.id == "authorize") or (
        isinstance(func, ast.Attribute) and func.attr.startswith("authorize"))


OPERATIONS = operations()


@pytest.mark.parametrize(("name", "function"), OPERATIONS, ids=[n for n, _ in OPERATIONS])
def test_each_operation_asks_for_its_rights_first(name: str, function: object) -> None:
    if name in DECIDED_OTHERWISE:
        return
    statement = first_statement(function)
    assert asks(statement), f"{name} begins with {ast.unparse(statement)!r}, not its rights check"


def test_the_exceptions_name_real_methods() -> None:
    names = {n for n, _ in OPERATIONS}
    assert set(DECIDED_OTHERWISE) <= names, sorted(set(DECIDED_OTHERWISE) - names)
    checked = names - set(DECIDED_OTHERWISE)
    assert len(checked) >= 25, sorted(checked)  # the operations this walks are really there


def test_a_method_without_its_check_is_caught() -> None:
    def leaky(self: object, topic: str) -> None:
        """Reads first."""
        len(topic)

    def careful(self: object, topic: str) -> None:
        authorize(topic)  # type: ignore[name-defined]  # noqa: F821 - parsed, never run

    assert not asks(first_statement(leaky))
    assert asks(first_statement(careful))

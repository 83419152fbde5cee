"""The remoting processors of message traffic (sends, pulls, send-backs, transactions, locks, pops), built from a
running broker in one call.

``message_processors(controller)`` takes what ``BrokerController`` wired for its gRPC service (the send, pull and
retry processors, the pull hold service, the accounts when auth is on) and returns the table entries
``{request code: processor}`` for the transport to register, with the ``shutdown`` that answers held pulls when the
broker stops (call it before the broker's own shutdown, as the gRPC server is stopped before the store). Replication's
rules for gRPC calls apply to these requests too (``message_replication``), through the broker's ``gate``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.remoting.client_processor import ClientProcessors
from broker.remoting.codes import RequestCode
from broker.remoting.lock_processor import LOCK_CODES, LockProcessor
from broker.remoting.message_ids import RemotingIds
from broker.remoting.message_outcomes import Access
from broker.remoting.message_replication import GroupReplication
from broker.remoting.pop_processor import POP_CODES, PopMessageProcessors
from broker.remoting.processor import Processor
from broker.remoting.pull_processor import PullMessageProcessor
from broker.remoting.pull_request import PULL_MESSAGE, SubscriptionOf
from broker.remoting.pull_suspend import PullSuspender
from broker.remoting.send_back import CONSUMER_SEND_MSG_BACK, SendBackProcessor
from broker.remoting.send_processor import SEND_CODES, SendMessageProcessor
from broker.remoting.transaction_checks import ProducerHeartbeat, ProducerUnregister, RemotingProducers
from broker.remoting.transaction_processor import END_TRANSACTION, EndTransactionProcessor

if TYPE_CHECKING:
    from broker.server.broker_controller import BrokerController


# The request codes these processors answer (docs/remoting.md's table is checked against them).
MESSAGE_CODES = (*SEND_CODES, PULL_MESSAGE, CONSUMER_SEND_MSG_BACK, END_TRANSACTION, *LOCK_CODES, *POP_CODES)


@dataclass
class MessageProcessors:
    table: dict[int, Processor]
    suspender: PullSuspender
    # The producer groups' connections, which the broker's transaction check-back reaches (transaction_checks.py).
    producers: RemotingProducers | None = None
    pops: PopMessageProcessors | None = None

    def shutdown(self) -> None:
        self.suspender.shutdown()
        if self.pops is not None:
            self.pops.shutdown()


def message_processors(
    controller: BrokerController, *, subscription_of: SubscriptionOf | None = None,
    msg_ids: RemotingIds | None = None, clients: ClientProcessors | None = None,
) -> MessageProcessors:
    """The entries for SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE, PULL_MESSAGE and CONSUMER_SEND_MSG_BACK,
    END_TRANSACTION, the queue locks and the pop codes (HEART_BEAT and UNREGISTER_CLIENT wrapped to know producers).
    ``subscription_of``: the (expression, type) a group's heartbeat registered for a topic, which filters the
    pulls of push consumers (they send none); without it they are given everything and filter by tag themselves.
    ``msg_ids``: the remoting address send answers' ids name (message_ids.py); None: the store's host.
    ``clients``: the heartbeat and unregister processors the broker table serves (their rights checks and consumer
    channels), wrapped here to learn the producer groups too; None: plain ones."""
    service = controller.service
    assert service is not None and service.retries is not None, "build the processors of a started broker"
    access = Access.of(controller)
    replication = GroupReplication(controller.gate)
    suspender = PullSuspender(service.pulls, controller.hold)
    sends = SendMessageProcessor(service.sends, access, replication, msg_ids)
    table: dict[int, Processor] = dict.fromkeys(SEND_CODES, sends)
    table[PULL_MESSAGE] = PullMessageProcessor(service.pulls, suspender, access, subscription_of, replication, msg_ids)
    table[CONSUMER_SEND_MSG_BACK] = SendBackProcessor(service.retries, access, replication)
    # transactions (with their check-backs over the producers' connections), queue locks, pops
    producers = RemotingProducers(access, ids=msg_ids)
    members = (clients or ClientProcessors(service, access)).processors()
    table[RequestCode.HEART_BEAT] = ProducerHeartbeat(members[RequestCode.HEART_BEAT], producers)
    table[RequestCode.UNREGISTER_CLIENT] = ProducerUnregister(members[RequestCode.UNREGISTER_CLIENT], producers)
    if service.transactions is not None:
        table[END_TRANSACTION] = EndTransactionProcessor(service.transactions, access, replication)
    table.update(dict.fromkeys(LOCK_CODES, LockProcessor(service, access, replication)))
    pops = PopMessageProcessors(service.pops, access, replication) if service.pops is not None else None
    if pops is not None:
        table.update(dict.fromkeys(POP_CODES, pops))
    return MessageProcessors(table, suspender, producers, pops)

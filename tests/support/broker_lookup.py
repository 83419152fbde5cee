"""A broker's answers to a requirement row's preview of a call's needs (broker/auth/requirements.py's ``Lookup``):
the producer group of a transaction named by id or half offset, and the topic of a message named by msgId. The
operations decide on what they resolve themselves; this is what a test grants a caller before it calls."""

from __future__ import annotations

from broker.errors import BrokerError
from broker.format.message import BODY_START, I32, POS_BODY_LENGTH
from broker.semantics.transaction import TransactionService
from broker.store import MessageStore


class BrokerLookup:
    def __init__(self, store: MessageStore, transactions: TransactionService) -> None:
        self.store = store
        self.transactions = transactions

    def transaction_group(self, txn_id: str, half_commitlog_offset: int | None) -> str | None:
        return self.transactions.producer_group_of(txn_id, half_commitlog_offset)

    def message_topic(self, msg_id: str) -> str | None:
        try:
            found = self.store.view_entry_by_msg_id(msg_id)
        except (BrokerError, ValueError):  # not an id at all: the handler says so
            return None
        if found is None:
            return None
        topic_at = BODY_START + I32.unpack_from(found, POS_BODY_LENGTH)[0]
        return found[topic_at + 1 : topic_at + 1 + found[topic_at]].decode("utf-8", "replace")

"""Sluice's message store: commit log, consume queues, index, flush, recovery and expiry (RocketMQ's design)."""

from broker.format.message import StoredMessage
from broker.store.message_store import MessageStore
from broker.store.store_config import ASYNC_FLUSH, SYNC_FLUSH, StoreConfig
from broker.store.store_results import GetResult, GetStatus, PutResult, PutStatus

__all__ = [
    "ASYNC_FLUSH",
    "SYNC_FLUSH",
    "GetResult",
    "GetStatus",
    "MessageStore",
    "PutResult",
    "PutStatus",
    "StoreConfig",
    "StoredMessage",
]

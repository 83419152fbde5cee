"""A real MessageStore in tmp_path with small files, restartable, checked for consistency at the end."""

from __future__ import annotations

from broker.format.message import StoredMessage
from broker.store import GetStatus, MessageStore, StoreConfig

SMALL = dict(
    mapped_file_size_commit_log=1 << 20,
    mapped_file_size_consume_queue=2000 * 20,
    max_hash_slot_num=1024,
    max_index_num=8192,
    max_message_size=64 * 1024,
    max_batch_bytes=512 * 1024,
    flush_interval_commit_log_ms=50,
)


def small_config(path: str, **overrides: object) -> StoreConfig:
    return StoreConfig(store_path=path, **{**SMALL, **overrides})  # type: ignore[arg-type]


class StoreBox:
    """Owns the store of one test: open, restart (clean or crash-like), and check at the end."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.store: MessageStore | None = None

    def open(self, **overrides: object) -> MessageStore:
        assert self.store is None
        self.store = MessageStore(small_config(self.path, **overrides))
        self.store.start()
        return self.store

    def close(self) -> None:
        if self.store is not None:
            self.store.shutdown()
            self.store = None

    @property
    def s(self) -> MessageStore:
        assert self.store is not None, "store is closed"
        return self.store

    def read_queue(self, topic: str, queue_id: int = 0, start: int = 0) -> list[StoredMessage]:
        """Every message of a queue from ``start`` (waits for the dispatcher first)."""
        assert self.s.wait_dispatched()
        out: list[StoredMessage] = []
        offset = start
        while True:
            res = self.s.get_message("TEST", topic, queue_id, offset, 1024)
            if res.status is GetStatus.NO_MATCHED_MESSAGE:  # only skipped units (rolled back in place): go past
                offset = res.next_begin_offset
                continue
            if res.status is not GetStatus.FOUND:
                return out
            out += res.messages()
            offset = res.next_begin_offset

    def read_topic(self, topic: str) -> list[StoredMessage]:
        assert self.s.wait_dispatched()
        return [m for q in sorted(self.s.queue_ids(topic)) for m in self.read_queue(topic, q)]

    def crash(self) -> None:
        """What SIGKILL leaves: nothing flushed by us, abort file kept (page cache keeps the bytes)."""
        assert self.store is not None
        self.store.abandon()
        self.store = None

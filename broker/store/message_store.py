"""MessageStore: the facade the broker server uses (RocketMQ's DefaultMessageStore).

Owns the commit log, consume queues, index, checkpoint and the service threads (dispatch, flush, cleanup), and
turns their outcomes into PutResult / GetResult statuses. Lifecycle: ``start()`` takes the ``lock`` file, recovers
(abnormally if an ``abort`` file was left behind), writes ``abort``, starts the threads; ``shutdown()`` stops them,
flushes everything, writes the checkpoint, removes ``abort`` and releases the lock.

Its parts, each in a module of its own: when writes are refused (write_state.py), the dispatch thread
(dispatch_service.py), one message's entry (single_entry.py), deleted topics (topic_deletions.py), lookups by key
and time (message_search.py) and the lock file (store_lock.py).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from broker.errors import MessageIllegalError, ServiceNotAvailableError
from broker.format.batch import (
    MAX_QUEUE_ID,
    EntryRun,
    SmallBatch,
    ValidatedBatch,
    validate_batch,
    validate_small_batch,
)
from broker.format.message import (
    BODY_START,
    I32,
    I64,
    POS_BODY_LENGTH,
    POS_PREPARED_TX_OFFSET,
    POS_STORE_HOST,
    POS_SYS_FLAG,
    TOPIC_PATTERN,
    Prop,
    StoredMessage,
    decode_entry,
    in_place_transactional,
    msg_id_prefix_of,
    parse_msg_id,
    takes_queue_offset,
    validate_topic,
)
from broker.store import truncation
from broker.store.check import check_store
from broker.store.checkpoint import Checkpoint
from broker.store.cleanup import CleanupService
from broker.store.commit_log import CommitLog, CreateMappedFileError
from broker.store.consume_queue import ConsumeQueue, VisibilityHold
from broker.store.consume_queue_table import ConsumeQueueTable
from broker.store.directory import make_dirs
from broker.store.disk_reserve import DiskReserve
from broker.store.dispatch_service import DispatchService
from broker.store.dispatcher import ArrivalListener, Dispatcher, DispatchHint
from broker.store.faults import FaultInjector
from broker.store.flush import (
    AsyncFlushService,
    ConsumeQueueFlushService,
    GroupCommitService,
    ServiceThread,
    flush_commit_log,
)
from broker.store.index_file import IndexService
from broker.store.message_search import earliest_message_time, offset_by_time, query_by_key
from broker.store.queue_reader import QueueReader
from broker.store.recovery import RecoveryReport, recover
from broker.store.single_entry import SingleEntryEncoder
from broker.store.store_config import StoreConfig
from broker.store.store_lock import StoreLock
from broker.store.store_results import GetResult, GetStatus, PutResult, PutStatus
from broker.store.topic_deletions import TopicDeletions
from broker.store.txn_visibility import TxnVisibility, state_path
from broker.store.write_state import WriteState

log = logging.getLogger(__name__)

# A caller may ask for more than max_transfer_bytes_per_get, but never more than this in one get: the buffer is
# built in memory and shipped in one response.
MAX_BYTES_PER_GET = 64 * 1024 * 1024
# check() waits this long for the dispatcher to reach the end of the commit log.
CHECK_DISPATCH_WAIT_S = 10.0


class MessageStore:
    def __init__(self, config: StoreConfig) -> None:
        config.validate()
        self.config = config
        self.faults = FaultInjector()
        faults = self.faults
        self.commit_log = CommitLog(
            config, faults.syncer("commitlog"), faults.allocator("commitlog"), faults.dir_syncer("commitlog")
        )
        self.queues = ConsumeQueueTable(
            config.consume_queue_dir,
            config.mapped_file_size_consume_queue,
            faults.syncer("consumequeue"),
            faults.dir_syncer("consumequeue"),
            faults.allocator("consumequeue"),
        )
        self.index: IndexService | None = (
            IndexService(
                config.index_dir,
                config.max_hash_slot_num,
                config.max_index_num,
                faults.syncer("index"),
                faults.dir_syncer("index"),
            )
            if config.message_index_enable
            else None
        )
        self.dispatcher = Dispatcher(self.commit_log, self.queues, self.index)
        self.dispatcher.set_due_times(config.schedule_topic, config.delay_level_ms)
        self._visibility_lock = threading.Lock()  # release_visibility and markers vs queue_ranges
        self.txn_visibility = TxnVisibility(
            state_path(config.config_dir), self.queues, self.dispatcher.listeners, self._visibility_lock,
            self.dispatcher.lock,
        )
        self.dispatcher.txn = self.txn_visibility
        self.checkpoint: Checkpoint | None = None
        self.recovery_report: RecoveryReport | None = None
        self._lock = StoreLock(config.store_path, config.lock_path)
        self._running = False
        self._counters = {"put_msgs": 0, "put_bytes": 0, "put_errors": 0, "get_msgs": 0, "get_bytes": 0, "gets": 0}
        self.disk_reserve = DiskReserve(config.store_path, config.disk_reserve_bytes)
        self.write_state = WriteState(config, self.disk_reserve, self.dispatcher, self._counters)
        self._services: list[ServiceThread] = []
        self._group_commit: GroupCommitService | None = None
        self._async_flush: AsyncFlushService | None = None
        self._cq_flush: ConsumeQueueFlushService | None = None
        self._dispatch_service: DispatchService | None = None
        self.cleanup: CleanupService | None = None
        self._encoder = SingleEntryEncoder(config, self.commit_log)
        self.topic_deletions = TopicDeletions(config, self.commit_log, self.queues, self.dispatcher,
                                              self.txn_visibility)
        # topic -> commit-log offset where it was last deleted (topic_deletions.py), the dispatcher's dict too
        self.deleted_topics = self.topic_deletions.table
        self._reader = QueueReader(self.commit_log, config.mapped_file_size_commit_log, self._counters)
        # A replicated group's confirmed offset (broker/ha/read_limit.py): readers see no entry ending past it.
        # None: everything written is readable (a broker on its own).
        self.read_limit: Callable[[], int] | None = None
        # A slave of a replicated group (broker/ha): its log is its master's copy, its queue-offset table unused
        self.replica = False

    # ================================================================================================ lifecycle
    def start(self) -> None:
        cfg = self.config
        new_dirs = make_dirs(cfg.store_path) + make_dirs(cfg.config_dir)
        self._lock.take()
        try:
            abnormal = os.path.exists(cfg.abort_path)
            self.checkpoint = Checkpoint(cfg.checkpoint_path, self.faults.syncer("checkpoint"))
            self.topic_deletions.load()  # before recovery: its re-dispatch must not bring deleted topics back
            cut = truncation.pending(cfg.store_path)
            if cut is not None and cut.reset:  # the log starts again: no deletion point names any of it
                self.deleted_topics.clear()
                self.topic_deletions.save()
            self.recovery_report = recover(
                cfg, self.commit_log, self.queues, self.index, self.dispatcher, self.checkpoint, abnormal, cut
            )
            self.txn_visibility.save(self.commit_log.min_offset, force=True)  # the file exists from the first start
            self.topic_deletions.settle()
            self.disk_reserve.make()  # after recovery, which may need the room more
            if abnormal or cut is not None:
                self._sync_recovered_files()
            if cut is not None:
                self._finish_truncation(cut.offset if not cut.reset else 0)
            with open(cfg.abort_path, "wb") as f:
                os.fsync(f.fileno())
            # The abort file must survive a power loss, or the next start would trust the files (normal recovery)
            # after a crash; the store directory also names the checkpoint and the lock file (directory.py).
            for d in dict.fromkeys([*new_dirs, cfg.store_path]):
                self.faults.fsync_dir(d, "store-dir")
            self._start_services()
        except BaseException:
            self._lock.release()
            raise
        self._running = True

    def _finish_truncation(self, end: int) -> None:
        """After a truncation (truncation.py): the checkpoint must not claim anything past the cut as flushed, or a
        crash would skip re-checking and re-dispatching what is written there next; then the intent goes."""
        assert self.checkpoint is not None
        data = self.checkpoint.data
        self.checkpoint.update(physic_offset=min(data.physic_offset, end), logics_offset=min(data.logics_offset, end),
                               index_offset=min(data.index_offset, end))
        truncation.done(self.config.store_path)

    def _start_services(self) -> None:
        cfg = self.config
        assert self.checkpoint is not None
        self._dispatch_service = DispatchService(self.dispatcher, cfg.dispatch_interval_ms,
                                                 self.write_state.set_dispatch_error,
                                                 self.write_state.release_reserve)
        if cfg.sync_flush:
            self._group_commit = GroupCommitService(self.commit_log, self.checkpoint, self.write_state.on_io_error)
        else:
            self._async_flush = AsyncFlushService(cfg, self.commit_log, self.checkpoint, self.write_state.on_io_error)
        self._cq_flush = ConsumeQueueFlushService(
            cfg, self.queues, self.index, self.dispatcher, self.checkpoint, self.write_state.on_io_error
        )
        self.cleanup = CleanupService(
            cfg, self.commit_log, self.queues, self.index, self.dispatcher, self.write_state.set_disk_full
        )
        services: list[ServiceThread | None] = [
            self._dispatch_service, self._group_commit, self._async_flush, self._cq_flush, self.cleanup,
        ]
        self._services = [s for s in services if s is not None]
        for s in self._services:
            s.start()

    def shutdown(self) -> None:
        """Stop taking writes, dispatch and flush everything, write the checkpoint, remove ``abort``."""
        if not self._running:
            return
        self._running = False
        self.commit_log.stop_appends()  # waits for an append in flight; later ones get SERVICE_NOT_AVAILABLE
        for s in reversed(self._services):
            s.stop()
        clean = False  # set only once every step below has succeeded: a step that raises leaves ``abort``
        try:
            assert self.checkpoint is not None
            # The commit log first: it holds the data, and the queues and index are rebuilt from it when a later
            # step fails (a consume-queue file that cannot be created, say).
            log_flushed = flush_commit_log(self.commit_log, self.checkpoint, self.write_state.on_io_error)
            self.dispatcher.dispatch_available(notify=False)
            queues_flushed = self._cq_flush is not None and self._cq_flush.flush_all(final=True)
            clean = log_flushed and queues_flushed and not self.write_state.write_error
        finally:
            self._close_files()
            if clean:
                os.unlink(self.config.abort_path)
            else:
                log.error("store shut down after an I/O error; the next start recovers abnormally")
            self._lock.release()

    def abandon(self) -> None:
        """Stop threads and close files without flushing or removing ``abort``: what a crash leaves behind.

        The page cache keeps what was written (as after SIGKILL), so tests can restart on the same directory.
        """
        self._running = False
        self.commit_log.stop_appends()
        for s in reversed(self._services):
            s.stop()
        self._close_files()
        self._lock.release()

    def _close_files(self) -> None:
        self.commit_log.close()
        for cq in list(self.queues.queues.values()):
            cq.close()
        if self.index is not None:
            self.index.close()
        if self.checkpoint is not None:
            self.checkpoint.close()

    def __enter__(self) -> MessageStore:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ================================================================================================ state
    @property
    def disk_full(self) -> bool:
        """Whether writes are refused for want of disk space (what the metrics and ``stats`` report)."""
        return self.write_state.disk_full

    def is_writable(self) -> bool:
        return self._running and self.write_state.writable()

    def _refusal(self) -> PutResult | None:
        if not self._running:
            return PutResult(
                PutStatus.SERVICE_NOT_AVAILABLE, error="the store is not running (shut down or not started)"
            )
        return self.write_state.refusal()

    def notify_appended(self) -> None:
        """New entries are in the commit log: the dispatcher makes them visible now, not at its next idle look
        (``dispatch_interval_ms``), which would add up to that interval to every message's end-to-end time."""
        service = self._dispatch_service
        if service is not None:
            service.wakeup()

    def _await_flush(self, end_offset: int, wait: bool) -> str:
        """SYNC_FLUSH: wait for the group commit (unless the message said WAIT=false). "" = durable or ASYNC."""
        gc = self._group_commit
        if gc is None:
            if self._async_flush is not None and self.commit_log.files.dirty_bytes() >= (
                self.config.flush_commit_log_least_pages * 4096
            ):
                self._async_flush.wakeup()
            return ""
        if not wait:
            gc.request(end_offset)  # the service thread flushes it soon; this writer does not wait
            return ""
        return gc.wait_flushed(end_offset, self.config.sync_flush_timeout_ms / 1000)

    # ================================================================================================ puts
    def put_message(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: Mapping[str, str] | None = None,
        *,
        flag: int = 0,
        sys_flag: int = 0,
        born_timestamp: int = 0,
        born_host: tuple[str, int] = ("127.0.0.1", 0),
        reconsume_times: int = 0,
        prepared_transaction_offset: int = 0,
        wait_store_ok: bool | None = None,
    ) -> PutResult:
        refused = self._refusal()
        if refused is not None:
            return refused
        encoded = self._encoder.encode(
            topic, queue_id, body, properties, flag=flag, sys_flag=sys_flag, born_timestamp=born_timestamp,
            born_host=born_host, reconsume_times=reconsume_times,
            prepared_transaction_offset=prepared_transaction_offset,
        )
        if isinstance(encoded, PutResult):
            return encoded
        entry = encoded
        counted = takes_queue_offset(sys_flag, prepared_transaction_offset)
        try:
            phys, qoff, ts = self.commit_log.append_entry(entry, topic, queue_id, counted)
        except (OSError, CreateMappedFileError) as e:
            return self.write_state.append_failed(e)
        except ServiceNotAvailableError as e:  # shutdown began while this put waited for the lock
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, error=e.message)
        self._counters["put_msgs"] += 1
        self._counters["put_bytes"] += len(entry)
        self.notify_appended()
        wait = wait_store_ok if wait_store_ok is not None else (properties or {}).get(Prop.WAIT, "true") != "false"
        why = self._await_flush(phys + len(entry), wait)
        return PutResult(
            PutStatus.FLUSH_DISK_TIMEOUT if why else PutStatus.PUT_OK,
            msg_id_prefix=self.msg_id_prefix(),
            commitlog_offsets=[phys],
            queue_ids=[queue_id],
            queue_offsets=[qoff],
            store_timestamp=ts,
            wrote_bytes=len(entry),
            error=why,
        )

    def msg_id_prefix(self) -> str:
        return msg_id_prefix_of(self.commit_log.store_ip, self.commit_log.store_port)

    def validate_batch(
        self, buffer: bytes | bytearray | memoryview, known: np.ndarray | None = None
    ) -> SmallBatch | ValidatedBatch:
        """Every check put_batch makes, without writing (MessageIllegalError on the first fault). A caller that
        must look at the batch first (the server checks its topics) passes the result to put_batch, so the
        buffer is scanned once. ``known``: the entries' positions, when the caller built the batch (see
        batch.walk: checked, not trusted)."""
        limit, max_body = self.config.batch_limit_bytes, self.config.max_message_size
        small = validate_small_batch(buffer, limit, max_body)
        return small if small is not None else validate_batch(buffer, limit, max_body, known)

    def put_batch(
        self,
        buffer: bytes | bytearray | memoryview,
        *,
        wait_store_ok: bool | None = None,
        validated: SmallBatch | ValidatedBatch | None = None,
    ) -> PutResult:
        """Append client-encoded entries (store fields zero) with one write; see batch.validate_batch.
        ``validated``: this store's validate_batch(buffer), when the caller already has it."""
        refused = self._refusal()
        if refused is not None:
            return refused
        if validated is None:
            try:
                validated = self.validate_batch(buffer)
            except MessageIllegalError as e:
                return PutResult(PutStatus.MESSAGE_ILLEGAL, error=e.message)
        assert len(validated.data) == len(buffer), "validated is not this buffer's"
        small = validated if isinstance(validated, SmallBatch) else None
        batch = validated if isinstance(validated, ValidatedBatch) else None
        try:
            if small is not None:
                phys_list, qoffs_list, ts = self.commit_log.append_small_batch(small)
                queue_ids = [k[1] for k in small.keys]
                data = small.data
            else:
                assert batch is not None
                phys, qoffs, ts = self.commit_log.append_batch(batch)
                self._hint_dispatcher(batch, phys, qoffs, ts)
                phys_list, qoffs_list = phys.tolist(), qoffs.tolist()
                queue_ids = batch.run.queue_ids.tolist()
                data = batch.data
        except (OSError, CreateMappedFileError) as e:
            return self.write_state.append_failed(e)
        except ServiceNotAvailableError as e:  # shutdown began while this put waited for the lock
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, error=e.message)
        self._counters["put_msgs"] += len(phys_list)
        self._counters["put_bytes"] += len(data)
        self.notify_appended()
        why = self._await_flush(phys_list[0] + len(data), True if wait_store_ok is None else wait_store_ok)
        return PutResult(
            PutStatus.FLUSH_DISK_TIMEOUT if why else PutStatus.PUT_OK,
            msg_id_prefix=self.msg_id_prefix(),
            commitlog_offsets=phys_list,
            queue_ids=queue_ids,
            queue_offsets=qoffs_list,
            store_timestamp=ts,
            wrote_bytes=len(data),
            error=why,
        )

    def _hint_dispatcher(self, batch: ValidatedBatch, phys: np.ndarray, qoffs: np.ndarray, ts: int) -> None:
        """Hand the dispatcher what validation already computed (positions, grouping) for this batch."""
        run = batch.run
        start = int(phys[0])
        shift = start % self.config.mapped_file_size_commit_log  # batch-relative -> file-relative positions
        end = start + len(batch.data)
        file_run = EntryRun(
            positions=run.positions + shift, sizes=run.sizes, queue_ids=run.queue_ids, queue_offsets=qoffs,
            sys_flags=run.sys_flags, store_timestamps=np.full(run.positions.size, ts, np.int64),
            body_crcs=run.body_crcs, body_lengths=run.body_lengths, topic_starts=run.topic_starts + shift,
            topic_lengths=run.topic_lengths, props_starts=run.props_starts + shift, props_lengths=run.props_lengths,
            end=end, stop_reason="",
        )
        self.dispatcher.add_hint(start, DispatchHint(end, file_run, batch.key_ids, batch.keys))

    # ================================================================================================ gets
    def get_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_msgs: int = 32,
        max_bytes: int | None = None,
        tag_codes: set[int] | None = None,
        message_filter: Callable[[StoredMessage], bool] | None = None,
        *,
        confirmed_only: bool = True,
    ) -> GetResult:
        """``confirmed_only=False``: also units past the read limit (the broker's own recovery, which must see
        every entry its log holds, as ``query_by_key`` does for the retry deduplication)."""
        if not self._running:
            raise ServiceNotAvailableError("the store is not running; retry once the broker has started")
        self._counters["gets"] += 1
        cq = self.queues.find(topic, queue_id)
        if cq is None:
            if queue_id < 0 or not topic or not TOPIC_PATTERN.fullmatch(topic):
                return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
        lo, hi = cq.min_offset, self.visible_max(cq) if confirmed_only else cq.max_offset
        if hi == 0:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, lo, hi)
        if offset < lo:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, lo, lo, hi)
        if offset == hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, lo, hi)
        if offset > hi:
            # corrected to the max offset, never rewound to 0 (apache/rocketmq issue 4215)
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, hi, lo, hi)
        max_msgs = max(1, min(max_msgs, self.config.max_msgs_per_get))
        limit = min(max_bytes or self.config.max_transfer_bytes_per_get, MAX_BYTES_PER_GET)
        return self._reader.read(cq, offset, max_msgs, limit, tag_codes, message_filter, lo, hi)

    # ================================================================================================ queries
    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.find(topic, queue_id)
        return cq.min_offset if cq else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.find(topic, queue_id)
        return self.visible_max(cq) if cq else 0

    def queue_end(self, topic: str, queue_id: int) -> int:
        """One past the queue's last unit, whether readers may see it yet or not (``max_offset`` is capped at the
        read limit); 0 for a queue that does not exist."""
        cq = self.queues.find(topic, queue_id)
        return cq.max_offset if cq else 0

    def visible_max(self, cq: ConsumeQueue) -> int:
        """One past the last unit readers may see: the queue's max offset, less the units whose entries end past
        ``read_limit()`` (a replicated group's confirmed offset, broker/ha/read_limit.py). Units are in commit-log
        order, so the cut is found from the end: usually the last unit is visible and one read decides."""
        hi = cq.max_offset
        limit = self.read_limit
        if limit is None or hi <= cq.min_offset:
            return hi
        bound = limit()
        last = cq.unit(hi - 1)
        if last is None or last.commitlog_offset + last.size <= bound:
            return hi
        lo, top = cq.min_offset, hi - 1  # the first unit past the bound is in [lo, top]
        while lo < top:
            mid = (lo + top) // 2
            unit = cq.unit(mid)
            if unit is not None and unit.commitlog_offset + unit.size <= bound:
                lo = mid + 1
            else:
                top = mid
        return lo

    def confirmed(self, commitlog_offset: int, size: int) -> bool:
        """Whether readers may see the entry at ``commitlog_offset`` (see visible_max)."""
        limit = self.read_limit
        return limit is None or commitlog_offset + size <= limit()

    def decided(self, msg: StoredMessage) -> bool:
        """Whether a message looked up by key or id may be shown as far as transactions go: an in-place
        transactional entry only once its marker committed it (below its queue's readable limit, not in an
        aborted range: txn_visibility.py); any other entry always."""
        if not in_place_transactional(msg.sys_flag, msg.prepared_transaction_offset):
            return True
        cq = self.queues.find(msg.topic, msg.queue_id)
        return cq is not None and msg.queue_offset < cq.max_offset and not cq.is_aborted(msg.queue_offset)

    def queue_ranges(self, topic: str, queue_ids: Iterable[int]) -> list[tuple[int, int, int]]:
        """(queue id, min offset, max offset) of several queues as of one instant (no commit half-shown)."""
        with self._visibility_lock:
            return [(q, self.min_offset(topic, q), self.max_offset(topic, q)) for q in queue_ids]

    def queue_ids(self, topic: str) -> list[int]:
        return sorted(q for t, q in self.queues.queues if t == topic)

    def topics(self) -> list[str]:
        return sorted({t for t, _ in self.queues.queues})

    def dispatched_offset(self) -> int:
        return self.dispatcher.dispatched_offset

    def max_phys_offset(self) -> int:
        return self.commit_log.max_offset

    def min_phys_offset(self) -> int:
        return self.commit_log.min_offset

    def lookup_message(self, commitlog_offset: int) -> StoredMessage | None:
        raw = self.lookup_entry(commitlog_offset)
        return None if raw is None else decode_entry(raw)

    def lookup_entry(self, commitlog_offset: int) -> bytes | None:
        """The message entry at ``commitlog_offset`` exactly as stored (what a pull returns); None if none starts
        there (CommitLog.lookup_entry) or it expired."""
        if commitlog_offset < self.commit_log.min_offset:
            return None
        return self.commit_log.lookup_entry(commitlog_offset)

    def view_entry_by_msg_id(self, msg_id: str) -> bytes | None:
        """The entry an offset msgId names, as stored; None unless one starts at its offset and was stored by the
        host its first 16 hex characters name (the entry's own STOREHOST: an id from another broker, or one
        made up, must not name whatever lies at that offset here), and readers may see it (confirmed).
        MessageIllegalError for a malformed id."""
        parts = parse_msg_id(msg_id)
        raw = self.lookup_entry(parts.commitlog_offset)
        if raw is None or raw[POS_STORE_HOST : POS_STORE_HOST + 8] != parts.store_ip + I32.pack(parts.store_port):
            return None
        if not self.confirmed(parts.commitlog_offset, len(raw)):  # replicas hold it (broker/ha)
            return None
        topic_at = BODY_START + I32.unpack_from(raw, POS_BODY_LENGTH)[0]
        if self.deleted_generation(raw[topic_at + 1 : topic_at + 1 + raw[topic_at]].decode("ascii", "replace"),
                                   parts.commitlog_offset):
            return None
        sys_flag, handle = I32.unpack_from(raw, POS_SYS_FLAG)[0], I64.unpack_from(raw, POS_PREPARED_TX_OFFSET)[0]
        if in_place_transactional(sys_flag, handle):
            return raw if self.decided(decode_entry(raw)) else None
        return raw

    def deleted_generation(self, topic: str, commitlog_offset: int) -> bool:
        """Whether the entry of ``topic`` at ``commitlog_offset`` was stored before the topic was last deleted: it
        belongs to no topic any more (a topic made again under the name is another one), so no client reads it by
        id or offset, as no query by key finds it."""
        return self.topic_deletions.deleted_generation(topic, commitlog_offset)

    def view_by_msg_id(self, msg_id: str) -> StoredMessage | None:
        raw = self.view_entry_by_msg_id(msg_id)
        return None if raw is None else decode_entry(raw)

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose message was stored at or after ``timestamp_ms`` (max offset if none)."""
        return offset_by_time(self, topic, queue_id, timestamp_ms)

    def earliest_message_time(self, topic: str, queue_id: int) -> int:
        """Store time of the queue's oldest message, -1 if the queue is empty."""
        return earliest_message_time(self, topic, queue_id)

    def query_by_key(
        self, topic: str, key: str, max_num: int = 64, begin_ms: int = 0, end_ms: int = 2**62, *,
        confirmed_only: bool = True,
    ) -> list[StoredMessage]:
        """The newest ``max_num`` messages of ``topic`` with ``key`` in KEYS or UNIQ_KEY, stored in [begin_ms,
        end_ms], oldest first (key_query.py). ``confirmed_only=False``: also messages past the read limit (the
        broker's own retry deduplication)."""
        return query_by_key(self, topic, key, max_num, begin_ms, end_ms, confirmed_only=confirmed_only)

    # ================================================================================================ admin
    def delete_topic(self, topic: str) -> None:
        """Delete the topic's consume queues and forget its queue offsets; commit-log entries expire as usual
        (TopicDeletions.delete says in which order, so that a crash does not bring the topic back)."""
        self.topic_deletions.delete(topic)

    def _sync_recovered_files(self) -> None:
        """After a crash: sync what recovery found before anything counts it as flushed (MappedFileQueue.sync_all
        says why). One fdatasync per file, on abnormal starts only."""
        self.commit_log.files.sync_all()
        for cq in list(self.queues.queues.values()):
            cq.files.sync_all()
        if self.index is not None:
            self.index.flush()

    def rebuild_queue_table(self, floors: Mapping[tuple[str, int], int] | None = None) -> None:
        """Queue offsets for appends from the consume queues, as recovery does (a replica taking office as master:
        its log was written by replication, which assigns none). ``floors``: offsets queues continue at at least
        (queues whose messages all expired before this replica's log begins)."""
        with self.commit_log.append_lock:
            table = dict(floors or {})
            for key, cq in self.queues.queues.items():
                table[key] = max(table.get(key, 0), cq.written_offset)
            self.commit_log.queue_table = table

    def add_arrival_listener(self, fn: ArrivalListener) -> None:
        self.dispatcher.listeners.append(fn)

    def hold_visibility(self, queues: Iterable[tuple[str, int]]) -> VisibilityHold:
        """Units dispatched to these queues from now on stay unseen by readers until ``release_visibility``, which
        shows them all at once (a batch-transaction commit: many puts, many queues, one instant).
        MessageIllegalError if a topic is not a name or a queue id is out of range (they become directories)."""
        wanted = sorted(set(queues))
        for topic, queue_id in wanted:
            validate_topic(topic)
            if not 0 <= queue_id < MAX_QUEUE_ID:
                raise MessageIllegalError(
                    f"queue id {queue_id} of topic {topic!r} is outside 0..{MAX_QUEUE_ID - 1}; hold existing queues"
                )
        hold = VisibilityHold()
        with self.dispatcher.lock:  # no pass under way: the offset a queue is held at is one readers saw
            for topic, queue_id in wanted:
                self.queues.find_or_create(topic, queue_id).place_hold(hold)
        return hold

    def release_visibility(self, hold: VisibilityHold) -> None:
        """Show what the hold hid, in every queue at the same instant, and wake the pulls waiting on them."""
        with self._visibility_lock:  # queue_ranges() reads all queues either before or after this
            hold.active = False
        for cq in hold.queues:
            for fn in self.dispatcher.listeners:
                fn(cq.topic, cq.queue_id, cq.max_offset)

    def wait_dispatched(self, timeout_s: float = CHECK_DISPATCH_WAIT_S, up_to: int | None = None) -> bool:
        """Block until the dispatcher has reached commit-log offset ``up_to`` (default: the end); False on
        timeout."""
        deadline = time.monotonic() + timeout_s
        while self.dispatcher.dispatched_offset < (self.commit_log.max_offset if up_to is None else up_to):
            if time.monotonic() > deadline:
                return False
            if self._dispatch_service is None or not self._running:
                self.dispatcher.dispatch_available()
            else:
                self._dispatch_service.wakeup()
                time.sleep(0.001)
        return True

    def flush(self) -> None:
        """Force the commit log, consume queues, index and checkpoint to disk now (OSError if a sync fails)."""
        assert self.checkpoint is not None
        self.wait_dispatched()
        if not flush_commit_log(self.commit_log, self.checkpoint, self.write_state.on_io_error):
            raise OSError(errno.EIO, self.write_state.write_error)
        if self._cq_flush is not None and not self._cq_flush.flush_all():
            raise OSError(errno.EIO, self.write_state.write_error)

    def check(self) -> list[str]:
        """Consistency oracle (see check.py): one line per inconsistency, [] when the store is consistent."""
        return check_store(self)

    def stats(self) -> dict[str, int | float]:
        out: dict[str, int | float] = dict(self._counters)
        out.update(
            commit_log_min_offset=self.commit_log.min_offset,
            commit_log_max_offset=self.commit_log.max_offset,
            commit_log_flushed_offset=self.commit_log.flushed_offset,
            dispatched_offset=self.dispatcher.dispatched_offset,
            commit_log_files=len(self.commit_log.files.files),
            consume_queues=len(self.queues.queues),
            disk_usage_ratio=self.config.disk_usage_probe(self.config.store_path),
            disk_full=int(self.write_state.disk_full),
            writable=int(self.is_writable()),
        )
        return out

"""MessageStore: the facade the broker server uses (RocketMQ's DefaultMessageStore).

Owns the commit log, consume queues, index, checkpoint and the service threads (dispatch, flush, cleanup), and
turns their outcomes into PutResult / GetResult statuses. Lifecycle: ``start()`` takes the ``lock`` file, recovers
(abnormally if an ``abort`` file was left behind), writes ``abort``, starts the threads; ``shutdown()`` stops them,
flushes everything, writes the checkpoint, removes ``abort`` and releases the lock.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from broker import json_file  # the module, not its names: json_file imports broker.store.directory (a cycle)
from broker.errors import InvalidArgumentError, MessageIllegalError, ServiceNotAvailableError, StoreLockedError
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
    END_FILE_MIN_BLANK_LENGTH,
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
from broker.format.single import Refusal, SingleEncoder
from broker.store import truncation
from broker.store.check import check_store
from broker.store.checkpoint import Checkpoint
from broker.store.cleanup import CleanupService
from broker.store.commit_log import CommitLog, CreateMappedFileError, now_ms
from broker.store.config import StoreConfig
from broker.store.consume_queue import ConsumeQueue, VisibilityHold
from broker.store.directory import make_dirs
from broker.store.disk_reserve import DiskReserve
from broker.store.dispatcher import ArrivalListener, ConsumeQueueTable, Dispatcher, DispatchHint
from broker.store.faults import FaultInjector
from broker.store.flush import (
    AsyncFlushService,
    ConsumeQueueFlushService,
    GroupCommitService,
    ServiceThread,
    flush_commit_log,
)
from broker.store.index_file import IndexService
from broker.store.queue_reader import QueueReader
from broker.store.recovery import RecoveryReport, recover
from broker.store.results import GetResult, GetStatus, PutResult, PutStatus
from broker.store.txn_visibility import TxnVisibility, state_path

log = logging.getLogger(__name__)

# A caller may ask for more than max_transfer_bytes_per_get, but never more than this in one get: the buffer is
# built in memory and shipped in one response.
MAX_BYTES_PER_GET = 64 * 1024 * 1024
# Bodies in one query-by-key answer, for the same reason: 4096 messages of 4 MiB would otherwise be 16 GiB.
QUERY_MAX_BYTES = 64 * 1024 * 1024
QUERY_MAX_CANDIDATES = 65_536  # index entries one key query may read messages for (hash collisions, time edges)
# check() waits this long for the dispatcher to reach the end of the commit log.
CHECK_DISPATCH_WAIT_S = 10.0
# After a dispatch pass fails with an OSError (ENOSPC creating a consume-queue file...), the next try waits this
# long, doubling per failure in a row up to the maximum.
DISPATCH_BACKOFF_MIN_S = 0.01
DISPATCH_BACKOFF_MAX_S = 1.0
# After an ENOSPC, writes resume once the file system has room for the next commit-log file and this much more:
# the consume-queue and index files of what is written next need a little too.
DISK_FULL_MARGIN_BYTES = 1 << 20


class DispatchService(ServiceThread):
    name = "reput-dispatch"

    def __init__(self, dispatcher: Dispatcher, interval_ms: int, on_state: Callable[[str], None],
                 release_space: Callable[[], bool]) -> None:  # fmt: skip
        super().__init__()
        self.dispatcher = dispatcher
        self.release_space = release_space  # frees the disk reserve on ENOSPC; True if it did
        self.interval_s = interval_ms / 1000
        self.backoff_s = 0.0  # after an OSError: the pause before the next try, doubled per failure in a row
        self.on_state = on_state  # told why dispatch fails, and "" once a pass succeeds again

    def run_once(self) -> None:
        try:
            self.dispatcher.dispatch_available()
        except OSError as e:
            if e.errno == errno.ENOSPC and self.release_space():
                return  # room was made: the next pass tries again at once
            # A full disk or a failing one lasts: retrying every interval would write an error line each time
            # (a thousand a second, onto that same disk). Puts' wakeups do not cut the pause short; stop() does.
            self.backoff_s = min(max(2 * self.backoff_s, DISPATCH_BACKOFF_MIN_S), DISPATCH_BACKOFF_MAX_S)
            log.error("dispatch failed: %s; retrying in %.2f s", e, self.backoff_s)
            self.on_state(f"consume queues cannot be written ({e}); writes resume once dispatch succeeds")
            self._stop.wait(self.backoff_s)
            return
        if self.backoff_s:
            self.backoff_s = 0.0
            self.on_state("")
        # The pass went to the end of the log: no second look now (it would find nothing, and run before the pulls
        # it just woke, on the same CPU). An append during the pass has set the wake-up, so this returns at once.
        self.wait(self.interval_s)


DELETED_TOPICS_FILE = "deletedTopics.json"  # in config/: {"deletedTopics": {topic: commit-log offset}}


def _parse_deleted_topics(data: dict[str, object]) -> dict[str, int]:
    table = data["deletedTopics"]
    if not isinstance(table, dict):
        raise TypeError(f"deletedTopics is a {type(table).__name__}, not a table")
    out = {str(topic): int(offset) for topic, offset in table.items()}
    for topic, offset in out.items():
        try:
            validate_topic(topic)  # it becomes a path when the topic is used again
        except MessageIllegalError as e:
            raise ValueError(e.message) from None
        if offset < 0:
            raise ValueError(f"deletion offset {offset} of topic {topic!r} is negative")
    return out


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
        )  # fmt: skip
        self.dispatcher.txn = self.txn_visibility
        self.checkpoint: Checkpoint | None = None
        self.recovery_report: RecoveryReport | None = None
        self._lock_fd = -1
        self._running = False
        self._disk_full = False
        self._enospc = False  # an append met ENOSPC: refused until the next commit-log file fits (_set_disk_full)
        self._disk_state_lock = threading.Lock()  # the cleanup thread's verdict vs an append's ENOSPC
        self.disk_reserve = DiskReserve(config.store_path, config.disk_reserve_bytes)
        self._write_error = ""
        # Why the dispatcher cannot write consume queues ("" = it can). Puts are refused meanwhile, as RocketMQ's
        # WRITE_LOGICS_QUEUE_ERROR bit does: acknowledged messages no consumer can see would only pile up.
        self._dispatch_error = ""
        self._services: list[ServiceThread] = []
        self._group_commit: GroupCommitService | None = None
        self._async_flush: AsyncFlushService | None = None
        self._cq_flush: ConsumeQueueFlushService | None = None
        self._dispatch_service: DispatchService | None = None
        self.cleanup: CleanupService | None = None
        self._single = SingleEncoder()
        self._counters = {"put_msgs": 0, "put_bytes": 0, "put_errors": 0, "get_msgs": 0, "get_bytes": 0, "gets": 0}
        # topic -> commit-log offset where it was last deleted: entries below belong to a deleted generation. On
        # disk (DELETED_TOPICS_FILE), so recovery's re-dispatch skips them instead of bringing the topic back.
        self.deleted_topics: dict[str, int] = {}
        self.dispatcher.deleted_before = self.deleted_topics  # the same dict: loaded at start, grown by deletions
        self._deleted_topics_lock = threading.Lock()  # one writer of the file at a time
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
        self._take_lock()
        try:
            abnormal = os.path.exists(cfg.abort_path)
            self.checkpoint = Checkpoint(cfg.checkpoint_path, self.faults.syncer("checkpoint"))
            self._load_deleted_topics()  # before recovery: its re-dispatch must not bring deleted topics back
            cut = truncation.pending(cfg.store_path)
            if cut is not None and cut.reset:  # the log starts again: no deletion point names any of it
                self.deleted_topics.clear()
                self._save_deleted_topics()
            self.recovery_report = recover(
                cfg, self.commit_log, self.queues, self.index, self.dispatcher, self.checkpoint, abnormal, cut
            )
            self.txn_visibility.save(self.commit_log.min_offset, force=True)  # the file exists from the first start
            self._settle_deletions()
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
            self._release_lock()
            raise
        self._running = True

    def _finish_truncation(self, end: int) -> None:
        """After a truncation (truncation.py): the checkpoint must not claim anything past the cut as flushed, or a
        crash would skip re-checking and re-dispatching what is written there next; then the intent goes."""
        assert self.checkpoint is not None
        data = self.checkpoint.data
        self.checkpoint.update(physic_offset=min(data.physic_offset, end), logics_offset=min(data.logics_offset, end),
                               index_offset=min(data.index_offset, end))  # fmt: skip
        truncation.done(self.config.store_path)

    def _take_lock(self) -> None:
        fd = os.open(self.config.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLockedError(
                f"store {self.config.store_path} is locked by another broker process (lock file "
                f"{self.config.lock_path}); stop it or use another store directory"
            ) from None
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd >= 0:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _start_services(self) -> None:
        cfg = self.config
        assert self.checkpoint is not None
        self._dispatch_service = DispatchService(self.dispatcher, cfg.dispatch_interval_ms, self._set_dispatch_error,
                                                 self._release_reserve)  # fmt: skip
        if cfg.sync_flush:
            self._group_commit = GroupCommitService(self.commit_log, self.checkpoint, self._on_io_error)
        else:
            self._async_flush = AsyncFlushService(cfg, self.commit_log, self.checkpoint, self._on_io_error)
        self._cq_flush = ConsumeQueueFlushService(
            cfg, self.queues, self.index, self.dispatcher, self.checkpoint, self._on_io_error
        )
        self.cleanup = CleanupService(
            cfg, self.commit_log, self.queues, self.index, self.dispatcher, self._set_disk_full
        )
        services: list[ServiceThread | None] = [
            self._dispatch_service, self._group_commit, self._async_flush, self._cq_flush, self.cleanup,
        ]  # fmt: skip
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
            log_flushed = flush_commit_log(self.commit_log, self.checkpoint, self._on_io_error)
            self.dispatcher.dispatch_available(notify=False)
            queues_flushed = self._cq_flush is not None and self._cq_flush.flush_all(final=True)
            clean = log_flushed and queues_flushed and not self._write_error
        finally:
            self._close_files()
            if clean:
                os.unlink(self.config.abort_path)
            else:
                log.error("store shut down after an I/O error; the next start recovers abnormally")
            self._release_lock()

    def abandon(self) -> None:
        """Stop threads and close files without flushing or removing ``abort``: what a crash leaves behind.

        The page cache keeps what was written (as after SIGKILL), so tests can restart on the same directory.
        """
        self._running = False
        self.commit_log.stop_appends()
        for s in reversed(self._services):
            s.stop()
        self._close_files()
        self._release_lock()

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
    def _on_io_error(self, reason: str) -> None:
        if not self._write_error:
            log.error("store is now read-only: %s", reason)
        self._write_error = reason

    def _set_disk_full(self, full: bool) -> None:
        """The cleanup service's verdict from its disk probe (over disk_space_warning_level_ratio or not). A refusal
        that came from an ENOSPC is lifted only once the next commit-log file fits (_room_for_next_file): below the
        ratio is not enough on a disk too small for the ratio to matter, and sends would fail one by one."""
        with self._disk_state_lock:
            if not full and self._enospc and not self._room_for_next_file():
                full = True
            reserve = self.disk_reserve
            if not full and reserve.size and not reserve.held:  # taken again only with room to spare
                full = bool(self._dispatch_error) or not self._room_for_next_file(reserve.size) or not reserve.make()
            if full != self._disk_full:
                if full:
                    log.error("disk use over %d%%: refusing writes (no file is deleted to make room)",
                              self.config.disk_space_warning_level_ratio)  # fmt: skip
                else:
                    log.warning("disk has room again: accepting writes")
            if not full:
                self._enospc = False
            self._disk_full = full

    def _release_reserve(self) -> bool:
        """Dispatch met ENOSPC: free the disk reserve for the units of messages already stored, and refuse new
        writes, which must not take that room, until the reserve is taken again (_set_disk_full)."""
        if not self.disk_reserve.release():
            return False
        with self._disk_state_lock:
            self._disk_full = True
        return True

    def _room_for_next_file(self, more: int = 0) -> bool:
        try:
            free = shutil.disk_usage(self.config.store_path).free
        except OSError:
            return False
        return free >= self.config.mapped_file_size_commit_log + DISK_FULL_MARGIN_BYTES + more

    @property
    def disk_full(self) -> bool:
        """Whether writes are refused for want of disk space (what the metrics and ``stats`` report)."""
        return self._disk_full

    def _set_dispatch_error(self, reason: str) -> None:
        if reason and not self._dispatch_error:
            log.error("refusing writes: %s", reason)
        elif not reason and self._dispatch_error:
            log.warning("dispatch works again: accepting writes")
        self._dispatch_error = reason

    def is_writable(self) -> bool:
        return (self._running and not self._disk_full and not self._write_error and not self._dispatch_error
                and not self.dispatcher.stuck)  # fmt: skip

    def _refusal(self) -> PutResult | None:
        if not self._running:
            return PutResult(
                PutStatus.SERVICE_NOT_AVAILABLE, error="the store is not running (shut down or not started)"
            )
        if self._disk_full and self.disk_reserve.size and not self.disk_reserve.held:
            return PutResult(
                PutStatus.SERVICE_NOT_AVAILABLE,
                error="disk full: the store's disk reserve went to messages already stored; writes resume once "
                "space is freed",
            )
        if self._disk_full and self._enospc:
            return PutResult(
                PutStatus.SERVICE_NOT_AVAILABLE,
                error=f"disk full: the next commit-log file ({self.config.mapped_file_size_commit_log} bytes) does "
                "not fit; writes resume once space is freed",
            )
        if self._disk_full:
            return PutResult(
                PutStatus.SERVICE_NOT_AVAILABLE,
                error=f"disk is over {self.config.disk_space_warning_level_ratio}% full; writes resume once "
                "expired files are deleted or space is freed",
            )
        if self._write_error:
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, error=f"store is read-only: {self._write_error}")
        if self._dispatch_error or self.dispatcher.stuck:  # stuck: the dispatcher says where, once, in the log
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, error=self._dispatch_error or self.dispatcher.stuck)
        return None

    def _append_failed(self, e: OSError | CreateMappedFileError) -> PutResult:
        self._counters["put_errors"] += 1
        if e.errno == errno.ENOSPC:
            with self._disk_state_lock:
                if not self._disk_full:
                    log.error("disk full (%s): refusing writes until the next commit-log file fits", e)
                self._enospc = True
                self._disk_full = True  # the cleanup service's next disk probe lifts this once space is back
            return PutResult(
                PutStatus.SERVICE_NOT_AVAILABLE, error=f"disk full: {e}; writes resume once space is freed"
            )
        if isinstance(e, CreateMappedFileError):
            return PutResult(PutStatus.CREATE_MAPPED_FILE_FAILED, error=e.message)
        self._on_io_error(f"commit log write failed: {e}")
        return PutResult(PutStatus.UNKNOWN_ERROR, error=f"commit log write failed: {e}")

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
        encoded = self._encode_single(
            topic, queue_id, body, properties, flag=flag, sys_flag=sys_flag, born_timestamp=born_timestamp,
            born_host=born_host, reconsume_times=reconsume_times,
            prepared_transaction_offset=prepared_transaction_offset,
        )  # fmt: skip
        if isinstance(encoded, PutResult):
            return encoded
        entry = encoded
        counted = takes_queue_offset(sys_flag, prepared_transaction_offset)
        try:
            phys, qoff, ts = self.commit_log.append_entry(entry, topic, queue_id, counted)
        except (OSError, CreateMappedFileError) as e:
            return self._append_failed(e)
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

    def _encode_single(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: Mapping[str, str] | None,
        *,
        flag: int,
        sys_flag: int,
        born_timestamp: int,
        born_host: tuple[str, int],
        reconsume_times: int,
        prepared_transaction_offset: int,
    ) -> bytearray | PutResult:
        """The encoded entry (queue offset, physical offset, store time still zero), or the PutResult saying why not."""
        entry = self._single.encode(
            topic, queue_id, body, properties, flag=flag, sys_flag=sys_flag, born_timestamp=born_timestamp,
            born_host=born_host, reconsume_times=reconsume_times,
            prepared_transaction_offset=prepared_transaction_offset, store_ip=self.commit_log.store_ip,
            store_port=self.commit_log.store_port, max_message_size=self.config.max_message_size, now_ms=now_ms,
        )  # fmt: skip
        if isinstance(entry, Refusal):
            status = PutStatus.PROPERTIES_SIZE_EXCEEDED if entry.properties_too_large else PutStatus.MESSAGE_ILLEGAL
            return PutResult(status, error=entry.reason)
        if len(entry) + END_FILE_MIN_BLANK_LENGTH > self.config.mapped_file_size_commit_log:
            return PutResult(
                PutStatus.MESSAGE_ILLEGAL,
                error=f"MESSAGE_SIZE_EXCEEDED: the entry is {len(entry)} bytes and cannot fit one commit-log file of "
                f"{self.config.mapped_file_size_commit_log} bytes; shrink the body or properties",
            )
        return entry

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
            return self._append_failed(e)
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
        )  # fmt: skip
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
        lo, hi = cq.min_offset, self._visible_max(cq) if confirmed_only else cq.max_offset
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
        return self._visible_max(cq) if cq else 0

    def queue_end(self, topic: str, queue_id: int) -> int:
        """One past the queue's last unit, whether readers may see it yet or not (``max_offset`` is capped at the
        read limit); 0 for a queue that does not exist."""
        cq = self.queues.find(topic, queue_id)
        return cq.max_offset if cq else 0

    def _visible_max(self, cq: ConsumeQueue) -> int:
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
        """Whether readers may see the entry at ``commitlog_offset`` (see _visible_max)."""
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
                                   parts.commitlog_offset):  # fmt: skip
            return None
        sys_flag, handle = I32.unpack_from(raw, POS_SYS_FLAG)[0], I64.unpack_from(raw, POS_PREPARED_TX_OFFSET)[0]
        if in_place_transactional(sys_flag, handle):
            return raw if self.decided(decode_entry(raw)) else None
        return raw

    def deleted_generation(self, topic: str, commitlog_offset: int) -> bool:
        """Whether the entry of ``topic`` at ``commitlog_offset`` was stored before the topic was last deleted: it
        belongs to no topic any more (a topic made again under the name is another one), so no client reads it by
        id or offset, as no query by key finds it."""
        return commitlog_offset < self.deleted_topics.get(topic, -1)

    def view_by_msg_id(self, msg_id: str) -> StoredMessage | None:
        raw = self.view_entry_by_msg_id(msg_id)
        return None if raw is None else decode_entry(raw)

    def _unit_timestamp(self, cq: ConsumeQueue, queue_offset: int) -> int | None:
        unit = cq.unit(queue_offset)
        if unit is None or unit.size <= 0:
            return None
        return self.commit_log.store_timestamp_at(unit.commitlog_offset)

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose message was stored at or after ``timestamp_ms`` (max offset if none)."""
        cq = self.queues.find(topic, queue_id)
        if cq is None:
            return 0
        lo, hi = cq.min_offset, self._visible_max(cq)
        while lo < hi:  # binary search: store timestamps grow with queue offset
            mid = (lo + hi) // 2
            ts = self._unit_timestamp(cq, mid)
            if ts is None or ts < timestamp_ms:  # None: expired while we looked, so everything below is gone
                lo = mid + 1
            else:
                hi = mid
        return lo

    def earliest_message_time(self, topic: str, queue_id: int) -> int:
        """Store time of the queue's oldest message, -1 if the queue is empty."""
        cq = self.queues.find(topic, queue_id)
        if cq is None or cq.max_offset <= cq.min_offset:
            return -1
        ts = self._unit_timestamp(cq, cq.min_offset)
        return -1 if ts is None else ts

    def query_by_key(
        self, topic: str, key: str, max_num: int = 64, begin_ms: int = 0, end_ms: int = 2**62, *,
        confirmed_only: bool = True,
    ) -> list[StoredMessage]:  # fmt: skip
        """The newest ``max_num`` messages of ``topic`` with ``key`` in KEYS or UNIQ_KEY, stored in [begin_ms,
        end_ms], oldest first; fewer if their bodies pass QUERY_MAX_BYTES (the answer is built whole in memory).
        ``confirmed_only=False``: also messages past the read limit (the broker's own retry deduplication)."""
        if self.index is None:
            raise InvalidArgumentError("the message index is disabled (message_index_enable=False)")
        max_num = max(1, min(max_num, 4096))
        found: list[StoredMessage] = []
        nbytes = 0
        deleted_at = self.deleted_topics.get(topic, -1)  # entries before it belong to a deleted generation
        seen: set[int] = set()
        # Candidates that are not matches (another key of the same hash, a message stored later in the range's
        # last second) must not use up the answer: the walk widens until max_num match or the index has no more,
        # bounded because each candidate costs a commit-log read.
        limit, done = 4 * max_num, False
        while not done:
            candidates = self.index.lookup(topic, key, limit, begin_ms, end_ms)  # newest first
            for off in candidates:
                if off in seen or off < deleted_at:
                    continue
                seen.add(off)
                msg = self.lookup_message(off)
                if msg is None or msg.topic != topic:
                    continue
                if confirmed_only and not self.confirmed(off, msg.store_size):
                    continue
                if not self.decided(msg):
                    continue
                has_key = key in msg.keys or msg.properties.get(Prop.UNIQ_KEY) == key  # hash collisions stop here
                if has_key and begin_ms <= msg.store_timestamp <= end_ms:
                    nbytes += len(msg.body)
                    done = len(found) > 0 and nbytes > QUERY_MAX_BYTES
                    if done:
                        break
                    found.append(msg)
                    done = len(found) == max_num
                    if done:
                        break
            done = done or len(candidates) < limit or limit >= QUERY_MAX_CANDIDATES  # no more, or the bound
            limit = min(4 * limit, QUERY_MAX_CANDIDATES)
        found.sort(key=lambda m: m.commitlog_offset)
        return found

    # ================================================================================================ admin
    def delete_topic(self, topic: str) -> None:
        """Delete the topic's consume queues and forget its queue offsets; commit-log entries expire as usual.

        A topic created again starts at queue offset 0. The deletion point is on disk before this returns, so a
        restart after a crash, whose recovery re-dispatches the end of the log, does not bring the deleted
        entries back (RocketMQ does). MessageIllegalError if ``topic`` is not a name (it becomes a path:
        "../config" must not reach rmdir); OSError if the deletion point cannot be written.
        """
        validate_topic(topic)
        with self.commit_log.append_lock:  # no new entries while the topic goes
            # None of its entries left to recreate a queue later. Notifying: other topics' held pulls wait for
            # what this pass dispatches for them.
            self.dispatcher.dispatch_available()
            deleted_at = self.commit_log.max_offset
            # On disk in this order: the log up to the deletion point (a point past what a power loss keeps would
            # hide the next generation's first messages), the point itself, and only then are the queues
            # destroyed (a crash before that leaves whole queues, which start() drops by the point).
            self.commit_log.files.flush()
            with self.dispatcher.lock:
                before = self.deleted_topics.get(topic)
                self.deleted_topics[topic] = deleted_at
            try:
                self._save_deleted_topics()
            except OSError:  # not deleted after all: the table must not say otherwise
                with self.dispatcher.lock:
                    if before is None:
                        del self.deleted_topics[topic]
                    else:
                        self.deleted_topics[topic] = before
                raise
            with self.dispatcher.lock:
                for cq in self.queues.remove_topic(topic):
                    cq.destroy()
                self.txn_visibility.forget_topic(topic)
                table = self.commit_log.queue_table  # changed in place: appenders hold no other reference to it
                for key in [k for k in table if k[0] == topic]:
                    del table[key]
                try:  # under the dispatcher's lock: the next generation's first dispatch may be making this folder
                    os.rmdir(os.path.join(self.config.consume_queue_dir, topic))
                except OSError:
                    pass  # not empty or not there: nothing of the deleted generation is left in it either way
            # at once: a start from the previous file would put the deleted generation's holds and rolled-back
            # ranges on the next generation's queues
            self.txn_visibility.save(self.commit_log.min_offset, force=True)

    def _deleted_topics_path(self) -> str:
        return os.path.join(self.config.config_dir, DELETED_TOPICS_FILE)

    def _load_deleted_topics(self) -> None:
        loaded = json_file.load_json(self._deleted_topics_path(), _parse_deleted_topics) or {}
        self.deleted_topics.clear()
        self.deleted_topics.update(loaded)

    def _save_deleted_topics(self) -> None:
        with self._deleted_topics_lock:
            json_file.write_json_atomic(self._deleted_topics_path(), {"deletedTopics": dict(self.deleted_topics)})

    def _sync_recovered_files(self) -> None:
        """After a crash: sync what recovery found before anything counts it as flushed (MappedFileQueue.sync_all
        says why). One fdatasync per file, on abnormal starts only."""
        self.commit_log.files.sync_all()
        for cq in list(self.queues.queues.values()):
            cq.files.sync_all()
        if self.index is not None:
            self.index.flush()

    def _settle_deletions(self) -> None:
        """After recovery: finish deletions a crash interrupted, and keep the table of deletion points true.

        - A queue of a deleted topic whose first unit lies below the deletion point is of the deleted generation
          (a crash came between saving the point and destroying the queues): destroyed now.
        - A point past the recovered end of the log (possible only if the log lost its tail, e.g. in a power
          loss) comes back to that end: later entries belong to the next generation.
        - A point the log has expired past names no entry any more: forgotten.
        """
        deleted, end, first = self.deleted_topics, self.commit_log.max_offset, self.commit_log.min_offset

        def old_generation(key: tuple[str, int]) -> bool:
            cq = self.queues.queues[key]
            unit = cq.unit(cq.min_offset) if key[0] in deleted else None
            return unit is not None and unit.commitlog_offset < deleted[key[0]]

        for cq in self.queues.remove(old_generation):
            log.warning("topic %s queue %d: deleted before a crash; its queue is removed now", cq.topic, cq.queue_id)
            self.commit_log.queue_table.pop((cq.topic, cq.queue_id), None)
            cq.destroy()
        changed = {t: min(at, end) for t, at in deleted.items() if first < at}
        if changed != deleted:
            deleted.clear()
            deleted.update(changed)
            self._save_deleted_topics()

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
        if not flush_commit_log(self.commit_log, self.checkpoint, self._on_io_error):
            raise OSError(errno.EIO, self._write_error)
        if self._cq_flush is not None and not self._cq_flush.flush_all():
            raise OSError(errno.EIO, self._write_error)

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
            disk_full=int(self._disk_full),
            writable=int(self.is_writable()),
        )
        return out

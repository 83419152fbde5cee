"""WriteState: whether the store takes writes now, and the PutResult that says why not.

Four conditions refuse writes until they clear: a full disk (the cleanup service's probe over
``disk_space_warning_level_ratio``, or an append that met ENOSPC, lifted only once the next commit-log file fits),
the disk reserve given up to the dispatcher, a failed write or sync (read-only until restart: a retried fdatasync
that succeeds proves nothing), and a dispatcher that cannot write consume queues (RocketMQ's
WRITE_LOGICS_QUEUE_ERROR bit: acknowledged messages no consumer can see would only pile up).
"""

from __future__ import annotations

import errno
import logging
import shutil
import threading

from broker.store.commit_log import CreateMappedFileError
from broker.store.disk_reserve import DiskReserve
from broker.store.dispatcher import Dispatcher
from broker.store.store_config import StoreConfig
from broker.store.store_results import PutResult, PutStatus

log = logging.getLogger(__name__)

# After an ENOSPC, writes resume once the file system has room for the next commit-log file and this much more:
# the consume-queue and index files of what is written next need a little too.
DISK_FULL_MARGIN_BYTES = 1 << 20


class WriteState:
    def __init__(self, config: StoreConfig, disk_reserve: DiskReserve, dispatcher: Dispatcher,
                 counters: dict[str, int]) -> None:
        self.config = config
        self.disk_reserve = disk_reserve
        self.dispatcher = dispatcher
        self._counters = counters  # the store's: failed appends count as put_errors
        self._disk_full = False
        self._enospc = False  # an append met ENOSPC: refused until the next commit-log file fits (set_disk_full)
        self._disk_state_lock = threading.Lock()  # the cleanup thread's verdict vs an append's ENOSPC
        self._write_error = ""
        # Why the dispatcher cannot write consume queues ("" = it can). Puts are refused meanwhile, as RocketMQ's
        # WRITE_LOGICS_QUEUE_ERROR bit does: acknowledged messages no consumer can see would only pile up.
        self._dispatch_error = ""

    @property
    def disk_full(self) -> bool:
        return self._disk_full

    @property
    def write_error(self) -> str:
        """Why the store is read-only ("" = it is not)."""
        return self._write_error

    def on_io_error(self, reason: str) -> None:
        if not self._write_error:
            log.error("store is now read-only: %s", reason)
        self._write_error = reason

    def set_disk_full(self, full: bool) -> None:
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
                              self.config.disk_space_warning_level_ratio)
                else:
                    log.warning("disk has room again: accepting writes")
            if not full:
                self._enospc = False
            self._disk_full = full

    def release_reserve(self) -> bool:
        """Dispatch met ENOSPC: free the disk reserve for the units of messages already stored, and refuse new
        writes, which must not take that room, until the reserve is taken again (set_disk_full)."""
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

    def set_dispatch_error(self, reason: str) -> None:
        if reason and not self._dispatch_error:
            log.error("refusing writes: %s", reason)
        elif not reason and self._dispatch_error:
            log.warning("dispatch works again: accepting writes")
        self._dispatch_error = reason

    def writable(self) -> bool:
        """No condition refuses writes (the store adds that it runs)."""
        return not self._disk_full and not self._write_error and not self._dispatch_error and not self.dispatcher.stuck

    def refusal(self) -> PutResult | None:
        """The refusal of a write now (the first condition that holds), None when writes are taken."""
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

    def append_failed(self, e: OSError | CreateMappedFileError) -> PutResult:
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
        self.on_io_error(f"commit log write failed: {e}")
        return PutResult(PutStatus.UNKNOWN_ERROR, error=f"commit log write failed: {e}")

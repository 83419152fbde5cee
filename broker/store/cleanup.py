"""Expiry: delete old commit-log files (and the consume-queue and index files that only point into them).

Rules (RocketMQ's CleanCommitLogService, percentages of the store's file system):

* files older than ``file_reserved_time_hours`` (file mtime, as RocketMQ) go at ``delete_when`` (hour of day), or
  at once when disk use is over ``disk_max_used_space_ratio`` (75%);
* over ``disk_space_warning_level_ratio`` (90%) writes are refused (reads go on) until a pass sees the disk below
  it again;
* over ``disk_space_clean_forcibly_ratio`` (85%) nothing unexpired is deleted by default: those files hold
  acknowledged messages, and a full disk refuses sends instead (Kafka's choice). Only with
  ``clean_file_forcibly_enable`` do the oldest files go even if not expired, at most ``delete_files_batch_max``
  per pass (RocketMQ's choice, which trades those messages for room to write).

The newest commit-log file is never deleted, nor any file not yet fully dispatched and flushed. Consumption
state is not considered: an expired message is gone, and readers of it get OFFSET_TOO_SMALL with the new minimum.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from broker.format.numbers import is_ascii_digits
from broker.store.commit_log import CommitLog
from broker.store.consume_queue_table import ConsumeQueueTable
from broker.store.dispatcher import Dispatcher
from broker.store.flush import ServiceThread
from broker.store.index_file import IndexService
from broker.store.store_config import StoreConfig

log = logging.getLogger(__name__)

# How often the disk is probed even when no cleaning is due, so that a full disk stops writes (and a freed one
# restarts them) within about a second instead of one cleaning interval.
DISK_PROBE_INTERVAL_S = 1.0


@dataclass
class CleanReport:
    disk_ratio_percent: float
    deleted_commit_log_files: int = 0
    deleted_consume_queue_files: int = 0
    deleted_index_files: int = 0
    disk_full: bool = False


class CleanupService(ServiceThread):
    name = "store-cleanup"

    def __init__(
        self,
        config: StoreConfig,
        commit_log: CommitLog,
        queues: ConsumeQueueTable,
        index: IndexService | None,
        dispatcher: Dispatcher,
        set_disk_full: Callable[[bool], None],
    ) -> None:
        super().__init__()
        self.config = config
        self.commit_log = commit_log
        self.queues = queues
        self.index = index
        self.dispatcher = dispatcher
        self.set_disk_full = set_disk_full
        self._last_clean = 0.0
        # The commit log's first offset when consume queues and index were last cleaned below it. Starting at 0,
        # the first pass after a restart cleans them if earlier runs expired commit-log files: a run killed
        # between deleting those and cleaning the queues left them with stale minimums and expired files.
        self._cleaned_below = 0
        # Whether the disk is over the forced-cleaning ratio with forced cleaning off: said once per episode in
        # the log, not once a second.
        self._pressure_logged = False

    def run_once(self) -> None:
        self.wait(DISK_PROBE_INTERVAL_S)
        if self.stopped:
            return
        now = time.monotonic()
        due = (now - self._last_clean) * 1000 >= self.config.clean_resource_interval_ms
        if due:
            self._last_clean = now
        try:
            self.clean_once(clean=due)
        except OSError as e:
            log.error("cleanup pass failed: %s", e)

    # ------------------------------------------------------------------------------------------------ one pass
    def disk_ratio_percent(self) -> float:
        return 100.0 * self.config.disk_usage_probe(self.config.store_path)

    def _is_delete_hour(self, now_ms: int) -> bool:
        hour = time.localtime(now_ms / 1000).tm_hour
        hours = {int(h) for h in self.config.delete_when.split(";") if is_ascii_digits(h.strip())}
        return hour in hours

    def clean_once(self, now_ms: int | None = None, *, clean: bool = True, manual: bool = False) -> CleanReport:
        """Probe the disk, delete what the rules allow, probe again; ``manual`` deletes expired files now."""
        now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        ratio = self.disk_ratio_percent()
        report = CleanReport(ratio)
        cfg = self.config
        self._update_disk_full(ratio)
        if not clean and ratio < cfg.disk_max_used_space_ratio:
            return report
        forced = ratio >= cfg.disk_space_clean_forcibly_ratio and cfg.clean_file_forcibly_enable
        self._log_pressure(ratio)
        if manual or forced or ratio >= cfg.disk_max_used_space_ratio or self._is_delete_hour(now_ms):
            report.deleted_commit_log_files = self._delete_commit_log_files(now_ms, forced)
        cl_min = self.commit_log.min_offset
        if cl_min > self._cleaned_below:  # this pass or an earlier one (another run) expired commit-log files
            self._clean_queues_and_index(cl_min, report)
            self._cleaned_below = cl_min
            report.disk_ratio_percent = self.disk_ratio_percent()
            self._update_disk_full(report.disk_ratio_percent)
        report.disk_full = report.disk_ratio_percent >= cfg.disk_space_warning_level_ratio
        return report

    def _clean_queues_and_index(self, cl_min: int, report: CleanReport) -> None:
        """Delete consume-queue and index files wholly below the commit log's first offset ``cl_min``, and move
        each queue's minimum to its first unit still readable."""
        for cq in list(self.queues.queues.values()):
            try:
                report.deleted_consume_queue_files += cq.delete_expired(cl_min)
            except ValueError:  # its files were closed under this pass: the topic was deleted meanwhile
                if not cq.files.destroyed:
                    raise
        if self.index is not None:
            report.deleted_index_files = self.index.delete_before(cl_min)

    def _log_pressure(self, ratio: float) -> None:
        """Say once per episode that unexpired files are kept although the disk is over the forced-cleaning ratio."""
        cfg = self.config
        over = ratio >= cfg.disk_space_clean_forcibly_ratio and not cfg.clean_file_forcibly_enable
        if over and not self._pressure_logged:
            log.warning(
                "disk use %.1f%% is over disk_space_clean_forcibly_ratio=%d%%: no unexpired commit-log file is "
                "deleted (clean_file_forcibly_enable is off); sends are refused from %d%% until space is freed",
                ratio, cfg.disk_space_clean_forcibly_ratio, cfg.disk_space_warning_level_ratio,
            )
        self._pressure_logged = over

    def _update_disk_full(self, ratio: float) -> None:
        self.set_disk_full(ratio >= self.config.disk_space_warning_level_ratio)

    def _delete_commit_log_files(self, now_ms: int, forced: bool) -> int:
        reserved_ms = self.config.file_reserved_time_hours * 3600 * 1000
        files = self.commit_log.files.files
        done_upto = min(self.dispatcher.dispatched_offset, self.commit_log.flushed_offset)
        count = 0
        for f in files[:-1]:  # never the file being written
            if f.file_from_offset + f.file_size > done_upto:
                break  # not yet dispatched or flushed: its messages are not indexed anywhere yet
            try:
                mtime_ms = os.stat(f.path).st_mtime * 1000
            except FileNotFoundError:
                mtime_ms = 0
            if not (forced or mtime_ms + reserved_ms <= now_ms):
                break  # files go oldest first so the log stays contiguous
            count += 1
            if count >= self.config.delete_files_batch_max:
                break
        if count:
            gone = self.commit_log.files.delete_first(count)
            for f in gone:
                log.info("expired commit log file %s deleted (forced=%s)", f.path, forced)
        return count

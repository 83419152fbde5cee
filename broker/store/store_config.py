"""StoreConfig: RocketMQ's ``MessageStoreConfig`` names in snake_case, with the unit in every name.

Defaults are RocketMQ's. Every size is configurable so tests can use tiny files. Limits that RocketMQ leaves
implicit are explicit here, each with the reason it exists.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.errors import InvalidArgumentError
from broker.format.message import DEFAULT_MAX_MESSAGE_SIZE, END_FILE_MIN_BLANK_LENGTH
from broker.format.numbers import MAX_NUMBER_DIGITS, is_ascii_digits

ASYNC_FLUSH = "ASYNC_FLUSH"
SYNC_FLUSH = "SYNC_FLUSH"
CQ_UNIT_SIZE = 20  # repeated from consume_queue.CQ_UNIT to avoid an import cycle; asserted there
OS_PAGE_SIZE = 4096  # RocketMQ counts flush "pages" in 4 KiB units


# Settings that must be > 0: the waits between passes of the flush and dispatch loops (0 spins a CPU), sizes a
# message or batch must fit in, and the commit-log files normal recovery re-checks (0 would find no write position).
POSITIVE_SETTINGS = (
    "flush_interval_commit_log_ms", "flush_interval_consume_queue_ms", "dispatch_interval_ms", "max_message_size",
    "max_batch_bytes", "recover_normally_file_count",
)


def disk_usage_ratio(path: str) -> float:
    """Fraction (0..1) of the file system holding ``path`` that is used, as ``df`` reports it."""
    usage = shutil.disk_usage(path)
    return usage.used / usage.total if usage.total else 0.0


@dataclass
class StoreConfig:
    store_path: str
    # --- file sizes
    mapped_file_size_commit_log: int = 1 << 30
    mapped_file_size_consume_queue: int = 300_000 * CQ_UNIT_SIZE
    max_hash_slot_num: int = 5_000_000
    max_index_num: int = 20_000_000
    # --- flush
    flush_disk_type: str = ASYNC_FLUSH
    flush_interval_commit_log_ms: int = 500
    flush_commit_log_least_pages: int = 4
    flush_commit_log_thorough_interval_ms: int = 10_000
    flush_interval_consume_queue_ms: int = 1000
    sync_flush_timeout_ms: int = 5000
    # --- messages
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    # A batch is copied and patched under the append lock; bounding it bounds how long other writers wait
    # (RocketMQ bounds a batch by maxMessageSize too). It must also fit in one commit-log file.
    max_batch_bytes: int = 4 * 1024 * 1024
    # --- expiry and disk
    file_reserved_time_hours: float = 72
    delete_when: str = "04"  # hours of the day, ';'-separated, as RocketMQ ("": expired files go by disk usage only)
    disk_max_used_space_ratio: int = 75  # percent: over this, expired files go at once (not at delete_when)
    # percent: over this, with clean_file_forcibly_enable, the oldest files go even if not expired
    disk_space_clean_forcibly_ratio: int = 85
    # RocketMQ's cleanFileForciblyEnable, but off by default: deleting unexpired files to make room deletes
    # acknowledged messages no consumer may have read. Off, a full disk refuses sends instead (as Kafka keeps its
    # log and stops taking writes); on, RocketMQ's behaviour (docs/operations.md says what it costs).
    clean_file_forcibly_enable: bool = False
    disk_space_warning_level_ratio: int = 90  # percent: over this, writes are refused until space is freed
    clean_resource_interval_ms: int = 10_000
    # Forced cleaning deletes at most this many files per pass so a pass never stalls readers for long.
    delete_files_batch_max: int = 10
    # Space the store keeps in a file of its own (disk_reserve.py) and gives back when the dispatcher meets a full
    # disk, so that messages already acknowledged still get their consume-queue units and index entries. 4 MiB is
    # some 100,000 of each (20 bytes apiece): more than can be acknowledged and not yet dispatched. 0: none.
    disk_reserve_bytes: int = 4 << 20
    # Injectable so tests can simulate a full disk; returns used/total of the store's file system (0..1).
    disk_usage_probe: Callable[[str], float] = field(default=disk_usage_ratio, repr=False)
    # --- index
    message_index_enable: bool = True
    # --- reads
    store_host: tuple[str, int] = ("127.0.0.1", 10911)
    max_transfer_bytes_per_get: int = 256 * 1024
    # One get decodes at most this many consume-queue units: bounds the work done under one request.
    max_msgs_per_get: int = 4096
    # --- recovery
    check_crc_on_recover: bool = True
    # Normal recovery re-checks only the last few commit-log files (RocketMQ: 3).
    recover_normally_file_count: int = 3
    # --- dispatch
    # How often an idle dispatcher looks for entries it was not told of. Every append wakes it at once
    # (MessageStore.notify_appended), so this look is a safety net only. RocketMQ's ReputMessageService looks
    # every 1 ms; here each look costs 27 us or more of the CPU the broker's Python threads share. An idle broker
    # used 2.7% of a CPU at 1 ms and 0.85% at 10 ms; a broker taking 400 sends a second (one at a time, each read
    # at once by a held pull) spent 907 us of CPU a message at 1 ms and 830 us at 10 ms (medians of four
    # alternating runs, 2026-11-27). 10 ms keeps a missed wake-up short and the looks cheap.
    dispatch_interval_ms: int = 10
    # --- delay levels (RocketMQ keeps messageDelayLevel in the store config too): the consume queue of the
    # schedule topic holds each unit's due time (store time + the delay of level queue id + 1) in its tag field,
    # as RocketMQ's does, so its files read the same. Empty: those units get a tag hash like any other.
    schedule_topic: str = "SCHEDULE_TOPIC_XXXX"
    delay_level_ms: tuple[int, ...] = ()

    def validate(self) -> None:
        """Raise InvalidArgumentError naming the first setting that cannot work."""
        if not self.store_path:
            raise InvalidArgumentError("store_path is empty; give the directory the store lives in")
        if any(d <= 0 for d in self.delay_level_ms):
            raise InvalidArgumentError(f"delay_level_ms={self.delay_level_ms}: every delay must be positive")
        if self.mapped_file_size_commit_log < 4096:
            raise InvalidArgumentError(
                f"mapped_file_size_commit_log={self.mapped_file_size_commit_log} is below 4096 bytes"
            )
        if self.mapped_file_size_consume_queue % CQ_UNIT_SIZE or self.mapped_file_size_consume_queue <= 0:
            raise InvalidArgumentError(
                f"mapped_file_size_consume_queue={self.mapped_file_size_consume_queue} must be a positive "
                f"multiple of {CQ_UNIT_SIZE} (the consume-queue unit size)"
            )
        if self.flush_disk_type not in (ASYNC_FLUSH, SYNC_FLUSH):
            raise InvalidArgumentError(f"flush_disk_type={self.flush_disk_type!r}; use ASYNC_FLUSH or SYNC_FLUSH")
        if self.max_hash_slot_num < 1 or self.max_index_num < 3:  # entry 0 is unused; a message needs one more
            raise InvalidArgumentError("max_hash_slot_num must be >= 1 and max_index_num >= 3")
        hours = self.delete_when.split(";") if self.delete_when.strip() else []  # "": by disk usage only
        if not all(is_ascii_digits(h.strip()) and len(h.strip()) <= MAX_NUMBER_DIGITS and int(h) <= 23 for h in hours):
            raise InvalidArgumentError(
                f"delete_when={self.delete_when!r}: give hours of the day 0..23 separated by semicolons, as "
                'RocketMQ\'s deleteWhen ("04" or "04;16"; "" for none); anything else would never delete expired '
                "files on time"
            )
        if self.max_message_size + 1024 > self.mapped_file_size_commit_log:
            raise InvalidArgumentError(
                f"max_message_size={self.max_message_size} does not fit a commit-log file of "
                f"{self.mapped_file_size_commit_log} bytes; raise the file size or lower the limit"
            )
        if not 0 < self.disk_max_used_space_ratio <= self.disk_space_clean_forcibly_ratio:
            raise InvalidArgumentError("need 0 < disk_max_used_space_ratio <= disk_space_clean_forcibly_ratio")
        if self.disk_space_clean_forcibly_ratio > self.disk_space_warning_level_ratio:
            raise InvalidArgumentError("need disk_space_clean_forcibly_ratio <= disk_space_warning_level_ratio")
        for name in POSITIVE_SETTINGS:
            if getattr(self, name) <= 0:
                raise InvalidArgumentError(f"{name} is {getattr(self, name)}; it must be a positive integer")
        # 0 is allowed (every file but the one being written is expired, as RocketMQ's fileReservedTime=0);
        # `not >=` also refuses NaN, which would never expire anything.
        if self.disk_reserve_bytes < 0:
            raise InvalidArgumentError(f"disk_reserve_bytes is {self.disk_reserve_bytes}; it must be >= 0 (0: none)")
        if not self.file_reserved_time_hours >= 0:
            raise InvalidArgumentError(
                f"file_reserved_time_hours is {self.file_reserved_time_hours}; it must be a number of hours >= 0"
            )

    @property
    def sync_flush(self) -> bool:
        return self.flush_disk_type == SYNC_FLUSH

    @property
    def batch_limit_bytes(self) -> int:
        """A batch is written into one file, which keeps room for the end-of-file blank."""
        return min(self.max_batch_bytes, self.mapped_file_size_commit_log - END_FILE_MIN_BLANK_LENGTH)

    # --- the disk layout, exactly as the design documents give it
    @property
    def commit_log_dir(self) -> str:
        return os.path.join(self.store_path, "commitlog")

    @property
    def consume_queue_dir(self) -> str:
        return os.path.join(self.store_path, "consumequeue")

    @property
    def index_dir(self) -> str:
        return os.path.join(self.store_path, "index")

    @property
    def config_dir(self) -> str:
        return os.path.join(self.store_path, "config")

    @property
    def checkpoint_path(self) -> str:
        return os.path.join(self.store_path, "checkpoint")

    @property
    def abort_path(self) -> str:
        return os.path.join(self.store_path, "abort")

    @property
    def lock_path(self) -> str:
        return os.path.join(self.store_path, "lock")

"""MappedFile and MappedFileQueue: fixed-size, preallocated files named by their first byte's global offset.

A MappedFileQueue is a directory of files of one size, ``00000000000000000000``, ``00000000001073741824``, ...
so the file holding global offset ``o`` is found by ``o // file_size``. Each file is one shared ``mmap``. An append
is one copy into the page cache: a slice assignment into the mapping for small entries (a ``pwrite`` per small
append cost several times more while other processes kept the ext4 journal busy: each one updates the mtime,
which takes a journal handle), one ``pwrite`` for big batches (cheaper than a page fault per page). Linux keeps
both views coherent, and ``fdatasync`` on the descriptor writes the mapping's dirty pages too. Files are
preallocated with ``posix_fallocate`` so that a full disk shows up as ENOSPC when a file is created
(SERVICE_NOT_AVAILABLE) rather than as SIGBUS when a mapped page is first touched.

Reserving as they fill (``reserve_as_written``, consume-queue files): the file is created sparse at its full size
and its blocks are reserved (``posix_fallocate``) ahead of each write, a step that doubles from
RESERVE_FIRST_BYTES up to RESERVE_MAX_STEP_BYTES, so no byte is ever written through the mapping unreserved (no
SIGBUS) and a full disk is still an ENOSPC from a system call. Why: a consume queue's file is 6 MB by default and
every queue of every topic has one; preallocated, a 38 KB batch naming 400 new queues took 2.3 GB of disk at once,
before the disk-use thresholds could see it. Reserved as written, a queue costs what it holds plus at most one
step. Reading a hole reads zeros, which is what an unwritten unit is.

Positions: ``wrote_position`` (bytes appended, relative to the file start) and ``flushed_position`` (bytes known
to be on disk). ``flushed_position`` only moves after fdatasync returned without error, and a failed fdatasync
is final for the whole queue (``sync_failed``): Linux may drop the dirty pages of a failed writeback and report the
error once, so a retry that returns 0 proves nothing ("fsyncgate"). Only a restart, whose recovery re-reads the
files, can say what reached the disk.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import itertools
import logging
import mmap
import os
import threading
from collections.abc import Callable

from broker.errors import CorruptionError
from broker.format.numbers import is_ascii_digits
from broker.store.directory import fsync_directory, make_dirs

log = logging.getLogger(__name__)

FILE_NAME_DIGITS = 20
ZERO_CHUNK = bytes(1 << 20)
# Appends at least this big go through pwrite, smaller ones through the mapping. Measured on the test machine:
# a small pwrite costs a syscall plus an mtime update (an ext4 journal handle) per call, a store through the
# mapping costs one page fault per page; for a batch of hundreds of KiB the single pwrite is cheaper than the
# faults.
PWRITE_MIN_BYTES = 64 * 1024
# Reservation steps of files reserved as written (module docstring): the first is one page (a queue that holds a
# few messages costs 4 KiB), each next one twice the last, so a busy queue makes a handful of fallocate calls per
# file, never one per write.
RESERVE_FIRST_BYTES = 4096
RESERVE_MAX_STEP_BYTES = 1 << 20

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
# Linux fallocate(2) with PUNCH_HOLE (Python's os module has only posix_fallocate); None where libc lacks it.
_fallocate = getattr(ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True), "fallocate", None)
if _fallocate is not None:
    _fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]


def file_name(offset: int) -> str:
    return f"{offset:0{FILE_NAME_DIGITS}d}"


def _punch_hole(fd: int, offset: int, length: int) -> bool:
    """Zero a range without writing it (Linux fallocate PUNCH_HOLE); False if the file system cannot."""
    if _fallocate is None or length <= 0:
        return False
    return bool(_fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length) == 0)


def unmap(mm: mmap.mmap, fd: int, path: str) -> None:
    """Close a file's mapping, then its descriptor. A mapping a reader still holds a view of (a numpy array) cannot
    close: it goes when that view is collected."""
    try:
        mm.close()
    except BufferError:
        log.debug("mmap of %s still exported; left to the garbage collector", path)
    os.close(fd)


def unlink_if_present(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class MappedFile:
    """One file of ``file_size`` bytes whose first byte is global offset ``file_from_offset``: preallocated, or
    reserved as it is written (``reserve_as_written``, module docstring)."""

    def __init__(
        self,
        path: str,
        file_size: int,
        sync: Callable[[int], None],
        *,
        create: bool,
        allocate: Callable[[int, int, int], None] = os.posix_fallocate,
        reserve_as_written: bool = False,
    ) -> None:
        self.path = path
        self.file_size = file_size
        self.file_from_offset = int(os.path.basename(path))
        self._sync = sync
        self._allocate = allocate
        # Bytes [0, reserved) have their blocks: writes below it cannot fail for space. A file reserved as written
        # that was opened again starts at 0 (reserving blocks it already has costs a system call, nothing more).
        self.reserved = 0 if reserve_as_written else file_size
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        self.fd = os.open(path, flags, 0o644)
        try:
            if create and reserve_as_written:
                os.ftruncate(self.fd, file_size)  # sparse: blocks come with _reserve
            elif create:
                allocate(self.fd, 0, file_size)
            actual = os.fstat(self.fd).st_size
            if actual != file_size:
                raise CorruptionError(f"file is {actual} bytes, expected {file_size}", path, 0)
            self.mm = mmap.mmap(self.fd, file_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            if create:
                os.unlink(path)
            raise
        self.wrote_position = 0 if create else file_size
        self.flushed_position = self.wrote_position
        self.closed = False
        # Held by fdatasync and by close: a file closed (topic deleted, file expired) while a flusher syncs it
        # waits for that sync, and a flush after the close skips it; the fd is never synced once closed (EBADF,
        # or another file's fd after reuse).
        self._fd_lock = threading.Lock()

    # ------------------------------------------------------------------------------------------------ writes
    @property
    def free_bytes(self) -> int:
        return self.file_size - self.wrote_position

    @property
    def is_full(self) -> bool:
        return self.wrote_position >= self.file_size

    def _reserve(self, end: int) -> None:
        """Give bytes [0, end) their blocks before they are written (module docstring); OSError (ENOSPC) leaves
        the file as it was."""
        step = min(max(self.reserved, RESERVE_FIRST_BYTES), RESERVE_MAX_STEP_BYTES)
        target = min(self.file_size, max(end, self.reserved + step))
        target += -target % RESERVE_FIRST_BYTES  # whole pages
        target = min(target, self.file_size)
        self._allocate(self.fd, self.reserved, target - self.reserved)
        self.reserved = target

    def append(self, data: bytes | bytearray | memoryview) -> int:
        """Write ``data`` at the write position; return the global offset it landed at."""
        pos = self.wrote_position
        n = len(data)
        assert pos + n <= self.file_size, (self.path, pos, n)
        if pos + n > self.reserved:
            self._reserve(pos + n)
        if n >= PWRITE_MIN_BYTES:
            if os.pwrite(self.fd, data, pos) != n:  # to a preallocated regular file: all or an exception
                raise OSError(f"short write to {self.path} at byte {pos}")
        else:
            self.mm[pos : pos + n] = data
        self.wrote_position = pos + n
        return self.file_from_offset + pos

    def write_at(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        """Overwrite bytes below the end (consume-queue units written out of order after a gap, or repaired).
        Bytes below the flushed position are unflushed again, so the next flush syncs them."""
        assert pos >= 0 and pos + len(data) <= self.file_size, (self.path, pos, len(data))
        if pos + len(data) > self.reserved:
            self._reserve(pos + len(data))
        self.mm[pos : pos + len(data)] = data
        self.wrote_position = max(self.wrote_position, pos + len(data))
        self.flushed_position = min(self.flushed_position, pos)

    def flush(self) -> int:
        """fdatasync if anything is unflushed; return the flushed position. Raises OSError, leaving it unchanged.
        A closed file is skipped: it was destroyed or the store is closing, and nothing of it is waited for."""
        target = self.wrote_position
        if self.flushed_position < target:
            with self._fd_lock:
                if self.closed:
                    return self.flushed_position
                self._sync(self.fd)
            self.flushed_position = target
        return self.flushed_position

    def sync(self) -> None:
        """fdatasync now, whatever the flushed position says (after a crash, see MappedFileQueue.sync_all)."""
        with self._fd_lock:
            if not self.closed:
                self._sync(self.fd)

    def set_positions(self, pos: int) -> None:
        """After recovery: everything up to ``pos`` is valid and (as far as we know) on disk."""
        assert 0 <= pos <= self.file_size, pos
        self.wrote_position = self.flushed_position = pos

    def zero_from(self, pos: int) -> None:
        """Erase ``[pos, file end)`` so stale bytes past a truncation point can never parse as entries."""
        length = self.file_size - pos
        if length <= 0:
            return
        if _punch_hole(self.fd, pos, length):
            if self.reserved < self.file_size:  # reserved as written: the punched range is reserved again on use
                self.reserved = min(self.reserved, pos - pos % RESERVE_FIRST_BYTES)
                return
            os.posix_fallocate(self.fd, pos, length)  # take the blocks back so later writes cannot hit ENOSPC
            return
        while pos < self.file_size:  # no hole punching: overwrite chunks that are not already zero
            n = min(len(ZERO_CHUNK), self.file_size - pos)
            if self.mm[pos : pos + n] != ZERO_CHUNK[:n]:
                os.pwrite(self.fd, ZERO_CHUNK[:n], pos)
            pos += n

    # ------------------------------------------------------------------------------------------------ reads
    def read(self, pos: int, size: int) -> bytes:
        """Bytes ``[pos, pos+size)`` of this file (a copy; ValueError if the file was closed meanwhile)."""
        return self.mm[pos : pos + size]

    # ------------------------------------------------------------------------------------------------ life
    def close(self) -> None:
        with self._fd_lock:
            if self.closed:
                return
            self.closed = True
            unmap(self.mm, self.fd, self.path)

    def destroy(self) -> None:
        self.close()
        unlink_if_present(self.path)

    def __repr__(self) -> str:
        return f"MappedFile({self.path}, wrote={self.wrote_position}, flushed={self.flushed_position})"


class MappedFileQueue:
    """The files of one directory, in offset order. Not thread-safe for writers: callers hold their own lock.

    Readers may run concurrently with appends and with deletion of the oldest files: ``files`` is replaced,
    never mutated in place, so a reader's snapshot stays consistent.
    """

    def __init__(
        self,
        directory: str,
        file_size: int,
        sync: Callable[[int], None],
        allocate: Callable[[int, int, int], None] = os.posix_fallocate,
        sync_dir: Callable[[str], None] = fsync_directory,
        *,
        reserve_as_written: bool = False,
    ) -> None:
        self.directory = directory
        self.file_size = file_size
        self._sync = sync
        self._allocate = allocate
        self.reserve_as_written = reserve_as_written  # MappedFile says what this means
        self._sync_dir = sync_dir
        self.files: list[MappedFile] = []
        self._lock = threading.Lock()  # guards replacing ``files`` and ``_unsynced_dirs``
        self.sync_failed = ""  # why an fdatasync failed: from then on flush() only raises (module docstring)
        # Directories with entries created since their last fsync (directory.py says why): the parents of
        # directories made here, and this directory once a file is created in it. Synced by the next flush().
        self._unsynced_dirs: list[str] = make_dirs(directory)
        self.destroyed = False  # its files deleted (topic deleted): a flush racing that has nothing left to sync

    def load(self) -> None:
        """Open every file in the directory; positions are set to full until recovery says otherwise."""
        names = sorted(n for n in os.listdir(self.directory) if is_ascii_digits(n) and len(n) == FILE_NAME_DIGITS)
        if names:
            last_path = os.path.join(self.directory, names[-1])
            size = os.path.getsize(last_path)
            if size < self.file_size:
                # A file cut short (torn tail, copied store): restore its size; recovery finds where data ends.
                log.warning("%s is %d bytes, expected %d: extending it with zeros", last_path, size, self.file_size)
                fd = os.open(last_path, os.O_RDWR)
                try:
                    if self.reserve_as_written:
                        os.ftruncate(fd, self.file_size)
                    else:
                        os.posix_fallocate(fd, 0, self.file_size)
                finally:
                    os.close(fd)
        files = [
            MappedFile(os.path.join(self.directory, n), self.file_size, self._sync, create=False,
                       allocate=self._allocate, reserve_as_written=self.reserve_as_written)
            for n in names
        ]
        for prev, nxt in itertools.pairwise(files):
            if nxt.file_from_offset != prev.file_from_offset + self.file_size:
                raise CorruptionError(
                    f"files are not contiguous: {os.path.basename(prev.path)} is followed by "
                    f"{os.path.basename(nxt.path)}; restore the missing file or move the later ones away",
                    nxt.path,
                    0,
                )
        for f in files:
            if f.file_from_offset % self.file_size:
                raise CorruptionError(f"file name is not a multiple of the file size {self.file_size}", f.path, 0)
        self.files = files

    # ------------------------------------------------------------------------------------------------ lookup
    def last(self) -> MappedFile | None:
        files = self.files
        return files[-1] if files else None

    def first(self) -> MappedFile | None:
        files = self.files
        return files[0] if files else None

    def find(self, offset: int) -> MappedFile | None:
        """The file containing global ``offset`` (or None if deleted / not yet created)."""
        files = self.files
        if not files:
            return None
        i = offset // self.file_size - files[0].file_from_offset // self.file_size
        if 0 <= i < len(files):
            return files[i]
        return None

    @property
    def min_offset(self) -> int:
        f = self.first()
        return f.file_from_offset if f else 0

    @property
    def max_offset(self) -> int:
        """Global offset one past the last written byte."""
        f = self.last()
        return f.file_from_offset + f.wrote_position if f else 0

    @property
    def flushed_offset(self) -> int:
        files = self.files
        for f in files:
            if f.flushed_position < f.file_size:
                return f.file_from_offset + f.flushed_position
        return files[-1].file_from_offset + files[-1].file_size if files else 0

    # ------------------------------------------------------------------------------------------------ growth
    def create(self, start_offset: int) -> MappedFile:
        """Create the file starting at ``start_offset`` (must follow the last one). OSError (e.g. ENOSPC) propagates."""
        assert start_offset % self.file_size == 0, start_offset
        last = self.last()
        assert last is None or start_offset == last.file_from_offset + self.file_size, (start_offset, last)
        path = os.path.join(self.directory, file_name(start_offset))
        f = MappedFile(path, self.file_size, self._sync, create=True, allocate=self._allocate,
                       reserve_as_written=self.reserve_as_written)
        with self._lock:
            self.files = [*self.files, f]
            if self.directory not in self._unsynced_dirs:
                self._unsynced_dirs.append(self.directory)
        return f

    def last_for_append(self, start_offset: int = 0) -> MappedFile:
        """The file to append to, creating the first or the next one when needed."""
        last = self.last()
        if last is None:
            return self.create(start_offset - start_offset % self.file_size)
        if last.is_full:
            return self.create(last.file_from_offset + self.file_size)
        return last

    # ------------------------------------------------------------------------------------------------ flush
    def flush(self) -> int:
        """fsync the directories with new entries, then fdatasync every file with unflushed bytes, oldest first;
        return the flushed global offset.

        Files and directories are taken together under the lock: a file created after that is neither synced nor
        named by a synced directory yet, so this pass leaves it for the next (its flushed position stays 0).
        An OSError from a sync propagates and leaves the flushed positions where they were; every later call
        raises too, without syncing (``sync_failed``, see the module docstring).
        """
        if self.sync_failed:
            raise OSError(errno.EIO, self.sync_failed)
        with self._lock:
            files, dirs = self.files, list(self._unsynced_dirs)
        for d in dirs:
            try:
                self._sync_dir(d)
            except OSError as e:
                if self.destroyed and isinstance(e, FileNotFoundError):
                    return self.flushed_offset  # removed with the queue's topic since the snapshot: nothing to keep
                self.sync_failed = f"fsync of directory {d} failed earlier ({e}); new files in it may not survive"
                raise
            # Taken off the list only once synced: a flush running beside this one (a request thread's beside the
            # flusher's) must not count a new file as flushed while its directory's fsync is still under way.
            with self._lock:
                if d in self._unsynced_dirs:
                    self._unsynced_dirs.remove(d)
        for f in files:
            if f.flushed_position < f.wrote_position and not f.closed:
                try:
                    f.flush()
                except OSError as e:
                    self.sync_failed = (
                        f"fdatasync of {f.path} failed earlier ({e}); no later sync can prove what reached the disk"
                    )
                    raise
        return self.flushed_offset

    def sync_all(self) -> None:
        """fdatasync every file. After a crash, recovery takes what the files hold as flushed, but a SIGKILL leaves
        written pages in the page cache only: a power loss soon after would lose what the checkpoint, advanced
        from those positions, says is on disk."""
        for f in self.files:
            f.sync()

    def dirty_bytes(self) -> int:
        return self.max_offset - self.flushed_offset

    # ------------------------------------------------------------------------------------------------ shrink
    def truncate(self, offset: int) -> None:
        """Make ``offset`` the end: later files are deleted, the file holding it is zeroed after it."""
        keep: list[MappedFile] = []
        # Newest first: a crash part-way leaves the files contiguous (deleting oldest first could leave a gap,
        # which the next start refuses as "not contiguous").
        for f in reversed(self.files):
            if f.file_from_offset + self.file_size <= offset:
                keep.append(f)
            elif f.file_from_offset <= offset:
                pos = offset - f.file_from_offset
                f.zero_from(pos)
                f.set_positions(pos)
                keep.append(f)
            else:
                log.warning(
                    "truncating: deleting %s (starts at %d, past the end %d)", f.path, f.file_from_offset, offset
                )
                f.destroy()
        with self._lock:
            self.files = keep[::-1]

    def delete_first(self, count: int) -> list[MappedFile]:
        """Remove the ``count`` oldest files from the queue and delete them from disk."""
        with self._lock:
            gone, self.files = self.files[:count], self.files[count:]
        for f in gone:
            f.destroy()
        return gone

    def close(self) -> None:
        for f in self.files:
            f.close()

    def destroy(self) -> None:
        with self._lock:
            gone, self.files = self.files, []
            self.destroyed, self._unsynced_dirs = True, []
        for f in gone:
            f.destroy()

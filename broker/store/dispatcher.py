"""Dispatcher (RocketMQ's ReputMessageService): builds consume-queue units and index entries from the commit log.

It follows the commit log from ``dispatched_offset`` to the write position, a run of entries at a time: the run is
scanned with numpy (batch.scan), its units grouped by queue and written with one write per queue per pass, keys
indexed, and arrival listeners told each queue's new max offset. Dispatch is idempotent: a unit whose queue
offset the consume queue already has is not written again (only compared, and rewritten if it differs: a page
lost in a power loss), and an index entry below the index's end is skipped, so recovery may re-dispatch from any
earlier point.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from broker.errors import CorruptionError
from broker.format.batch import Buffer, EntryRun, queue_keys, scan, transaction_handles
from broker.format.message import (
    BLANK_MAGIC,
    H_PREPARED_TX_OFFSET,
    H_QUEUE_ID,
    H_QUEUE_OFFSET,
    H_STORE_TIMESTAMP,
    H_SYS_FLAG,
    PREFIX,
    SysFlag,
    decode_entry,
    is_topic_name,
    parse_layout,
    quick_layout,
    tag_hash_code,
    takes_queue_offset,
)
from broker.store.commit_log import CommitLog
from broker.store.consume_queue import CQ_DTYPE, CQ_UNIT, ConsumeQueue
from broker.store.consume_queue_table import ConsumeQueueTable
from broker.store.index_file import IndexService, index_key, prefixed_key_hashes
from broker.store.mapped_file import MappedFile
from broker.store.property_scan import (
    INDEXED_NAME_ENDS,
    KEYS_NAME,
    SEP_TAGS,
    SEP_TAGS_LEN,
    TAG_NAME_END,
    TAGS_LEN,
    TAGS_NAME,
    UNIQ_NAME,
    contains,
    may_have_keys,
    message_keys,
    names_may_occur,
    property_value,
    same_bytes,
    uniq_tails,
)
from broker.store.txn_visibility import MARKER_TOPIC, TxnVisibility, markers_in

log = logging.getLogger(__name__)

ArrivalListener = Callable[[str, int, int], None]
# One pass reads at most this much of the commit log, so listeners hear of new messages at least this often
# and a long backlog (recovery) is processed in bounded memory.
DISPATCH_CHUNK_BYTES = 8 * 1024 * 1024
# Runs up to this size are parsed entry by entry with struct: below some 250 entries numpy's fixed cost per pass
# (tens of calls, about 0.3 ms) is larger than the work itself. `python -m bench.dispatch`, 100 B messages:
# 64 entries (12.5 KB) 3.0 us per entry scalar against 5.0 vectorised, 128 (25 KB) 2.8 against 4.0, 512 (100 KB)
# 2.5 against 1.6. Single puts from many writers arrive in passes of this size (32 SYNC writers: 17-30 a pass).
SCALAR_DISPATCH_BYTES = 32 * 1024
# From this many bytes a run is searched for those names in one numpy pass (names_may_occur) instead of one
# bytes.find per name: 37 against 58 us at 32 KB, 2.3 against 5.2 ms at 4 MB (EO sink's half entries).
CENSUS_MIN_BYTES = 16 * 1024
# Distinct tags seen are remembered up to this many (tags are few in practice: a cache, not a table).
MAX_CACHED_TAGS = 4096


Grouping = tuple[np.ndarray, list[tuple[str, int]]]  # key id per entry, distinct (topic, queue id)
# Hints waiting for the dispatcher hold their arrays in memory: beyond this many entries new ones are dropped and
# the dispatcher scans those batches from the file instead (same result, more work).
MAX_HINTED_ENTRIES = 256 * 1024
STALE_HINT_CHECK = 64  # more waiting hints than this: drop those the dispatcher has already passed


@dataclass
class DispatchHint:
    """What put_batch learned about one appended batch, so the dispatcher need not scan and group it again."""

    end: int  # commit-log offset after the batch
    run: EntryRun  # positions relative to the file, queue offsets and store time filled in
    key_ids: np.ndarray
    keys: list[tuple[str, int]]


@dataclass(frozen=True)
class ProducerKeys:
    """A run's index keys when each message's only key is the UNIQ_KEY its producer appended (the common run): the
    entries that carry one and their keys' characters, one row each (property_scan.UniqTails). The index hashes
    the rows as they are (index_file.prefixed_key_hashes), where a (message, [key]) pair and a "topic#key" string
    a message cost about a microsecond of Python each."""

    entries: np.ndarray  # indexes into the run
    chars: np.ndarray  # (len(entries), UNIQ_KEY_CHARS) uint8

    def __len__(self) -> int:
        return len(self.entries)


class Dispatcher:
    def __init__(self, commit_log: CommitLog, queues: ConsumeQueueTable, index: IndexService | None) -> None:
        self.commit_log = commit_log
        self.queues = queues
        self.index = index
        self.dispatched_offset = 0
        self.last_dispatched_timestamp = 0
        self.listeners: list[ArrivalListener] = []
        self._topic_names: dict[bytes, str] = {}  # decoded (and checked) once: topics repeat endlessly
        self._stuck_reported = -1  # commit-log offset of the last "stuck" error: logged once, not once a pass
        # Why dispatch cannot pass an entry ("" while it can): the store refuses puts meanwhile, since what it
        # acknowledged would never become readable before a restart's recovery cuts the log there.
        self.stuck = ""
        self._tag_codes: dict[bytes, int] = {}  # raw TAGS value -> its hash code: tags repeat endlessly too
        self._hints: dict[int, DispatchHint] = {}  # commit-log offset -> what put_batch already knows there
        self._hinted_entries = 0
        self._hint_lock = threading.Lock()  # not self.lock: a put must never wait for a dispatch pass
        self.lock = threading.Lock()  # one dispatch pass at a time (thread, recovery, check)
        self._due_topic = ""  # the schedule topic, whose units carry a due time as their tag (set_due_times)
        self._delays_ms: tuple[int, ...] = ()
        # Deleted topics -> the commit-log offset of their deletion (MessageStore.deleted_topics, kept on disk):
        # entries below it belong to a deleted generation and get no unit and no index entry when recovery
        # re-dispatches them, or a deletion would be undone by a crash.
        self.deleted_before: dict[str, int] = {}
        # What readers may see of in-place transactional entries (txn_visibility.py); fed from every pass.
        self.txn: TxnVisibility | None = None

    def set_due_times(self, schedule_topic: str, delay_level_ms: tuple[int, ...]) -> None:
        """Units of ``schedule_topic`` queue q get tag = store time + delay_level_ms[q] (RocketMQ's
        computeDeliverTimestamp; queue q holds delay level q + 1); queues past the table get the last delay."""
        self._due_topic, self._delays_ms = (schedule_topic, tuple(delay_level_ms)) if delay_level_ms else ("", ())

    def _due_time(self, queue_id: int, store_timestamp: int) -> int:
        return store_timestamp + self._delays_ms[min(max(queue_id, 0), len(self._delays_ms) - 1)]

    def unit_tag(self, topic: str, queue_id: int, props: bytes, store_timestamp: int) -> int:
        """The consume-queue tag field of one message (the definition; the vectorised pass computes the same)."""
        if topic == self._due_topic:
            return self._due_time(queue_id, store_timestamp)
        return self._tag_code(props) if props else 0

    def add_hint(self, start: int, hint: DispatchHint) -> None:
        """Called after put_batch appended at ``start``; ignored once the dispatcher is past it or too many wait."""
        with self._hint_lock:
            if start < self.dispatched_offset:
                return
            if self._hinted_entries + len(hint.run) > MAX_HINTED_ENTRIES:
                live = {k: h for k, h in self._hints.items() if k >= self.dispatched_offset}
                self._hints = live
                self._hinted_entries = sum(len(h.run) for h in live.values())
                if self._hinted_entries + len(hint.run) > MAX_HINTED_ENTRIES:
                    return
            self._hints[start] = hint
            self._hinted_entries += len(hint.run)

    # ------------------------------------------------------------------------------------------------ passes
    def dispatch_available(self, notify: bool = True) -> int:
        """Dispatch everything written so far; return how many entries were dispatched."""
        total = 0
        with self.lock:
            while True:
                before = self.dispatched_offset
                n = self._dispatch_chunk(notify)
                if self.txn is not None:
                    self.txn.advance(self.dispatched_offset)
                if n < 0 or (n == 0 and self.dispatched_offset == before):
                    break
                total += n
            if self.stuck and self.dispatched_offset > self._stuck_reported:  # moved on (e.g. the file expired)
                self.stuck = ""
        return total

    def _dispatch_chunk(self, notify: bool) -> int:
        """One pass over at most DISPATCH_CHUNK_BYTES of one file; -1 when there is nothing to do."""
        start = self.dispatched_offset
        files = self.commit_log.files
        f = files.find(start)
        if f is None:
            first = files.first()
            if first is not None and start < first.file_from_offset:  # expired under us: skip ahead
                self.dispatched_offset = first.file_from_offset
                return 0
            return -1
        rel = start - f.file_from_offset
        wrote = f.wrote_position
        if rel >= wrote:
            if wrote >= f.file_size and files.find(f.file_from_offset + f.file_size) is not None:
                self.dispatched_offset = f.file_from_offset + f.file_size
                return 0
            return -1
        with self._hint_lock:
            hint = self._hints.pop(start, None)
            if hint is not None:
                self._hinted_entries -= len(hint.run)
            if len(self._hints) > STALE_HINT_CHECK:  # hints added while a scan already covered them
                self._hints = {k: h for k, h in self._hints.items() if k > start}
                self._hinted_entries = sum(len(h.run) for h in self._hints.values())
        old_generation = self._before_a_deletion(start)
        if hint is not None and f.file_from_offset + wrote >= hint.end and not old_generation:
            # A batch appended by put_batch: its entries were scanned and grouped before the write.
            self._dispatch_run(hint.run, f.mm, f.file_from_offset, notify, (hint.key_ids, hint.keys))
            self.dispatched_offset = hint.end
            return len(hint.run)
        chunk = DISPATCH_CHUNK_BYTES
        if rel + chunk < wrote:
            # An entry bigger than a chunk (max_message_size may be set above it) is taken whole: a pass whose
            # limit cuts the first entry finds none complete and would stop there ("partial") on every pass.
            chunk = max(chunk, PREFIX.unpack_from(f.mm, rel)[0])
        limit = min(wrote, rel + chunk)
        if limit - rel <= SCALAR_DISPATCH_BYTES or old_generation:  # the scalar pass skips deleted generations
            return self._dispatch_scalar(f, rel, limit, notify)
        run = scan(f.mm, rel, limit, verify_crc=False)
        if run.stop_reason == "blank":
            end = f.file_size  # the rest of the file is the end-of-file blank
        elif run.stop_reason in ("", "partial"):
            end = run.end  # "partial": the next entry crosses the chunk limit; the next pass takes it
        else:
            if len(run) == 0:
                self._stuck(f.path, run.end, f.file_from_offset + run.end, run.stop_reason)
                return -1
            end = run.end
        grouped = self._group(run, f.mm)
        if len(grouped[0]) < len(run):  # an entry with a topic that is not a name: stop before it
            run, end = run.take(len(grouped[0])), int(run.positions[len(grouped[0])])
            if len(run) == 0:
                self._stuck(f.path, end, f.file_from_offset + end, "its TOPIC is not a valid topic name")
                return -1
        if len(run):
            self._dispatch_run(run, f.mm, f.file_from_offset, notify, grouped)
        self.dispatched_offset = f.file_from_offset + end
        return len(run)

    def _before_a_deletion(self, offset: int) -> bool:
        """Whether entries from ``offset`` on may belong to a deleted topic's old generation: only when recovery
        re-dispatches a range written before a deletion (delete_topic dispatches everything before it deletes)."""
        deleted = self.deleted_before
        return bool(deleted) and offset < max(deleted.values())

    def _stuck(self, path: str, pos: int, offset: int, why: str) -> None:
        """Log that dispatch cannot pass the entry at ``offset``, once (the service retries every pass)."""
        self.stuck = (f"dispatch is stuck at {path} byte {pos} (commit-log offset {offset}): {why}; restart the "
                      "broker so that recovery checks the log")
        if offset != self._stuck_reported:
            self._stuck_reported = offset
            log.error("dispatcher stuck at %s byte %d (commit-log offset %d): %s; restart the broker so that recovery "
                      "checks the log", path, pos, offset, why)

    def _topic_name(self, raw: bytes) -> str | None:
        """The topic of stored TOPIC bytes, None when they are not a valid name (never stored by a put: a torn
        or damaged entry, whose name would become a path). Only a cache miss is checked: topics repeat."""
        name = self._topic_names.get(raw)
        if name is None and is_topic_name(raw):
            name = self._topic_names[raw] = raw.decode("ascii")
        return name

    def _group(self, run: EntryRun, buf: Buffer) -> Grouping:
        """queue_keys with decoded names; cut before the first entry (by position) whose topic is not a name (key
        ids shorter than the run then say where). Keys are in sorted order, not log order, so every key is named
        first: the entries before the cut may use any of the good ones."""
        key_ids, raw_keys = queue_keys(buf, run)
        names = [self._topic_name(raw) for raw, _ in raw_keys]
        keys = [(name or "", q) for name, (_, q) in zip(names, raw_keys, strict=True)]
        bad = [k for k, name in enumerate(names) if name is None]
        if bad:  # entries from the cut on are not dispatched, so no unit is ever written under a bad key's ""
            return key_ids[: int(np.flatnonzero(np.isin(key_ids, bad))[0])], keys
        return key_ids, keys

    def _dispatch_scalar(self, f: MappedFile, rel: int, limit: int, notify: bool) -> int:
        """A few entries (small batches, single puts): a struct per entry, no numpy per-call overhead, one
        consume-queue write per queue."""
        base, file_size = f.file_from_offset, f.file_size
        data = bytes(f.mm[rel:limit])  # at most SCALAR_DISPATCH_BYTES: one small copy, then plain bytes parsing
        pos = 0
        end = len(data)
        names = self._topic_names
        want_keys = self.index is not None
        parse_props = self._may_need_props(data, 0, end)
        arrived: dict[tuple[str, int], tuple[ConsumeQueue, list[int], list[bytes]]] = {}
        keyed: list[tuple[str, list[str], int, int]] = []  # (topic, keys, commit-log offset, store time)
        in_place: dict[tuple[str, int], tuple[list[int], list[int]]] = {}  # queue -> (handles, queue offsets)
        markers: list[tuple[int, bytes]] = []  # (commit-log offset, body)
        txn_from = self.txn.applied_to if self.txn is not None else -1
        pack = CQ_UNIT.pack
        ts = self.last_dispatched_timestamp
        deleted = self.deleted_before
        count = 0
        while pos < end:
            if pos + 8 <= end and PREFIX.unpack_from(data, pos)[1] == BLANK_MAGIC:
                pos = file_size - rel
                break
            quick = quick_layout(data, pos, end)
            if quick is None:
                try:
                    lay = parse_layout(data, pos, end)  # the definition: says what is wrong
                except CorruptionError as e:
                    if pos == 0:
                        self._stuck(f.path, rel, base + rel, e.message)
                        return -1
                    break  # the next pass starts at the bad entry and reports it
                quick = (tuple(lay.header), lay.topic_start, lay.topic_len, lay.props_len)
            h, topic_at, topic_len, props_len = quick
            total, qid = h[0], h[H_QUEUE_ID]
            raw_topic = data[topic_at : topic_at + topic_len]
            topic = names.get(raw_topic) or self._topic_name(raw_topic)
            if topic is None:
                if pos == 0:
                    self._stuck(f.path, rel, base + rel, f"TOPIC {raw_topic!r} is not a valid topic name")
                    return -1
                break  # the next pass starts at the bad entry and reports it
            ts = h[H_STORE_TIMESTAMP]
            if deleted and base + rel + pos < deleted.get(topic, -1):  # a deleted generation: its queues are gone
                pos += total
                count += 1
                continue
            props = data[pos + total - props_len : pos + total] if parse_props and props_len else b""
            if takes_queue_offset(h[H_SYS_FLAG], h[H_PREPARED_TX_OFFSET]):
                key = (topic, qid)
                got = arrived.get(key)
                if got is None:
                    arrived[key] = got = (self.queues.find_or_create(topic, qid), [], [])
                got[1].append(h[H_QUEUE_OFFSET])
                got[2].append(pack(base + rel + pos, total, self.unit_tag(topic, qid, props, ts)))
                if txn_from >= 0 and base + rel + pos >= txn_from:
                    if h[H_SYS_FLAG] & SysFlag.TRANSACTION_MASK == SysFlag.TRANSACTION_PREPARED_TYPE:
                        mine = in_place.setdefault(key, ([], []))
                        mine[0].append(h[H_PREPARED_TX_OFFSET])
                        mine[1].append(h[H_QUEUE_OFFSET])
                    elif topic == MARKER_TOPIC:
                        markers.append((base + rel + pos, decode_entry(data[pos : pos + total]).body))
            if props and want_keys and may_have_keys(props):
                msg_keys = message_keys(props)
                if msg_keys:
                    keyed.append((topic, msg_keys, base + rel + pos, ts))
            pos += total
            count += 1
        if self.txn is not None:
            for key, (handles, qoffs) in in_place.items():  # before the units: held before readers could see them
                self.txn.register(key, arrived[key][0], np.array(handles, np.int64), np.array(qoffs, np.int64))
        for cq, qoffs, units in arrived.values():
            self._put_units(cq, qoffs, units)
        if keyed:  # after the units, as the vectorised path does: a message found by key is in its queue too
            assert self.index is not None
            self.index.put_many(keyed)
        if self.txn is not None:
            for _, marker in markers_in(markers, f.path):
                self.txn.decide(marker)
        self.dispatched_offset = base + rel + pos  # after the units: a caller that waits on it finds them
        self.last_dispatched_timestamp = ts
        if notify:  # once per queue per pass, as the vectorised path does
            for (topic, qid), (cq, _, _) in arrived.items():
                for fn in self.listeners:
                    fn(topic, qid, cq.max_offset)
        return count

    @staticmethod
    def _put_units(cq: ConsumeQueue, qoffs: list[int], units: list[bytes]) -> None:
        """Write one queue's units of a pass; units below the queue's end were written before a recovery's
        re-dispatch: they are only checked (repaired where they differ)."""
        have = cq.written_offset
        if qoffs[0] < have:
            stale = [i for i, q in enumerate(qoffs) if q < have]
            cq.repair_units(
                np.array([qoffs[i] for i in stale], np.int64),
                np.frombuffer(b"".join(units[i] for i in stale), CQ_DTYPE),
            )
            keep = [i for i, q in enumerate(qoffs) if q >= have]
            if not keep:
                return
            qoffs, units = [qoffs[i] for i in keep], [units[i] for i in keep]
        first = qoffs[0]
        if first > have:
            log.error(
                "consume queue %s/%d: unit %d follows max offset %d; units missing", cq.topic, cq.queue_id, first, have
            )
        if qoffs[-1] - first == len(qoffs) - 1:
            cq.put_units(first, b"".join(units))
        else:  # not consecutive (damaged log): one unit at a time at its own position
            for q, u in zip(qoffs, units, strict=True):
                cq.put_units(q, u)

    def _dispatch_run(
        self, run: EntryRun, buf: Buffer, base: int, notify: bool, grouped: Grouping | None = None
    ) -> None:
        key_ids, keys = self._group(run, buf) if grouped is None else grouped
        assert len(key_ids) == len(run), "the caller cuts the run before an entry whose topic is not a name"
        tags, keyed = self._tags_and_keyed(run, buf)
        phys = run.positions + base
        handles = self._transaction_handles(run, buf)
        self._write_units(run, key_ids, keys, phys, tags, notify, handles)
        if self.txn is not None:
            self._decide(run, buf, key_ids, keys, phys)
        if self.index is not None and keyed:
            if isinstance(keyed, ProducerKeys):
                e = keyed.entries
                prefixes = [index_key(topic, "") for topic, _queue in keys]
                hashes = prefixed_key_hashes(prefixes, key_ids[e], keyed.chars)
                self.index.put_hashed(hashes, phys[e], run.store_timestamps[e].astype(np.int64))
            else:
                at, times = phys.tolist(), run.store_timestamps.tolist()
                self.index.put_many([(keys[int(key_ids[i])][0], ks, at[i], times[i]) for i, ks in keyed])
        self.last_dispatched_timestamp = int(run.store_timestamps[-1])

    @staticmethod
    def _transaction_handles(run: EntryRun, buf: Buffer) -> np.ndarray | None:
        """batch.transaction_handles, with no array over ``buf`` unless the run has a PREPARED entry."""
        if not ((run.sys_flags & SysFlag.TRANSACTION_MASK) == SysFlag.TRANSACTION_PREPARED_TYPE).any():
            return None
        arr = np.frombuffer(buf, np.uint8)
        handles = transaction_handles(arr, run)
        del arr  # the view holds an export of the mapped file (it could not be closed while one is alive)
        return handles

    def _decide(self, run: EntryRun, buf: Buffer, key_ids: np.ndarray, keys: list[tuple[str, int]],
                phys: np.ndarray) -> None:
        """Apply the run's transaction markers (after its units are written: a marker shows them)."""
        assert self.txn is not None
        ids = [k for k, (topic, _) in enumerate(keys) if topic == MARKER_TOPIC]
        if not ids:
            return
        idx = np.flatnonzero(np.isin(key_ids, ids) & (phys >= self.txn.applied_to))
        found = []
        for i in idx.tolist():
            pos, size = int(run.positions[i]), int(run.sizes[i])
            found.append((int(phys[i]), decode_entry(bytes(buf[pos : pos + size])).body))
        for _, marker in markers_in(found, "commit log"):
            self.txn.decide(marker)

    def _may_need_props(self, buf: Buffer, start: int, end: int) -> bool:
        """False when ``buf[start:end]`` holds no TAGS (nor KEYS / UNIQ_KEY, when indexing) name at all: that
        proves no entry there has a tag code or index keys to parse. A few KB are searched once per name; a long
        run in one numpy pass over its \x01 bytes (names_may_occur), about 3x faster than three searches."""
        if end - start >= CENSUS_MIN_BYTES:
            return names_may_occur(buf, start, end, INDEXED_NAME_ENDS if self.index is not None else TAG_NAME_END)
        if contains(buf, TAGS_NAME, start, end):
            return True
        return self.index is not None and (contains(buf, KEYS_NAME, start, end) or contains(buf, UNIQ_NAME, start, end))

    def _tag_code(self, props: bytes) -> int:
        """The consume-queue tag field for one message's raw properties (tag_hash_code of its TAGS, 0 if none)."""
        tag = property_value(props, TAGS_NAME)
        if not tag:
            return 0
        code = self._tag_codes.get(tag)
        if code is None:
            code = tag_hash_code(tag.decode("utf-8", "replace"))
            if len(self._tag_codes) >= MAX_CACHED_TAGS:
                self._tag_codes.clear()
            self._tag_codes[tag] = code
        return code

    def _tags_and_keyed(
        self, run: EntryRun, buf: Buffer
    ) -> tuple[np.ndarray, list[tuple[int, list[str]]] | ProducerKeys]:
        """Tag code per entry, and (entry, properties) of the entries that may carry index keys.

        A batch usually repeats one properties string (same tag, no keys): when every entry's properties are the
        same bytes (checked in numpy) they are parsed once; otherwise entry by entry, tag codes from a cache.
        """
        n = len(run)
        tags = np.zeros(n, np.int64)
        keyed: list[tuple[int, list[str]]] = []  # (entry, its index keys)
        want_keys = self.index is not None
        with_props = np.flatnonzero(run.props_lengths > 0)
        if not with_props.size:
            return tags, keyed
        # The two shapes of a batch (one properties string; a producer's shared prefix and UNIQ_KEYs) are told from
        # the sections alone, before the census of the whole run below, which reads every body too (0.3 ms of a
        # batch of 1,000 x 1 KiB, 2026-11-28) and would find the names a shape's sections hold anyway.
        starts = run.props_starts[with_props]
        lengths = run.props_lengths[with_props]
        same = same_bytes(buf, starts, lengths)
        if same is not None:
            tags[with_props] = self._tag_code(same)
            if want_keys and may_have_keys(same):
                shared = message_keys(same)
                keyed = [(i, shared) for i in with_props.tolist()] if shared else []
            return tags, keyed
        tailed = uniq_tails(buf, starts, lengths)
        if tailed is not None:  # a producer's batch: one shared prefix, then each message's own UNIQ_KEY
            tags[with_props] = self._tag_code(tailed.prefix)
            if want_keys:
                shared = message_keys(tailed.prefix)
                if not shared:  # the UNIQ_KEYs are the only keys: indexed from their bytes
                    return tags, ProducerKeys(with_props, tailed.chars)
                keyed = [(i, [*shared, u]) for i, u in zip(with_props.tolist(), tailed.keys(), strict=True)]
            return tags, keyed
        # Untagged, unkeyed messages with varied properties (the exactly-once sink's halves and commits): nothing
        # to parse. A body holding one of the names only sends the run down the per-entry path below.
        if not self._may_need_props(buf, int(run.positions[0]), int(run.positions[-1] + run.sizes[-1])):
            return tags, keyed
        # property_value and _tag_code inlined: this loop is the dispatcher's per-message cost for varied properties
        codes: list[int] = []
        cache = self._tag_codes
        tag_code = self._tag_code
        ends = (starts + lengths).tolist()
        for i, a, b in zip(with_props.tolist(), starts.tolist(), ends, strict=True):
            p = bytes(buf[a:b])
            if p.startswith(TAGS_NAME):
                j = TAGS_LEN
            else:
                j = p.find(SEP_TAGS)
                j = j + SEP_TAGS_LEN if j >= 0 else -1
            if j < 0:
                codes.append(0)
            else:
                k = p.find(b"\x02", j)
                code = cache.get(p[j:k] if k >= 0 else p[j:])
                codes.append(code if code is not None else tag_code(p))
            if want_keys and (KEYS_NAME in p or UNIQ_NAME in p):
                found = message_keys(p)
                if found:
                    keyed.append((i, found))
        tags[with_props] = codes
        return tags, keyed

    def _write_units(
        self,
        run: EntryRun,
        key_ids: np.ndarray,
        keys: list[tuple[str, int]],
        phys: np.ndarray,
        tags: np.ndarray,
        notify: bool,
        handles: np.ndarray | None = None,
    ) -> None:
        tx = run.sys_flags & SysFlag.TRANSACTION_MASK
        counted = tx != SysFlag.TRANSACTION_ROLLBACK_TYPE  # message.takes_queue_offset, for the whole run
        in_place = None
        if handles is not None:
            counted &= (tx != SysFlag.TRANSACTION_PREPARED_TYPE) | (handles > 0)
            if self.txn is not None:
                in_place = (handles > 0) & (phys >= self.txn.applied_to)
        units = np.empty(len(run), CQ_DTYPE)
        units["offset"] = phys
        units["size"] = run.sizes
        units["tag"] = tags
        if len(keys) == 1:
            groups = [np.flatnonzero(counted)] if not counted.all() else [np.arange(len(run))]
        else:
            ids = np.where(counted, key_ids, len(keys))
            order = np.argsort(ids, kind="stable")
            bounds = np.cumsum(np.bincount(ids, minlength=len(keys) + 1))[:-1]
            groups = np.split(order, bounds)[: len(keys)]
        for idx in groups:
            if idx.size == 0:
                continue
            topic, qid = keys[int(key_ids[idx[0]])]
            cq = self.queues.find_or_create(topic, qid)
            group = units[idx]
            if topic == self._due_topic:
                group["tag"] = run.store_timestamps[idx] + self._due_time(qid, 0)
            if in_place is not None:
                mine = idx[in_place[idx]]
                if mine.size:  # before the units: held before readers could see them
                    assert self.txn is not None and handles is not None
                    self.txn.register((topic, qid), cq, handles[mine], run.queue_offsets[mine])
            self._put_group(cq, run.queue_offsets[idx], group)
            if notify:
                for fn in self.listeners:
                    fn(topic, qid, cq.max_offset)

    @staticmethod
    def _put_group(cq: ConsumeQueue, qoffs: np.ndarray, units: np.ndarray) -> None:
        have = cq.written_offset
        fresh = qoffs >= have  # re-dispatch after recovery: units already there are only checked
        if not fresh.all():
            cq.repair_units(qoffs[~fresh], units[~fresh])
            qoffs, units = qoffs[fresh], units[fresh]
            if qoffs.size == 0:
                return
        first = int(qoffs[0])
        if first > have:
            log.error(
                "consume queue %s/%d: unit %d follows max offset %d; the units between are missing",
                cq.topic,
                cq.queue_id,
                first,
                have,
            )
        if int(qoffs[-1]) - first == qoffs.size - 1:
            cq.put_units(first, units.tobytes())
        else:  # not consecutive (damaged log): one unit at a time at its own position
            for q, u in zip(qoffs.tolist(), units, strict=True):
                cq.put_units(q, u.tobytes())

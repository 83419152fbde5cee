"""check(): a consistency oracle over the whole store, called at the end of storage tests.

It re-reads everything from the files and cross-checks: every commit-log entry frames and CRCs correctly and sits
at its own PHYSICALOFFSET; store times never go back; each queue's offsets are consecutive; every consume-queue
unit points at the entry with its topic, queue, offset, size and tag hash, and every entry has its unit; the
in-memory next-offset table matches the queues; every index entry points at a message carrying that key hash,
and every live message is indexed under each of its keys.
Returns one line per inconsistency; [] means consistent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from broker.format.batch import Buffer, counted_entries, scan
from broker.store.consume_queue import CQ_DTYPE
from broker.store.index_file import INDEX_HEADER, index_key, key_hash
from broker.store.property_scan import message_keys

if TYPE_CHECKING:
    from broker.store.message_store import MessageStore

MAX_PROBLEMS = 200  # a broken store can produce millions of lines; the first ones say enough


class _LogEntry(NamedTuple):
    topic: str
    queue_id: int
    queue_offset: int
    size: int
    tag_hash: int
    counted: bool
    key_hashes: frozenset[int]
    deleted: bool  # of a deleted topic's old generation: re-dispatch after a crash indexes it no more


def check_store(store: MessageStore) -> list[str]:
    problems: list[str] = []
    if not store.wait_dispatched():
        problems.append(
            f"dispatcher stuck at {store.dispatcher.dispatched_offset}, "
            f"commit log ends at {store.commit_log.max_offset}"
        )
    if store.replica:  # a slave's appends assign no queue offsets: its table is rebuilt when it takes office,
        store.rebuild_queue_table()  # from its queues, so after they hold every entry replicated so far
    entries = _check_commit_log(store, problems)
    _check_queues(store, entries, problems)
    _check_index(store, entries, problems)
    store.txn_visibility.check(problems)
    return problems[:MAX_PROBLEMS]


def _check_commit_log(store: MessageStore, problems: list[str]) -> dict[int, _LogEntry]:
    entries: dict[int, _LogEntry] = {}
    last_ts = 0
    next_qoff: dict[tuple[str, int], int] = {}
    files = store.commit_log.files.files
    for f in files:
        run = scan(f.mm, 0, f.wrote_position, verify_crc=True)
        if run.stop_reason == "blank":
            if f.wrote_position != f.file_size:
                problems.append(f"{f.path}: blank entry at byte {run.end} but write position {f.wrote_position}")
        elif run.stop_reason or run.end != f.wrote_position:
            problems.append(f"{f.path}: entries end at byte {run.end} ({run.stop_reason}), written {f.wrote_position}")
        topics = run.topics(f.mm)
        props = run.properties(f.mm)
        phys_field = _phys_fields(f.mm, run.positions)
        counted_all = counted_entries(np.frombuffer(f.mm, np.uint8), run)
        for i in range(len(run)):
            pos = int(run.positions[i])
            phys = f.file_from_offset + pos
            if phys_field[i] != phys:
                problems.append(f"{f.path} byte {pos}: PHYSICALOFFSET {phys_field[i]} != actual {phys}")
            ts = int(run.store_timestamps[i])
            if ts < last_ts:
                problems.append(f"{f.path} byte {pos}: store time {ts} goes back from {last_ts}")
            last_ts = max(last_ts, ts)
            topic = topics[i].decode("ascii", "replace")
            qid, qoff = int(run.queue_ids[i]), int(run.queue_offsets[i])
            counted = bool(counted_all[i])
            deleted = phys < store.deleted_topics.get(topic, -1)
            if deleted:
                counted = False  # an entry of a since-deleted topic: its queue numbering started over
            keys = message_keys(props[i]) if props[i] else []
            entries[phys] = _LogEntry(
                topic, qid, qoff, int(run.sizes[i]), store.dispatcher.unit_tag(topic, qid, props[i], ts),
                counted, frozenset(key_hash(index_key(topic, k)) for k in keys), deleted,
            )
            if counted:
                key = (topic, qid)
                want = next_qoff.get(key)
                if want is not None and qoff != want:
                    problems.append(f"{f.path} byte {pos}: {topic}/{qid} queue offset {qoff}, expected {want}")
                next_qoff[key] = qoff + 1
    if files and store.commit_log.max_offset != store.dispatcher.dispatched_offset:
        problems.append(
            f"dispatched offset {store.dispatcher.dispatched_offset} != commit log end {store.commit_log.max_offset}"
        )
    return entries


def _phys_fields(buf: Buffer, positions: np.ndarray) -> list[int]:
    arr = np.frombuffer(buf, np.uint8)
    if positions.size == 0:
        return []
    out = arr[(positions + 28)[:, None] + np.arange(8)].view(">i8").ravel().tolist()
    del arr
    return [int(x) for x in out]


def _check_queues(store: MessageStore, entries: dict[int, _LogEntry], problems: list[str]) -> None:
    cl_min = store.commit_log.min_offset
    covered: set[int] = set()
    for (topic, qid), cq in sorted(store.queues.queues.items()):
        name = f"consume queue {topic}/{qid}"
        lo, hi = cq.min_offset, cq.written_offset
        want = store.commit_log.queue_table.get((topic, qid), 0)  # absent: never written (a held, empty queue)
        if want != hi:
            problems.append(f"{name}: next-offset table says {want}, queue max offset is {hi}")
        q = lo
        prev_phys = -1
        while q < hi:
            raw = cq.read_units(q, 65536)
            if not raw:
                problems.append(f"{name}: units from {q} unreadable (file missing)")
                break
            units = np.frombuffer(raw, CQ_DTYPE)
            for j, (phys, size, tag) in enumerate(units.tolist()):
                qo = q + j
                where = f"{name} unit {qo} ({cq.files.directory} byte {qo * 20})"
                if size <= 0:
                    problems.append(f"{where}: empty unit inside [{lo}, {hi})")
                    continue
                if phys <= prev_phys:
                    problems.append(f"{where}: commit-log offset {phys} not after previous {prev_phys}")
                prev_phys = phys
                if phys < cl_min:
                    continue
                e = entries.get(phys)
                if e is None:
                    problems.append(f"{where}: points at {phys}, where no entry starts")
                    continue
                covered.add(phys)
                if (e.topic, e.queue_id, e.queue_offset, e.size, e.tag_hash) != (topic, qid, qo, size, tag):
                    problems.append(
                        f"{where}: unit ({phys}, {size}, {tag}) does not match entry "
                        f"({e.topic}/{e.queue_id} offset {e.queue_offset}, size {e.size}, tag {e.tag_hash})"
                    )
            q += units.size
            if len(problems) > MAX_PROBLEMS:
                return
    for phys, e in entries.items():
        if not e.counted or phys in covered:
            continue
        queue = store.queues.find(e.topic, e.queue_id)
        if queue is None:
            if (e.topic, e.queue_id) in store.commit_log.queue_table:
                problems.append(f"entry at {phys} ({e.topic}/{e.queue_id} #{e.queue_offset}) has no consume queue")
            continue
        if queue.min_offset <= e.queue_offset:
            problems.append(f"entry at {phys} ({e.topic}/{e.queue_id} #{e.queue_offset}) has no consume-queue unit")
        if len(problems) > MAX_PROBLEMS:
            return


def _check_index(store: MessageStore, entries: dict[int, _LogEntry], problems: list[str]) -> None:
    if store.index is None:
        return
    cl_min = store.commit_log.min_offset
    present: set[tuple[int, int]] = set()  # (commit-log offset, key hash) of every index entry
    for f in store.index.files:
        h = f.header
        for number in range(1, h.index_count):
            e = f.entry(number)
            present.add((e.commitlog_offset, e.key_hash))
            where = f"{f.path} entry {number}"
            if not 0 <= e.prev_index < number:
                problems.append(f"{where}: previous entry {e.prev_index} is not before it")
            if e.commitlog_offset < cl_min:
                continue
            msg = entries.get(e.commitlog_offset)
            if msg is None:
                problems.append(f"{where}: points at commit-log offset {e.commitlog_offset}, where no entry starts")
            elif e.key_hash not in msg.key_hashes:
                problems.append(f"{where}: key hash {e.key_hash} is not a key of the message at {e.commitlog_offset}")
            if len(problems) > MAX_PROBLEMS:
                return
        # All slots at once (a Python call per slot took 25 s over the default 5M slots); only the first bad one is
        # named, as before.
        slots = np.frombuffer(f.mm, ">i4", count=f.slots, offset=INDEX_HEADER.size)
        bad = np.flatnonzero((slots < 0) | (slots >= h.index_count))
        if bad.size:
            slot = int(bad[0])
            problems.append(f"{f.path} slot {slot}: entry {int(slots[slot])} outside [0, {h.index_count})")
        del slots  # a view of the mapping: the file cannot be closed while it lives
    # The other way round: every live message is indexed under each of its keys (files below the commit log's
    # first offset are deleted by cleanup; a message with more keys than a file holds keeps only the first ones).
    for phys, msg in entries.items():
        if phys < cl_min or msg.deleted or not msg.key_hashes or len(msg.key_hashes) > store.index.entries - 2:
            continue
        for kh in sorted(msg.key_hashes - {kh for kh in msg.key_hashes if (phys, kh) in present}):
            problems.append(f"message at commit-log offset {phys} ({msg.topic}): key hash {kh} has no index entry")
            if len(problems) > MAX_PROBLEMS:
                return

"""The streaming jobs, run as users run them (``python -m streaming_jobs.NAME``, local[2]), against the broker
container: topic_mirror (filter + transform), to_parquet (content and partitioning), windowed_counts (append mode,
watermark closed by a late heartbeat), the demo on ``--endpoints``, and the exactly-once mirror across a broker
container restart and a SIGKILL of its driver.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from jobs_helpers import create_topics, flat, produce, read_topic, run_job, start_job, stored_count

from broker.client import Message
from broker.errors import BrokerError
from broker.testing import SluiceContainer
from tests.support.waiting import became_true

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(420)]

QUEUES = 4


def test_topic_mirror_with_where_and_transform(broker: SluiceContainer, tmp_path: Path) -> None:
    endpoint = broker.get_endpoint()
    create_topics(endpoint, QUEUES, "orders", "orders_eu")
    n = 1200
    sent = [
        Message("orders", json.dumps({"id": i, "region": "eu" if i % 3 == 0 else "us"}).encode(),
                tags="eu" if i % 3 == 0 else "us", keys=(f"order{i}",), properties={"n": str(i)})
        for i in range(n)
    ]
    produce(endpoint, sent, QUEUES)
    run_job(
        "topic_mirror",
        *("--endpoints", endpoint, "--source", "orders", "--target", "orders_eu"),
        *("--checkpoint", str(tmp_path / "chk"), "--trigger", "available-now"),
        *("--where", "tags = 'eu'", "--transform", "upper(cast(body as string))"),
    )
    src = flat(read_topic(endpoint, "orders"))
    expected = {m.body.decode().upper().encode(): m for m in src if m.tags == "eu"}
    assert len(expected) == n // 3
    dst = read_topic(endpoint, "orders_eu")
    got = flat(dst)
    assert Counter(m.body for m in got) == Counter(list(expected)), "the mirror is not the filtered, transformed source"
    for m in got:
        s = expected[m.body]
        assert m.tags == "eu" and m.keys == s.keys and m.properties.get("n") == s.properties["n"]
    # Each source queue goes to one target queue, in source order.
    for qid, msgs in dst.items():
        positions = [(expected[m.body].queue_id, expected[m.body].queue_offset) for m in msgs]
        assert len({q for q, _ in positions}) <= 1 and positions == sorted(positions), f"target queue {qid}"


def test_to_parquet_content_and_partitioning(broker: SluiceContainer, tmp_path: Path) -> None:
    endpoint = broker.get_endpoint()
    topics = ("pq_a", "pq_b")
    create_topics(endpoint, 2, *topics)
    for t, n in zip(topics, (500, 300), strict=True):
        produce(endpoint, [Message(t, f"{t}-{i:05d}".encode(), tags=f"t{i % 2}") for i in range(n)], 2)
    out = tmp_path / "parquet"
    run_job(
        "to_parquet",
        *("--endpoints", endpoint, "--topic", ",".join(topics), "--output", str(out)),
        *("--checkpoint", str(tmp_path / "chk"), "--trigger", "available-now", "--body-as-string"),
        *("--max-messages-per-trigger", "400"),
    )
    stored = {t: flat(read_topic(endpoint, t)) for t in topics}
    days = {
        t: {datetime.fromtimestamp(m.store_timestamp / 1000, UTC).date().isoformat() for m in msgs}
        for t, msgs in stored.items()
    }
    # Hive-style layout: date=<store day, UTC>/topic=<topic>/part-*.parquet, and nothing else holds data.
    data_files = sorted(p.relative_to(out) for p in out.rglob("*.parquet"))
    assert data_files, f"no Parquet files under {out}"
    dirs = {str(p.parent) for p in data_files}
    assert dirs == {f"date={d}/topic={t}" for t in topics for d in days[t]}, dirs
    assert (out / "_spark_metadata").is_dir(), "the file sink's exactly-once log is missing"
    for t in topics:
        rows: list[dict[str, object]] = []
        for d in days[t]:
            rows += pq.read_table(out / f"date={d}" / f"topic={t}").to_pylist()
        got = sorted((r["queue_id"], r["queue_offset"], r["body"], r["tags"]) for r in rows)
        want = sorted((m.queue_id, m.queue_offset, m.body.decode(), m.tags) for m in stored[t])
        assert got == want, f"{t}: Parquet rows differ from the topic ({len(got)} vs {len(want)})"


def test_windowed_counts_append_mode_with_watermark(broker: SluiceContainer, tmp_path: Path) -> None:
    endpoint = broker.get_endpoint()
    create_topics(endpoint, 2, "events", "event_counts")
    base_ms = int(datetime(2026, 1, 1, 12, 0, tzinfo=UTC).timestamp() * 1000)
    # Minute m, key k -> count; the events are spread over both queues, in no particular time order.
    want = {(0, "view"): 7, (0, "click"): 3, (1, "view"): 5, (2, "click"): 4, (2, "buy"): 1}
    events = [(base_ms + m * 60_000 + (j * 7919) % 60_000, k) for (m, k), c in want.items() for j in range(c)]
    events.sort(key=lambda e: (e[0] * 31) % 1000)
    msgs = [Message("events", json.dumps({"event": k, "ts": ts}).encode()) for ts, k in events]
    # The late heartbeat: event time 10 minutes on, so the watermark (2 minutes behind) passes minutes 0..2.
    msgs.append(Message("events", json.dumps({"event": "heartbeat", "ts": base_ms + 10 * 60_000}).encode()))
    produce(endpoint, msgs, 2)
    run_job(
        "windowed_counts",
        *("--endpoints", endpoint, "--source", "events", "--target", "event_counts"),
        *("--checkpoint", str(tmp_path / "chk"), "--trigger", "available-now"),
        *("--window", "1 minute", "--watermark", "2 minutes"),
    )
    got: dict[tuple[int, str], int] = {}
    for m in flat(read_topic(endpoint, "event_counts")):
        row = json.loads(m.body)
        start = datetime.fromisoformat(row["window_start"]).timestamp() * 1000
        end = datetime.fromisoformat(row["window_end"]).timestamp() * 1000
        assert end - start == 60_000, row
        minute = int(start - base_ms) // 60_000
        assert (minute, row["key"]) not in got, f"window emitted twice: {row}"
        assert m.tags == row["key"]
        got[(minute, row["key"])] = row["count"]
    # Every closed window once, with its count; the heartbeat's own window is still open, so not emitted.
    assert got == want


def test_demo_against_the_container(broker: SluiceContainer) -> None:
    events = 3000
    endpoint = broker.get_endpoint()
    out = run_job("demo", "--endpoints", endpoint, "--events", str(events))
    assert f"[1/4] broker: using the running broker at {endpoint}" in out, out[-3000:]
    assert "[2/4] produce:" in out and "[3/4] stream:" in out and "[4/4] check:" in out, out[-3000:]
    # the heartbeat is read like a click (one input row more) and said to be one
    assert f"read {events + 1} messages ({events} click events + 1 heartbeat)" in out, out[-3000:]
    assert "events per minute and type" in out, out[-3000:]
    assert f"events sent: {events}   events counted: {events}" in out, out[-3000:]
    assert "consumer group demo-etl on clicks" in out, out[-3000:]
    assert stored_count(broker.get_endpoint(), "click-stats") > 0


# ---- exactly-once mirror across a broker container restart and a driver SIGKILL ---------------------------

EO_MESSAGES = 30_000
EO_PER_TRIGGER = 2000


def mirrored(endpoint: str) -> int:
    """Messages in eo_b; -1 while the broker is away."""
    try:
        return stored_count(endpoint, "eo_b")
    except BrokerError:
        return -1


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the job's process group (driver and JVM); it may already be gone."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


@pytest.mark.slow
def test_exactly_once_mirror_across_broker_restart_and_driver_kill(broker: SluiceContainer, tmp_path: Path) -> None:
    endpoint = broker.get_endpoint()
    create_topics(endpoint, QUEUES, "eo_a", "eo_b")
    produce(endpoint, [Message("eo_a", f"id-{i:06d}".encode(), tags=f"t{i % 3}") for i in range(EO_MESSAGES)], QUEUES)
    checkpoint, log = tmp_path / "chk", tmp_path / "driver.log"
    common = ("--source", "eo_a", "--target", "eo_b", "--checkpoint", str(checkpoint))

    def start_continuous(endpoint: str) -> subprocess.Popen[bytes]:
        return start_job(
            "topic_mirror",
            *("--endpoints", endpoint, *common, "--trigger", "continuous", "--interval", "1 second"),
            *("--max-messages-per-trigger", str(EO_PER_TRIGGER)),
            log=log,
        )

    def driver_log() -> str:
        return log.read_text(errors="replace")[-4000:]

    def progress(endpoint: str, beyond: int, timeout_s: float = 120) -> bool:
        return became_true(lambda: mirrored(endpoint) >= beyond + 2 * EO_PER_TRIGGER,
                           timeout_s=timeout_s, interval_s=0.5)

    proc = start_continuous(endpoint)
    try:
        # Some micro-batches are committed into B, then the broker container restarts under the running query.
        assert progress(endpoint, 0), f"no progress before the restart:\n{driver_log()}"
        assert proc.poll() is None, driver_log()
        before = mirrored(endpoint)
        broker.terminate(timeout_s=10)
        broker.restart()
        new_endpoint = broker.get_endpoint()
        survived = new_endpoint == endpoint and progress(endpoint, before, 60) and proc.poll() is None
        print(f"broker restarted ({endpoint} -> {new_endpoint}) with {before} in eo_b; job carried on: {survived}")
        endpoint = new_endpoint
        if not survived:  # a new port, or the query failed while the broker was away: a new run from the checkpoint
            kill_group(proc)
            proc = start_continuous(endpoint)
            assert progress(endpoint, max(mirrored(endpoint), 0)), f"no progress after the restart:\n{driver_log()}"
        # Then the driver is SIGKILLed mid-run (a batch is being written or committed about every second).
        time.sleep(1.3)
        assert proc.poll() is None, driver_log()
        kill_group(proc)
        in_b = mirrored(endpoint)
        print(f"driver killed with {in_b} messages in eo_b")
        assert in_b < EO_MESSAGES, "the job finished before it was killed; the test would prove nothing"
    finally:
        kill_group(proc)

    # The restart from the checkpoint finishes the rest, and B holds every id of A exactly once.
    run_job("topic_mirror", "--endpoints", endpoint, *common, "--trigger", "available-now")
    ids = Counter(m.body for m in flat(read_topic(endpoint, "eo_b")))
    expected = {f"id-{i:06d}".encode() for i in range(EO_MESSAGES)}
    missing = expected - ids.keys()
    dupes = {k: c for k, c in ids.items() if c > 1}
    assert not missing, f"{len(missing)} ids lost, e.g. {sorted(missing)[:5]}"
    assert not dupes, f"{len(dupes)} ids written more than once, e.g. {list(dupes.items())[:5]}"
    assert ids.keys() == expected, f"unexpected ids in eo_b, e.g. {sorted(ids.keys() - expected)[:5]}"

"""What the Spark and streaming-job integration tests share: running a job as users do (``python -m
streaming_jobs.NAME``, its own driver process) and reading a topic of the containerised broker from the host."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from broker.client import Admin, Message, Producer, PullConsumer, SendStatus
from broker.client.results import ReceivedMessage
from tests.support.brokers import wait_dispatched

REPO = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 240.0  # one job run on local[2]: Spark start (~10 s) plus a few small micro-batches
PRODUCE_CHUNK = 1000


def job_env() -> dict[str, str]:
    """The job's Python workers must be this interpreter (they import ``connector``)."""
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return env


def job_command(name: str, *args: str) -> list[str]:
    return [sys.executable, "-m", f"streaming_jobs.{name}", *args]


def run_job(name: str, *args: str, timeout_s: float = JOB_TIMEOUT_S) -> str:
    """Run a job to completion; its stdout. Fails with the tail of its output when it exits non-zero."""
    proc = subprocess.run(
        job_command(name, *args),
        cwd=REPO,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert proc.returncode == 0, (
        f"streaming_jobs.{name} exited {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n"
        f"--- stderr\n{proc.stderr[-5000:]}"
    )
    return proc.stdout


def start_job(name: str, *args: str, log: Path) -> subprocess.Popen[bytes]:
    """Start a job in its own process group (so SIGKILL reaches the driver and its JVM), output appended to log."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            job_command(name, *args),
            cwd=REPO,
            env=job_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def create_topics(endpoint: str, queues: int, *topics: str) -> None:
    with Admin(endpoint) as admin:
        for topic in topics:
            admin.create_topic(topic, queues=queues)


def produce(endpoint: str, msgs: list[Message], queues: int) -> None:
    """Send in chunks, the chunks round-robin over the queues (each chunk stored all-or-nothing, in order); returns
    once the consume queues show every message (pulls only see dispatched messages)."""
    max_offsets: dict[str, dict[int, int]] = {}
    with Producer(endpoint, group="it-producer") as producer:
        for i, lo in enumerate(range(0, len(msgs), PRODUCE_CHUNK)):
            chunk = msgs[lo : lo + PRODUCE_CHUNK]
            results = producer.send_batch(chunk, queue_id=i % queues)
            assert len(results) == len(chunk)
            for msg, r in zip(chunk, results, strict=True):
                assert r.status is SendStatus.SEND_OK, r
                per_queue = max_offsets.setdefault(msg.topic, {})
                per_queue[r.queue_id] = max(per_queue.get(r.queue_id, 0), r.queue_offset + 1)
    for topic, per_queue in max_offsets.items():
        wait_dispatched(endpoint, topic, per_queue)


def stored_count(endpoint: str, topic: str) -> int:
    """Messages in the topic's consume queues (max - min over every queue)."""
    with Admin(endpoint) as admin:
        return sum(hi - lo for lo, hi in admin.queue_offsets(topic).values())


def read_topic(endpoint: str, topic: str) -> dict[int, list[ReceivedMessage]]:
    """Every message of every queue of the topic, in queue order, read with the host's pull consumer."""
    out: dict[int, list[ReceivedMessage]] = {}
    with Admin(endpoint) as admin:
        queues = admin.queue_offsets(topic)
    with PullConsumer(endpoint, "it-verify") as consumer:
        for qid, (lo, hi) in sorted(queues.items()):
            offset, msgs = lo, []
            while offset < hi:
                result = consumer.pull(topic, qid, offset, max_msgs=1000)
                assert result.next_begin_offset > offset or result.messages, f"{topic}/{qid}: no progress at {offset}"
                msgs.extend(result.messages)
                offset = result.next_begin_offset
            out[qid] = msgs
    return out


def flat(by_queue: dict[int, list[ReceivedMessage]]) -> list[ReceivedMessage]:
    return [m for qid in sorted(by_queue) for m in by_queue[qid]]

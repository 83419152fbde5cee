"""Broker semantics over gRPC: `python -m bench.semantics` prints a table and writes bench/results/semantics.json.

Against a broker subprocess in a fresh temporary store (ASYNC_FLUSH):

* batch transactions, the exactly-once Spark sink's path: N messages of 100 B sent into one transaction
  (``Producer.send_encoded(..., transaction_id=...)``, batches of 2,500), then ``Admin.end_transaction(commit)``
  until the last message is visible, with what the commit cost the broker process (user and system CPU, minor
  page faults: fresh memory it touched) and the commit-log bytes written per message; once written in place (the
  default) and once as half messages (``as_halves=True``), beside the same messages through plain SendBatch;
* the client-side half rewrite alone (``half_batch.to_half_batch``) against the transaction service's decoding
  rewrite (``transaction_codec.rewrite_batch_as_half``), in this process.

The machine's load average is recorded with the figures: on a shared 2-core machine they move with it.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.report import save
from broker.client import Admin, Message, Producer
from broker.client.half_batch import to_half_batch
from broker.client.outgoing_message import encode_message
from broker.format.transaction_codec import rewrite_batch_as_half
from broker.server.process import BrokerProcess

RESULTS = Path(__file__).resolve().parent / "results" / "semantics.json"
BATCH = 2_500
BODY = b"x" * 100


def batches(topic: str, n: int) -> list[tuple[bytes, int]]:
    out = []
    for start in range(0, n, BATCH):
        count = min(BATCH, n - start)
        out.append((b"".join(encode_message(Message(topic, BODY), i % 8, 1) for i in range(count)), count))
    return out


def visible(admin: Admin, topic: str) -> int:
    return sum(high - low for low, high in admin.queue_offsets(topic).values())


def broker_usage(pid: int) -> tuple[float, float, int]:
    """(user CPU s, system CPU s, minor page faults) of a process so far, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks, int(fields[7])  # utime, stime, minflt


def log_end(admin: Admin) -> int:
    return int(admin.stats()["store_commit_log_max_offset"])


def bench_broker(n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="sluice-bench-sem-") as tmp:  # noqa: SIM117
        with (
            BrokerProcess(Path(tmp) / "store") as proc,
            Producer(proc.endpoint) as producer,
            Admin(proc.endpoint) as admin,
        ):
            assert proc.proc is not None
            pid = proc.proc.pid
            out: dict[str, float] = {"messages": n}
            admin.create_topic("TxWarms", 8)  # a fresh broker's first sends are slower: not the plain figure
            for buffer, count in batches("TxWarms", n // 2):
                producer.send_encoded(buffer, count)
            # topics of one name length: bytes per message compare like with like
            admin.create_topic("TxPlain", 8)
            plain = batches("TxPlain", n)
            before, started = log_end(admin), time.perf_counter()
            for buffer, count in plain:
                producer.send_encoded(buffer, count)
            out["plain_send_batch_msgs_per_s"] = n / (time.perf_counter() - started)
            out["plain_bytes_per_msg"] = (log_end(admin) - before) / n
            for kind, as_halves, topic in (("in_place", False, "TxPlace"), ("halves", True, "TxHalve")):
                admin.create_topic(topic, 8)
                sent = batches(topic, n)
                before, started = log_end(admin), time.perf_counter()
                for buffer, count in sent:
                    producer.send_encoded(buffer, count, transaction_id=f"bench:{kind}", as_halves=as_halves)
                send_s = time.perf_counter() - started
                usage = broker_usage(pid)
                started = time.perf_counter()
                assert admin.end_transaction(f"bench:{kind}", commit=True) == "COMMITTED"
                while visible(admin, topic) < n:
                    time.sleep(0.001)
                commit_s = time.perf_counter() - started
                after = broker_usage(pid)
                out.update({
                    f"{kind}_send_batch_msgs_per_s": n / send_s,
                    f"{kind}_commit_msgs_per_s": n / commit_s,
                    f"{kind}_commit_s": commit_s,
                    # what the commit cost the broker process: CPU, and fresh pages touched (memory it holds)
                    f"{kind}_commit_broker_user_s": after[0] - usage[0],
                    f"{kind}_commit_broker_sys_s": after[1] - usage[1],
                    f"{kind}_commit_broker_minor_faults": float(after[2] - usage[2]),
                    f"{kind}_end_to_end_msgs_per_s": n / (send_s + commit_s),
                    f"{kind}_bytes_per_msg": (log_end(admin) - before) / n,
                })
    return out


def bench_rewrite(reps: int = 20) -> dict[str, float]:
    ((buffer, count),) = batches("Tx", BATCH)[:1]
    started = time.perf_counter()
    for _ in range(reps):
        to_half_batch(buffer, "g", "bench:2")
    client_s = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(max(1, reps // 5)):
        rewrite_batch_as_half(buffer, "g", "bench:2")
    broker_s = time.perf_counter() - started
    return {
        "client_half_rewrite_msgs_per_s": count * reps / client_s,
        "broker_decoding_rewrite_msgs_per_s": count * max(1, reps // 5) / broker_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    results: dict[str, Any] = {**bench_rewrite(), **bench_broker(args.messages)}
    results["load_average_1m"] = (load_before + os.getloadavg()[0]) / 2
    results["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    print(f"{'measure':<40} {'value':>14}")
    for key, value in results.items():
        if isinstance(value, float):
            print(f"{key:<40} {value:>14,.1f}")
    save(RESULTS, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One soak run: start the processes, the clients and the fault schedule; heal; drain; check; write the JSON file."""

from __future__ import annotations

import json
import logging
import random
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jepsen import QUEUES as ORDERED_QUEUES
from jepsen import TOPIC as ORDERED
from jepsen import Workload, check, read_log

from broker.client import Producer, TransactionProducer
from broker.errors import BrokerError
from tests.soak import checker as c
from tests.soak.faults import Injector, Schedule, available_kinds
from tests.soak.spark_job import SPARK_IN, SPARK_OUT, SparkJob
from tests.soak.topology import EXTRA, REPLICATED, RESTART_BROKER, Topology
from tests.soak.workload import (
    BATCH,
    PLAIN,
    TIMED,
    TXN,
    History,
    PopLoop,
    PullLoop,
    Writer,
    batch_step,
    plain_step,
    push_consumer,
    timed_step,
    txn_checker,
    txn_step,
)
from tests.support.waiting import became_true

log = logging.getLogger(__name__)

DRAIN_S = 240.0  # after healing: consumers catch up, due timers fire, open transactions are checked back
WRITER_PAUSE_S = 0.05  # between one writer's sends: enough load to matter, little enough for 2 shared cores
PUSH_MEMBERS = 2
DRAIN_LOG_INTERVAL_S = 20.0
READ_ATTEMPTS = 30  # 2 s apart: a master elected after the heal answers well within a minute
SPARK_IN_BROKERS = [REPLICATED, RESTART_BROKER]  # the job's source reads through failovers and a broker's restart


def run(minutes: float, seed: int, root: Path, out: Path, log_level: str = "WARNING",
        only: tuple[str, ...] = (), min_faults: int = 0, each_kind: bool = False) -> dict[str, Any]:
    """One run of ``minutes`` of load and faults (then the heal, the drain and the check); ``only``: these fault
    kinds alone (of those this machine can inject); ``min_faults``: injected even if the minutes are over (a slow
    machine); ``each_kind``: at least one fault of each kind (the schedule draws each once first). The report, also
    written to ``out``."""
    began = time.monotonic()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    history = History()
    topology = Topology(root, log_level)
    kinds: tuple[str, ...] = ()
    skipped: dict[str, str] = {}
    schedule = Schedule(seed, ())
    injected = 0
    closers: list[Any] = []
    report: dict[str, Any] = {"seed": seed, "minutes": minutes, "started": started_at, "rerun":
                              f"python -m tests.soak --seed {seed} --minutes {minutes}"}
    try:
        topology.start()
        kinds, skipped = available_kinds(topology)
        if only:
            kinds = tuple(k for k in kinds if k in only)
        schedule = Schedule.draw(seed, kinds)
        if each_kind:
            min_faults = max(min_faults, len(kinds))
        topology.create_topic(PLAIN, [REPLICATED, *EXTRA])
        for topic in (BATCH, TXN, TIMED):
            topology.create_topic(topic, [REPLICATED])
        topology.create_topic(ORDERED, [REPLICATED], ORDERED_QUEUES)
        topology.create_topic(SPARK_IN, SPARK_IN_BROKERS)
        topology.create_topic(SPARK_OUT, [REPLICATED])
        spark = SparkJob(topology.namesrv, root).start()
        closers.append(spark.stop)
        ns = topology.namesrv
        consumers = [push_consumer(ns, "soak-push", PLAIN, history, "push", ) for _ in range(PUSH_MEMBERS)]
        consumers += [push_consumer(ns, "soak-bcast", PLAIN, history, f"broadcast-{i}", broadcast=True)
                      for i in range(PUSH_MEMBERS)]
        consumers.append(push_consumer(ns, "soak-orderly", ORDERED, history, "orderly", orderly=True))
        for i, pc in enumerate(consumers):
            pc.client_id = f"{pc.client_id}-{i}"
            pc.start()
            closers.append(pc.shutdown)
        pull = PullLoop(ns, TIMED, history)
        pop = PopLoop(lambda: topology.endpoint(REPLICATED), BATCH, history)
        rng = random.Random(seed)
        producer = Producer(namesrv=ns, timeout_s=20, attempt_timeout_s=3)
        txn = TransactionProducer(None, "soak-txn", txn_checker, namesrv=ns, timeout_s=20)
        closers += [producer.close, txn.close]
        writers = [Writer("plain", history, plain_step(producer, 0), WRITER_PAUSE_S),
                   Writer("batch", history, batch_step(producer, 0), WRITER_PAUSE_S * 4),
                   Writer("timed", history, timed_step(producer, 0, rng), WRITER_PAUSE_S),
                   Writer("txn", history, txn_step(txn, 0), WRITER_PAUSE_S),
                   Writer("spark", history, plain_step(producer, 0, SPARK_IN, "spark_input"), WRITER_PAUSE_S)]
        ordered = Workload(ns, writers=2, pause_s=WRITER_PAUSE_S).start()
        for thread in (pull.thread, pop.thread, *(w.thread for w in writers)):
            thread.start()
        injector = Injector(topology, BATCH, began, pop.hold, spark)
        deadline = began + minutes * 60
        for fault in schedule.faults:
            if injected >= min_faults and time.monotonic() + fault.gap_s >= deadline:
                break
            time.sleep(fault.gap_s)
            injector.inject(fault)
            injected += 1
            log.warning("fault %d %s %s at %.0f s, healed at %.0f s %s", injected, fault.kind, fault.target,
                        fault.started_s, fault.healed_s, fault.note)
        time.sleep(max(0.0, deadline - time.monotonic()))
        for w in writers:
            w.stop.set()
        ordered.stop()
        for w in writers:
            w.thread.join(timeout=60)
        topology.heal()
        report["features"] = _drain_and_check(topology, history, ordered)
        report["spark_job"] = spark.report()
        for loop in (pull, pop):
            loop.stop.set()
            loop.thread.join(timeout=30)
    except BaseException as e:
        report["error"] = f"{type(e).__name__}: {e}"
        report["logs"] = topology.logs(40).splitlines()[-400:]
        raise
    finally:
        for close in reversed(closers):
            try:
                close()
            except BrokerError as e:
                log.warning("closing: %s", e)
        topology.close()
        report["duration_s"] = round(time.monotonic() - began, 1)
        report["fault_kinds"] = list(kinds)
        report["fault_kinds_skipped"] = skipped
        report["schedule"] = schedule.as_json(injected)
        report["faults_injected"] = dict(Counter(f.kind for f in schedule.faults[:injected]))
        report["sends"] = history.counts()
        features = report.get("features", {})
        report["violations"] = sum(f["violations"] for f in features.values()) if features else None
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, default=str))
    return report


def _drain_and_check(topology: Topology, history: History, ordered: Workload) -> dict[str, Any]:
    def read(topic: str, brokers: list[str]) -> list[tuple[str, Any]]:
        """Asked again while a broker does not answer: the master may still move once after healing."""
        for _ in range(READ_ATTEMPTS):
            try:
                return [x for b in brokers for x in c.read_topic(topology.endpoint(b), topic, b)]
            except BrokerError as e:
                log.warning("reading %s: %s", topic, e)
                time.sleep(2)
        return [x for b in brokers for x in c.read_topic(topology.endpoint(b), topic, b)]

    with history.lock:
        sent = list(history.sent)
    by_feature: dict[str, list[Any]] = {}
    for s in sent:
        by_feature.setdefault(s.feature, []).append(s)
    due = max((s.due_ms for s in sent), default=0)
    committed = {s.body for s in by_feature.get("txn", []) if s.status == "ok" and s.intent == "commit"}
    last_said = [time.monotonic()]

    # consumers catch up, the last timers come due, open transactions are decided by check-back
    def drained() -> bool:
        try:
            missing = _missing()
        except BrokerError as e:
            log.warning("draining: %s", e)
            return False
        if missing and time.monotonic() - last_said[0] > DRAIN_LOG_INTERVAL_S:
            last_said[0] = time.monotonic()
            log.warning("draining: still missing %s", missing)
        return not missing

    def _missing() -> dict[str, int]:
        plain = {m.body.decode() for _, m in read(PLAIN, [REPLICATED, *EXTRA])}
        timed = {m.body.decode() for _, m in read(TIMED, [REPLICATED])}
        pops = {m.body.decode() for _, m in read(BATCH, [REPLICATED])}
        with history.lock:
            acked = set(history.acked_pops) | history.ack_unknown
        missing = {"timers not due yet": int(time.time() * 1000 < due),
                   "push": len(plain - history.delivered_bodies("push")),
                   "pull": len(timed - history.delivered_bodies("pull")), "pop": len(pops - acked),
                   "txn": len(committed - {m.body.decode() for _, m in read(TXN, [REPLICATED])}),
                   "spark": len({m.body.decode() for _, m in read(SPARK_IN, SPARK_IN_BROKERS)}
                                - {m.body.decode() for _, m in read(SPARK_OUT, [REPLICATED])}),
                   "orderly": len(set(read_log(topology.endpoint(REPLICATED)).values())
                                  - history.delivered_bodies("orderly"))}
        for i in range(PUSH_MEMBERS):
            missing[f"broadcast-{i}"] = len(plain - history.delivered_bodies(f"broadcast-{i}"))
        return {k: v for k, v in missing.items() if v}

    drained_in = became_true(drained, timeout_s=DRAIN_S, interval_s=2.0)
    features: dict[str, c.FeatureReport] = {}

    plain_stored = read(PLAIN, [REPLICATED, *EXTRA])
    f = features["plain"] = c.FeatureReport()
    c.check_sends(f, by_feature.get("plain", []), c.where(plain_stored))
    bodies = {m.body.decode() for _, m in plain_stored}
    c.check_delivered(features.setdefault("push_clustering", c.FeatureReport()), history, "push", bodies)
    for i in range(PUSH_MEMBERS):
        c.check_delivered(features.setdefault("push_broadcasting", c.FeatureReport()), history, f"broadcast-{i}",
                          bodies)

    batch_stored = read(BATCH, [REPLICATED])
    c.check_sends(features.setdefault("batch", c.FeatureReport()), by_feature.get("batch", []), c.where(batch_stored))
    f = features["pop"] = c.FeatureReport()
    with history.lock:
        acked = set(history.acked_pops) | history.ack_unknown  # an ack whose answer was lost may have been done
        f.notes["acks_unknown"] = len(history.ack_unknown)
        for code, n in history.acks_refused.items():  # each message so refused must come back and be acked
            f.notes[f"acks_refused_{code}"] = n
        for what in history.redelivered_after_ack:
            f.add("redelivered_after_ack", what)
    for body in sorted({m.body.decode() for _, m in batch_stored}):
        f.checked += 1
        if body not in acked:
            f.add("lost", f"{body} stored, never acknowledged by the pop consumer")
    f.notes["pop_deliveries"] = len(history.delivered.get("pop", []))

    timed_stored = c.where(read(TIMED, [REPLICATED]))
    c.check_timed(features.setdefault("delay", c.FeatureReport()), by_feature.get("delay", []), timed_stored)
    c.check_timed(features.setdefault("timer", c.FeatureReport()), by_feature.get("timer", []), timed_stored)
    f = features["pull"] = c.FeatureReport()
    c.check_delivered(f, history, "pull", set(timed_stored))
    with history.lock:
        for what in history.offsets_backwards:
            f.add("offsets_backwards", what)

    txn = c.where(read(TXN, [REPLICATED]))
    c.check_txn(features.setdefault("txn", c.FeatureReport()), by_feature.get("txn", []), txn)

    # the Spark job: its input as sent, then its output against what its input holds
    spark_in = read(SPARK_IN, SPARK_IN_BROKERS)
    c.check_sends(features.setdefault("spark_input", c.FeatureReport()), by_feature.get("spark_input", []),
                  c.where(spark_in))
    c.check_copied(features.setdefault("spark", c.FeatureReport()), {m.body.decode() for _, m in spark_in},
                   [m.body.decode() for _, m in read(SPARK_OUT, [REPLICATED])])

    # ordered: jepsen's checker over every replica's log (all three in sync now), then the orderly consumer
    logs = {f"replica-{rid}": read_log(topology.group.endpoint(rid)) for rid in topology.group.ids}
    j = check("soak ordered", ordered.outcomes, logs)
    f = features["ordered"] = c.FeatureReport(checked=len(ordered.outcomes))
    for kind, items in (("lost", j.lost), ("misplaced", j.conflicting), ("duplicated", j.duplicated),
                        ("reordered", j.reordered)):
        for what in items:
            f.add(kind, what)
    f.notes.update({"acknowledged": j.acknowledged, "unknown": j.unknown, "refused": j.failed})
    f = features["orderly"] = c.FeatureReport()
    c.check_delivered(f, history, "orderly", set(logs["replica-1"].values()))
    c.check_order(f, history, "orderly")

    out = {name: r.as_json() for name, r in features.items()}
    out["_drain"] = {"drained": drained_in, "checked": 0, "violations": 0}
    return out

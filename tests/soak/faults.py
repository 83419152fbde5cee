"""The fault schedule of a soak, drawn from its seed, and the injection of each fault.

The schedule is a list of (kind, gap before it, how long it lasts), drawn in full before the run: the same seed gives
the same list. Faults run one after another, each healed before the next (a replica restarted and back in sync,
the disk emptied, the paused master resumed, the cable plugged in again): a soak checks every promise through every
fault, not a cluster that faults left below its in-sync minimum for good.

A partition (only inside the soak's network, network.py) cuts one replica of broker-a off from everything: usually
the master, which loses its lease while the two others elect a new master, and must step down and rejoin behind it
once healed; sometimes a replica that is not master, which the master must drop from its in-sync set (and keep
writing with the two left) and take back once it caught up. Which of the two is drawn from the seed too."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from small_fs import fill

from tests.soak import network
from tests.soak.spark_job import SparkJob
from tests.soak.topology import DISK_BROKER, GROUP_SETTINGS, REPLICATED, RESTART_BROKER, Topology
from tests.support.waiting import became_true, wait_until

KILL_MASTER, PAUSE_MASTER, RESTART, FULL_DISK, KILL_CLIENT, PARTITION = (
    "master-sigkill", "master-sigstop", "broker-restart", "full-disk", "client-kill", "partition")
KILL_SPARK = "spark-driver-kill"
KINDS = (KILL_MASTER, PAUSE_MASTER, RESTART, FULL_DISK, KILL_CLIENT, PARTITION, KILL_SPARK)
GAP_S = (4.0, 12.0)  # quiet time before each fault: the workload runs on a healed cluster between faults
DURATION_S = (3.0, 10.0)
PAUSE_MIN_S = 2 * float(GROUP_SETTINGS["ha_lease_ttl_s"]) + 1  # a pause outlives the lease: a new master is elected
RECOVERY_S = 180.0  # a failover and a rejoin take 10-30 s on a busy 2-core machine; this is a hang, not slowness
PLANNED = 400  # drawn up front; a run uses as many as its minutes allow
MASTER, REPLICA = "master", "replica"  # the side a partition cuts off, as drawn
PARTITION_MASTER_SHARE = 0.75  # isolating the master (a failover) is the case that tests most; a replica, the rest
DROP_S = 30.0  # a replica cut off leaves the in-sync set after ha_max_lag_ms (3 s); later is noted, not fatal


@dataclass
class Fault:
    kind: str
    gap_s: float
    duration_s: float
    target: str = ""
    started_s: float = -1.0  # since the run began
    started_ms: int = 0  # the wall clock, to set beside the store timestamps of what the checker reads
    healed_s: float = -1.0
    note: str = ""


@dataclass
class Schedule:
    seed: int
    kinds: tuple[str, ...]
    faults: list[Fault] = field(default_factory=list)

    @classmethod
    def draw(cls, seed: int, kinds: tuple[str, ...]) -> Schedule:
        rng = random.Random(seed)
        # every kind once (in an order drawn from the seed), then kinds at random: a short run (``each_kind``)
        # meets each fault, a long one a random mix
        first = rng.sample(kinds, len(kinds))
        picks = first + [rng.choice(kinds) for _ in range(PLANNED - len(first))] if kinds else []
        faults = [Fault(kind, round(rng.uniform(*GAP_S), 1), round(rng.uniform(*DURATION_S), 1)) for kind in picks]
        for f in faults:  # drawn after the list: the kinds, gaps and durations of a seed do not depend on it
            if f.kind == PARTITION:
                f.target = MASTER if rng.random() < PARTITION_MASTER_SHARE else REPLICA
        return cls(seed, kinds, faults)

    def as_json(self, upto: int) -> list[dict[str, object]]:
        return [asdict(f) for f in self.faults[:upto]]


def available_kinds(topology: Topology) -> tuple[tuple[str, ...], dict[str, str]]:
    """The kinds this machine can inject, and why each other one is not."""
    skipped: dict[str, str] = {}
    kinds = list(KINDS)
    if not topology.in_network:
        kinds.remove(PARTITION)
        skipped[PARTITION] = ("not root: no network namespaces can be made to cut a replica off"
                              if os.geteuid() != 0 else "run without the soak's network namespaces (--no-network)")
    if topology.disk is None:
        kinds.remove(FULL_DISK)
        skipped[FULL_DISK] = "not root: no tmpfs can be mounted for broker-c's store"
    return tuple(kinds), skipped


class Injector:
    def __init__(self, topology: Topology, pop_topic: str, began: float, pop_hold: threading.Event,
                 spark: SparkJob) -> None:
        self.t, self.pop_topic, self.began, self.pop_hold = topology, pop_topic, began, pop_hold
        self.spark = spark

    def _now(self) -> float:
        return round(time.monotonic() - self.began, 1)

    def inject(self, f: Fault) -> None:
        f.started_s = self._now()
        f.started_ms = int(time.time() * 1000)
        getattr(self, "_" + f.kind.replace("-", "_"))(f)
        f.healed_s = self._now()

    def _master_sigkill(self, f: Fault) -> None:
        g = self.t.group
        master = g.wait_master(timeout_s=RECOVERY_S)
        f.target = f"{REPLICATED}/{master}"
        g.kill(master)
        g.wait_master(other_than=master, timeout_s=RECOVERY_S)
        time.sleep(f.duration_s)
        g.start_replica(master)
        wait_until(self.t.in_sync, "the killed replica back in sync", timeout_s=RECOVERY_S, interval_s=0.5)

    def _master_sigstop(self, f: Fault) -> None:
        g = self.t.group
        master = g.wait_master(timeout_s=RECOVERY_S)
        f.target = f"{REPLICATED}/{master}"
        g.pause(master)
        try:
            time.sleep(max(f.duration_s, PAUSE_MIN_S))
        finally:
            g.resume(master)
        wait_until(self.t.in_sync, "the paused replica back in sync", timeout_s=RECOVERY_S, interval_s=0.5)

    def _broker_restart(self, f: Fault) -> None:
        f.target = RESTART_BROKER
        self.t.extra[RESTART_BROKER].stop()
        time.sleep(f.duration_s)
        self.t.start_extra(RESTART_BROKER)

    def _full_disk(self, f: Fault) -> None:
        assert self.t.disk is not None
        f.target = DISK_BROKER
        filler = fill(self.t.disk)
        try:
            time.sleep(f.duration_s)
        finally:
            filler.unlink()

    def _client_kill(self, f: Fault) -> None:
        f.target = "pop consumer process"
        endpoint = self.t.endpoint(REPLICATED)
        self.pop_hold.set()  # the soak's own pop consumer steps aside, so the doomed one gets messages to hold
        proc = subprocess.Popen([sys.executable, "-m", "tests.soak.victim", endpoint, self.pop_topic],
                                stdout=subprocess.PIPE, text=True, cwd=str(Path(__file__).resolve().parents[2]))
        held = 0
        hold_until = time.monotonic() + f.duration_s / 2  # it holds messages a while before it dies
        give_up = time.monotonic() + 30.0  # no message to take (the topic drained): killed anyway
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                _, count, *error = line.split(maxsplit=2)
                held, f.note = int(count), " ".join(error).strip()
                now = time.monotonic()
                if (held and now >= hold_until) or now > give_up:
                    break
        finally:
            proc.kill()
            proc.wait()
            self.pop_hold.clear()
        f.note = f"killed holding {held} messages" + (f" (last error: {f.note})" if f.note else "")

    def _spark_driver_kill(self, f: Fault) -> None:
        """The Spark driver SIGKILLed wherever it is (reading, its tasks sending, committing, or between batches),
        then started again from its checkpoint, as its supervisor would."""
        f.target = f"spark driver pid {self.spark.kill()}"

    def _partition(self, f: Fault) -> None:
        g = self.t.group
        master = g.wait_master(timeout_s=RECOVERY_S)
        target = master
        if f.target == REPLICA:  # one the master counts in sync, if any: dropping it is what is tested
            state = g.state()
            others = [rid for rid in g.ids if rid != master]
            in_sync = [rid for rid in others if state is not None and rid in state.in_sync]
            target = (in_sync or others)[0]
        role = MASTER if target == master else REPLICA
        f.target = f"{REPLICATED}/{target}"
        hold_until = time.monotonic() + max(f.duration_s, PAUSE_MIN_S)
        network.cable(target, up=False)
        try:
            cut = time.monotonic()
            if role == MASTER:
                new = g.wait_master(other_than=target, timeout_s=RECOVERY_S)
                f.note = f"master cut off; replica {new} master after {time.monotonic() - cut:.1f} s"
            else:
                def dropped() -> bool:
                    state = g.state()
                    return state is not None and target not in state.in_sync

                f.note = (f"replica cut off; out of the in-sync set after {time.monotonic() - cut:.1f} s"
                          if became_true(dropped, timeout_s=DROP_S, interval_s=0.5)
                          else f"replica cut off; still in the in-sync set after {DROP_S:.0f} s")
            time.sleep(max(0.0, hold_until - time.monotonic()))
        finally:
            network.cable(target, up=True)
        wait_until(self.t.in_sync, "the cut-off replica back in sync", timeout_s=RECOVERY_S, interval_s=0.5)

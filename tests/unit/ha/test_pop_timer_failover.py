"""Pop and timer state through a SIGKILL of the master, on real processes with a real etcd (controller mode, three
replicas): an acknowledged pop message is not delivered again, an in-flight one comes back after its invisible time
and not before, a receipt handle of the old master is accepted by the new one, and timer messages due during the
failover are delivered once (broker/semantics/pop_log.py, timer_delivered.py)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from broker.client import Admin, Message, PopConsumer, Producer, PullConsumer
from broker.errors import BrokerError, InvalidReceiptHandleError, NotMasterError, ServiceNotAvailableError
from broker.format.message import Prop
from broker.ha.local_group import ReplicaGroup
from tests.support.waiting import wait_until

# Short leases keep a failover a few seconds (as test_failover_faults.py); pops may ask for a short invisible time.
SETTINGS = {"ha_lease_ttl_s": 2, "min_insync_replicas": 2, "ha_max_lag_ms": 3000, "ha_ack_timeout_ms": 3000,
            "pop_min_invisible_ms": 100}
TOPIC, GROUP = "PopOrders", "pop-ha"
MESSAGES = 60
INVISIBLE_MS = 10_000  # long enough that the new master is up well before the in-flight messages are due again


def _group(root: Path) -> ReplicaGroup:
    return ReplicaGroup(root, 3, settings=SETTINGS, log_level=os.environ.get("SLUICE_LOG", "WARNING"))


def _ready(g: ReplicaGroup, topic: str, queues: int) -> int:
    master = g.wait_master()
    with Admin(g.endpoint(master)) as admin:
        admin.create_topic(topic, queues, if_not_exists=True)
        admin.update_subscription_group(GROUP)
    wait_until(lambda: g.state() is not None and len(g.state().in_sync) == 3,  # type: ignore[union-attr]
               "all three replicas in sync", timeout_s=60)
    return master


def _try(call: Callable[[], None]) -> bool:
    """Whether ``call`` went through; False while the broker is not yet master or its pop service not started."""
    try:
        call()
    except (NotMasterError, ServiceNotAvailableError):
        return False
    except InvalidReceiptHandleError as e:  # an ack answers per handle, each refused while the service starts
        if "SERVICE_NOT_AVAILABLE" in e.message:
            return False
        raise
    return True


def test_pop_acks_and_in_flight_messages_survive_a_master_kill(tmp_path: Path) -> None:
    with _group(tmp_path) as g:
        master = _ready(g, TOPIC, 2)
        with Producer(g.endpoint(master)) as p:
            for i in range(MESSAGES):
                p.send(Message(TOPIC, f"m-{i}".encode()))
        with PopConsumer(g.endpoint(master), GROUP) as c:
            popped = []
            wait_until(lambda: len(popped) == MESSAGES or bool(popped.extend(c.receive(TOPIC, 32, INVISIBLE_MS))),
                       "every message received", timeout_s=15)
            assert len(popped) == MESSAGES
            by_body = {p.message.body: p for p in popped}
            assert len(by_body) == MESSAGES
            acked = popped[:20]  # answered before the kill: never delivered again
            c.ack_all(acked)
            racing = popped[20:40]  # acked one by one while the master dies: each answered one stays acked
            held = popped[40:50]  # in flight across the failover, then acked on the new master with their handles
            untouched = popped[50:]  # in flight and never acked: delivered again after their time, not before
            answered: list[bytes] = []

            def ack_while_dying() -> None:
                for m in racing:
                    try:
                        c.ack(m)
                    except BrokerError:
                        return  # the master is gone: this one's outcome is unknown, and so is every later one's
                    answered.append(m.message.body)
                    time.sleep(0.02)

            acks = threading.Thread(target=ack_while_dying)
            acks.start()
            time.sleep(0.15)
            g.kill(master)
            acks.join()
        new = g.wait_master(other_than=master, timeout_s=30)
        due_at_ms = min(p.invisible_until_ms for p in popped)
        assert int(time.time() * 1000) < due_at_ms - 1000, "the failover took longer than the invisible time"
        with PopConsumer(g.endpoint(new), GROUP) as c:
            # the old master's handles: accepted by the new one, once it serves pops (etcd names it a moment before
            # it took office)
            wait_until(lambda: _try(lambda: c.ack_all(held)), "the new master accepting the old handles", timeout_s=15)
            again: dict[bytes, int] = {}  # body -> when it came back (ms)
            while int(time.time() * 1000) < due_at_ms + 4000:
                for m in c.receive(TOPIC, 32, INVISIBLE_MS, wait_ms=500):
                    again.setdefault(m.message.body, int(time.time() * 1000))
                    c.ack(m)
                if all(m.message.body in again for m in untouched):
                    break
        print(f"\nacked before the kill {len(acked)}, during it {len(answered)} of {len(racing)} answered, "
              f"{len(again)} delivered again")
        early = {b: t - by_body[b].invisible_until_ms for b, t in again.items() if t < by_body[b].invisible_until_ms}
        assert not early, f"delivered again before their invisible time ended: {early}"
        came_back_acked = sorted(b for b in again if b in {m.message.body for m in acked + held} | set(answered))
        assert not came_back_acked, f"acknowledged messages delivered again: {came_back_acked}"
        missing = sorted(m.message.body for m in untouched if m.message.body not in again)
        assert not missing, f"in-flight messages never delivered again: {missing}"
        unknown = {m.message.body for m in racing} - set(answered)
        assert set(again) <= {m.message.body for m in untouched} | unknown


def test_timer_messages_due_during_a_failover_are_delivered_once(tmp_path: Path) -> None:
    topic, count = "Timed", 300
    with _group(tmp_path) as g:
        master = _ready(g, topic, 1)
        first_due = int(time.time() * 1000) + 2000
        with Producer(g.endpoint(master)) as p:
            for i in range(count):  # due over 3 s from first_due on: the kill lands among the deliveries
                due = first_due + i * 10
                p.send(Message(topic, f"t-{i}".encode(), properties={Prop.TIMER_DELIVER_MS: str(due)}), queue_id=0)

        def delivered_on(rid: int) -> int:
            with Admin(g.endpoint(rid)) as admin:
                return int(admin.stats().get("timer_delivered", 0))

        wait_until(lambda: delivered_on(master) >= count // 3, "a third of them delivered", timeout_s=20,
                   interval_s=0.02)
        g.kill(master)
        new = g.wait_master(other_than=master, timeout_s=30)

        def bodies() -> list[bytes]:
            with PullConsumer(endpoint=g.endpoint(new), group="timer-reader") as c:
                out: list[bytes] = []
                while True:
                    got = c.pull(topic, 0, len(out), max_msgs=256).messages
                    if not got:
                        return out
                    out += [m.body for m in got]

        wait_until(lambda: len(bodies()) >= count, "every timer message delivered", timeout_s=30)
        time.sleep(1.0)  # a second copy of anything would be there by now
        got = bodies()
        twice = sorted({b for b in got if got.count(b) > 1})
        print(f"\n{count} timer messages, {len(got)} delivered, {len(twice)} twice")
        assert not twice, f"delivered twice: {twice[:10]}"
        assert sorted(got) == sorted(f"t-{i}".encode() for i in range(count))

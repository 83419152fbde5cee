"""Thread placement of the standalone broker (broker/server/thread_placement.py): Python threads on the chosen
CPUs under SCHED_BATCH, native threads on every CPU under the normal policy, bad settings refused with the reason.

Its effect on speed is measured by bench/store.py (``--python-cpus off`` against the default), not asserted here.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from broker.config import BrokerConfig
from broker.errors import BrokerError, InvalidArgumentError
from broker.ha.manager import HA_SERVER_THREAD_PREFIX
from broker.ha.slave_fetcher import SLAVE_FETCHER_THREAD_NAME
from broker.server.process import BrokerProcess
from broker.server.thread_placement import (
    NATIVE_POLICY,
    PYTHON_POLICY,
    TASK_DIR,
    ThreadPlacement,
    parse_python_cpus,
)
from broker.store.flush import GroupCommitService

ALLOWED = frozenset(os.sched_getaffinity(0))


def test_auto_takes_one_cpu_when_there_are_several() -> None:
    assert parse_python_cpus("auto", frozenset({0, 1})) == {0}
    assert parse_python_cpus("AUTO", frozenset({2, 3, 5})) == {2}
    assert parse_python_cpus("auto", frozenset({3})) is None  # one CPU: nothing to gain
    assert parse_python_cpus("off", frozenset({0, 1})) is None


def test_explicit_cpu_lists() -> None:
    assert parse_python_cpus("1", frozenset({0, 1})) == {1}
    assert parse_python_cpus(" 0,1 ", frozenset({0, 1})) == {0, 1}


@pytest.mark.parametrize(
    ("spec", "says"),
    [("fast", "comma-separated list"), ("0;1", "comma-separated list"), ("", "comma-separated list"),
     ("7", "[7]"), ("0,9", "[9]")],
)
def test_bad_settings_say_what_is_wrong(spec: str, says: str) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        parse_python_cpus(spec, frozenset({0, 1}))
    assert says in err.value.message and repr(spec.strip().lower()) in err.value.message


def test_broker_config_refuses_a_bad_setting_before_anything_starts() -> None:
    with pytest.raises(InvalidArgumentError, match="python_cpus"):
        BrokerConfig(python_cpus="half")
    assert BrokerConfig().python_cpus == "auto"


def _affinity(tid: int) -> frozenset[int]:
    return frozenset(os.sched_getaffinity(tid))


@pytest.fixture
def restore_affinity() -> Iterator[None]:
    """Placement pins every Python thread of this test process: give each thread every CPU and the normal policy
    back afterwards."""
    yield
    for name in os.listdir(TASK_DIR):
        try:
            os.sched_setaffinity(int(name), ALLOWED)
            os.sched_setscheduler(int(name), NATIVE_POLICY, os.sched_param(0))
        except ProcessLookupError:
            pass


def test_reconcile_pins_python_threads_and_frees_native_ones(restore_affinity: None) -> None:
    narrow = frozenset({min(ALLOWED)})
    # Native threads inherit their creator's mask: create gRPC's threads from a narrowed thread, as a pinned
    # Python thread of the broker would, so that reconcile has something to free.
    os.sched_setaffinity(0, narrow)
    server = grpc.server(futures.ThreadPoolExecutor(2))
    server.add_insecure_port("127.0.0.1:0")
    server.start()
    release = threading.Event()
    worker = threading.Thread(target=release.wait, name="placement-test")
    worker.start()
    flusher = threading.Thread(target=release.wait, name=GroupCommitService.name)  # threads placed apart
    flusher.start()
    fetcher = threading.Thread(target=release.wait, name=SLAVE_FETCHER_THREAD_NAME)
    fetcher.start()
    fetch_worker = threading.Thread(target=release.wait, name=f"{HA_SERVER_THREAD_PREFIX}_3")
    fetch_worker.start()
    try:
        os.sched_setaffinity(0, ALLOWED)
        placement = ThreadPlacement(narrow, ALLOWED)
        before = {int(n) for n in os.listdir(TASK_DIR)}
        assert placement.reconcile() > 0 and not placement.failed
        python_ids = {t.native_id for t in threading.enumerate()}
        native_ids = (before & {int(n) for n in os.listdir(TASK_DIR)}) - python_ids  # placed by that pass
        assert native_ids, "gRPC started no native threads"
        assert worker.native_id is not None and _affinity(worker.native_id) == narrow
        assert _affinity(threading.get_native_id()) == narrow
        assert os.sched_getscheduler(worker.native_id) == PYTHON_POLICY == os.sched_getscheduler(0)
        assert flusher.native_id is not None and _affinity(flusher.native_id) == ((ALLOWED - narrow) or ALLOWED)
        assert os.sched_getscheduler(flusher.native_id) == NATIVE_POLICY
        assert fetcher.native_id is not None and _affinity(fetcher.native_id) == _affinity(flusher.native_id)
        assert os.sched_getscheduler(fetcher.native_id) == NATIVE_POLICY
        assert fetch_worker.native_id is not None and _affinity(fetch_worker.native_id) == _affinity(flusher.native_id)
        for tid in native_ids:
            try:
                assert _affinity(tid) == ALLOWED, f"native thread {tid} still narrowed"
                assert os.sched_getscheduler(tid) == NATIVE_POLICY, f"native thread {tid} under SCHED_BATCH"
            except ProcessLookupError:
                pass  # ended since the listing
        again = placement.reconcile()
        started_since = {int(n) for n in os.listdir(TASK_DIR)} - before
        assert again <= len(started_since), (again, started_since)  # a placed thread is not placed twice
    finally:
        release.set()
        worker.join()
        flusher.join()
        fetcher.join()
        fetch_worker.join()
        server.stop(0)


def _cpu_list(cpus: frozenset[int]) -> str:
    """A CPU set as /proc writes Cpus_allowed_list: ranges a-b, single CPUs, comma-separated."""
    out: list[str] = []
    for c in sorted(cpus):
        if out and c - 1 in cpus:
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out)


def _masks(pid: int) -> list[tuple[str, int]]:
    """(CPU list, scheduling policy) of each thread of process ``pid``."""
    masks = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
            policy = os.sched_getscheduler(int(tid))
        except (FileNotFoundError, ProcessLookupError):
            continue
        cpus = [line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith("Cpus_allowed_list")]
        masks.append((cpus[0], policy))
    return masks


def test_sluice_broker_places_its_threads(tmp_path: Path) -> None:
    """A SYNC_FLUSH broker: Python threads on one CPU, the flusher on the others, native threads on all."""
    broker = BrokerProcess(tmp_path / "store", extra_args=["--flush", "sync"]).start()
    try:
        assert broker.proc is not None
        pinned = (str(min(ALLOWED)), PYTHON_POLICY)
        apart, everything = _cpu_list(ALLOWED - {min(ALLOWED)}), _cpu_list(ALLOWED)
        deadline = time.monotonic() + 10

        def placed(masks: list[tuple[str, int]]) -> bool:
            others = {m for m in masks if m != pinned and m != (apart, NATIVE_POLICY)}
            return {pinned, (apart, NATIVE_POLICY)} <= set(masks) and others <= {(everything, NATIVE_POLICY)}

        masks = _masks(broker.proc.pid)
        while len(ALLOWED) >= 2 and not placed(masks) and time.monotonic() < deadline:
            # placement runs once a second: wait for a pass that placed both kinds, and that came after the last
            # thread started (a thread started by a pinned one shares its CPU until the next pass)
            time.sleep(0.1)
            masks = _masks(broker.proc.pid)
        if len(ALLOWED) >= 2:
            assert pinned in masks, masks
            assert masks.count((apart, NATIVE_POLICY)) >= 1, masks  # the flusher (and nothing else) apart
            others = {m for m in masks if m != pinned and m != (apart, NATIVE_POLICY)}
            assert others <= {(everything, NATIVE_POLICY)}, masks  # native threads: every CPU, normal policy
        else:  # one CPU: "auto" leaves every thread alone
            assert len(set(masks)) == 1 and masks[0][1] == NATIVE_POLICY, masks
    finally:
        broker.stop()


def test_sluice_broker_refuses_a_cpu_it_may_not_use(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path / "store", extra_args=["--python-cpus", str(max(ALLOWED) + 1)])
    with pytest.raises(BrokerError) as err:
        proc.start(timeout_s=30)
    assert "may not use" in err.value.message, err.value.message

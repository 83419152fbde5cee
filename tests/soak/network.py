"""The soak's network: network namespaces joined by a bridge, so that a fault can cut one replica's cable.

A hub namespace holds a bridge; each other namespace has one veth pair to it (``eth0`` inside, ``h-r1`` and so on
on the bridge). broker-a's replicas run one to a namespace (``sksPID-r1`` .. ``sksPID-r3``); everything else (etcd,
the name server, broker-b, broker-c and every client, that is the soak's own process) runs in ``sksPID-out``. PID is
the process id of the run that built them, so two soaks (``make soak`` beside ``make test``'s short one) never touch
each other's network, and tests/unit/ha/test_partition.py's names differ too; the subnet is the same in every run,
which is harmless: each run's addresses exist only inside its own namespaces, and the machine's own network is never
touched.

Building it needs root. ``python -m tests.soak`` run as root builds it, runs itself again inside ``sks-out``
(``run_inside``) and removes it at the end, whatever the end: the processes left in the namespaces (by a soak that
was killed) are killed first, then the namespaces deleted; the leftovers of earlier runs whose builder is gone are
removed the same way before a new one is built.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from types import FrameType

NET = "10.231.9"
TAG_ENV = "SLUICE_SOAK_NETWORK"  # the run inside learns the names of its network from the run that built it
TAG = os.environ.get(TAG_ENV) or f"sks{os.getpid()}"
TAGGED = re.compile(r"^sks(\d+)-")
HUB = f"{TAG}-hub"
OUTSIDE = f"{TAG}-out"
REPLICAS = {1: f"{TAG}-r1", 2: f"{TAG}-r2", 3: f"{TAG}-r3"}
ADDRESS = {OUTSIDE: f"{NET}.1", **{ns: f"{NET}.{rid + 1}" for rid, ns in REPLICAS.items()}}
IP_TIMEOUT_S = 30.0


def _hub_end(ns: str) -> str:
    """The name of ``ns``'s veth end on the bridge: short (interface names hold 15 bytes), unique in its hub."""
    return "h-" + ns.removeprefix(f"{TAG}-")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=IP_TIMEOUT_S)


def exec_in(ns: str) -> list[str]:
    """The command prefix that runs a program in namespace ``ns`` (it execs: the program keeps the PID)."""
    return ["ip", "netns", "exec", ns]


def inside() -> bool:
    """Whether this process runs in the soak's outside namespace (so the whole network exists)."""
    if os.geteuid() != 0 or not os.environ.get(TAG_ENV):
        return False
    found = _ip("netns", "identify", str(os.getpid()), check=False)
    return found.returncode == 0 and OUTSIDE in found.stdout.split()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def teardown(stale: bool = False) -> None:
    """Every process still in one of this run's namespaces killed (SIGKILL: a soak's leftovers), every namespace
    deleted; ``stale``: those of earlier runs whose builder is gone too. Nothing happens for a namespace that does not
    exist."""
    existing = [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()]
    ours = {OUTSIDE, *REPLICAS.values(), HUB}
    for ns in sorted(existing, key=lambda n: n.endswith("-hub")):  # the hub last: the others' veths end there
        tagged = TAGGED.match(ns)
        if ns not in ours and not (stale and tagged and not _alive(int(tagged.group(1)))):
            continue
        for pid in _ip("netns", "pids", ns, check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        _ip("netns", "del", ns, check=False)


def build() -> None:
    teardown(stale=True)
    _ip("netns", "add", HUB)
    _ip("-n", HUB, "link", "add", "br0", "type", "bridge")
    _ip("-n", HUB, "link", "set", "br0", "up")
    for ns, addr in ADDRESS.items():
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "set", "lo", "up")  # the outside namespace's own processes meet on 127.0.0.1
        _ip("-n", HUB, "link", "add", _hub_end(ns), "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("-n", HUB, "link", "set", _hub_end(ns), "master", "br0", "up")
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")


def cable(rid: int, up: bool) -> None:
    """Replica ``rid``'s cable to the bridge plugged in (``up``) or pulled: pulled, it reaches no one and no one
    reaches it, though it keeps running."""
    _ip("-n", HUB, "link", "set", _hub_end(REPLICAS[rid]), "up" if up else "down")


def run_inside(argv: list[str]) -> int:
    """``python -m tests.soak ARGV`` again in a fresh network, its exit status; the network removed after it.

    The child runs in a process group of its own, so a Ctrl-C reaches it once, through this process (a SIGTERM too,
    as a SIGINT): it then closes and reports as an interrupted run does; a second signal kills it, and the
    teardown what it left."""
    build()
    child: subprocess.Popen[bytes] | None = None
    signals = 0

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal signals
        signals += 1
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGINT if signals == 1 else signal.SIGKILL)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        child = subprocess.Popen([*exec_in(OUTSIDE), sys.executable, "-m", "tests.soak", *argv], process_group=0,
                                 env={**os.environ, TAG_ENV: TAG})
        if signals:  # one came while it was starting
            child.send_signal(signal.SIGINT)
        code = child.wait(timeout=None)
        return 128 - code if code < 0 else code  # killed by a signal: as a shell says it
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        for s, handler in previous.items():
            signal.signal(s, handler)
        teardown()

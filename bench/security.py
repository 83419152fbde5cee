"""What TLS and authentication cost: `python -m bench.security [--rounds N] [--duration S] [--quick]` prints a table
and writes bench/results/security.json.

Three brokers, each a subprocess (`sluice broker`) on a fresh temporary store, one at a time:

* ``plain``: plain text, no authentication;
* ``tls``: TLS with a P-256 certificate from a CA made with the ``openssl`` command for the run;
* ``tls_auth``: TLS and ``--auth``; the clients sign every call as a user that is not a super user and holds a
  handful of Allow and Deny entries, so every call is authenticated (an HMAC-SHA1) and authorized (the request's
  needs decided on those entries).

On each broker: SendBatch throughput with pre-encoded entries of 100 B (2000 a call) and 1 KiB (1000 a call), each
with its UNIQ_KEY as the Producer sends it (bench/batches.py), from two threads, as bench.server sends, and raw pull
throughput of 100 B and 1 KiB messages (one thread reading preloaded queues from the start again and again, up to
4096 messages or 8 MiB a call). Each figure also has the broker's and this client process's CPU time per message,
which says on which side the extra cost lands.

With ``--rounds N`` (at least three) the brokers take turns N times, each round in another order. Each figure is
the median of its rounds, shown with the rounds' spread (lowest to highest): the best round alone would report the
luckiest moment of a shared machine, not what a run can expect. Ratios are of the medians, to plain text in the
same run, the only comparison this machine allows (docs/benchmarks.md); the spread of a ratio is that of its
rounds' own ratios (each kind against plain text of the same round). Target: TLS + auth at least 0.8x plain text
for SendBatch of 1 KiB, on the medians.

Last, authorization alone, in this process: the time ``AuthGate`` spends authenticating one SendBatch and one
PullMessage request of the same user and the operation's check of its rights (no network, no TLS), split into
its parts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.batches import producer_batches
from bench.report import save
from bench.server import process_cpu_s, run_threads
from broker.auth import operations
from broker.auth.accounts import Accounts, User
from broker.auth.caller import Caller, current
from broker.auth.gate import AuthGate, AuthSettings, source_address
from broker.auth.operations import Operation
from broker.auth.policy import allows
from broker.auth.requirements import requirement_of
from broker.client import Admin, Producer, PullConsumer
from broker.client.credentials import Credentials
from broker.format.signature import check_date_time, parse_header, signature_matches
from broker.private_file import write_private
from broker.server.metrics import Counter
from broker.server.process import BrokerProcess

RESULTS = Path(__file__).resolve().parent / "results" / "security.json"
KINDS = ("plain", "tls", "tls_auth")
KIND_NAMES = {"plain": "plain text", "tls": "TLS", "tls_auth": "TLS + auth"}
SIZES_BYTES = (100, 1024)
QUEUES = 8
SEND_THREADS = 2
SEND_BATCH_MSGS = {100: 2000, 1024: 1000}  # as bench.server: about 0.3 MB and 1.1 MB a call
PULL_PRELOAD_PER_QUEUE = {100: 20_000, 1024: 5_000}  # read again and again: about 5 and 45 MB in all
PULL_MAX_MSGS = 4096
PULL_MAX_BYTES = 8 << 20
GROUP = "sec-bench"
TARGET_RATIO = 0.8  # TLS + auth against plain text, SendBatch of 1 KiB
MIN_ROUNDS = 3  # a median of fewer rounds is one round's figure, and a spread of one says nothing
MAX_ROUNDS = 10  # each round starts three brokers; more is a job for a quieter machine, not more rounds
QUICK_DURATION_S = 1.0  # --quick: the shortest case that still runs a few hundred SendBatch calls
DISPATCH_TIMEOUT_S = 60.0
GATE_CALLS = 2000  # per gate measurement: long enough for a stable figure, short beside the broker runs

ROOT_ACCESS_KEY, ROOT_SECRET_KEY = "bench-root", "bench-root-secret"
USER_ACCESS_KEY, USER_SECRET_KEY = "bench-app", "bench-app-secret"
# The bench user's entries: what an application's user typically holds (its topics by name and by prefix, its
# group, one Deny), so each decision scans several entries and picks the most specific.
USER_GRANTS = (
    ("Topic:SecSend100", ("Pub",), "Allow"),
    ("Topic:SecSend1024", ("Pub",), "Allow"),
    ("Topic:SecPull*", ("Pub", "Sub"), "Allow"),
    ("Group:sec-bench", ("Sub",), "Allow"),
    ("Topic:SecAudit", ("All",), "Deny"),
)


def send_topic(size: int) -> str:
    return f"SecSend{size}"


def pull_topic(size: int) -> str:
    return f"SecPull{size}"


# ---------------------------------------------------------------------------------------------------- brokers
@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path


def make_pki(directory: Path) -> Pki:
    """A CA and a server certificate for 127.0.0.1 signed by it (P-256, as the TLS tests make theirs)."""
    exe = shutil.which("openssl")
    if exe is None:
        raise SystemExit("bench.security makes its certificates with the openssl command; install openssl")

    def openssl(*args: str | Path) -> None:
        subprocess.run([exe, *map(str, args)], check=True, capture_output=True)

    ca, ca_key = directory / "ca.pem", directory / "ca-key.pem"
    cert, key = directory / "server.pem", directory / "server-key.pem"
    csr, ext = directory / "server.csr", directory / "server.ext"
    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *curve, "-keyout", ca_key, "-out", ca, "-days", "1", "-subj", "/CN=bench-ca", "-addext",
            "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl("req", "-new", *curve, "-keyout", key, "-out", csr, "-subj", "/CN=bench-broker")
    ext.write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n")
    openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, "-days", "1",
            "-extfile", ext)
    return Pki(ca, cert, key)


@contextmanager
def running(kind: str, pki: Pki, workdir: Path) -> Iterator[tuple[BrokerProcess, dict[str, Any]]]:
    """A ``kind`` broker with the topics (and, with auth, the bench user) made; yields it and the clients'
    keyword arguments."""
    tls: dict[str, Any] = {"tls_ca": str(pki.ca)} if kind != "plain" else {}
    args = ["--tls-cert", str(pki.cert), "--tls-key", str(pki.key)] if kind != "plain" else []
    config = None
    if kind == "tls_auth":
        args.append("--auth")
        config = workdir / "auth.json"  # the root user in a 0600 file: the environment would reach every broker
        root_user = {"auth_root_access_key": ROOT_ACCESS_KEY, "auth_root_secret_key": ROOT_SECRET_KEY}
        write_private(config, json.dumps(root_user).encode())
    root = {**tls, "access_key": ROOT_ACCESS_KEY, "secret_key": ROOT_SECRET_KEY} if kind == "tls_auth" else tls
    client = {**tls, "access_key": USER_ACCESS_KEY, "secret_key": USER_SECRET_KEY} if kind == "tls_auth" else tls
    with tempfile.TemporaryDirectory(prefix="sluice-bench-security-", dir=workdir) as store:
        broker = BrokerProcess(Path(store) / "store", flush="async", config=config, extra_args=args).start()
        try:
            with Admin(broker.endpoint, **root) as admin:
                for size in SIZES_BYTES:
                    admin.create_topic(send_topic(size), queues=QUEUES)
                    admin.create_topic(pull_topic(size), queues=QUEUES)
                if kind == "tls_auth":
                    make_user(admin)
            yield broker, client
        finally:
            broker.stop()


def make_user(admin: Admin) -> None:
    admin.create_user(USER_ACCESS_KEY, USER_SECRET_KEY)
    for resource, actions, decision in USER_GRANTS:
        admin.grant_acl(USER_ACCESS_KEY, resource, actions, decision)


# ---------------------------------------------------------------------------------------------------- cases
def batches(topic: str, size: int, count: int) -> list[bytes]:
    """One batch a queue, each message with its own UNIQ_KEY as the Producer sends it (bench/batches.py)."""
    body = bytes(range(256)) * (size // 256 + 1)
    return producer_batches(topic, body[:size], QUEUES, count, tags="T")


def costs(msgs: int, seconds: float, broker_cpu_s: float, client_cpu_s: float) -> dict[str, float]:
    return {"msgs": msgs, "seconds": seconds, "msgs_per_s": msgs / seconds,
            "broker_cpu_us_per_msg": broker_cpu_s / msgs * 1e6 if msgs else 0.0,
            "client_cpu_us_per_msg": client_cpu_s / msgs * 1e6 if msgs else 0.0}


def send_case(broker: BrokerProcess, client: dict[str, Any], size: int, duration_s: float) -> dict[str, float]:
    assert broker.proc is not None
    per_call = SEND_BATCH_MSGS[size]
    # each thread its own batches: two sends of one buffer at once would wait on its first message's key
    mine = [batches(send_topic(size), size, per_call) for _ in range(SEND_THREADS)]
    producers = [Producer(broker.endpoint, **client) for _ in range(SEND_THREADS)]
    try:
        for p, own in zip(producers, mine, strict=True):  # warm: channel and TLS handshake
            p.send_encoded(own[0], per_call)
        calls = [0] * SEND_THREADS

        def one(i: int) -> int:
            calls[i] += 1
            producers[i].send_encoded(mine[i][calls[i] % QUEUES], per_call)
            return per_call

        broker_cpu, client_cpu = process_cpu_s(broker.proc.pid), time.process_time()
        msgs, seconds = run_threads(SEND_THREADS, one, duration_s)
        return costs(msgs, seconds, process_cpu_s(broker.proc.pid) - broker_cpu, time.process_time() - client_cpu)
    finally:
        for p in producers:
            p.close()


def preload(broker: BrokerProcess, client: dict[str, Any], size: int) -> None:
    topic, per_queue = pull_topic(size), PULL_PRELOAD_PER_QUEUE[size]
    with Producer(broker.endpoint, **client) as producer:
        for _ in range(per_queue // 1000):
            for one_queue in batches(topic, size, 1000):
                producer.send_encoded(one_queue, 1000)
    deadline = time.monotonic() + DISPATCH_TIMEOUT_S
    with Admin(broker.endpoint, **client) as admin:  # the dispatcher builds consume queues after a send returns
        while any(hi < per_queue for _lo, hi in admin.queue_offsets(topic).values()):
            if time.monotonic() > deadline:
                raise SystemExit(f"{topic}: not dispatched within {DISPATCH_TIMEOUT_S} s")
            time.sleep(0.05)


def pull_case(broker: BrokerProcess, client: dict[str, Any], size: int, duration_s: float) -> dict[str, float]:
    assert broker.proc is not None
    preload(broker, client, size)
    topic = pull_topic(size)
    with PullConsumer(broker.endpoint, GROUP, **client) as consumer:
        consumer.pull_raw(topic, 0, 0, max_msgs=10)  # warm: channel and TLS handshake
        broker_cpu, client_cpu = process_cpu_s(broker.proc.pid), time.process_time()
        msgs, started = 0, time.perf_counter()
        stop = time.monotonic() + duration_s
        queue_id, offset = 0, 0
        while time.monotonic() < stop:
            r = consumer.pull_raw(topic, queue_id, offset, max_msgs=PULL_MAX_MSGS, max_bytes=PULL_MAX_BYTES)
            if r.entry_positions:
                msgs += len(r.entry_positions)
                offset = r.next_begin_offset
            else:  # the queue's end: the next queue, from its start
                queue_id, offset = (queue_id + 1) % QUEUES, 0
        seconds = time.perf_counter() - started
        return costs(msgs, seconds, process_cpu_s(broker.proc.pid) - broker_cpu, time.process_time() - client_cpu)


def case_name(what: str, size: int) -> str:
    return f"{what}_{'100B' if size == 100 else '1KiB'}"


def run_broker(kind: str, pki: Pki, workdir: Path, duration_s: float) -> dict[str, dict[str, float]]:
    out = {}
    with running(kind, pki, workdir) as (broker, client):
        for size in SIZES_BYTES:
            out[case_name("send_batch", size)] = send_case(broker, client, size, duration_s)
        for size in SIZES_BYTES:
            out[case_name("pull", size)] = pull_case(broker, client, size, duration_s)
    return out


# ---------------------------------------------------------------------------------------------------- the gate
class _Peer:
    """What the gate asks of a call's context when the call is signed: its peer address."""

    def peer(self) -> str:
        return "ipv4:127.0.0.1:40000"


def per_call_us(fn: Callable[[], object], calls: int = GATE_CALLS) -> float:
    """The median of three timings of ``calls`` calls, in microseconds a call."""
    timings = []
    for _ in range(MIN_ROUNDS):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        timings.append((time.perf_counter() - started) / calls)
    return statistics.median(timings) * 1e6


def authorize_costs(gate: AuthGate, user: User, method: str, operation: Operation, objects: dict[str, Any],
                    msgs: int, context: Any) -> dict[str, Any]:
    """Microseconds the authorization of a call of ``method`` (of ``msgs`` messages, 0: a pull) takes: the gate's
    own decision and the operation's check of the caller's rights on ``objects`` (broker/auth/operations.py's
    ``authorize``, as the processor asks it), with its parts: the operation's needs, and deciding them on the user's
    entries."""
    requirement = requirement_of(method)
    assert requirement is not None
    needs = operations.needs_of(operation, **objects)
    entries, source = gate.accounts.entries(user.access_key), source_address(context.peer())
    caller_token = current.set(Caller(user.access_key, source, gate.accounts))  # as the gate's wrapper sets it

    def authorize() -> None:
        gate.authorize(user, method, requirement)
        operations.authorize(operation, **objects)

    out = {
        "messages_per_call": msgs,
        "authorize_us": per_call_us(authorize),
        "needs_us": per_call_us(lambda: operations.needs_of(operation, **objects)),
        "decide_us": per_call_us(lambda: [allows(entries, n, source) for n in needs]),
    }
    current.reset(caller_token)
    return out


def gate_costs(workdir: Path) -> dict[str, Any]:
    """Microseconds the gate spends on one call of the bench user, whole and by part."""
    (workdir / "gate-config").mkdir()
    accounts = Accounts(workdir / "gate-config", User(ROOT_ACCESS_KEY, ROOT_SECRET_KEY, super_user=True))
    accounts.create_user(USER_ACCESS_KEY, USER_SECRET_KEY)
    for resource, actions, decision in USER_GRANTS:
        accounts.grant(USER_ACCESS_KEY, resource, actions, decision)
    gate = AuthGate(accounts, AuthSettings(window_s=900, certificate_names_user=False), Counter("refusals", ""))
    metadata = dict(Credentials(USER_ACCESS_KEY, USER_SECRET_KEY).metadata())
    context: Any = _Peer()
    user = gate.authenticate(metadata, context)
    out: dict[str, Any] = {"entries": len(accounts.entries(USER_ACCESS_KEY))}
    out["authenticate_us"] = per_call_us(lambda: gate.authenticate(metadata, context))
    header, date_time = parse_header(metadata["authorization"]), metadata["x-mq-date-time"]
    now = dt.datetime.now(dt.UTC)
    out["parse_header_us"] = per_call_us(lambda: parse_header(metadata["authorization"]))
    out["check_date_time_us"] = per_call_us(lambda: check_date_time(date_time, now, 900))
    out["hmac_us"] = per_call_us(lambda: signature_matches(USER_SECRET_KEY, date_time, header.signature_hex))
    requests: dict[str, tuple[str, Operation, dict[str, Any], int]] = {}
    for size in SIZES_BYTES:
        requests[case_name("send_batch", size)] = (
            "/sluice.v1.Broker/SendBatch", Operation.PUBLISH_BATCH, {"topics": [send_topic(size)]},
            SEND_BATCH_MSGS[size],
        )
    # A pull's answer holds as many messages as there are, up to its limits: its cost is per call only (0).
    requests["pull"] = (
        "/sluice.v1.Broker/PullMessage", Operation.CONSUME, {"group": GROUP, "topics": [pull_topic(100)]}, 0
    )
    for name, (method, operation, objects, msgs) in requests.items():
        costs_of = authorize_costs(gate, user, method, operation, objects, msgs, context)
        costs_of["gate_us"] = out["authenticate_us"] + costs_of["authorize_us"]
        if msgs:
            costs_of["gate_us_per_msg"] = costs_of["gate_us"] / msgs
        out[name] = costs_of
    return out


# ---------------------------------------------------------------------------------------------------- report
FIGURES = ("msgs_per_s", "broker_cpu_us_per_msg", "client_cpu_us_per_msg")


def median_of(runs: list[dict[str, dict[str, float]]], case: str) -> dict[str, float]:
    """Each figure of ``case`` as the median of the rounds, and the rounds' lowest and highest throughput."""
    out = {f: statistics.median(r[case][f] for r in runs) for f in FIGURES}
    rates = [r[case]["msgs_per_s"] for r in runs]
    out["msgs_per_s_min"], out["msgs_per_s_max"] = min(rates), max(rates)
    return out


def round_ratios(runs: dict[str, list[dict[str, dict[str, float]]]], kind: str, case: str) -> list[float]:
    """``kind`` against plain text in each round: the spread of a ratio (rounds are paired by their number)."""
    return [k[case]["msgs_per_s"] / p[case]["msgs_per_s"] for k, p in zip(runs[kind], runs["plain"], strict=True)]


def rate(c: dict[str, float]) -> str:
    """A case's median throughput and its rounds' spread."""
    return f"{c['msgs_per_s']:,.0f} [{c['msgs_per_s_min']:,.0f}-{c['msgs_per_s_max']:,.0f}]"


def render(report: dict[str, Any]) -> list[str]:
    lines = [
        f"TLS and authentication against plain text, {report['date']}, {report['source']} ({report['machine']}; "
        f"{report['rounds']} rounds of {report['duration_s']:g} s per case; median of the rounds, their spread "
        f"min-max in brackets; load average {report['load_average_at_start']:.2f} at the start, "
        f"{report['load_average_at_end']:.2f} at the end)"
    ]
    rows = [["case", *(KIND_NAMES[k] + " msgs/s" for k in KINDS), "target"]]
    m, spread = report["median"], report["ratio_spread"]
    for case in report["cases"]:
        cells = [rate(m["plain"][case])]
        cells += [f"{rate(m[k][case])} ({report['ratios'][k][case]:.2f}x [{spread[k][case][0]:.2f}-"
                  f"{spread[k][case][1]:.2f}])" for k in KINDS[1:]]
        met = "met" if report["target"]["met"] else "not met"
        target = f">= {TARGET_RATIO}x: {met}" if case == report["target"]["case"] else ""
        rows.append([case.replace("_", " "), *cells, target])
        for side in ("broker", "client"):
            rows.append([f"  {side} CPU us/msg", *(f"{m[k][case][f'{side}_cpu_us_per_msg']:.2f}" for k in KINDS), ""])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    g = report["gate"]
    lines.append(
        f"gate in this process (user with {g['entries']} entries): authenticate {g['authenticate_us']:.1f} us (header "
        f"{g['parse_header_us']:.1f}, timestamp {g['check_date_time_us']:.1f}, HMAC {g['hmac_us']:.1f})"
    )
    for name in (*(case_name("send_batch", s) for s in SIZES_BYTES), "pull"):
        c = g[name]
        per_msg = f", {c['gate_us_per_msg']:.3f} us a message" if "gate_us_per_msg" in c else ""
        lines.append(f"  {name.replace('_', ' ')}: authorize {c['authorize_us']:.1f} us (needs "
                     f"{c['needs_us']:.1f}, decisions {c['decide_us']:.1f}); whole gate {c['gate_us']:.1f} us a "
                     f"call{per_msg}")
    return lines


def source_state() -> str:
    """The commit measured, and whether broker/ differs from it: what code the figures are of."""
    repo = Path(__file__).resolve().parents[1]
    try:
        git = ["git", "-C", str(repo)]
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        changed = subprocess.run([*git, "status", "--porcelain", "--", "broker"], capture_output=True, text=True,
                                 check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head.stdout.strip() + (" with uncommitted changes in broker/" if changed.stdout.strip() else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.security", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per throughput case (default 4)")
    parser.add_argument("--rounds", type=int, default=MIN_ROUNDS,
                        help=f"turns of the three brokers, {MIN_ROUNDS}..{MAX_ROUNDS}")
    quick = f"{MIN_ROUNDS} rounds of {QUICK_DURATION_S:g} s cases (the shortest run with a median)"
    parser.add_argument("--quick", action="store_true", help=quick)
    args = parser.parse_args(argv)
    if not MIN_ROUNDS <= args.rounds <= MAX_ROUNDS:
        parser.error(f"--rounds must be {MIN_ROUNDS}..{MAX_ROUNDS}: a median and a spread need three rounds")
    rounds, duration_s = (MIN_ROUNDS, QUICK_DURATION_S) if args.quick else (args.rounds, args.duration)
    load_at_start = os.getloadavg()[0]
    runs: dict[str, list[dict[str, dict[str, float]]]] = {k: [] for k in KINDS}
    with tempfile.TemporaryDirectory(prefix="sluice-bench-security-") as tmp:
        workdir = Path(tmp)
        pki = make_pki(workdir)
        for round_no in range(rounds):
            order = KINDS[round_no % len(KINDS) :] + KINDS[: round_no % len(KINDS)]  # each kind first in turn
            for kind in order:
                runs[kind].append(run_broker(kind, pki, workdir, duration_s))
                print(f"round {round_no + 1}/{rounds}: {KIND_NAMES[kind]} done", file=sys.stderr, flush=True)
        gate = gate_costs(workdir)
    cases = list(runs["plain"][0])
    medians = {k: {c: median_of(runs[k], c) for c in cases} for k in KINDS}
    ratios = {k: {c: medians[k][c]["msgs_per_s"] / medians["plain"][c]["msgs_per_s"] for c in cases} for k in KINDS}
    ratio_spread = {k: {c: (min(r := round_ratios(runs, k, c)), max(r)) for c in cases} for k in KINDS}
    report = {
        "date": dt.datetime.now(dt.UTC).date().isoformat(),
        "command": " ".join(["python -m bench.security", *(argv if argv is not None else sys.argv[1:])]),
        "source": source_state(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg()[0],
        "rounds": rounds,
        "duration_s": duration_s,
        "cases": cases,
        "runs": runs,
        "median": medians,
        "ratios": ratios,
        "ratio_spread": ratio_spread,
        "target": {
            "case": "send_batch_1KiB",
            "tls_auth_ratio_at_least": TARGET_RATIO,
            "met": ratios["tls_auth"]["send_batch_1KiB"] >= TARGET_RATIO,
        },
        "gate": gate,
    }
    print("\n".join(render(report)))
    save(RESULTS, report, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

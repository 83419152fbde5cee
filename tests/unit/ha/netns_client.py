"""The partition test's client side, run inside the test's network namespace (``ip netns exec``), where the
group's addresses are: the Jepsen workload (until a stop file appears), reading every replica's log back, and
asking etcd who is master. Results go to files the test reads."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from jepsen import Workload, read_log

from broker.errors import BrokerError
from broker.ha.etcd_client import Etcd


def workload(namesrv: str, stop_file: Path, out: Path, progress: Path) -> None:
    w = Workload(namesrv, writers=4).start()
    while not stop_file.exists():
        progress.write_text(str(w.acknowledged()))
        time.sleep(0.1)
    w.stop()
    out.write_text(json.dumps([dataclasses.asdict(o) for o in w.outcomes]))


def read(endpoints: list[str], out: Path) -> None:
    logs = {}
    for ep in endpoints:
        logs[ep] = {f"{q}:{o}": body for (q, o), body in read_log(ep).items()}
    out.write_text(json.dumps(logs))


def state(etcd: str, prefix: str) -> None:
    host, port = etcd.rsplit(":", 1)
    client = Etcd([(host, int(port))])
    try:
        kv, master = client.get(prefix + "state"), client.get(prefix + "master")
        print(json.dumps({"state": kv.value if kv else None, "master": master.value if master else None}))
    except BrokerError as e:
        print(json.dumps({"error": e.message}))
    finally:
        client.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("workload")
    w.add_argument("--namesrv", required=True)
    w.add_argument("--stop-file", type=Path, required=True)
    w.add_argument("--out", type=Path, required=True)
    w.add_argument("--progress", type=Path, required=True)
    r = sub.add_parser("read")
    r.add_argument("--endpoints", required=True)
    r.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("state")
    s.add_argument("--etcd", required=True)
    s.add_argument("--prefix", required=True)
    args = ap.parse_args()
    if args.cmd == "workload":
        workload(args.namesrv, args.stop_file, args.out, args.progress)
    elif args.cmd == "read":
        read(args.endpoints.split(","), args.out)
    else:
        state(args.etcd, args.prefix)


if __name__ == "__main__":
    main()

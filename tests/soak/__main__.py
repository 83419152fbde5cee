"""``python -m tests.soak [--minutes N] [--seed S] [--out FILE] [--only KIND,...]``: one soak run; exit status 1 on
any violation. Run as root, it builds the soak's network namespaces (network.py), runs again inside them so that a
partition can cut a replica off, and removes them at the end (``--no-network``: loopback only, no partition)."""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import sys
import tempfile
from pathlib import Path

from tests.soak import network
from tests.soak.faults import KINDS
from tests.soak.run import run

DEFAULT_MINUTES = 5.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", DEFAULT_MINUTES)))
    parser.add_argument("--seed", type=int, default=int(os.environ.get("SOAK_SEED", random.randrange(1 << 31))))
    parser.add_argument("--out", type=Path, default=Path("bench/results/soak.json"))
    parser.add_argument("--root", type=Path, help="where the stores go (default: a temporary directory)")
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument("--each-kind", action="store_true",
                        help="inject every kind of fault once even when the minutes are over (the short soak)")
    parser.add_argument("--only", type=_kinds, default=(),
                        help=f"these fault kinds alone, comma-separated (of {', '.join(KINDS)})")
    parser.add_argument("--no-network", action="store_true",
                        help="as root too, run on loopback without network namespaces (no partition fault)")
    args = parser.parse_args(argv)
    if os.geteuid() == 0 and not args.no_network and not network.inside():
        # the seed is passed on: the one drawn here (when none was given) is the one the report names; the stores go
        # to a directory this process removes, even after the run inside was killed
        rest = list(sys.argv[1:] if argv is None else argv)
        with tempfile.TemporaryDirectory(prefix="soak-net-", dir=args.root) as stores:
            return network.run_inside([*rest, "--seed", str(args.seed), "--root", stores])
    if network.inside():  # a Ctrl-C comes forwarded by the run outside, which a shell may have started ignoring it
        signal.signal(signal.SIGINT, signal.default_int_handler)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("tests.soak").setLevel(logging.INFO)
    # Under faults the clients warn at every refused connection and moved master: the report says what counts
    logging.getLogger("broker.client").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="soak-", dir=args.root) as root:
        report = run(args.minutes, args.seed, Path(root), args.out, args.log_level, only=args.only,
                     each_kind=args.each_kind)
    features = report.get("features", {})
    for name, f in features.items():
        sys.stderr.write(f"{name:18} checked {f['checked']:7}  violations {f['violations']}\n")
    sys.stderr.write(f"seed {args.seed}: {report['faults_injected']} faults; {report['violations']} violations; "
                     f"report in {args.out}\n")
    return 0 if report["violations"] == 0 else 1


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"unknown fault kind {', '.join(unknown)}; the kinds: {', '.join(KINDS)}")
    return kinds


if __name__ == "__main__":
    sys.exit(main())

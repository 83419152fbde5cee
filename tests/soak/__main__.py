"""``python -m tests.soak [--minutes N] [--seed S] [--out FILE]``: one soak run; exit status 1 on any violation."""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import tempfile
from pathlib import Path

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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("tests.soak").setLevel(logging.INFO)
    # Under faults the clients warn at every refused connection and moved master: the report says what counts
    logging.getLogger("broker.client").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="soak-", dir=args.root) as root:
        report = run(args.minutes, args.seed, Path(root), args.out, args.log_level, each_kind=args.each_kind)
    features = report.get("features", {})
    for name, f in features.items():
        sys.stderr.write(f"{name:18} checked {f['checked']:7}  violations {f['violations']}\n")
    sys.stderr.write(f"seed {args.seed}: {report['faults_injected']} faults; {report['violations']} violations; "
                     f"report in {args.out}\n")
    return 0 if report["violations"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

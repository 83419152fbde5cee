"""``sluice``'s entry point: parse, set up logging, run the command, and turn every failure into one line.

A refused request or bad input prints ``error: <what and what to do> [RESPONSE_CODE]`` on stderr and exits with 1
(an UNAUTHENTICATED one adds a line saying where the command's credentials came from, if anywhere);
a usage mistake exits with 2 (argparse); Ctrl-C exits with 130 after the command's own summary (interrupt.py).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from broker.cli.interrupt import INTERRUPTED_EXIT
from broker.cli.parser import build_parser
from broker.cli.profile import PROFILE_ENV
from broker.client.credentials import ACCESS_KEY_ENV, SECRET_KEY_ENV
from broker.errors import BrokerError, ResponseCode


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run(argv)
    except KeyboardInterrupt:  # Ctrl-C outside a command's own handling (starting up, a short command)
        print("interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT


def run(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    level = args.log_level if args.log_level != "WARNING" else getattr(args, "log_level_default", "WARNING")
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    try:
        return int(args.func(args))
    except BrokerError as e:
        print(f"error: {e.message} [{e.code.name}]", file=sys.stderr)
        if e.code is ResponseCode.UNAUTHENTICATED:
            print(credentials_hint(args), file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except OSError as e:  # e.g. a store directory that cannot be made: say what, without a traceback
        print(f"error: {e}", file=sys.stderr)
        return 1


def credentials_hint(args: argparse.Namespace) -> str:
    where = getattr(args, "credentials_from", "")
    if where:
        return f"(the access key and secret key came from {where})"
    return (f"(this command sent no credentials: set {ACCESS_KEY_ENV} and {SECRET_KEY_ENV}, or name a profile file "
            f"with --profile FILE or ${PROFILE_ENV})")

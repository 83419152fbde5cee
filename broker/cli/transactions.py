"""``sluice tx list|commit|rollback``: look at transactions and decide open ones by hand.

``commit``/``rollback ID`` decides one transaction the broker knows: an unknown id is refused by the broker and
nothing is recorded (when transactions start with it, the error says to add ``--prefix``); a decision that
contradicts the transaction's earlier outcome (a commit of a rolled-back one) changes nothing, says so, and exits
with 1. ``--prefix`` decides every OPEN transaction whose id starts with the text.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from broker.cli.output import emit, vars_of
from broker.cli.profile import client_args
from broker.errors import QueryNotFoundError

if TYPE_CHECKING:
    from broker.client import Admin

SIMILAR_SHOWN = 3  # ids named in the hint that an unknown id is a prefix of others


def cmd_tx(args: argparse.Namespace) -> int:
    from broker.client import Admin

    with Admin(**client_args(args)) as admin:
        if args.action == "list":
            found = admin.list_transactions(args.prefix, args.status or "")
            rows = [[t.transaction_id, t.producer_group, t.status, t.half_count, t.check_times,
                     " ".join(t.held_queues)] for t in found]
            emit(args, [vars_of(t) for t in found], rows, ["transaction", "producer_group", "status", "messages",
                                                             "checks", "holds readers at"])
            return 0
        commit = args.action == "commit"
        ended = admin.end_transactions(args.target, commit) if args.prefix_mode else end_one(admin, args.target, commit)
    emit(args, ended, [[k, v] for k, v in sorted(ended.items())], ["transaction", "status"])
    wanted = "COMMITTED" if commit else "ROLLED_BACK"
    contradicted = sorted(k for k, v in ended.items() if v != wanted)
    if contradicted:
        earlier = ended[contradicted[0]].lower().replace("_", " ")
        print(f"error: transaction {contradicted[0]!r} was already {earlier}; the {args.action} changed nothing"
              + (f" (and {len(contradicted) - 1} more ended otherwise)" if len(contradicted) > 1 else ""),
              file=sys.stderr)
        return 1
    if not ended:
        print(f"no open transaction starts with {args.target!r}; nothing to {args.action}", file=sys.stderr)
    return 0


def end_one(admin: Admin, txn_id: str, commit: bool) -> dict[str, str]:
    try:
        return {txn_id: admin.end_transaction(txn_id, commit)}
    except QueryNotFoundError:
        similar = [t.transaction_id for t in admin.list_transactions(txn_id) if t.transaction_id != txn_id]
        if not similar:
            raise
        shown = ", ".join(similar[:SIMILAR_SHOWN]) + (", ..." if len(similar) > SIMILAR_SHOWN else "")
        raise QueryNotFoundError(
            f"no transaction {txn_id!r}, but {len(similar)} start with it ({shown}); add --prefix to "
            f"{'commit' if commit else 'roll back'} every open one of them"
        ) from None

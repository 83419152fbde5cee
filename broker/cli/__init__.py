"""``sluice``: run a broker, and the commands a person uses to inspect and drive one.

    sluice broker --store DIR [--listen HOST:PORT] [--flush async|sync] [--config FILE] [--metrics-port N]
    sluice topic create|list|delete|describe ...
    sluice send TOPIC [--tags T] [--keys K] [--property k=v] [--body TEXT | --size B] [--count N] (or stdin lines)
    sluice consume TOPIC --group G [--from earliest|latest|committed] [--follow] [--tags EXPR | --sql EXPR]
    sluice query key TOPIC KEY [--begin TIME] [--end TIME] | sluice query id MSGID
    sluice group list | lag GROUP | reset-offsets GROUP --topic T --to-earliest|--to-latest|--to-offset N|...
    sluice tx list|commit|rollback ...
    sluice stats
    sluice user create|update|delete|list ...   |   sluice acl grant|revoke|list ...

The grammar and help texts are in parser.py; each command in a module of its own (send.py, consume.py, groups.py,
transactions.py, admin_cmd.py, users.py, broker_cmd.py); profile.py says where a command's endpoint, TLS files and
credentials come from; main.py turns failures into one ``error:`` line.
"""

from broker.cli.main import main
from broker.cli.parser import build_parser

__all__ = ["build_parser", "main"]

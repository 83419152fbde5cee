"""docs/remoting.md's table of supported request codes is the code's: every code the name server's and the
broker's processor tables answer, with its RocketMQ number and name, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from broker.namesrv.remoting_processor import NameServerRemoting
from broker.namesrv.route_table import RouteTable
from broker.remoting.admin_table import ADMIN_CODES
from broker.remoting.broker_table import broker_processors
from broker.remoting.codes import RequestCode
from broker.remoting.message_processors import MESSAGE_CODES

DOC = Path(__file__).resolve().parents[3] / "docs" / "remoting.md"
ROW = re.compile(r"^\| (\d+) \| (\w+) \| (name server|broker) \|", re.MULTILINE)


def test_the_supported_codes_table_is_the_processor_tables() -> None:
    documented = {(int(n), name, where) for n, name, where in ROW.findall(DOC.read_text())}
    namesrv = NameServerRemoting(RouteTable(), lambda: 0).processors()
    broker = broker_processors(SimpleNamespace(admin=None))  # type: ignore[arg-type]  # building needs no broker
    served = {(int(c), RequestCode(c).name, "name server") for c in namesrv}
    served |= {(int(c), RequestCode(c).name, "broker") for c in [*broker, *MESSAGE_CODES, *ADMIN_CODES]}
    assert documented == served

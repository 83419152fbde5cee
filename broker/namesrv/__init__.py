"""The name server: brokers register their topics with it, clients ask it where a topic's queues are.

As RocketMQ's NameServer it is stateless and knows nothing durable: the route table lives in memory and is
rebuilt within one registration interval (30 s) of a restart. Several name servers run side by side without
talking to each other; every broker registers with all of them, and clients try them in turn.
"""

from broker.namesrv.name_server import DEFAULT_NAMESRV_PORT, NameServer
from broker.namesrv.route_table import DEFAULT_BROKER_EXPIRE_MS, RouteTable

__all__ = ["DEFAULT_BROKER_EXPIRE_MS", "DEFAULT_NAMESRV_PORT", "NameServer", "RouteTable"]

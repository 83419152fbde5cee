"""Who a broker is in a cluster: its cluster, broker name and id, the address clients reach it at, and the id of
its store.

The store id is a random id made once, when the store is first used by a broker, and kept in
``config/brokerIdentity.json``. Name servers use it to tell the same broker restarting (it replaces its own
registration at once, whatever address it comes back at) from another broker claiming a name and id that are
taken (refused while the first is alive).
"""

from __future__ import annotations

import socket
import uuid
from dataclasses import dataclass
from pathlib import Path

from broker.json_file import load_json, write_json_atomic

IDENTITY_FILE = "brokerIdentity.json"


@dataclass(frozen=True)
class BrokerIdentity:
    cluster: str
    broker_name: str
    broker_id: int
    address: str  # HOST:PORT that clients and other brokers use
    store_id: str

    @property
    def is_master(self) -> bool:
        return self.broker_id == 0


def default_broker_name() -> str:
    """RocketMQ's default brokerName is the host name."""
    return socket.gethostname() or "broker"


def load_store_id(config_dir: Path) -> str:
    """The store's id, made and saved (atomically, synced) the first time."""
    path = config_dir / IDENTITY_FILE
    loaded = load_json(path, lambda raw: str(raw["storeId"]))
    if loaded:
        return loaded
    store_id = uuid.uuid4().hex
    write_json_atomic(path, {"storeId": store_id})
    return store_id

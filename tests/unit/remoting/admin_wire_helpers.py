"""An in-process broker serving its remoting port, and the requests ``mqadmin`` and 4.x clients send it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from broker.remoting.client import RemotingClient
from broker.remoting.command import RemotingCommand
from broker.remoting.message_properties import format_properties
from broker.server.broker_controller import BrokerController


@dataclass
class Remoting:
    broker: BrokerController
    client: RemotingClient

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.broker.port}"

    def call(self, code: int, body: bytes = b"", **ext: str) -> RemotingCommand:
        return self.client.invoke(RemotingCommand(code, ext_fields=ext, body=body))

    def send(self, topic: str, body: bytes, props: dict[str, str] | None = None, queue_id: int = 0) -> RemotingCommand:
        """SEND_MESSAGE_V2 as a 4.x producer writes it."""
        text = format_properties(props or {}).rstrip("\x02")
        return self.call(310, body, a="pg", b=topic, c="TBW102", d="4", e=str(queue_id), f="0", g="1700000000000",
                         h="0", i=text, j="0", k="false", m="false")


@pytest.fixture
def remoting_broker(broker_factory: Callable[..., BrokerController]) -> Iterator[Remoting]:
    broker = broker_factory(remoting_listen="127.0.0.1:0", broker_name="broker-a")
    with RemotingClient(broker.remoting_address()) as client:
        yield Remoting(broker, client)

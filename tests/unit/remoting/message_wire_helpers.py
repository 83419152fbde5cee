"""Requests to the remoting message processors of an in-process broker, as a 4.x client builds them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pytest

from broker.remoting.command import RemotingCommand
from broker.remoting.message_processors import MessageProcessors, message_processors
from broker.remoting.message_properties import format_properties
from broker.remoting.processor import RequestContext
from broker.server.broker_controller import BrokerController

SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE, PULL_MESSAGE, CONSUMER_SEND_MSG_BACK = 10, 310, 320, 11, 36
SUSPEND, COMMIT_OFFSET, SUBSCRIPTION = 0x2, 0x1, 0x4
ROOT_SECRET = "root-secret-1"  # auth_broker's root secret key


@dataclass
class FakePeer:
    address: str = "127.0.0.1:50123"
    sent: list[RemotingCommand] = field(default_factory=list)

    def send_oneway(self, command: RemotingCommand) -> None:
        self.sent.append(command)


class Slave:
    """A replication manager that is not its group's master (broker/ha/gate.py GateTarget, the parts asked)."""

    def is_master(self) -> bool:
        return False

    def identity_text(self) -> str:
        return "broker b (slave)"


@pytest.fixture
def remoting(broker: BrokerController) -> Iterator[MessageProcessors]:
    built = message_processors(broker)
    yield built
    built.shutdown()


def auth_broker(broker_factory: Callable[..., BrokerController], **settings: Any) -> BrokerController:
    """A broker that authenticates every request (root ``root``, secret ROOT_SECRET; plaintext signatures allowed,
    as remoting clients sign) and knows user ``u``, who holds no right yet."""
    broker = broker_factory(auth_enabled=True, auth_root_access_key="root", auth_root_secret_key=ROOT_SECRET,
                            allow_plaintext_auth=True, **settings)
    assert broker.accounts is not None
    broker.accounts.create_user("u", "u-secret-123")
    return broker


def call(table: MessageProcessors, code: int, ext: dict[str, str], body: bytes = b"", user: str | None = None
         ) -> RemotingCommand | Future[RemotingCommand]:
    answer = table.table[code].process(RemotingCommand(code, opaque=7, ext_fields=ext, body=body),
                                       RequestContext(FakePeer(), user))
    assert answer is not None
    return answer


def answered(answer: RemotingCommand | Future[RemotingCommand], timeout_s: float = 5.0) -> RemotingCommand:
    command = answer.result(timeout_s) if isinstance(answer, Future) else answer
    assert command.is_response and command.opaque == 7
    return command


def v2_header(topic: str, properties: str = "", *, queue_id: int = 0, sys_flag: int = 0, group: str = "pg"
              ) -> dict[str, str]:
    return {"a": group, "b": topic, "c": "TBW102", "d": "4", "e": str(queue_id), "f": str(sys_flag),
            "g": "1700000000000", "h": "0", "i": properties, "j": "0", "k": "false", "m": "false"}


def send(table: MessageProcessors, topic: str, body: bytes, props: dict[str, str] | None = None, *,
         user: str | None = None, **header: int) -> RemotingCommand:
    text = format_properties(props or {}).rstrip("\x02")  # as the Java client writes it: no trailing \x02
    return answered(call(table, SEND_MESSAGE_V2, v2_header(topic, text, **header), body, user))


def pull_header(group: str, topic: str, queue_id: int, offset: int, *, sys_flag: int = SUBSCRIPTION,
                suspend_ms: int = 0, subscription: str = "*", expression_type: str = "TAG", max_msgs: int = 32,
                commit_offset: int = 0) -> dict[str, str]:
    return {"consumerGroup": group, "topic": topic, "queueId": str(queue_id), "queueOffset": str(offset),
            "maxMsgNums": str(max_msgs), "sysFlag": str(sys_flag), "commitOffset": str(commit_offset),
            "suspendTimeoutMillis": str(suspend_ms), "subscription": subscription, "subVersion": "0",
            "expressionType": expression_type}

"""The interface between the remoting transport and the handler of one request code (RocketMQ's processor table).

The transport decodes a frame, finds the processor registered for its ``code`` and calls :meth:`Processor.process`
on a worker thread (processors call the store and may block). A processor answers in one of three ways:

- a :class:`RemotingCommand` (built with ``request.response(...)``): sent at once;
- a :class:`concurrent.futures.Future` of one: sent when it completes (a long-polling pull holds its answer until
  messages arrive or its suspend time ends, without holding a worker thread);
- ``None``: nothing is sent (one-way requests, and requests whose answer the processor sends itself).

A processor only translates: it parses the header fields it reads, calls Sluice's operation for the code, and maps
the outcome (and every ``BrokerError``) to RocketMQ's response code. It never raises for a bad request.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from broker.remoting.command import RemotingCommand

Answer = RemotingCommand | Future[RemotingCommand] | None


class Peer(Protocol):
    """The connection a request came on: who sent it, and a way to send it commands (broker-to-client calls such as
    ``NOTIFY_CONSUMER_IDS_CHANGED`` and ``CHECK_TRANSACTION_STATE``, which are one-way)."""

    @property
    def address(self) -> str: ...

    def send_oneway(self, command: RemotingCommand) -> None: ...


@dataclass(frozen=True)
class RequestContext:
    """What a processor knows of a request besides its frame."""

    peer: Peer
    # The authenticated user name when the request carried a valid RocketMQ ACL signature, else None.
    user: str | None = None


class Processor(Protocol):
    def process(self, request: RemotingCommand, context: RequestContext) -> Answer: ...

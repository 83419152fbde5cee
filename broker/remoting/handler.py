"""A processor made of one function: the function answers, and a ``BrokerError`` it raises is answered with its
RocketMQ response code and message (broker/remoting/codes.py), as every refusal of the broker is."""

from __future__ import annotations

from collections.abc import Callable

from broker.errors import BrokerError
from broker.remoting.codes import error_code
from broker.remoting.command import RemotingCommand
from broker.remoting.processor import Answer, RequestContext


class Handler:
    def __init__(self, handle: Callable[[RemotingCommand], Answer]) -> None:
        self.handle = handle

    def process(self, request: RemotingCommand, context: RequestContext) -> Answer:
        try:
            return self.handle(request)
        except BrokerError as e:
            return request.response(error_code(e), remark=e.message)


class ContextHandler:
    """A :class:`Handler` whose function also reads the request's context (its user, its connection)."""

    def __init__(self, handle: Callable[[RemotingCommand, RequestContext], Answer]) -> None:
        self.handle = handle

    def process(self, request: RemotingCommand, context: RequestContext) -> Answer:
        try:
            return self.handle(request, context)
        except BrokerError as e:
            return request.response(error_code(e), remark=e.message)

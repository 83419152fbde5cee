"""The processor shape of the query and administration codes: parse the header, check the caller's rights on what it
names (``message_outcomes.Access`` and the request code's row in ``broker.auth.requirements.REMOTING``), then do the
work as that caller, so that operations deciding on what they read (a message viewed by offset) decide as for gRPC.

A refusal (``BrokerError``) is answered with its RocketMQ code (``codes.error_code``) and its message as the remark;
any other failure with ``message_outcomes.failure`` (SYSTEM_ERROR, or SERVICE_NOT_AVAILABLE for an I/O error).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from broker.errors import BrokerError
from broker.remoting.codes import error_code
from broker.remoting.command import RemotingCommand
from broker.remoting.message_outcomes import MAX_REMARK_CHARS, Access, failure
from broker.remoting.processor import Answer, RequestContext

log = logging.getLogger(__name__)


class Guarded:
    """``parse(request)`` gives the object the rights row reads (its ``name`` in REMOTING); ``handle(request, parsed)``
    answers."""

    def __init__(self, access: Access, name: str, parse: Callable[[RemotingCommand], Any],
                 handle: Callable[[RemotingCommand, Any], RemotingCommand]) -> None:
        self.access, self.name, self.parse, self.handle = access, name, parse, handle

    def process(self, request: RemotingCommand, context: RequestContext) -> Answer:
        try:
            parsed = self.parse(request)
            with self.access.as_caller(context):
                return self.handle(request, parsed)
        except BrokerError as e:
            code = error_code(e)
            log.info("remoting %s refused: %s (%s)", self.name, e.message[:200], code.name)
            return request.response(int(code), remark=e.message[:MAX_REMARK_CHARS])
        except Exception as e:  # noqa: BLE001 - the last line of defence: answered, and the broker serves on
            return failure(request, e)

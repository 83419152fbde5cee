"""Which remoting request codes need which rights: the bridge from request codes to the requirement table's
``REMOTING`` rows (broker/auth/requirements.py), shared by the broker's and the name server's remoting ports.

* ``anonymous_codes()``: the codes whose row is ``ANONYMOUS`` (route reads), served without credentials;
* ``declared_codes()``: the codes that have a row. A code served without one is for super users only (default
  deny, as for gRPC methods): a processor added without declaring its rights cannot be reached by other users;
* :class:`Admitted`: a processor checked against its row before it runs, on the ``topic`` and ``consumerGroup``
  its header names (the offset and consumer-list codes). The message processors and the heartbeat read more
  than those two fields and check their rows themselves (message_outcomes.py ``Access.admitted``).
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.auth.requirements import REMOTING, is_anonymous
from broker.errors import BrokerError
from broker.remoting.codes import RequestCode
from broker.remoting.command import RemotingCommand
from broker.remoting.message_outcomes import Access, refusal
from broker.remoting.processor import Answer, Processor, RequestContext

# Codes decided on another code's row: SEND_MESSAGE_V2 is SEND_MESSAGE with shorter field names.
_SAME_ROW: dict[int, str] = {RequestCode.SEND_MESSAGE_V2: "SEND_MESSAGE"}


def row_name(code: int) -> str | None:
    """The REMOTING row that decides ``code``; None when it has none."""
    if code in _SAME_ROW:
        return _SAME_ROW[code]
    try:
        name = RequestCode(code).name
    except ValueError:
        return None
    return name if name in REMOTING else None


def anonymous_codes() -> frozenset[int]:
    return frozenset(c for c in RequestCode if (name := row_name(c)) is not None and is_anonymous(REMOTING[name]))


def declared_codes() -> frozenset[int]:
    return frozenset(c for c in RequestCode if row_name(c) is not None)


@dataclass(frozen=True)
class Names:
    """What an offset or consumer-list request names, as its row reads it."""

    topic: str
    consumer_group: str


class Admitted:
    """``inner`` run as the request's caller once the rights its row names are checked (NO_PERMISSION otherwise,
    with nothing done)."""

    def __init__(self, inner: Processor, access: Access, code: int) -> None:
        name = row_name(code)
        assert name is not None, f"request code {code} has no REMOTING row"
        self.inner, self.access, self.name = inner, access, name

    def process(self, request: RemotingCommand, context: RequestContext) -> Answer:
        ext = request.ext_fields
        names = Names(ext.get("topic", ""), ext.get("consumerGroup", ""))
        try:
            with self.access.admitted(context, self.name, names):
                return self.inner.process(request, context)
        except BrokerError as e:
            return refusal(request, e)

"""Which remoting request codes may be served to whom: the bridge from request codes to the requirement table's
``REMOTING`` rows (broker/auth/requirements.py), shared by the broker's and the name server's remoting ports.

* ``anonymous_codes()``: the codes whose row is ``ANONYMOUS`` (route reads), served without credentials;
* ``declared_codes()``: the codes that have a row. A code served without one is for super users only (default
  deny, as for gRPC methods): a processor added without declaring its operations cannot be reached by other users;
* :class:`AsCaller`: a processor run as the request's caller, so that the operations it translates to decide the
  caller's rights on what they touch (broker/auth/operations.py), as for every other front.
"""

from __future__ import annotations

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


class AsCaller:
    """``inner`` run as the request's caller (message_outcomes.py ``Access.as_caller``); a refusal is answered with
    its code, nothing done."""

    def __init__(self, inner: Processor, access: Access) -> None:
        self.inner, self.access = inner, access

    def process(self, request: RemotingCommand, context: RequestContext) -> Answer:
        try:
            with self.access.as_caller(context):
                return self.inner.process(request, context)
        except BrokerError as e:
            return refusal(request, e)

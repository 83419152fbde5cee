"""Which broker names a transaction may name as its coordinator, checked when the transaction starts here.

A transaction over several brokers names its coordinator (``TRAN_COORDINATOR`` on its halves, the ``coordinator``
of an in-place SendBatch): the broker that keeps its decision (decision_log.py). A participant never rolls such a
transaction back alone (participant_resolver.py); it asks the coordinator, through the name servers, until an
answer comes. So a transaction naming a broker that does not exist would stay open for ever, and with rows written
in place it would hold its queues' readers for ever. Its first SendBatch on this broker is therefore refused,
storing nothing, unless the name is one the broker can ask:

* its own name (it keeps its own decisions);
* with name servers (``--namesrv``), a broker they list now: the writer found its brokers through the same name
  servers a moment ago. Names found are trusted for KNOWN_TTL_S. A name server that does not answer cannot say
  no: the write is let through (logged), and the transaction is ended as any other once its coordinator answers.

Without name servers no other broker can be asked, so no other name is taken.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from broker.errors import BrokerError, InvalidArgumentError

log = logging.getLogger(__name__)

KNOWN_TTL_S = 30.0  # how long a coordinator name the name servers listed is taken without asking them again
MAX_KNOWN = 4096  # names remembered at most (a cluster has far fewer brokers; a bound, not a tuning knob)


class CoordinatorNames:
    def __init__(self, own_name: str, list_brokers: Callable[[], Iterable[str]] | None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``list_brokers``: the broker names the name servers list now (BrokerError when none answers); None for
        a broker without name servers."""
        self.own_name = own_name
        self.list_brokers = list_brokers
        self.clock = clock
        self._lock = threading.Lock()
        self._known: dict[str, float] = {}  # name -> when the name servers last listed it

    def require(self, name: str) -> None:
        """Return when a transaction may name ``name`` as its coordinator; InvalidArgumentError otherwise."""
        if not name or name == self.own_name:
            return
        if self.list_brokers is None:
            raise InvalidArgumentError(
                f"the transaction names broker {name!r} as its coordinator, but this broker ({self.own_name!r}) has "
                "no name servers (--namesrv) through which to ask it for the decision; nothing stored"
            )
        now = self.clock()
        with self._lock:
            seen = self._known.get(name)
        if seen is not None and now - seen < KNOWN_TTL_S:
            return
        try:
            listed = set(self.list_brokers())
        except BrokerError as e:
            log.warning("coordinator %r of a new transaction not checked: the name servers did not answer (%s)",
                        name, e.message)
            return
        with self._lock:
            for known in listed:
                self._known[known] = now
            while len(self._known) > MAX_KNOWN:
                self._known.pop(next(iter(self._known)))
        if name not in listed:
            shown = ", ".join(sorted(listed)[:10]) or "none"
            raise InvalidArgumentError(
                f"the transaction names broker {name!r} as its coordinator, which the name servers do not list "
                f"(they list: {shown}); it could never be asked for the decision. Nothing stored"
            )


__all__ = ["KNOWN_TTL_S", "CoordinatorNames"]

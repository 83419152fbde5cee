"""Riding out a failover: a call that meets a replicated group while its master moves is tried again, for a bounded
time, instead of failing the query.

While a group elects a new master (controller mode, docs/replication.md) the name servers briefly list it without a
master: its topics have no writable queue (ServiceNotAvailableError), or, once the dead master's registration
expired and before the new one registered, no route at all (TopicNotExistError "no live broker holds topic").
A write meets NOT_MASTER or a refused connection on the old master's address. None of these stored anything, so
the call is made again, with the route asked anew, until a master answers or ``FAILOVER_WAIT_S`` passed; then the
error says that no master came back, and what was last refused.

A TopicNotExistError is waited out only while some group of the cluster has no live master (or no broker is listed
at all): with every group's master registered, the topic really does not exist and the caller hears so at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from broker.client.route import MASTER_ID
from broker.client.router import Router
from broker.errors import BrokerError, BrokerUnreachableError, ServiceNotAvailableError, TlsError, TopicNotExistError

log = logging.getLogger(__name__)

T = TypeVar("T")
# A controller-mode failover takes the lease TTL (5 s by default) plus a registration with the name servers (one
# register interval, 30 s at most by default); a group without a master for a minute is an outage, not a failover.
FAILOVER_WAIT_S = 60.0
BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0)  # between tries; the last repeats until the wait is over


def group_without_master(router: Router) -> bool:
    """True when the name servers list no broker, or some broker group without its master (id 0)."""
    try:
        brokers = router.cluster_brokers()
    except ServiceNotAvailableError:
        return True  # no name server answers: nothing tells that the topic is really gone
    if not brokers:
        return True
    with_master = {b.broker_name for b in brokers if b.broker_id == MASTER_ID}
    return any(b.broker_name not in with_master for b in brokers)


def nothing_stored(e: BrokerError) -> bool:
    """The call certainly stored nothing: refused before the write (NOT_MASTER, NOT_ENOUGH_REPLICAS, no live
    master, no writable queue), or its connection was never made. A call without an answer is not such a call,
    nor one TLS refused (a setting to change, not a master to wait for)."""
    if isinstance(e, TlsError):
        return False
    if isinstance(e, BrokerUnreachableError):
        return not e.request_sent
    return isinstance(e, ServiceNotAvailableError)


def until_master(
    call: Callable[[], T], router: Router | None, what: str, *,
    retry_if: Callable[[BrokerError], bool] = nothing_stored, topic: str | None = None,
    wait_s: float = FAILOVER_WAIT_S,
) -> T:
    """``call()``, tried again while a master moves: ``retry_if`` says which errors are safe to try again, and a
    TopicNotExistError is also tried again while ``router`` shows a group without master. ServiceNotAvailableError
    naming ``what`` once ``wait_s`` passed."""
    deadline = time.monotonic() + wait_s
    tries = 0
    while True:
        try:
            return call()
        except TopicNotExistError as e:
            if not retry_if(e) and (router is None or not group_without_master(router)):
                raise
            last: BrokerError = e
        except BrokerError as e:
            if not retry_if(e):
                raise
            last = e
        if router is not None and topic is not None:
            router.refresh(topic)  # the next try asks the name servers where the master is now
        if time.monotonic() >= deadline:
            raise ServiceNotAvailableError(
                f"{what}: no master came back within {wait_s:.0f} s ({type(last).__name__}: {last.message}); the "
                "group is down, not failing over"
            ) from last
        delay = BACKOFF_S[min(tries, len(BACKOFF_S) - 1)]
        tries += 1
        log.warning("%s: %s; trying again in %.1f s (a master may be moving)", what, last.message, delay)
        time.sleep(delay)


__all__ = ["FAILOVER_WAIT_S", "group_without_master", "nothing_stored", "until_master"]

"""Calls to name servers: reads try each name server in turn; registrations go to one named server.

A name-server list is ``HOST:PORT[,HOST:PORT...]`` (port 9876 when left out), from ``namesrv=`` or the
environment's ``SLUICE_NAMESRV``. Name servers do not share state, but every broker registers with all of them, so
any one that answers knows the whole cluster (within a registration interval).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from broker.address import format_address, parse_listen
from broker.client.credentials import Credentials, signed_channel
from broker.client.tls import TlsSettings, explain, open_channel, split_scheme
from broker.errors import BrokerError, BrokerUnreachableError, InvalidArgumentError, TlsError, TopicNotExistError
from broker.proto import namesrv_pb2 as npb
from broker.proto import namesrv_pb2_grpc as npb_grpc
from broker.proto.status import error_from_rpc

log = logging.getLogger(__name__)

NAMESRV_ENV = "SLUICE_NAMESRV"
DEFAULT_NAMESRV_PORT = 9876  # RocketMQ's
MAX_NAMESRVS = 32  # RocketMQ deployments run 2-4; the bound keeps a typo (a pasted list) from fanning out
NAMESRV_TIMEOUT_S = 5.0  # every name-server call is an in-memory lookup: a slow answer means a sick server
T = TypeVar("T")


def parse_namesrv_list(text: str | None) -> list[str]:
    """``host:port[,host:port...]`` -> addresses; InvalidArgumentError naming what is wrong."""
    raw, _https = split_scheme(text if text is not None else os.environ.get(NAMESRV_ENV, ""))
    items = [t.strip() for t in raw.split(",") if t.strip()]
    if not items:
        raise InvalidArgumentError(
            f"no name server given: write HOST:PORT[,HOST:PORT...] (namesrv=, --namesrv or ${NAMESRV_ENV})"
        )
    if len(items) > MAX_NAMESRVS:
        raise InvalidArgumentError(f"{len(items)} name servers named; at most {MAX_NAMESRVS} are accepted")
    out: list[str] = []
    for item in items:
        host, port = parse_listen(item, DEFAULT_NAMESRV_PORT)
        if port == 0 or host in ("0.0.0.0", "::") or item.strip().startswith(":"):
            raise InvalidArgumentError(f"name server {item!r} must name a host and a port other than 0")
        out.append(format_address(host, port))
    return out


class NameServerClient:
    """One channel per name server; ``call`` tries them in turn, starting with the last one that answered."""

    def __init__(self, addresses: list[str], timeout_s: float = NAMESRV_TIMEOUT_S, *,
                 tls: TlsSettings | None = None, credentials: Credentials | None = None) -> None:
        if not addresses:
            raise InvalidArgumentError("a name-server client needs at least one address")
        self.addresses = list(addresses)
        self.timeout_s = timeout_s
        self.tls = tls
        self._channels = {a: signed_channel(open_channel(a, [("grpc.enable_retries", 0)], tls), credentials)
                          for a in self.addresses}
        self._stubs = {a: npb_grpc.NameServerStub(c) for a, c in self._channels.items()}
        self._preferred = 0
        self._lock = threading.Lock()

    def call_one(self, address: str, method: str, request: Any, timeout_s: float | None = None) -> Any:
        try:
            return getattr(self._stubs[address], method)(request, timeout=timeout_s or self.timeout_s)
        except grpc.RpcError as e:
            raise explain(error_from_rpc(e), address, self.tls) from None

    def call(self, method: str, request: Any) -> Any:
        """The first answer, trying each name server once; an answer that is a refusal (a topic no broker holds)
        is the answer, not a reason to ask the next. BrokerUnreachableError when none answers."""
        with self._lock:
            start = self._preferred
        failures: list[tuple[str, BrokerError]] = []
        for i in range(len(self.addresses)):
            index = (start + i) % len(self.addresses)
            address = self.addresses[index]
            try:
                result = self.call_one(address, method, request)
            except BrokerUnreachableError as e:
                failures.append((address, e))
                continue
            if index != start:
                with self._lock:
                    self._preferred = index
            return result
        raise none_answered(failures)

    # ------------------------------------------------------------------------------------------------ reads
    def route(self, topic: str) -> npb.TopicRouteData:
        result: npb.TopicRouteData = self.call("GetRouteInfoByTopic", npb.GetRouteInfoRequest(topic=topic))
        return result

    def cluster_info(self) -> npb.BrokerClusterInfo:
        result: npb.BrokerClusterInfo = self.call("GetBrokerClusterInfo", npb.GetBrokerClusterInfoRequest())
        return result

    def replica_groups(self) -> list[Any]:
        """Each broker group's master, epoch, in-sync members and slaves' lag (broker/client/cluster_view.py)."""
        from broker.client.cluster_view import group_rows

        return list(group_rows(self.cluster_info()))

    def topics(self) -> list[str]:
        return list(self.call("GetAllTopicList", npb.GetAllTopicListRequest()).topics)

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()


def none_answered(failures: list[tuple[str, BrokerError]]) -> BrokerUnreachableError:
    """The error of a call no name server answered (address, error of each): a TlsError when TLS refused every one
    (the fix is the same for all)."""
    text = "; ".join(f"{a}: {e.message}" for a, e in failures)
    if failures and all(isinstance(e, TlsError) for _, e in failures):
        return TlsError(f"no name server accepted the connection ({text})")
    return BrokerUnreachableError(f"no name server answered ({text}); check --namesrv and that they run",
                                  request_sent=False)


def route_or_none(client: NameServerClient, topic: str) -> npb.TopicRouteData | None:
    try:
        return client.route(topic)
    except TopicNotExistError:
        return None


def first_answer(calls: list[Callable[[], T]]) -> T:
    """The first of ``calls`` that does not raise a BrokerError; the last error when all do."""
    last: BrokerError | None = None
    for call in calls:
        try:
            return call()
        except BrokerError as e:
            last = e
    assert last is not None
    raise last

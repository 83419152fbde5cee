"""What every admin call stands on: the router to one broker (``endpoint=``) or to a cluster (``namesrv=``), the
live brokers the name servers list, and the masters a change goes to (``Admin`` is the class to use; see
admin.py)."""

from __future__ import annotations

from typing import Any

from broker.client.admin_results import BrokerInfo, ClusterInfo, broker_info
from broker.client.connection import Connection
from broker.client.namesrv_client import none_answered
from broker.client.router import Router, RouterClient
from broker.errors import BrokerError, InvalidArgumentError
from broker.proto import namesrv_pb2 as npb


class AdminBase(RouterClient):
    def __init__(
        self, endpoint: str | None = None, *, namesrv: str | None = None, timeout_s: float = 30.0,
        router: Router | None = None,
        tls_ca: str | None = None, tls_cert: str | None = None, tls_key: str | None = None,
        access_key: str | None = None, secret_key: str | None = None,
    ) -> None:
        super().__init__(endpoint, namesrv, timeout_s, router, tls_ca, tls_cert, tls_key, access_key, secret_key)

    @property
    def cluster_mode(self) -> bool:
        return self.router.cluster_mode

    @property
    def conn(self) -> Connection:
        """The broker's connection, for an admin of one broker (``endpoint=``)."""
        return self.router.direct

    @property
    def stub(self) -> Any:
        return self.router.direct.stub

    # ------------------------------------------------------------------------------------------ cluster
    def cluster_info(self) -> ClusterInfo:
        """Every live broker the name servers know (``sluice cluster list``; ``as_json()`` is its ``--json``).
        Each name server is asked; a broker's latest registration wins."""
        namesrv = self.router.namesrv
        if namesrv is None:
            raise InvalidArgumentError(
                f"cluster_info needs name servers (namesrv=); this admin talks to the single {self.router.describe()}"
            )
        found: dict[tuple[str, int], npb.BrokerLiveInfo] = {}
        failures: list[tuple[str, BrokerError]] = []
        for address in namesrv.addresses:
            try:
                answer = namesrv.call_one(address, "GetBrokerClusterInfo", npb.GetBrokerClusterInfoRequest())
            except BrokerError as e:
                failures.append((address, e))
                continue
            for b in answer.brokers:
                known = found.get((b.broker_name, b.broker_id))
                if known is None or b.last_update_ms > known.last_update_ms:
                    found[(b.broker_name, b.broker_id)] = b
        if len(failures) == len(namesrv.addresses):
            raise none_answered(failures)
        brokers = sorted(found.values(), key=lambda b: (b.cluster, b.broker_name, b.broker_id))
        return ClusterInfo(tuple(broker_info(b) for b in brokers))

    def _targets(self, cluster: str | None, broker: str | None) -> list[BrokerInfo]:
        """The masters a change goes to: one named broker, every master of the named cluster, or of the only
        cluster there is. InvalidArgumentError for a name no live broker has."""
        if cluster is not None and broker is not None:
            raise InvalidArgumentError("give cluster= (every master of it) or broker= (one), not both")
        info = self.cluster_info()
        clusters = info.clusters()
        if broker is not None:
            found = [b for b in info.masters() if b.broker_name == broker]
            if not found:
                names = sorted(b.broker_name for b in info.masters())
                raise InvalidArgumentError(
                    f"broker {broker!r} is not a live master in {self.router.describe()}; live masters: {names}"
                )
            return found
        if cluster is None:
            if len(clusters) != 1:
                raise InvalidArgumentError(
                    f"name the cluster (cluster=) or the broker (broker=): {self.router.describe()} know clusters "
                    f"{clusters}"
                )
            cluster = clusters[0]
        found = info.masters(cluster)
        if not found:
            raise InvalidArgumentError(
                f"cluster {cluster!r} has no live master in {self.router.describe()}; known clusters: {clusters}"
            )
        return found

    def _connection(self, broker: BrokerInfo) -> Connection:
        return self.router.connection(broker.address)

    def _one_broker(self, cluster: str | None, broker: str | None) -> None:
        if cluster is not None or broker is not None:
            raise InvalidArgumentError(
                "cluster= and broker= name brokers of a cluster; this admin talks to the single "
                f"{self.router.describe()} (give namesrv=)"
            )


def with_broker(e: BrokerError, broker_name: str) -> BrokerError:
    """``e`` with the broker's name in front (a cluster's answer names who gave it), same class and code."""
    if not broker_name:
        return e
    try:
        return type(e)(f"broker {broker_name}: {e.message}", e.code)
    except TypeError:  # a subclass with another constructor (CorruptionError): keep the code
        return BrokerError(f"broker {broker_name}: {e.message}", e.code)


def ask_broker(broker_name: str, conn: Connection, method: str, request: Any) -> Any:
    """One call to a broker, its error naming the broker."""
    try:
        return conn.call(getattr(conn.stub, method), request)
    except BrokerError as e:
        raise with_broker(e, broker_name) from None

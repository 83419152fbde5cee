"""A PushConsumer's membership of its group: heartbeats to every broker of the subscription (which also tell
when the group changed there), and leaving the group on shutdown."""

from __future__ import annotations

import logging

from broker.client.connection import Connection
from broker.client.consumer_options import (
    BROADCASTING,
)
from broker.client.push_consumer_state import PushConsumerState
from broker.errors import BrokerError, ServiceNotAvailableError, TopicNotExistError
from broker.proto import sluice_pb2 as pb

log = logging.getLogger(__name__)


class Heartbeats(PushConsumerState):
    """Heartbeats and unregistering, on every broker holding a subscribed topic."""

    def _unregister(self) -> None:
        """Leave the group on every broker this consumer heartbeats (each would expire it otherwise)."""
        request = self._heartbeat_request(unregister=True)
        addresses = list(self._group_versions) if self.router.cluster_mode else [self.router.direct.endpoint]
        for address in addresses:
            conn = self._broker(address)
            try:
                conn.call(conn.stub.Heartbeat, request, timeout_s=self.control_timeout_s)
            except BrokerError as e:
                log.warning("could not unregister %s from %s on %s: %s", self.client_id, self.group, address,
                            e.message)

    def _heartbeat_request(self, unregister: bool = False) -> pb.HeartbeatRequest:
        model = pb.BROADCASTING if self.model is BROADCASTING else pb.CLUSTERING
        return pb.HeartbeatRequest(client_id=self.client_id, consumer_group=self.group,
                                   subscriptions=self.subscription, model=model, unregister=unregister)

    def _broker(self, address: str) -> Connection:
        return self.router.connection(address) if self.router.cluster_mode else self.router.direct

    def _heartbeat_targets(self, *, starting: bool = False) -> list[str]:
        """Addresses of every broker holding a subscribed topic (the one broker without name servers). Starting,
        name servers that do not answer are an error: nothing could ever be found."""
        if not self.router.cluster_mode:
            return [self.router.direct.endpoint]
        addresses: set[str] = set()
        unreachable: BrokerError | None = None
        for topic in sorted(self.subscription):
            try:
                route = self.router.route(topic)
            except TopicNotExistError:
                continue
            except BrokerError as e:
                unreachable = unreachable or e
                continue
            for group in route.groups.values():
                addresses.update(group.addresses.values())
        if starting and unreachable is not None and not addresses:
            raise unreachable
        return sorted(addresses)

    def _heartbeat(self, *, starting: bool = False) -> bool:
        """Send a heartbeat to every broker of the subscription; True when the group's membership changed on one
        of them since the last heartbeat (or a broker was added). Starting, a broker's refusal is an error (a
        wrong setting); a broker that does not answer is one only when it is the only broker."""
        request = self._heartbeat_request()
        versions: dict[str, int] = {}
        for address in self._heartbeat_targets(starting=starting):
            conn = self._broker(address)
            try:
                answer = conn.call(conn.stub.Heartbeat, request, timeout_s=self.control_timeout_s)
                versions[address] = answer.group_version
            except BrokerError as e:
                if starting and (not self.router.cluster_mode or not isinstance(e, ServiceNotAvailableError)):
                    raise
                log.warning("heartbeat of %s to %s failed: %s", self.client_id, address, e.message)
                if address in self._group_versions:
                    versions[address] = self._group_versions[address]  # still registered there, probably
        changed = any(self._group_versions.get(a) != v for a, v in versions.items())
        self._group_versions = versions
        return changed

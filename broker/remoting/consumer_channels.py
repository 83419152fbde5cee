"""The remoting connections of each consumer group's RocketMQ 4 clients, and the ``NOTIFY_CONSUMER_IDS_CHANGED``
(40) they are sent when their group's membership changes.

A 4.x consumer rebalances every 20 s, and at once when its broker sends it ``NOTIFY_CONSUMER_IDS_CHANGED`` (one-way,
header ``consumerGroup``). RocketMQ's broker sends it to every connection of a group when a client joins, changes
its subscriptions, leaves, or its connection closes; so does this one. The consumer table (broker/server/
consumer_manager.py) tells :meth:`changed` of every change, whichever front made it (a gRPC consumer joining too, a
consumer expiring); the connections are the ones heartbeats came on (``joined``).

A connection that closes takes its clients out of their groups (``closed``: the transport's ``on_close``), as
RocketMQ does when a channel closes: the others are told at once instead of after the 120 s expiry.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from broker.errors import BrokerError
from broker.remoting.codes import RequestCode
from broker.remoting.command import RemotingCommand
from broker.remoting.processor import Peer

log = logging.getLogger(__name__)


class ConsumerChannels:
    def __init__(self, members: Callable[[str], list[str]], leave: Callable[[str, str], None]) -> None:
        """``members(group)``: the group's live client ids; ``leave(group, client_id)``: take a client out of its
        group (the broker's unregister)."""
        self._members = members
        self._leave = leave
        self._lock = threading.Lock()
        self._peers: dict[str, dict[str, Peer]] = {}  # group -> client id -> the connection its heartbeat came on

    def joined(self, group: str, client_id: str, peer: Peer) -> None:
        """A heartbeat of ``client_id`` in ``group`` came on ``peer`` (before the consumer table records it, so
        that the notice of its joining reaches it too)."""
        with self._lock:
            self._peers.setdefault(group, {})[client_id] = peer

    def changed(self, group: str) -> None:
        """The group's membership changed: tell each of its remoting clients, forgetting those that left."""
        live = set(self._members(group))
        with self._lock:
            peers = self._peers.get(group, {})
            for gone in [c for c in peers if c not in live]:
                del peers[gone]
            if not peers:
                self._peers.pop(group, None)
            targets = list(dict.fromkeys(peers.values()))
        for peer in targets:
            peer.send_oneway(RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                             ext_fields={"consumerGroup": group}))

    def closed(self, peer: Peer) -> None:
        """``peer``'s connection ended: its clients leave their groups (the others are told, by ``changed``)."""
        with self._lock:
            leaving = [(g, c) for g, peers in self._peers.items() for c, p in peers.items() if p is peer]
            for g, c in leaving:
                del self._peers[g][c]
        for group, client_id in leaving:
            try:
                self._leave(group, client_id)
            except BrokerError as e:
                log.warning("group %s: client %s of a closed connection could not leave: %s", group, client_id,
                            e.message)

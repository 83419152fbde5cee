"""A PushConsumer's rebalance: the subscribed topics' routes polled, the group's members asked, the queues
allocated (allocation.py) and applied: workers started for new queues and dropped for lost ones."""

from __future__ import annotations

import logging
import time

from broker.client.allocation import AVERAGELY, CIRCLE, STRATEGIES, allocate_averagely, allocate_by_circle
from broker.client.consumer_options import (
    CLUSTERING,
)
from broker.client.orderly_locks import OrderlyLocks
from broker.client.push_worker import QueueWorker
from broker.client.route import MessageQueue
from broker.errors import BrokerError, TopicNotExistError
from broker.proto import sluice_pb2 as pb

log = logging.getLogger(__name__)

__all__ = ["AVERAGELY", "CIRCLE", "STRATEGIES", "Rebalance", "allocate_averagely", "allocate_by_circle"]


class Rebalance(OrderlyLocks):
    """Which queues this consumer pulls, decided again at each rebalance."""

    def _new_worker(self, key: MessageQueue) -> QueueWorker:
        """The worker of a newly assigned queue; the consumer itself builds it (a worker calls its listener)."""
        raise NotImplementedError

    def _poll_routes(self) -> None:
        """Ask for the subscribed topics' routes again when due (with one broker: at every rebalance, a cheap
        question to that broker)."""
        now = time.monotonic()
        if self.router.cluster_mode and now < self._next_route_poll:
            return
        self._next_route_poll = now + self.route_poll_interval_ms / 1000
        for topic in self.subscription:
            self.router.refresh(topic)

    def _rebalance(self) -> None:
        self._poll_routes()
        with self._lock:
            current = set(self._workers)
        desired: set[MessageQueue] = set()
        lists: dict[str, list[str] | None] = {}  # broker name -> the group's members there, for this pass
        for topic in sorted(self.subscription):
            queues = self._topic_queues(topic)
            if queues is not None and self.model is CLUSTERING and queues:
                ids = self._consumer_ids(topic, sorted({q.broker_name for q in queues}), lists)
                queues = None if ids is None else self.allocate(queues, ids, self.client_id)
            if queues is None:  # unknown now (the group, or the route): keep what this topic has, as RocketMQ does
                desired |= {k for k in current if k.topic == topic}
            else:
                desired |= set(queues)
        self._apply(desired)

    def _consumer_ids(self, topic: str, brokers: list[str], lists: dict[str, list[str] | None]) -> list[str] | None:
        """The group's members as the first of ``brokers`` that lists this consumer sees them; None when they
        cannot be known. A broker that restarted lists nobody until the next heartbeat: allocating over its list
        would drop every queue, so when no broker lists this client the ones that answered are sent a heartbeat
        and asked again."""
        for name in brokers:
            if name not in lists:
                lists[name] = self._ask_consumer_ids(topic, name)
            found = lists[name]
            if found is not None and self.client_id in found:
                return found
        answered = [name for name in brokers if lists[name] is not None]
        for name in answered:
            lists[name] = self._ask_consumer_ids(topic, name, heartbeat_first=True)
            found = lists[name]
            if found is not None and self.client_id in found:
                return found
        if answered:
            where = f"by any broker of {topic}" if self.router.cluster_mode else "even after a heartbeat"
            log.warning("%s is not listed in %s %s; keeping the current queues", self.client_id, self.group, where)
        return None

    def _ask_consumer_ids(self, topic: str, broker_name: str, *, heartbeat_first: bool = False) -> list[str] | None:
        request = pb.GetConsumerListRequest(consumer_group=self.group)
        try:
            conn = self.router.broker_connection(topic, broker_name, write=False)
            if heartbeat_first:
                conn.call(conn.stub.Heartbeat, self._heartbeat_request(), timeout_s=self.control_timeout_s)
            return list(conn.call(conn.stub.GetConsumerList, request, timeout_s=self.control_timeout_s).client_ids)
        except BrokerError as e:
            # with one broker nothing else can say: the current queues are kept; in a cluster the next broker is asked
            where = f" on {broker_name}" if self.router.cluster_mode else ""
            then = "" if self.router.cluster_mode else "; keeping the current queues"
            log.warning("cannot list the consumers of %s%s: %s%s", self.group, where, e.message, then)
            return None

    def _topic_queues(self, topic: str) -> list[MessageQueue] | None:
        """The topic's readable queues over every broker that holds it; None when that cannot be known now (a
        topic no broker holds has none)."""
        try:
            queues = self.router.route(topic).read_queues()
        except TopicNotExistError as e:
            if topic not in self._unrouted and topic != self.retry_topic:
                log.warning("consumer group %s: %s; its queues are consumed once a broker holds it", self.group,
                            e.message)
            self._unrouted.add(topic)
            return []  # deleted, or never created: its queues can be neither read nor committed
        except BrokerError as e:
            log.warning("cannot rebalance topic %s: %s; keeping its queues", topic, e.message)
            return None
        self._unrouted.discard(topic)
        return queues

    def _apply(self, desired: set[MessageQueue]) -> None:
        """Start the workers of new queues and drop those of lost ones without waiting for them: a listener call
        in progress must not hold up heartbeats and lock renewals. A dropped worker releases its queue itself."""
        with self._lock:
            if self._stop.is_set():
                return
            self._desired = desired
            current = set(self._workers)
            dropped = [self._workers.pop(k) for k in sorted(current - desired)]
            self._retiring.update((w.key, w) for w in dropped)
            # a queue whose previous worker is still finishing starts once it has (_worker_done asks for that)
            for key in sorted(desired - current - set(self._retiring)):
                worker = self._workers[key] = self._new_worker(key)
                worker.start()
        for w in dropped:
            w.drop()
        if dropped or desired - current:
            log.info("%s of %s now consumes %s", self.client_id, self.group, ", ".join(map(str, sorted(desired))))

    def _worker_done(self, worker: QueueWorker) -> None:
        """In the worker's thread, as it ends (dropped, or died): commit its queue, forget it, unlock it."""
        key = worker.key
        with self._lock:
            if self._workers.get(key) is worker:  # died on its own: released like a dropped one, then restarted
                del self._workers[key]
                self._retiring[key] = worker
            stopping = self._stop.is_set()  # shutdown commits and unregisters everything itself
        try:
            if not stopping:
                self._commit_dropped(key)
        finally:
            # unlocked, then out of _retiring (shutdown joins it until then), and no renewal locks it in between
            with self._lock_calls:
                if self.orderly and not stopping:
                    self._unlock_queues({key})
                with self._lock:
                    if self._retiring.get(key) is worker:
                        del self._retiring[key]
                    wanted = key in self._desired
        if wanted and not stopping:
            self._rebalance_now.set()

    def _commit_dropped(self, key: MessageQueue) -> None:
        try:
            self.offsets.commit_queue(key, force=True)
        except BrokerError as e:
            log.warning("committing %s of %s on dropping it failed: %s", key, self.group, e.message)
        finally:
            self.offsets.forget(key)

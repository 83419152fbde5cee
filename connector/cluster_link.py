"""ClusterLink: the source's way to every broker of a cluster, found through its name servers (option ``namesrv``).

* Routes: the client caches a topic's route for 30 s (RocketMQ's pollNameServerInterval); while planning, the
  driver asks the name servers again at most every ``ROUTE_REFRESH_S``, so a broker or queue that joins shows up
  as new partitions within a trigger or two, and a broker that leaves is noticed at the next trigger.
* A broker of a topic's route that does not answer (after the usual retries) is named in ``gone`` while planning,
  with the reason; the stream reader then stops the query or holds that broker's queues (failOnDataLoss).
* A pull that cannot reach its broker asks for the topic's route again before its retry: a broker that came back at
  another address, or a group's new master, is found there. Pulls, and route lookups that meet a group without a
  master ("no live broker holds topic" between the dead master's registration expiring and the new one's), wait
  up to ``connector.failover.FAILOVER_WAIT_S``.
* Group offsets are committed broker by broker, each broker storing its own queues' offsets (RocketMQ keeps a
  queue's consumer offset on the broker that owns the queue). A broker the name servers no longer list is skipped:
  its queues' offsets stay in Spark's checkpoint, and the next commit after it returns stores them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from broker.client import PullConsumer, RawPullResult
from broker.client.results import PullStatus
from broker.client.route import MessageQueue
from broker.client.router import Router
from broker.errors import BrokerError, ServiceNotAvailableError, SubscriptionGroupNotExistError, TopicNotExistError
from broker.proto import sluice_pb2 as pb
from connector.auth_options import ANONYMOUS, AuthKeys
from connector.broker_link import BrokerLink, BrokerQueue, retried
from connector.failover import FAILOVER_WAIT_S, until_master
from connector.offsets import QueueKey
from connector.tls_options import PLAIN, TlsFiles

log = logging.getLogger(__name__)

T = TypeVar("T")

ROUTE_REFRESH_S = 1.0  # planning asks the name servers again at most this often per topic (each trigger, at most)
# A queue that ends below offsets the driver planned: during a failover, the replica a read reaches (one that
# restarted, was just elected, or serves reads while its group has no master) can show less than was confirmed
# until a master's in-sync replicas report to it. That is part of the failover, and bounded as the rest of it:
# asked again for as long as a master may take to come back before the reader takes it for a lost tail. (15 s
# was too short: in an hour's soak a read during a partition of the master still found the tail short after 15 s,
# and the query stopped on a DataLossError for 3 messages every replica then held.)
SHORT_TAIL_RECHECK_S = FAILOVER_WAIT_S
SHORT_TAIL_PAUSE_S = 0.5
MAX_REFRESH_TIMES = 10_000  # topics whose last refresh is remembered (a topicPattern over a large cluster)


class ClusterLink(BrokerLink):
    def __init__(self, namesrv: str, group: str, timeout_s: float, tls: TlsFiles = PLAIN,
                 auth: AuthKeys = ANONYMOUS) -> None:
        self.router = Router(namesrv=namesrv, timeout_s=timeout_s, tls=tls.settings(), credentials=auth.credentials())
        self.consumer = PullConsumer(group=group, router=self.router)
        self._refreshed: dict[str, float] = {}  # topic -> monotonic time of its last route refresh

    def _fresh_route(self, topic: str) -> None:
        now = time.monotonic()
        if now - self._refreshed.get(topic, -ROUTE_REFRESH_S) >= ROUTE_REFRESH_S:
            if len(self._refreshed) >= MAX_REFRESH_TIMES:
                self._refreshed.clear()
            self.router.refresh(topic)
            self._refreshed[topic] = now

    def queue_offsets(self, topic: str, gone: dict[str, str] | None = None) -> dict[BrokerQueue, tuple[int, int]]:
        self._fresh_route(topic)
        try:
            route = self._routed(topic, lambda: self.router.route(topic))
        except TopicNotExistError:
            return {}
        out: dict[BrokerQueue, tuple[int, int]] = {}
        for broker in sorted({mq.broker_name for mq in route.read_queues()}):
            try:
                out.update(retried(lambda broker=broker: self._broker_offsets(topic, broker)))  # type: ignore[misc]
            except TopicNotExistError:
                continue  # the broker left the route, or no longer holds the topic (the reader says which)
            except ServiceNotAvailableError as e:
                if gone is None:
                    raise
                gone[broker] = e.message
        return out

    def _broker_offsets(self, topic: str, broker: str) -> dict[BrokerQueue, tuple[int, int]]:
        """TopicNotExistError once the broker is no longer in the topic's route (asked again after each failure:
        a broker that stopped cleanly, or whose registration expired, leaves it)."""
        conn = self.router.broker_connection(topic, broker, write=False)
        try:
            response = conn.call(conn.stub.GetQueueOffsets, pb.GetQueueOffsetsRequest(topic=topic))
        except ServiceNotAvailableError:
            self.router.refresh(topic)
            raise
        return {(broker, q.queue_id): (q.min_offset, q.max_offset) for q in response.queues}

    def topics(self) -> list[str]:
        assert self.router.namesrv is not None
        namesrv = self.router.namesrv
        return sorted(retried(namesrv.topics))

    def committed(self, topic: str) -> dict[BrokerQueue, int]:
        try:
            found = self._routed(topic, lambda: self.consumer.committed_by_queue(topic))
        except TopicNotExistError:
            return {}
        return {(mq.broker_name, mq.queue_id): off for mq, off in found.items()}

    def offset_by_timestamp(self, topic: str, broker: str, queue_id: int, timestamp_ms: int) -> int:
        request = pb.SearchOffsetByTimestampRequest(topic=topic, queue_id=queue_id, timestamp_ms=timestamp_ms)

        def search() -> int:
            conn = self.router.broker_connection(topic, broker, write=False)
            return int(conn.call(conn.stub.SearchOffsetByTimestamp, request).offset)

        return until_master(search, self.router, f"offset by time of {topic}/{broker}/{queue_id}",
                            retry_if=_read_retry, topic=topic)

    def commit(self, offsets: Mapping[QueueKey, int]) -> None:
        """Each broker's queues to that broker; BrokerError after every live broker was tried when one failed."""
        by_broker: dict[str, dict[MessageQueue, int]] = {}
        for (topic, broker, qid), off in offsets.items():
            by_broker.setdefault(broker, {})[MessageQueue(topic, broker, qid)] = off
        live = self.live_brokers()
        failed: list[BrokerError] = []
        for broker, queues in sorted(by_broker.items()):
            if broker not in live:
                log.info("broker %s is not in the cluster now: its queues' group offsets are committed when it "
                         "returns", broker)
                continue
            try:
                self.consumer.commit_offsets(queues)
            except SubscriptionGroupNotExistError:
                raise  # permanent: the caller says how to fix it
            except BrokerError as e:
                failed.append(e)
        if failed:
            raise failed[0]

    def pull_raw(self, key: QueueKey, offset: int, *, max_msgs: int, tags: str) -> RawPullResult:
        topic, broker, qid = key
        mq = MessageQueue(topic, broker, qid)

        def pull() -> RawPullResult:
            try:
                return self.consumer.pull_raw(mq, offset, max_msgs=max_msgs, timeout_ms=0, tags=tags)
            except ServiceNotAvailableError:
                self.router.refresh(topic)  # the broker may be back at another address
                raise

        # A read of offsets planned on this broker: tried again while it (or its group's master) is away, also when
        # a failover leaves its group out of the topic's route for a moment.
        deadline = time.monotonic() + SHORT_TAIL_RECHECK_S
        while True:
            r = until_master(pull, self.router, f"pull of {topic}/{broker}/{qid}", retry_if=_read_retry, topic=topic)
            short = r.status not in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG) and r.max_offset < offset
            if not short or time.monotonic() >= deadline:
                return r  # a tail still short after the recheck is the reader's data loss (failOnDataLoss)
            log.warning("%s ends at %d, below the planned offset %d; asking again (a replica that just took over "
                        "may not show what was confirmed yet)", mq, r.max_offset, offset)
            self.router.refresh(topic)
            time.sleep(SHORT_TAIL_PAUSE_S)

    def _routed(self, topic: str, call: Callable[[], T]) -> T:
        """``call()`` retried while a broker restarts (``retried``), and while the name servers, during a
        failover, list some group without a master and so may say that no live broker holds ``topic``."""
        return until_master(lambda: retried(call), self.router, f"the route of {topic}", retry_if=_never,
                            topic=topic)

    def live_brokers(self) -> set[str]:
        return retried(lambda: {b.broker_name for b in self.router.cluster_brokers()})

    def queues_on(self, broker: str, topic: str) -> set[int] | None:
        listed = {b.broker_id: b.address for b in retried(self.router.cluster_brokers) if b.broker_name == broker}
        if not listed:
            return None
        conn = self.router.connection(listed.get(0) or listed[min(listed)])  # the master, else a slave (reads)
        try:
            response = retried(lambda: conn.call(conn.stub.GetQueueOffsets, pb.GetQueueOffsetsRequest(topic=topic)))
        except TopicNotExistError:
            return set()
        self.router.refresh(topic)  # the route this client cached missed these queues: the next look asks again
        return {q.queue_id for q in response.queues}

    def close(self) -> None:
        self.consumer.close()
        self.router.close()


def _read_retry(e: BrokerError) -> bool:
    """Reads change nothing: a broker that does not answer is asked again, whatever the call did. (A broker
    missing from the topic's route is waited for only while a group has no master: one that left the cluster is
    said at once.)"""
    return isinstance(e, ServiceNotAvailableError)


def _never(e: BrokerError) -> bool:
    return False


__all__ = ["ClusterLink"]

"""Orderly consumption's queue locks: locked on the queue's broker before it is consumed, renewed by the control
thread, trusted locally for ``lock_max_live_ms`` only, unlocked when a queue is dropped."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable

from broker.client.heartbeat import Heartbeats
from broker.client.route import MessageQueue
from broker.errors import BrokerError
from broker.proto import sluice_pb2 as pb

log = logging.getLogger(__name__)


def by_broker(queues: Iterable[MessageQueue]) -> dict[str, list[MessageQueue]]:
    out: dict[str, list[MessageQueue]] = defaultdict(list)
    for mq in sorted(queues):
        out[mq.broker_name].append(mq)
    return out


class OrderlyLocks(Heartbeats):
    """The locks an orderly PushConsumer holds, by queue."""

    def _lock_request(self, queues: list[MessageQueue]) -> pb.LockBatchRequest:
        wire = [pb.MessageQueue(topic=mq.topic, queue_id=mq.queue_id) for mq in queues]
        return pb.LockBatchRequest(consumer_group=self.group, client_id=self.client_id, queues=wire)

    def _renew_locks(self) -> None:
        """Orderly: renew the locks of the assigned queues and of dropped ones still finishing (another consumer
        must not take a queue while this one is still in its listener, as in RocketMQ)."""
        with self._lock_calls:
            with self._lock:
                keys = set(self._workers) | set(self._retiring)
            self._lock_queues(keys)

    def _lock_queues(self, keys: set[MessageQueue]) -> set[MessageQueue]:
        """Lock (or renew) queues, each on its broker's master; the set this consumer holds afterwards."""
        held: set[MessageQueue] = set()
        with self._lock_calls:
            for broker_name, queues in by_broker(keys).items():
                sent = time.monotonic()  # the broker's lifetime starts later: counting from here errs on the safe side
                try:
                    conn = self.router.queue_connection(queues[0], write=True)
                    answer = conn.call(conn.stub.LockBatchMQ, self._lock_request(queues),
                                       timeout_s=self.control_timeout_s)
                    got = {MessageQueue(q.topic, broker_name, q.queue_id) for q in answer.queues}
                except BrokerError as e:
                    log.warning("locking %d queues of %s failed: %s", len(queues), self.group, e.message)
                    got = set()
                with self._lock:
                    for key in queues:
                        self._locked.pop(key, None)
                    self._locked.update(dict.fromkeys(got, sent + self.lock_max_live_ms / 1000))
                held |= got
        return held

    def _unlock_queues(self, keys: set[MessageQueue]) -> None:
        with self._lock_calls:
            with self._lock:
                for key in keys:
                    self._locked.pop(key, None)
            for queues in by_broker(keys).values():
                try:
                    conn = self.router.queue_connection(queues[0], write=True)
                    conn.call(conn.stub.UnlockBatchMQ, self._lock_request(queues), timeout_s=self.control_timeout_s)
                except BrokerError as e:  # the broker lets the locks expire after 60 s
                    log.warning("unlocking %d queues of %s failed: %s", len(queues), self.group, e.message)

    def _hold_lock(self, key: MessageQueue) -> bool:
        """Orderly, before every pull and every chunk: is the queue ours? A record past its local lifetime is not
        trusted (renewals may have stopped and the broker given the queue away): the broker is asked again."""
        with self._lock:
            if self._locked.get(key, 0.0) > time.monotonic():
                return True
        return key in self._lock_queues({key})

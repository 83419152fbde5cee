"""PushConsumer: subscribe, and a listener is called with messages as they arrive.

Inside: a control thread sends heartbeats, rebalances (every ``rebalance_interval_ms``, and at once when a
heartbeat shows the group changed) and commits offsets; one worker thread per assigned queue runs a long-polling
pull loop and calls the listener in queue order. CLUSTERING splits the queues over the group (client-side,
AVERAGELY or CIRCLE) and keeps offsets on the broker; BROADCASTING gives every consumer every queue and keeps
offsets on the client (in memory, or in a JSON file when ``offset_store_path`` is given).

The listener returns ``ConsumeStatus.CONSUME_SUCCESS`` (or None) or ``RECONSUME_LATER``. In CLUSTERING mode a
failed message (RECONSUME_LATER, or the listener raised) is sent back to the broker (ConsumerSendMsgBack, unless
``send_back=False``): it comes again through ``%RETRY%{group}``, which every clustering consumer subscribes to
automatically, after the delay of its retry (10 s, 30 s, 1 m, ...), and goes to ``%DLQ%{group}`` after
``max_reconsume_times`` (default: the group's retryMaxTimes, 16); the queue goes on meanwhile. Messages whose
send-back fails, and failed messages in BROADCASTING mode, are retried on the same queue after
``reconsume_delay_ms``, so nothing is skipped. The listener is called from several threads (one per queue): it
must be thread-safe.

``orderly=True`` (RocketMQ's MessageListenerOrderly): each queue is locked on the broker before it is consumed
(renewed every ``lock_renew_interval_ms``, 20 s; the broker lets a lock expire after 60 s; the client trusts its
own record of a lock for ``lock_max_live_ms``, 30 s, after which it locks again before the next message), one
thread per queue calls the listener in queue order, and a failed message suspends its queue for
``reconsume_delay_ms`` and is retried, never skipped nor sent back -- unless ``max_reconsume_times`` is set (>= 0;
RocketMQ's orderly default is unlimited): a message that failed that many retries is moved to ``%DLQ%{group}``
(ConsumerSendMsgBack with a negative delay level) and the queue goes on; if the broker cannot take it, the queue
stays suspended. A queue taken away by a rebalance keeps its lock until its listener call in progress returns.
``expression_types={topic: "SQL92"}`` makes that topic's expression an SQL92 selector over the properties,
evaluated on the broker. ``%DLQ%`` topics cannot be subscribed.

A cluster (``namesrv=`` instead of ``endpoint=``), as RocketMQ's client:

* Queues are ``MessageQueue(topic, broker_name, queue_id)``. A rebalance splits the union of every broker's
  readable queues of each subscribed topic (and of ``%RETRY%{group}``, which each broker the group heartbeats
  creates, and which holds the messages sent back to that broker) among the group's members. Routes come from the
  name servers, asked again every ``route_poll_interval_ms`` (30 s, RocketMQ's pollNameServerInterval).
* Heartbeats go to every broker holding a subscribed topic. The member list comes from the first broker of the
  topic, in name order, that answers and lists this consumer (RocketMQ's findConsumerIdList asks one broker of
  the topic; a fixed order makes the members of a group read the same list). A broker that does not list this
  consumer has restarted or expired it: its list may lack other members too, so the next broker is asked, and
  only when none lists it is each sent a heartbeat and asked again.
* Committed offsets go to the broker that owns each queue, pulls and orderly locks to the queue's broker, and a
  failed message is sent back to the broker that holds it.
* A broker that is down stays in the routes until the name servers expire it (120 s without a registration,
  RocketMQ's BROKER_CHANNEL_EXPIRED_TIME): meanwhile its queues stay assigned, their workers back off
  ``pull_backoff_ms`` between attempts and go on from where they were when it returns, and every other broker's
  queues are consumed as usual. A broker that leaves the routes (expired, or shut down cleanly, which unregisters
  it at once) takes its queues out of the next rebalance; when it registers again they come back, starting at the
  offsets committed on it.

With one broker (``endpoint=``) a queue's broker name is ``""``; ``assigned_queues()`` and the offset store's
``offsets()`` are keyed by ``(topic, queue_id)`` there, as they always were.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from broker.client.consumer_options import (
    BROADCASTING,
    CLUSTERING,
    FIRST,
    LAST,
    TIMESTAMP,
    ConsumeFrom,
    ConsumeStatus,
    MessageModel,
)
from broker.client.offset_store import QueueKey
from broker.client.pull_consumer import send_back
from broker.client.push_worker import QueueWorker
from broker.client.rebalance import Rebalance
from broker.client.results import ReceivedMessage
from broker.client.route import MessageQueue
from broker.errors import BrokerError
from broker.format.message import Prop
from broker.format.system_topics import RETRY_GROUP_TOPIC_PREFIX

log = logging.getLogger(__name__)

_QueueWorker = QueueWorker  # its former name, still imported by a test

__all__ = [
    "BROADCASTING",
    "CLUSTERING",
    "FIRST",
    "LAST",
    "TIMESTAMP",
    "ConsumeFrom",
    "ConsumeStatus",
    "MessageModel",
    "PushConsumer",
]


class PushConsumer(Rebalance):
    """A push consumer: its settings and state (push_consumer_state.py), heartbeats (heartbeat.py), orderly
    locks (orderly_locks.py) and rebalance (rebalance.py) are layered classes; the workers are push_worker.py's.
    This class adds the lifecycle, the control thread and the delivery of messages to the listener."""

    def start(self) -> PushConsumer:
        try:
            self._heartbeat(starting=True)
            self._rebalance()
        except BaseException:
            self.router.close()  # a failed start leaves no open channel behind (the caller gets no object to close)
            raise
        self._control = threading.Thread(target=self._control_loop, name=f"consumer-{self.group}", daemon=True)
        self._control.start()
        return self

    def shutdown(self) -> None:
        """Stop consuming, commit, leave the group and close. May be called from the listener: that call's own
        message is then not committed (it comes again, as after any stop in the middle of a message)."""
        me = threading.current_thread()
        if self._stop.is_set():
            if getattr(me, "owner", None) is not self:  # a worker waiting here could block the first call's join
                self._closed.wait()
            return
        self._stop.set()
        self._rebalance_now.set()
        try:
            control = self._control
            # not yet started: start() is still in its first rebalance and a listener already calls this
            if control is not None and control is not me and control.ident is not None:
                control.join()
            with self._lock:
                workers = [*self._workers.values(), *self._retiring.values()]
                self._workers.clear()
            for w in workers:
                w.drop()
            for w in workers:
                if w is not me:  # from the listener: this thread's worker ends when the listener returns
                    w.join()
            self._commit_quietly()
            self._unregister()
        finally:
            self.router.close()
            self._closed.set()

    def __enter__(self) -> PushConsumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def assigned_queues(self, include_retry: bool = False) -> set[QueueKey]:
        """The queues this consumer pulls (without its automatic %RETRY% subscription unless asked): MessageQueues
        in a cluster, (topic, queue id) pairs with one broker."""
        return {self.offsets.key(mq) for mq in self.assigned_message_queues(include_retry)}

    def assigned_message_queues(self, include_retry: bool = False) -> set[MessageQueue]:
        """The queues this consumer pulls, as MessageQueues (with one broker, their broker name is "")."""
        with self._lock:
            return {k for k in self._workers if include_retry or k.topic != self.retry_topic}

    def _control_loop(self) -> None:
        tick_ms = min(self.heartbeat_interval_ms, self.rebalance_interval_ms, self.persist_interval_ms,
                      self.lock_renew_interval_ms)
        since = {"heartbeat": 0, "rebalance": 0, "persist": 0, "lock": 0}
        while not self._stop.is_set():
            triggered = self._rebalance_now.wait(tick_ms / 1000)
            self._rebalance_now.clear()
            if self._stop.is_set():
                return
            for k in since:
                since[k] += tick_ms
            # Each task on its own: a broker that cannot take this round's commit must not hold up the lock
            # renewals (or the rebalance) of every other broker's queues.
            if since["heartbeat"] >= self.heartbeat_interval_ms:
                since["heartbeat"] = 0
                triggered |= bool(self._control_task(self._heartbeat))
            if triggered or since["rebalance"] >= self.rebalance_interval_ms:
                since["rebalance"] = 0
                self._control_task(self._rebalance)
            if since["persist"] >= self.persist_interval_ms:
                since["persist"] = 0
                self._control_task(self.offsets.commit_all)
            if self.orderly and since["lock"] >= self.lock_renew_interval_ms:
                since["lock"] = 0
                self._control_task(self._renew_locks)

    def _control_task(self, task: Callable[[], object]) -> object:
        try:
            return task()
        except BrokerError as e:
            log.warning("consumer %s of %s: %s; will retry", self.client_id, self.group, e.message)
        except Exception:  # the control thread must outlive any surprise: log it and go on
            log.exception("consumer %s of %s: control loop error; will retry", self.client_id, self.group)
        return None

    def _new_worker(self, key: MessageQueue) -> QueueWorker:
        return QueueWorker(self, key)

    def _call_listener(self, chunk: list[ReceivedMessage]) -> bool:
        try:
            status = self.listener(chunk)
        except Exception:  # the application's code: log it and consume the messages again later
            log.exception("listener of %s raised on %d messages; will retry them", self.group, len(chunk))
            return False
        return status is None or status is ConsumeStatus.CONSUME_SUCCESS

    def _restore_topic(self, msg: ReceivedMessage) -> ReceivedMessage:
        """A message from the retry topic is shown under its original topic, as RocketMQ's client does."""
        if msg.topic.startswith(RETRY_GROUP_TOPIC_PREFIX) and Prop.RETRY_TOPIC in msg.properties:
            msg.topic = msg.properties[Prop.RETRY_TOPIC]
        return msg

    def _send_back(self, mq: MessageQueue, chunk: list[ReceivedMessage]) -> list[ReceivedMessage]:
        """Send failed messages back to the broker that holds them (``mq``'s); returns those it could not take
        (retried here)."""
        kept: list[ReceivedMessage] = []
        for msg in chunk:
            try:
                send_back(self.router.queue_connection(mq, write=True), self.group, msg, 0, self.max_reconsume_times)
            except BrokerError as e:
                log.warning("send-back of %s to %s failed (%s); retrying it here", msg.msg_id, self.group, e.message)
                kept.append(msg)
        return kept

    def _dead_letter(self, mq: MessageQueue, chunk: list[ReceivedMessage], attempts: int) -> list[ReceivedMessage]:
        """Orderly: move messages that failed ``attempts`` times to ``%DLQ%{group}`` on their broker; returns those
        the broker did not take (the queue stays suspended on them)."""
        kept: list[ReceivedMessage] = []
        for msg in chunk:
            try:
                conn = self.router.queue_connection(mq, write=True)
                send_back(conn, self.group, msg, -1, self.max_reconsume_times)  # < 0: straight to the DLQ
                log.warning("orderly: %s failed %d times; moved to the dead-letter queue of %s", msg.msg_id,
                            attempts, self.group)
            except BrokerError as e:
                log.warning("orderly: dead-lettering %s failed (%s); the queue stays on it", msg.msg_id, e.message)
                kept.append(msg)
        return kept

    def _commit_quietly(self) -> None:
        try:
            self.offsets.commit_all()
        except BrokerError as e:
            log.warning("final offset commit of %s failed: %s", self.group, e.message)

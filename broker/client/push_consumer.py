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
import os
import socket
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import grpc

from broker.client.call_stream import CallStream
from broker.client.connection import Connection
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
from broker.client.credentials import Credentials
from broker.client.message import decode_entries
from broker.client.offset_store import LocalOffsetStore, OffsetStore, QueueKey, RemoteOffsetStore
from broker.client.pull_consumer import send_back
from broker.client.rebalance import AVERAGELY, STRATEGIES
from broker.client.results import PullStatus, ReceivedMessage
from broker.client.route import MessageQueue
from broker.client.router import Router
from broker.client.tls import TlsSettings
from broker.errors import BrokerError, InvalidArgumentError, ServiceNotAvailableError, TopicNotExistError
from broker.format.lock_lease import DEFAULT_LOCK_MAX_LIVE_MS
from broker.format.message import Prop
from broker.format.system_topics import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX, retry_topic
from broker.proto import sluice_pb2 as pb
from broker.proto.status import error_from_rpc
from broker.proto.subscription import parse_tags, tag_matches

log = logging.getLogger(__name__)

EARLY_ANSWER_BACKOFF_S = 0.1
LOCK_RETRY_S = 1.0  # orderly: an unlocked queue (held by another consumer) is tried again this often
# Orderly: how long the client trusts a lock without renewing it -- RocketMQ's client lockMaxLiveTime, half of the
# broker's (broker.format.lock_lease.DEFAULT_LOCK_MAX_LIVE_MS), so a client whose renewals stop pauses its queues
# well before the broker could give them to another consumer.
CLIENT_LOCK_MAX_LIVE_MS = DEFAULT_LOCK_MAX_LIVE_MS // 2
DEFAULT_ROUTE_POLL_INTERVAL_MS = 30_000  # RocketMQ's pollNameServerInterval
# Heartbeats, member lists and locks: in-memory lookups on the broker. The control thread sends them to each broker
# in turn, so one that does not answer (a host gone from the network) must not hold the others' lock renewals and
# commits up for a whole request timeout.
CONTROL_CALL_TIMEOUT_S = 5.0


Listener = Callable[[list[ReceivedMessage]], ConsumeStatus | None]
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


def default_client_id() -> str:
    return f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"


def by_broker(queues: Iterable[MessageQueue]) -> dict[str, list[MessageQueue]]:
    out: dict[str, list[MessageQueue]] = defaultdict(list)
    for mq in sorted(queues):
        out[mq.broker_name].append(mq)
    return out


class _QueueWorker(threading.Thread):
    """Pull loop of one queue; stops when dropped (rebalance) or when the consumer shuts down."""

    def __init__(self, owner: PushConsumer, key: MessageQueue) -> None:
        super().__init__(name=f"pull-{key}", daemon=True)
        self.owner, self.key = owner, key
        self.dropped = threading.Event()
        self._call: grpc.Future | None = None
        # The queue's pulls go on one PullStream (broker/client/call_stream.py) of the broker's connection; calls
        # when the broker takes no stream.
        self._stream: tuple[Connection, CallStream] | None = None
        self._lock = threading.Lock()

    def drop(self) -> None:
        self.dropped.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()
            if self._stream is not None:
                self._stream[1].cancel()  # a held pull on it ends now

    def run(self) -> None:
        try:
            self._loop()
        except Exception:  # a worker must never die silently: log, and the next rebalance restarts it
            log.exception("pull loop of %s died", self.key)
        finally:
            with self._lock:
                if self._stream is not None:
                    self._stream[1].cancel()
            self.owner._worker_done(self)

    def _loop(self) -> None:
        o, mq = self.owner, self.key
        while o.orderly and not o._hold_lock(mq):  # the lock first: the previous owner commits before it unlocks
            if self.dropped.wait(LOCK_RETRY_S):
                return
        offset = self._initial_offset()
        while offset is not None and not self.dropped.is_set():
            if o.orderly and not o._hold_lock(mq):
                self.dropped.wait(LOCK_RETRY_S)
                continue
            started = time.monotonic()
            try:
                response = self._pull(offset)
            except BrokerError as e:
                if self.dropped.is_set():
                    return
                # a broker that is down (or restarting) is asked again after the backoff, from the same offset
                log.warning("pull %s at %d failed: %s; retrying in %d ms", mq, offset, e.message, o.pull_backoff_ms)
                self.dropped.wait(o.pull_backoff_ms / 1000)
                continue
            if response is None or self.dropped.is_set():
                return
            status = PullStatus[pb.PullStatus.Name(response.status)]
            if status is PullStatus.FOUND:
                messages = decode_entries(response.entries, response.entry_positions)
                if not self._consume(messages):
                    return
            elif status is PullStatus.NO_NEW_MSG and time.monotonic() - started < o.long_poll_ms / 2000:
                # Answered early without news: the broker is out of held-pull capacity. Do not spin.
                self.dropped.wait(EARLY_ANSWER_BACKOFF_S)
            elif status is PullStatus.OFFSET_ILLEGAL:
                log.warning("offset %d of %s is illegal (queue holds %d..%d); continuing at %d", offset, mq,
                            response.min_offset, response.max_offset, response.next_begin_offset)  # fmt: skip
            offset = response.next_begin_offset
            o.offsets.update(mq, offset)

    def _initial_offset(self) -> int | None:
        """Where to start; asked again while the broker cannot answer (say it restarts), None once dropped."""
        while not self.dropped.is_set():
            try:
                return self.owner.offsets.initial_offset(self.key)
            except BrokerError as e:
                log.warning("cannot find where to start %s: %s; retrying in %d ms", self.key, e.message,
                            self.owner.pull_backoff_ms)  # fmt: skip
                self.dropped.wait(self.owner.pull_backoff_ms / 1000)
        return None

    def _pull(self, offset: int) -> pb.PullResponse | None:
        o, mq = self.owner, self.key
        commit = o.offsets.pending_commit(mq) if o.model is CLUSTERING else None
        request = pb.PullRequest(
            consumer_group=o.group, topic=mq.topic, queue_id=mq.queue_id, queue_offset=offset,
            max_msgs=o.pull_batch_size, suspend_timeout_ms=o.long_poll_ms, tag_expression=o.subscription[mq.topic],
            commit_offset=-1 if commit is None else commit, expression_type=o.expression_types.get(mq.topic, "TAG"),
        )  # fmt: skip
        conn = o.router.queue_connection(mq)  # the queue's broker, as the route names it now
        timeout_s = o.long_poll_ms / 1000 + 10
        try:
            response = self._pull_on_stream(conn, request, timeout_s)
            if response is None and not self.dropped.is_set():
                response = self._pull_call(conn, request, timeout_s)
        except BrokerError as error:
            if self.dropped.is_set():
                return None
            if commit is not None and isinstance(error, InvalidArgumentError):
                # The broker refused the piggy-backed commit (say the queue was cut back after a crash): stop
                # sending it; the pull itself will be corrected by OFFSET_ILLEGAL.
                o.offsets.mark_committed(mq, commit)
            raise
        if response is None:
            return None  # dropped meanwhile
        if commit is not None:
            o.offsets.mark_committed(mq, commit)
        return response

    def _pull_on_stream(self, conn: Connection, request: pb.PullRequest, timeout_s: float) -> pb.PullResponse | None:
        """The pull on the queue's stream; None when dropped or when the broker takes no stream now."""
        with self._lock:
            if self.dropped.is_set():
                return None
            if self._stream is None or self._stream[0] is not conn:  # first, or the queue's broker changed
                if self._stream is not None:
                    self._stream[1].cancel()
                self._stream = (conn, CallStream(conn.stub.PullStream, conn.explain, conn.connected))
            stream = self._stream[1]
        response: pb.PullResponse | None = stream.call(request, timeout_s)
        return response

    def _pull_call(self, conn: Connection, request: pb.PullRequest, timeout_s: float) -> pb.PullResponse | None:
        with self._lock:
            if self.dropped.is_set():
                return None
            call = conn.stub.PullMessage.future(request, timeout=timeout_s)
            self._call = call
        try:
            response: pb.PullResponse = call.result()
            return response
        except grpc.FutureCancelledError:
            return None
        except grpc.RpcError as e:
            raise conn.explain(error_from_rpc(e)) from None
        finally:
            with self._lock:
                self._call = None

    def _consume(self, messages: list[ReceivedMessage]) -> bool:
        """Call the listener chunk by chunk; retry a failed chunk until it succeeds. False when dropped."""
        o, mq = self.owner, self.key
        wanted = o.tag_sets[mq.topic]
        if wanted is not None:  # "*" needs no check, and no message's properties decoded for it
            messages = [m for m in messages if tag_matches(wanted, m.tags)]
        if mq.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):  # only a retry queue holds messages to show renamed
            messages = [o._restore_topic(m) for m in messages]
        send_back_failed = o.send_back
        dead_letters = o.orderly and o.max_reconsume_times >= 0
        for start in range(0, len(messages), o.consume_batch_size):
            chunk = messages[start : start + o.consume_batch_size]
            next_offset = chunk[-1].queue_offset + 1
            failures = 0  # of this chunk, here: orderly retries never leave the queue
            while not self.dropped.is_set():
                if o.orderly and not o._hold_lock(mq):  # lost (expired): wait until it is ours again
                    self.dropped.wait(LOCK_RETRY_S)
                    continue
                done = o._call_listener(chunk)
                if not done and o._stop.is_set():
                    return False  # shut down from the listener: no channel to send back on; the chunk comes again
                if not done and send_back_failed:
                    chunk = o._send_back(mq, chunk)  # the ones the broker took come again through the retry topic
                    done = not chunk
                elif not done and dead_letters:
                    failures += 1
                    if failures > o.max_reconsume_times:  # retried max_reconsume_times times: a dead letter
                        chunk = o._dead_letter(mq, chunk, failures)
                        done = not chunk
                if done:
                    # progress per chunk, not per pull: a queue dropped mid-batch (rebalance) is committed up to
                    # here, so its next owner does not consume the finished part of the batch again
                    o.offsets.update(mq, next_offset)
                    break
                self.dropped.wait(o.reconsume_delay_ms / 1000)
            if self.dropped.is_set():
                return False
        return True


def _check_positive(**settings: float) -> None:
    """InvalidArgumentError naming the first setting that is not > 0. A consumer built with, say, long_poll_ms=0
    would pull in a busy loop, and a negative one would have every pull refused while it logged retries."""
    for name, value in settings.items():
        if not value > 0:
            raise InvalidArgumentError(f"{name}={value} must be > 0")


class PushConsumer:
    def __init__(
        self, endpoint: str | None, group: str, subscription: Mapping[str, str], listener: Listener, *,
        namesrv: str | None = None, model: MessageModel = CLUSTERING, consume_from: ConsumeFrom = LAST,
        consume_timestamp_ms: int = 0, allocate: str = AVERAGELY, client_id: str | None = None,
        pull_batch_size: int = 32, consume_batch_size: int = 1, long_poll_ms: int = 15_000,
        heartbeat_interval_ms: int = 30_000, rebalance_interval_ms: int = 20_000, persist_interval_ms: int = 5_000,
        pull_backoff_ms: int = 3_000, reconsume_delay_ms: int = 1_000, offset_store_path: str | Path | None = None,
        timeout_s: float = 30.0, orderly: bool = False, max_reconsume_times: int = -1,
        expression_types: Mapping[str, str] | None = None, lock_renew_interval_ms: int = 20_000,
        send_back: bool = True, lock_max_live_ms: int = CLIENT_LOCK_MAX_LIVE_MS,
        route_poll_interval_ms: int = DEFAULT_ROUTE_POLL_INTERVAL_MS,
        tls_ca: str | None = None, tls_cert: str | None = None, tls_key: str | None = None,
        access_key: str | None = None, secret_key: str | None = None,
    ) -> None:  # fmt: skip
        """``endpoint``: one broker (``host:port``); or ``None`` with ``namesrv="host:port[,host:port]"``: a
        cluster found through its name servers."""
        if not subscription:
            raise InvalidArgumentError("subscription is empty; give {topic: tag expression}, e.g. {'T': '*'}")
        dead = [t for t in subscription if t.startswith(DLQ_GROUP_TOPIC_PREFIX)]
        if dead:
            raise InvalidArgumentError(f"{dead[0]} is a dead-letter queue: its messages are never redelivered")
        if allocate not in STRATEGIES:
            raise InvalidArgumentError(f"allocate {allocate!r} is not one of {sorted(STRATEGIES)}")
        _check_positive(
            pull_batch_size=pull_batch_size, consume_batch_size=consume_batch_size, long_poll_ms=long_poll_ms,
            heartbeat_interval_ms=heartbeat_interval_ms, rebalance_interval_ms=rebalance_interval_ms,
            persist_interval_ms=persist_interval_ms, pull_backoff_ms=pull_backoff_ms,
            lock_renew_interval_ms=lock_renew_interval_ms, lock_max_live_ms=lock_max_live_ms, timeout_s=timeout_s,
            route_poll_interval_ms=route_poll_interval_ms,
        )  # fmt: skip
        if reconsume_delay_ms < 0:
            raise InvalidArgumentError(f"reconsume_delay_ms={reconsume_delay_ms} is negative; use 0 or more")
        self.group, self.listener, self.model = group, listener, model
        self.subscription = dict(subscription)
        self.expression_types = {t: k.upper() for t, k in (expression_types or {}).items()}
        self.orderly, self.max_reconsume_times = orderly, max_reconsume_times
        self.lock_renew_interval_ms, self.lock_max_live_ms = lock_renew_interval_ms, lock_max_live_ms
        self.send_back = send_back and model is CLUSTERING and not orderly
        self.retry_topic = retry_topic(group)
        if self.send_back:  # failed messages come back through the group's retry topic
            self.subscription.setdefault(self.retry_topic, "*")
        self.tag_sets = {
            t: None if self.expression_types.get(t, "TAG") == "SQL92" else parse_tags(e)
            for t, e in self.subscription.items()
        }  # refuses bad tag expressions now; SQL92 ones are checked by the broker at the first pull
        self._locked: dict[MessageQueue, float] = {}  # orderly: queue -> time.monotonic() until which it is ours
        self._lock_calls = threading.RLock()  # orders lock renewals and unlocks of one queue as they were decided
        self.allocate = STRATEGIES[allocate]
        self.client_id = client_id or default_client_id()
        self.pull_batch_size, self.consume_batch_size = pull_batch_size, max(1, consume_batch_size)
        self.long_poll_ms, self.pull_backoff_ms, self.reconsume_delay_ms = (
            long_poll_ms,
            pull_backoff_ms,
            reconsume_delay_ms,
        )
        self.heartbeat_interval_ms, self.rebalance_interval_ms = heartbeat_interval_ms, rebalance_interval_ms
        self.persist_interval_ms, self.route_poll_interval_ms = persist_interval_ms, route_poll_interval_ms
        self.control_timeout_s = min(timeout_s, CONTROL_CALL_TIMEOUT_S)
        # after the checks: a refusal opens nothing
        self.router = Router(endpoint, namesrv, timeout_s=timeout_s, tls=TlsSettings.of(tls_ca, tls_cert, tls_key),
                                       credentials=Credentials.of(access_key, secret_key))
        self.offsets: OffsetStore = (
            LocalOffsetStore(self.router, consume_from, consume_timestamp_ms, offset_store_path)
            if model is BROADCASTING
            else RemoteOffsetStore(self.router, group, consume_from, consume_timestamp_ms)
        )
        self._workers: dict[MessageQueue, _QueueWorker] = {}
        self._retiring: dict[MessageQueue, _QueueWorker] = {}  # dropped, still finishing (a listener call running)
        self._desired: set[MessageQueue] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = threading.Event()  # shutdown finished: committed, unregistered, channels closed
        self._rebalance_now = threading.Event()
        self._control: threading.Thread | None = None
        self._group_versions: dict[str, int] = {}  # broker address -> the group's version there at the last heartbeat
        self._next_route_poll = 0.0
        self._unrouted: set[str] = set()  # subscribed topics no broker holds now (logged once until they appear)

    @property
    def conn(self) -> Connection:
        """The broker's connection, for a consumer of one broker (``endpoint=``)."""
        return self.router.direct

    # ------------------------------------------------------------------------------------------------ lifecycle
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
                            e.message)  # fmt: skip

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

    # ------------------------------------------------------------------------------------------------ control
    def _control_loop(self) -> None:
        tick_ms = min(self.heartbeat_interval_ms, self.rebalance_interval_ms, self.persist_interval_ms,
                      self.lock_renew_interval_ms)  # fmt: skip
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

    def _heartbeat_request(self, unregister: bool = False) -> pb.HeartbeatRequest:
        model = pb.BROADCASTING if self.model is BROADCASTING else pb.CLUSTERING
        return pb.HeartbeatRequest(client_id=self.client_id, consumer_group=self.group,
                                   subscriptions=self.subscription, model=model, unregister=unregister)  # fmt: skip

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
                            e.message)  # fmt: skip
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
                worker = self._workers[key] = _QueueWorker(self, key)
                worker.start()
        for w in dropped:
            w.drop()
        if dropped or desired - current:
            log.info("%s of %s now consumes %s", self.client_id, self.group, ", ".join(map(str, sorted(desired))))

    def _worker_done(self, worker: _QueueWorker) -> None:
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

    def _call_listener(self, chunk: list[ReceivedMessage]) -> bool:
        try:
            status = self.listener(chunk)
        except Exception:  # the application's code: log it and consume the messages again later
            log.exception("listener of %s raised on %d messages; will retry them", self.group, len(chunk))
            return False
        return status is None or status is ConsumeStatus.CONSUME_SUCCESS

    # ------------------------------------------------------------------------------------------------ semantics
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
                            attempts, self.group)  # fmt: skip
            except BrokerError as e:
                log.warning("orderly: dead-lettering %s failed (%s); the queue stays on it", msg.msg_id, e.message)
                kept.append(msg)
        return kept

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
                                       timeout_s=self.control_timeout_s)  # fmt: skip
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

    def _commit_quietly(self) -> None:
        try:
            self.offsets.commit_all()
        except BrokerError as e:
            log.warning("final offset commit of %s failed: %s", self.group, e.message)

"""A PushConsumer's worker: one thread per assigned queue, pulling (long polls, on a PullStream when the broker
takes one) and calling the listener in queue order; orderly, it holds the queue's lock before each pull and chunk.

Apart from the consumer because a worker is the data path of one queue; the consumer decides which queues have one."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import grpc

from broker.client.call_stream import CallStream
from broker.client.connection import Connection
from broker.client.consumer_options import (
    CLUSTERING,
)
from broker.client.outgoing_message import decode_entries
from broker.client.results import PullStatus, ReceivedMessage
from broker.client.route import MessageQueue
from broker.errors import BrokerError, InvalidArgumentError
from broker.format.subscription import tag_matches
from broker.format.system_topics import RETRY_GROUP_TOPIC_PREFIX
from broker.proto import sluice_pb2 as pb
from broker.proto.status import error_from_rpc

if TYPE_CHECKING:
    from broker.client.push_consumer import PushConsumer

log = logging.getLogger(__name__)

EARLY_ANSWER_BACKOFF_S = 0.1
LOCK_RETRY_S = 1.0  # orderly: an unlocked queue (held by another consumer) is tried again this often


class QueueWorker(threading.Thread):
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
        self._ahead: ThreadPoolExecutor | None = None  # sends the next pull while the listener works (_pull_ahead)

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
                    self._stream[1].cancel()  # ends a pull sent ahead, too
            if self._ahead is not None:
                self._ahead.shutdown(wait=False)
            self.owner._worker_done(self)

    def _loop(self) -> None:
        o, mq = self.owner, self.key
        while o.orderly and not o._hold_lock(mq):  # the lock first: the previous owner commits before it unlocks
            if self.dropped.wait(LOCK_RETRY_S):
                return
        offset = self._initial_offset()
        ahead: tuple[float, Future[pb.PullResponse | None]] | None = None  # the next pull, sent while consuming
        while offset is not None and not self.dropped.is_set():
            if o.orderly and not o._hold_lock(mq):
                self.dropped.wait(LOCK_RETRY_S)
                continue
            started = time.monotonic()
            try:
                if ahead is None:
                    response = self._pull(offset)
                else:
                    (started, pending), ahead = ahead, None
                    response = pending.result()
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
                ahead = self._pull_ahead(response.next_begin_offset)
                if not self._consume(messages):
                    return
            elif status is PullStatus.NO_NEW_MSG and time.monotonic() - started < o.long_poll_ms / 2000:
                # Answered early without news: the broker is out of held-pull capacity. Do not spin.
                self.dropped.wait(EARLY_ANSWER_BACKOFF_S)
            elif status is PullStatus.OFFSET_ILLEGAL:
                log.warning("offset %d of %s is illegal (queue holds %d..%d); continuing at %d", offset, mq,
                            response.min_offset, response.max_offset, response.next_begin_offset)
            offset = response.next_begin_offset
            o.offsets.update(mq, offset)

    def _pull_ahead(self, offset: int) -> tuple[float, Future[pb.PullResponse | None]] | None:
        """A concurrent consumer's next pull, sent before the listener is called with this one's messages, so that
        the broker finds and sends the next answer while the listener works (one after the other, the two take
        the larger part of a push consumer's time a message). Its offset is this answer's next one whatever the
        listener says: a failed message is sent back (or retried here) before the worker moves on. The pull
        carries the commit of what was consumed before this answer; the rest goes with the next pull or the
        periodic commit. Orderly consumers pull after each answer, under the queue's lock."""
        if self.owner.orderly:
            return None
        try:
            if self._ahead is None:
                self._ahead = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"pull-ahead-{self.key}")
            return time.monotonic(), self._ahead.submit(self._pull, offset)
        except RuntimeError:  # the interpreter is exiting (no new threads): the loop pulls this one itself
            return None

    def _initial_offset(self) -> int | None:
        """Where to start; asked again while the broker cannot answer (say it restarts), None once dropped."""
        while not self.dropped.is_set():
            try:
                return self.owner.offsets.initial_offset(self.key)
            except BrokerError as e:
                log.warning("cannot find where to start %s: %s; retrying in %d ms", self.key, e.message,
                            self.owner.pull_backoff_ms)
                self.dropped.wait(self.owner.pull_backoff_ms / 1000)
        return None

    def _pull(self, offset: int) -> pb.PullResponse | None:
        o, mq = self.owner, self.key
        commit = o.offsets.pending_commit(mq) if o.model is CLUSTERING else None
        request = pb.PullRequest(
            consumer_group=o.group, topic=mq.topic, queue_id=mq.queue_id, queue_offset=offset,
            max_msgs=o.pull_batch_size, suspend_timeout_ms=o.long_poll_ms, tag_expression=o.subscription[mq.topic],
            commit_offset=-1 if commit is None else commit, expression_type=o.expression_types.get(mq.topic, "TAG"),
        )
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

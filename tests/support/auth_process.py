"""A broker process with ``--auth`` for the authorization tests, and what they do to it: users with chosen rights,
raw calls on Sluice's own stubs and on RocketMQ 5's, signed as one user, and the victim's objects (an open
transaction, a stored message) that an attacker tries to reach."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
from rocketmq.grpc_protocol import definition_pb2 as v2
from rocketmq.grpc_protocol import service_pb2 as v2s
from rocketmq.grpc_protocol import service_pb2_grpc as v2g

from broker.client import Message, encode_message
from broker.client.connection import Connection
from broker.client.credentials import Credentials
from broker.client.half_batch import to_half_batch
from broker.errors import TopicNotExistError
from broker.private_file import write_private
from broker.proto import coordinator_pb2_grpc as cpb_grpc
from broker.proto import sluice_pb2 as pb
from broker.server.process import BrokerProcess

ROOT = Credentials("root", "root-secret-value")
SETTINGS: dict[str, Any] = {
    "auth_enabled": True,
    "allow_plaintext_auth": True,  # loopback only: these tests are about rights, test_auth_broker about TLS
    "auth_root_access_key": ROOT.access_key,
    "auth_root_secret_key": ROOT.secret_key,
    # A victim's transaction must stay open for the whole test: no check-back rolls it back meanwhile.
    "transaction_timeout_ms": 600_000,
    "store": {"mapped_file_size_commit_log": 16 << 20, "mapped_file_size_consume_queue": 4000 * 20,
              "max_hash_slot_num": 4096, "max_index_num": 16384},
}
CLIENT_ID_HEADER = "x-mq-client-id"
_users = itertools.count()
FORBIDDEN = v2.Code.FORBIDDEN


def start_secured(root: Path) -> BrokerProcess:
    config = root / "broker.json"
    write_private(config, json.dumps(SETTINGS).encode())  # it holds the root secret: 0600, or the broker refuses it
    return BrokerProcess(root / "store", config=config, log_level="WARNING").start()


@contextmanager
def secured_broker(root: Path) -> Iterator[Secured]:
    """``start_secured(root)``'s broker, to call with auth; afterwards stopped cleanly (asserted)."""
    proc = start_secured(root)
    yield Secured(proc)
    assert proc.stop() == 0, "\n".join(proc.output)


def unique(prefix: str) -> str:
    """A name no other test has used: ``prefix`` and eight random hex digits."""
    return f"{prefix}{uuid.uuid4().hex[:8]}"


class Secured:
    """Calls on one broker process with auth."""

    def __init__(self, proc: BrokerProcess) -> None:
        self.proc = proc
        self.endpoint = proc.endpoint

    @contextmanager
    def _connection(self, creds: Credentials | None) -> Iterator[Connection]:
        conn = Connection(self.endpoint, 10, None, creds)
        try:
            yield conn
        finally:
            conn.close()

    def call(self, method: str, request: Any, creds: Credentials | None = ROOT) -> Any:
        """A Sluice Broker call; a refusal raises its BrokerError (NoPermissionError for NO_PERMISSION)."""
        with self._connection(creds) as conn:
            return conn.call(getattr(conn.stub, method), request)

    def coordinator(self, method: str, request: Any, creds: Credentials = ROOT) -> Any:
        """A TransactionCoordinator call; a refusal raises the gRPC error."""
        with grpc.insecure_channel(self.endpoint) as channel:
            rpc = getattr(cpb_grpc.TransactionCoordinatorStub(channel), method)
            return rpc(request, metadata=creds.metadata(), timeout=10)

    def v2(self, method: str, request: Any, creds: Credentials) -> Any:
        """A RocketMQ 5 call (unary answers; a streaming one's answers as a list). Refusals by the gate are the
        call's gRPC error; those of an operation on what it resolved are in the answer's status (FORBIDDEN), as
        every refusal of that protocol's handlers."""
        with grpc.insecure_channel(self.endpoint) as channel:
            rpc = getattr(v2g.MessagingServiceStub(channel), method)
            client_id = f"auth-test-{creds.access_key}"  # a client id belongs to the first user naming it
            answer = rpc(request, metadata=[*creds.metadata(), (CLIENT_ID_HEADER, client_id)], timeout=10)
            return list(answer) if method in ("ReceiveMessage", "PullMessage") else answer

    def user(self, *grants: tuple[str, str] | tuple[str, str, str]) -> Credentials:
        """A new user holding exactly ``grants`` ((resource, "Pub,Sub"[, "Deny"]), ...; Allow by default)."""
        creds = Credentials(f"user{next(_users)}", "user-secret-value")
        self.call("CreateUser", pb.UserRequest(access_key=creds.access_key, secret_key=creds.secret_key))
        for resource, actions, *decision in grants:
            entry = pb.AclEntry(access_key=creds.access_key, resource=resource, actions=actions.split(","),
                                decision=decision[0] if decision else "Allow")
            self.call("GrantAcl", pb.GrantAclRequest(entry=entry))
        return creds

    # ------------------------------------------------------------------------------------------ the victim's
    def topic(self, name: str, queues: int = 1) -> str:
        self.call("CreateTopic", pb.CreateTopicRequest(topic=name, queue_nums=queues, if_not_exists=True))
        return name

    def send(self, topic: str, body: bytes, creds: Credentials = ROOT) -> pb.SendResponse:
        return self.call("SendMessage", pb.SendMessageRequest(topic=topic, queue_id=0, body=body), creds)

    def open_transaction(self, topic: str, producer_group: str, txn_id: str) -> pb.SendResponse:
        """One half of a new transaction, sent by the root user for its producer."""
        return self.call("SendMessage", pb.SendMessageRequest(topic=topic, queue_id=0, body=b"victim half",
                                                              producer_group=producer_group, transactional=True,
                                                              transaction_id=txn_id))

    def open_batch_transaction(self, topic: str, producer_group: str, txn_id: str, count: int = 2
                               ) -> pb.SendResponse:
        """Halves sent with SendBatch: the broker keeps no per-half index of them (looked up in the store)."""
        entries = b"".join(encode_message(Message(topic, b"victim batch half %d" % i), 0) for i in range(count))
        entries = to_half_batch(entries, producer_group, txn_id)  # as the Producer sends a transaction's batch
        return self.call("SendBatch", pb.SendBatchRequest(entries=entries, count=count, producer_group=producer_group,
                                                          transaction_id=txn_id))

    def transaction(self, txn_id: str) -> pb.TransactionInfo | None:
        """What the super user sees of a transaction (None: none recorded under that id)."""
        found = self.call("ListTransactions", pb.ListTransactionsRequest(prefix=txn_id)).transactions
        return next((t for t in found if t.transaction_id == txn_id), None)

    def visible(self, topic: str, group: str = "AuditG") -> int:
        """Messages a consumer with every right reads from queue 0 of ``topic`` (the super user's pull)."""
        answer = self.call("PullMessage", pb.PullRequest(consumer_group=group, topic=topic, queue_id=0,
                                                         queue_offset=0, max_msgs=64))
        return len(answer.entry_positions)

    def max_offset(self, topic: str) -> int:
        """Messages stored in ``topic`` (0 when it does not exist)."""
        try:
            ranges = self.call("GetQueueOffsets", pb.GetQueueOffsetsRequest(topic=topic)).queues
        except TopicNotExistError:
            return 0
        return sum(q.max_offset for q in ranges)


def v2_refused(call: Callable[[], Any]) -> bool:
    """Whether a RocketMQ 5 call was refused for permission, by the gate or in its answer (``Secured.v2``)."""
    try:
        answer = call()
    except grpc.RpcError as e:
        return e.code() is grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined, no-any-return]
    if hasattr(answer, "entries") and answer.entries and answer.entries[0].HasField("status"):
        return answer.entries[0].status.code == FORBIDDEN  # type: ignore[no-any-return]
    return v2_status(answer) == FORBIDDEN


def v2_status(answer: Any) -> int:
    """The code of a RocketMQ 5 answer (a streaming one's first status)."""
    if isinstance(answer, list):
        return next(a.status.code for a in answer if a.HasField("status"))
    return int(answer.status.code)


def v2_end(topic: str, txn_id: str) -> Any:
    return v2s.EndTransactionRequest(topic=v2.Resource(name=topic), transaction_id=txn_id, message_id=txn_id,
                                     resolution=v2.COMMIT, source=v2.SOURCE_CLIENT)


def name_resources(request: Any, name: str, message_type: str, topic: str, group: str) -> None:
    """Fill a sample request's message field ``name`` (of ``message_type``) so that it names ``topic`` and
    ``group``, the way every front's requests carry them: what an authorization test needs its rights read from."""
    if name in ("topic", "group") and message_type == "Resource":
        getattr(request, name).name = topic if name == "topic" else group
    elif name == "message_queue":
        request.message_queue.topic.name = topic
    elif name == "messages":
        request.messages.add().topic.name = topic
    elif name in ("offsets", "queues"):
        getattr(request, name).add().topic = topic

"""One error hierarchy for the whole broker.

Every error carries a RocketMQ-style response code (``ResponseCode``) so that the gRPC layer can map it to a
status and a client can act on it without parsing text. Messages say what was wrong and what to do about it.
"""

from __future__ import annotations

import enum


class ResponseCode(enum.IntEnum):
    """RocketMQ's ``ResponseCode`` values, kept numerically identical so logs read the same."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208
    # Sluice additions (RocketMQ has no code for these; numbers kept out of its ranges).
    STORE_CORRUPTED = 900
    INVALID_ARGUMENT = 901
    INVALID_RECEIPT_HANDLE = 902  # pop: a handle not issued here, altered, expired, acked or superseded
    LIMIT_EXCEEDED = 903  # a configured bound (topics, queues, groups...) refuses the request; retrying will not help
    # Fewer in-sync replicas than min_insync_replicas: the write was refused before anything was stored (Kafka's
    # NOT_ENOUGH_REPLICAS). Another broker group may take it.
    NOT_ENOUGH_REPLICAS = 904
    # This broker is not its group's master (a slave, or a master fenced by a newer epoch): nothing was done; the
    # client finds the group's master through the name servers.
    NOT_MASTER = 905
    # No valid credentials: none given where the broker requires them, an unknown or disabled access key, a wrong
    # signature, a malformed header, or a timestamp outside the broker's window (broker/auth). RocketMQ answers
    # these with NO_PERMISSION too; a client must be able to tell "who are you" from "you may not".
    UNAUTHENTICATED = 906


# Values from a request that an error message repeats are cut to this many characters: a message travels in the
# gRPC status details (a header, percent-encoded, capped at a few KiB by the receiver), and an echo of a 20,000-
# character field would replace the real error with a transport one.
ECHO_MAX_CHARS = 60


def shown(value: object, limit: int = ECHO_MAX_CHARS) -> str:
    """``repr(value)`` for an error message, cut to about ``limit`` characters with how much was left out."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...(+{len(text) - limit} chars)"


class BrokerError(Exception):
    """Base of every error Sluice raises on purpose. ``code`` says what kind; the text says what to do."""

    code: ResponseCode = ResponseCode.SYSTEM_ERROR

    def __init__(self, message: str, code: ResponseCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class InvalidArgumentError(BrokerError):
    """A caller passed a value outside what the broker accepts (bad offset, unknown option...)."""

    code = ResponseCode.INVALID_ARGUMENT


class MessageIllegalError(BrokerError):
    """A message (or batch buffer) that cannot be stored as sent: bad topic, too big, bad CRC, bad framing."""

    code = ResponseCode.MESSAGE_ILLEGAL


class ServiceNotAvailableError(BrokerError):
    """The store refuses writes: shut down, disk full, or read-only after an I/O error."""

    code = ResponseCode.SERVICE_NOT_AVAILABLE

    @classmethod
    def files_failed(cls, e: OSError) -> ServiceNotAvailableError:
        """A request the broker's files failed (a full disk, say): not the request's fault, so the caller may ask
        again; every front answers it so."""
        return cls(f"the broker's files failed it ({e}); retry later")


class BrokerUnreachableError(ServiceNotAvailableError):
    """No answer from the broker (connection refused or reset, deadline passed): the request may or may not have
    been carried out, so only idempotent requests may be sent again blindly. ``request_sent`` is False only when
    the connection could not be made at all, so the broker never saw the request."""

    def __init__(self, message: str, code: ResponseCode | None = None, *, request_sent: bool = True) -> None:
        super().__init__(message, code)
        self.request_sent = request_sent


class TlsError(BrokerUnreachableError):
    """A connection the TLS layer refused (plain text against TLS or the reverse, an untrusted certificate, one
    for another host, a client certificate missing or refused): nothing was sent; the message says what to change
    (broker/client/tls.py diagnoses it)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, request_sent=False)


class SendOutcomeUnknownError(BrokerUnreachableError):
    """A send whose answer never came, even after retries to the same broker: the message may be stored (once; a
    retry is never stored a second time) or not. Look it up by its UNIQ_KEY (``sluice query key``) before sending
    it again."""


class FlushDiskTimeoutError(BrokerError):
    """A SYNC_FLUSH write was appended but not confirmed on disk in time; it may or may not survive a crash."""

    code = ResponseCode.FLUSH_DISK_TIMEOUT


class FlushSlaveTimeoutError(BrokerError):
    """A SYNC_MASTER write was stored on the master but the in-sync replicas did not confirm it in time: it may or may
    not survive a failover. A producer reports the outcome as unknown (SendOutcomeUnknownError)."""

    code = ResponseCode.FLUSH_SLAVE_TIMEOUT


class NotEnoughReplicasError(ServiceNotAvailableError):
    """Refused before anything was written: the group's in-sync set is smaller than min_insync_replicas."""

    code = ResponseCode.NOT_ENOUGH_REPLICAS


class NotMasterError(ServiceNotAvailableError):
    """Refused before anything was done: this broker is not its group's master (a write, or an admin change)."""

    code = ResponseCode.NOT_MASTER


class NoPermissionError(BrokerError):
    """The request is well formed but not allowed: a system topic read from outside the broker, a group whose
    consumption is disabled, a dead-letter queue pulled."""

    code = ResponseCode.NO_PERMISSION


class AuthenticationError(BrokerError):
    """The request carries no valid credentials (broker/auth); the message says which check failed, never a secret."""

    code = ResponseCode.UNAUTHENTICATED


class LimitExceededError(BrokerError):
    """A configured bound of the broker refuses the request (topics it may create, queues it may hold...); the
    message names the setting. Sending the same request again will not help."""

    code = ResponseCode.LIMIT_EXCEEDED


class SystemBusyError(BrokerError):
    """The broker is overloaded and refused the request before doing anything: send it again after a pause."""

    code = ResponseCode.SYSTEM_BUSY


class TopicNotExistError(BrokerError):
    code = ResponseCode.TOPIC_NOT_EXIST


class TopicExistsError(BrokerError):
    code = ResponseCode.TOPIC_EXIST_ALREADY


class SubscriptionGroupNotExistError(BrokerError):
    code = ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST


class SubscriptionParseError(BrokerError):
    code = ResponseCode.SUBSCRIPTION_PARSE_FAILED


class QueryNotFoundError(BrokerError):
    code = ResponseCode.QUERY_NOT_FOUND


class InvalidReceiptHandleError(BrokerError):
    """Pop consumption: a receipt handle this broker did not issue, altered, expired, acked or superseded by a later
    delivery or change of invisible time. Receive the message again."""

    code = ResponseCode.INVALID_RECEIPT_HANDLE


class CorruptionError(BrokerError):
    """Bytes on disk that fail a check (magic, CRC, length). Always names the file and the byte offset."""

    code = ResponseCode.STORE_CORRUPTED

    def __init__(self, message: str, path: str = "", offset: int = -1) -> None:
        where = f" ({path} at byte {offset})" if path else ""
        super().__init__(message + where)
        self.path = path
        self.offset = offset


class StoreLockedError(BrokerError):
    """Another broker process already holds the store directory's ``lock`` file."""

    code = ResponseCode.SERVICE_NOT_AVAILABLE


class RemotingFrameError(BrokerError):
    """A remoting frame that cannot be read (broker/remoting/frame.py): a length over the limit, a negative or
    oversized header length, a truncated frame, an unknown serialization type or a header that does not parse. The
    transport closes that connection: after a bad frame the stream's boundaries are lost."""

    code = ResponseCode.INVALID_ARGUMENT

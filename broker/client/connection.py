"""One gRPC channel to a broker, with errors turned back into the broker's own BrokerError classes.

An endpoint is ``host:port`` (``[ipv6]:port``) or several comma-separated; with several, the first that answers is
used. Each must name its port (``broker/address.py``): gRPC would otherwise try 443 and wait for a broker that
is not there. ``https://host:port`` or TLS settings make the channel TLS (broker/client/tls.py); a call that fails
at the TLS layer raises TlsError saying why.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from broker.address import DEFAULT_PORT, format_address, parse_endpoint
from broker.client.call_stream import CallStream
from broker.client.credentials import Credentials, signed_channel
from broker.client.tls import TlsSettings, explain, open_channel, resolve
from broker.errors import BrokerError, InvalidArgumentError, ServiceNotAvailableError
from broker.proto import HTTP2_MAX_FRAME_BYTES
from broker.proto import sluice_pb2 as pb
from broker.proto import sluice_pb2_grpc as pb_grpc
from broker.proto.status import error_from_rpc
from broker.proto.wire import serialize

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = f"127.0.0.1:{DEFAULT_PORT}"
ENDPOINT_ENV = "SLUICE_ENDPOINT"
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
CONNECT_PROBE_S = 1.0  # how long to try each of several endpoints before moving on
# gRPC waits longer and longer between attempts to reach a broker that does not answer (up to 120 s by default),
# and a call in between fails at once: a broker back after a few minutes away would be used again only up to two
# minutes later. Every client channel to one address shares that wait (gRPC's subchannel pool), so a consumer
# retrying its pulls kept even a new producer away. Tried again at least every second instead (RocketMQ's client
# connects again at the next request).
MAX_RECONNECT_BACKOFF_MS = 1000
# How long one attempt to connect may take (gRPC's option for it is named min_reconnect_backoff; its default is
# 20 s). A host that drops the SYNs (a killed container whose address is still in this machine's ARP cache, a
# firewall) would otherwise hold a call until its own deadline, and DEADLINE_EXCEEDED counts as "may have reached
# the broker": a producer could not send the message to another broker. A failed connect is UNAVAILABLE, "failed to
# connect", which is known never to have left. RocketMQ's client gives up connecting after 3 s too
# (connectTimeoutMillis).
CONNECT_TIMEOUT_MS = 3000
T = TypeVar("T")


def resolve_endpoint(endpoint: str | None) -> str:
    return endpoint or os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT


def _channel(target: str, tls: TlsSettings | None, credentials: Credentials | None) -> grpc.Channel:
    return signed_channel(open_channel(
        target,
        [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.enable_retries", 0),
            ("grpc.http2.max_frame_size", HTTP2_MAX_FRAME_BYTES),
            ("grpc.initial_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
            ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
            ("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_MS),
        ],
        tls,
    ), credentials)


def _core_connectivity_check(channel: grpc.Channel) -> Callable[[bool], int] | None:
    """gRPC core's ``check_connectivity_state`` of ``channel``, found once by attribute (grpcio's internals): under
    the signing interceptor's wrapper (credentials.py) and grpcio's channel. None where it is not there."""
    core: Any = channel
    for _ in range(3):
        check = getattr(core, "check_connectivity_state", None)
        if check is not None:
            return check
        core = getattr(core, "_channel", None)
    return None


class Connection:
    def __init__(self, endpoint: str | None = None, timeout_s: float = 30.0, tls: TlsSettings | None = None,
                 credentials: Credentials | None = None) -> None:
        self.credentials = credentials
        plain, self.tls = resolve(resolve_endpoint(endpoint), tls)
        assert plain is not None
        self.endpoint = plain
        targets = [format_address(*parse_endpoint(e)) for e in self.endpoint.split(",") if e.strip()]
        if not targets:
            raise InvalidArgumentError(f"endpoint {endpoint!r} names no broker; write HOST:PORT[,HOST:PORT...]")
        self.timeout_s = timeout_s
        self.target, self.channel = self._connect(targets)
        self.stub = pb_grpc.BrokerStub(self.channel)
        # SendBatch takes Framed requests too (broker/proto/wire.py): a batch's entries are not copied by protobuf
        self.stub.SendBatch = self.channel.unary_unary(
            f"/{pb.DESCRIPTOR.services_by_name['Broker'].full_name}/SendBatch", request_serializer=serialize,
            response_deserializer=pb.SendResponse.FromString,
        )
        self._connectivity = _core_connectivity_check(self.channel)
        self.send_stream = CallStream(self.stub.SendStream, self.explain, self.connected)

    def _connect(self, targets: list[str]) -> tuple[str, grpc.Channel]:
        if len(targets) == 1:
            # connect lazily; errors surface on the first call
            return targets[0], _channel(targets[0], self.tls, self.credentials)
        for target in targets:
            channel = _channel(target, self.tls, self.credentials)
            try:
                grpc.channel_ready_future(channel).result(timeout=CONNECT_PROBE_S)
                return target, channel
            except grpc.FutureTimeoutError:
                log.warning("broker %s did not answer within %.0f s; trying the next endpoint", target, CONNECT_PROBE_S)
                channel.close()
        raise ServiceNotAvailableError(f"none of the brokers {targets} answered; check they run and the addresses")

    def call(self, method: Callable[..., T], request: Any, timeout_s: float | None = None) -> T:
        """Invoke a stub method; a failed call raises the broker's BrokerError subclass."""
        try:
            return method(request, timeout=timeout_s or self.timeout_s)
        except grpc.RpcError as e:
            raise self.explain(error_from_rpc(e)) from None

    def send_message(self, request: pb.SendMessageRequest, timeout_s: float | None = None) -> pb.SendResponse:
        """SendMessage, on the connection's send stream when it can take it (call_stream.py), else as a call."""
        response: pb.SendResponse | None = self.send_stream.call(request, timeout_s or self.timeout_s)
        if response is None:
            response = self.call(self.stub.SendMessage, request, timeout_s)
        return response

    def connected(self) -> bool:
        """Whether gRPC core holds a live connection to the broker now. A stream opened on a connection that has
        since closed (the broker killed) would take a request and fail it with an unknown outcome; core knows of the
        close as soon as its own threads read it, before the stream's status reaches Python (call_stream.py). Read
        through grpcio's channel internals: True (no check) where they are not as expected."""
        return self._connectivity is None or self._connectivity(False) == grpc.ChannelConnectivity.READY.value[0]

    def explain(self, error: BrokerError) -> BrokerError:
        """``error`` with what the TLS layer says of this connection when it failed there (tls.py)."""
        return explain(error, self.target, self.tls)

    def close(self) -> None:
        self.send_stream.close()
        self.channel.close()


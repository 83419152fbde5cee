"""NameServer: the route table behind a gRPC port, and the thread that expires silent brokers.

Expiry also runs on every read and registration, so a route never names a broker past its expiry time; the
thread only keeps the log honest when nobody asks (RocketMQ scans every 5 s as well). With ``tls`` the port serves
TLS (broker/server/server_tls.py); brokers and clients then connect with TLS settings of their own.

Who may register. Registration is the cluster's control plane: a registration names where clients send and read
(a broker of the same name with a higher epoch replaces the real master in every route) and an unregistration
takes a broker out of them. So a name server needs a ``root`` user, the cluster's credential that every broker signs
its registrations with (broker/auth/gate.py checks each RegisterBroker and UnregisterBroker; route reads stay
open, broker/auth/requirements.py says why), and refuses to be made without one unless told
``allow_anonymous_registration``: anyone who reaches the port may then register and unregister brokers, which is
for tests and development on a trusted machine only. With a root user that setting changes nothing.

With ``remoting_listen`` (``HOST:PORT``) the name server also serves RocketMQ's remoting protocol on that port, for
RocketMQ 4 clients and ``mqadmin`` (broker/namesrv/remoting_processor.py): route reads (and, without a root user,
``mqadmin deleteTopic``'s route deletion), with the same TLS settings; registration stays on the gRPC port.
"""

from __future__ import annotations

import logging
import threading
from concurrent import futures

import grpc

from broker.auth.accounts import Accounts, User
from broker.auth.gate import AuthGate, AuthSettings
from broker.errors import InvalidArgumentError, ServiceNotAvailableError
from broker.format.signature import DEFAULT_WINDOW_S, ROOT_ACCESS_KEY_ENV, ROOT_SECRET_KEY_ENV
from broker.namesrv.name_server_service import NameServerService, now_ms
from broker.namesrv.remoting_processor import NameServerRemoting
from broker.namesrv.route_table import DEFAULT_BROKER_EXPIRE_MS, RouteTable
from broker.proto import namesrv_pb2_grpc as npb_grpc
from broker.remoting.admission import anonymous_codes, declared_codes
from broker.remoting.authentication import Authenticator
from broker.remoting.server import RemotingServer
from broker.server.metrics import Counter
from broker.server.server_tls import ServerTls, add_port

log = logging.getLogger(__name__)

DEFAULT_NAMESRV_PORT = 9876  # RocketMQ's
EXPIRE_SCAN_MS = 5_000
MAX_WORKERS = 32  # every call is a short in-memory lookup; no call is ever held
SHUTDOWN_GRACE_S = 5.0


class NameServer:
    def __init__(self, host: str = "0.0.0.0", port: int = DEFAULT_NAMESRV_PORT,
                 broker_expire_ms: int = DEFAULT_BROKER_EXPIRE_MS, tls: ServerTls | None = None,
                 root: User | None = None, auth_window_s: int = DEFAULT_WINDOW_S,
                 allow_anonymous_registration: bool = False,
                 remoting_listen: tuple[str, int] | None = None) -> None:
        """``root``: brokers must sign their registrations as this user. Without one, InvalidArgumentError unless
        ``allow_anonymous_registration`` (module docstring)."""
        if broker_expire_ms <= 0:
            raise ValueError("broker_expire_ms must be > 0")
        if root is None and not allow_anonymous_registration:
            raise InvalidArgumentError(
                f"a name server needs the cluster's root user, which brokers sign their registrations with: set "
                f"{ROOT_ACCESS_KEY_ENV} and {ROOT_SECRET_KEY_ENV} as for the brokers. Without it anyone who reaches "
                "the port can register a broker (taking over a master's routes) or unregister one; "
                "--allow-anonymous-registration allows that, for tests and development only"
            )
        self.host, self.port = host, port
        self.tls = tls
        self.root = root
        self.refusals = Counter("sluice_namesrv_auth_refusals_total", "Registrations refused by authentication")
        self.gate = AuthGate(Accounts(None, root), AuthSettings(auth_window_s, False), self.refusals) if root else None
        self.table = RouteTable(broker_expire_ms)
        self.server: grpc.Server | None = None
        self.remoting: RemotingServer | None = None
        if remoting_listen is not None:
            # With a root user, every code the requirement table does not mark ANONYMOUS (all but the route reads)
            # takes the root user's RocketMQ ACL signature, as the gRPC port's registrations do.
            authenticator = (Authenticator(Accounts(None, root), anonymous_codes(), self.refusals, declared_codes())
                             if root else None)
            processors = NameServerRemoting(self.table, now_ms, open_routes=self.gate is None).processors()
            self.remoting = RemotingServer(processors, *remoting_listen, tls=tls, name="namesrv-remoting",
                                           authenticator=authenticator)
        self._stop = threading.Event()
        self._expiry: threading.Thread | None = None

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def start(self) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(MAX_WORKERS, "namesrv-worker"),
                             options=[("grpc.so_reuseport", 0)],
                             interceptors=[self.gate] if self.gate is not None else [])
        target = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        try:
            self.port = add_port(server, target, self.tls, "the name server")
        except RuntimeError as e:
            raise ServiceNotAvailableError(f"cannot listen on {target} ({e}); is another process using it?") from None
        npb_grpc.add_NameServerServicer_to_server(NameServerService(self.table, authenticated=self.gate is not None),
                                                  server)
        server.start()
        self.server = server
        if self.remoting is not None:
            try:
                self.remoting.start()
            except ServiceNotAvailableError:
                server.stop(None)
                self.server = None
                raise
        self._expiry = threading.Thread(target=self._expire_loop, name="namesrv-expiry", daemon=True)
        self._expiry.start()
        log.info("name server listening on %s (brokers expire after %d ms)", self.address, self.table.broker_expire_ms)
        if self.root is not None:
            log.info("registrations must be signed as root user %r", self.root.access_key)
        else:
            log.warning("registration is NOT authenticated (--allow-anonymous-registration): anyone who reaches %s "
                        "can register or unregister brokers; brokers with --auth will not register here; for tests "
                        "and development only", self.address)

    def _expire_loop(self) -> None:
        while not self._stop.wait(EXPIRE_SCAN_MS / 1000):
            self.table.expire(now_ms())

    def shutdown(self) -> None:
        self._stop.set()
        if self.remoting is not None:
            self.remoting.shutdown()
        if self.server is not None:
            self.server.stop(SHUTDOWN_GRACE_S).wait()
            self.server = None
        if self._expiry is not None:
            self._expiry.join()
        log.info("name server stopped")

    def __enter__(self) -> NameServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

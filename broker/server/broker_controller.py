"""BrokerController: owns the store, the managers, the gRPC server, the metrics endpoint and periodic tasks.

Start-up order follows RocketMQ's BrokerController: load config files, start the store (which recovers), then
open the network. Shutdown reverses it: release held pulls, stop accepting and let in-flight calls finish, stop
periodic tasks, persist offsets and topics, shut the store down (flush, remove the abort file, release the lock).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc

from broker.address import check_port_free, format_address
from broker.auth.accounts import USERS_FILE, Accounts, root_user
from broker.auth.accounts_admin import AccountsAdmin
from broker.auth.gate import AuthGate, AuthSettings
from broker.auth.held_streams import UserStreams
from broker.auth.http_basic import metrics_access
from broker.auth.operations import transaction_access
from broker.client.coordinator import CoordinatorClient
from broker.client.namesrv_client import NameServerClient
from broker.client.router import Router
from broker.config import BrokerConfig, parse_host_port
from broker.errors import InvalidArgumentError, ServiceNotAvailableError
from broker.format.message import StoredMessage
from broker.format.signature import ROOT_ACCESS_KEY_ENV, ROOT_SECRET_KEY_ENV
from broker.ha.manager import BrokerHooks, ReplicationManager
from broker.ha.replication_gate import ReplicationGate
from broker.ha.replication_metrics import register_replication_metrics
from broker.namesrv.route_table import Runtime
from broker.proto import HTTP2_MAX_FRAME_BYTES
from broker.proto import coordinator_pb2_grpc as cpb_grpc
from broker.proto import sluice_pb2_grpc as pb_grpc
from broker.remoting.admin_table import admin_processors
from broker.remoting.admission import anonymous_codes, declared_codes
from broker.remoting.authentication import Authenticator
from broker.remoting.broker_table import broker_processors
from broker.remoting.client_processor import ClientProcessors
from broker.remoting.message_ids import RemotingIds
from broker.remoting.message_outcomes import Access
from broker.remoting.message_processors import MessageProcessors, message_processors
from broker.remoting.server import RemotingServer
from broker.rmqv2 import wiring as rmqv2_wiring
from broker.rmqv2.clients import ClientRegistry
from broker.semantics import (
    QueueLockManager,
    RetryService,
    ScheduleMessageService,
    SubscriptionGroupManager,
    TransactionService,
)
from broker.semantics.coordinator_names import CoordinatorNames
from broker.semantics.decision_log import DecisionLog
from broker.semantics.participant_resolver import ParticipantResolver
from broker.semantics.pop import PopService
from broker.semantics.timer import TimerService
from broker.server.admin_processor import AdminProcessor
from broker.server.broker_gauges import register_broker_gauges
from broker.server.broker_identity import BrokerIdentity, default_broker_name, load_store_id
from broker.server.broker_service import BrokerService
from broker.server.call_streams import PULL_MESSAGE_METHOD, SEND_MESSAGE_METHOD, CallStreams, through_interceptors
from broker.server.check_streams import CheckHub
from broker.server.consumer_manager import ConsumerManager
from broker.server.consumer_offsets import ConsumerOffsetManager
from broker.server.coordinator_service import CoordinatorService, coordinator_asker
from broker.server.metrics import BrokerMetrics, MetricsServer
from broker.server.pop_processor import PopProcessor
from broker.server.pull_hold import PullHoldService
from broker.server.pull_processor import PullProcessor
from broker.server.registration import NameServerRegistrar
from broker.server.request_guard import MalformedRequestGuard
from broker.server.retry_processor import RetryProcessor
from broker.server.send_dedup import SendDeduplicator
from broker.server.send_processor import SendProcessor
from broker.server.server_tls import add_port
from broker.server.topic_config import TopicConfigManager
from broker.server.transaction_processor import TransactionProcessor
from broker.store import MessageStore

log = logging.getLogger(__name__)

CONSUMER_EXPIRE_SCAN_MS = 10_000  # RocketMQ's ClientHousekeepingService scans every 10 s
RESTART_BIND_WAIT_S = 30.0  # a restart in place retries binding its ports this long
POP_REVIVE_S = 0.5  # pop: dead letters nobody popped, auto-renewals, offsets (renewals act 10 s ahead: ample)
COORDINATOR_CALL_TIMEOUT_S = 10.0  # a participant's question to a coordinator broker: an in-memory lookup there


def advertised_ip(host: str) -> str:
    """The IPv4 put in msgIds: the listen host when it is concrete, else this machine's address."""
    if host not in ("", "0.0.0.0", "::"):
        try:
            return socket.gethostbyname(host)
        except OSError:
            return "127.0.0.1"
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class BrokerController:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        # every series names its broker: one Prometheus scrapes all brokers of a cluster
        self.metrics = BrokerMetrics((("cluster", config.cluster_name),
                                      ("broker", config.broker_name or default_broker_name())))
        self.topics = TopicConfigManager(
            config.config_dir, default_queue_nums=config.default_topic_queue_nums,
            max_queue_nums=config.max_topic_queue_nums, auto_create=config.auto_create_topic_enable,
            max_total_queue_nums=config.max_total_queue_nums,
            max_auto_create_topics_per_request=config.max_auto_create_topics_per_request,
        )
        self.offsets = ConsumerOffsetManager(config.config_dir)
        self.consumers = ConsumerManager(config.consumer_expire_ms, config.max_consumers)
        # Held pulls and transaction check streams each occupy a gRPC worker; together they stay within this, so
        # sends and admin calls always find one of the reserved workers. Streams may take half of it.
        max_held = config.grpc_max_workers - config.grpc_reserved_workers
        self.check_hub = CheckHub(max_streams=max(1, max_held // 2))
        # RocketMQ 5 clients' Telemetry streams hold a worker each too, as do held pops: all count against max_held.
        self.rmqv2_clients = ClientRegistry(expire_ms=config.consumer_expire_ms, max_streams=max(1, max_held // 2),
                                            max_clients=config.rmqv2_max_clients)
        self.call_streams = CallStreams(max_streams=max(1, max_held // 2))  # SendStream's, PullStream's
        self.pops: PopService | None = None
        self.timers: TimerService | None = None
        self.hold = PullHoldService(
            long_polling_enable=config.long_polling_enable, short_polling_time_ms=config.short_polling_time_ms,
            recheck_ms=config.long_polling_recheck_ms, max_held=max_held, held_elsewhere=self._held_elsewhere,
        )
        self.store: MessageStore | None = None
        # Broker semantics services: started after the store (tx recovery before serving), stopped before it.
        self.schedule: ScheduleMessageService | None = None
        self.transactions: TransactionService | None = None
        self.decisions: DecisionLog | None = None  # this broker as a coordinator (decision_log.py)
        self.participants: ParticipantResolver | None = None  # ... and as a participant
        self._coordinator_router: Router | None = None
        self.groups: SubscriptionGroupManager | None = None
        self.locks = QueueLockManager()
        self.server: grpc.Server | None = None
        self._interceptors: tuple[grpc.ServerInterceptor, ...] = ()  # the client port's, outermost first
        self.accounts: Accounts | None = None  # users and their access control entries (broker/auth)
        self.auth_gate: AuthGate | None = None  # with auth on
        self.metrics_server: MetricsServer | None = None
        self.port = 0
        self.host = config.listen_address[0]
        self._stop_tasks = threading.Event()
        self._tasks: threading.Thread | None = None
        self._stopped = False
        self._started_at = 0.0
        self.identity: BrokerIdentity | None = None
        self.registrar: NameServerRegistrar | None = None
        self.remoting: RemotingServer | None = None  # RocketMQ's remoting port (remoting_listen), when served
        self.remoting_messages: MessageProcessors | None = None  # its sends, pulls (and held pulls), send-backs
        # Replication (broker/ha): None for a broker on its own. The gate refuses writes on a slave and holds
        # acknowledgements for the in-sync replicas; the manager runs this replica's role.
        self.replication_settings = config.replication()
        self.gate = ReplicationGate()
        self.replication: ReplicationManager | None = None
        self._semantics_started = False
        if not hasattr(self, "_restart_lock"):
            # Kept across a restart in place, which runs __init__ again: the owner's shutdown waits for a restart
            # under way and then stops what it started, and a closed broker is never started again by one.
            self._restart_lock = threading.Lock()
            self._closed = False
        self._last_runtime = (time.monotonic(), 0.0, 0.0)  # (when, put messages, get messages) at the last report

    def _held_elsewhere(self) -> int:
        """Calls other than held pulls that hold a gRPC worker: check and Telemetry streams, send and pull streams
        between two requests (call_streams.py), held pops."""
        pops = self.pops.held_count() if self.pops is not None else 0
        streams = self.call_streams.waiting_count()
        return self.check_hub.open_count() + self.rmqv2_clients.open_count() + streams + pops

    def _check_back(self, group: str, txn_id: str, half: StoredMessage) -> None:
        """A transaction's check-back: through a RocketMQ 5 producer's Telemetry stream when one publishes to the
        group (the topic, as the RocketMQ proxy names it), else over a RocketMQ 4 producer's remoting connection,
        else through a Sluice producer's check stream."""
        if self.rmqv2_clients.check(group, txn_id, half):
            return
        remoting = self.remoting_messages.producers if self.remoting_messages is not None else None
        if remoting is None or not remoting.check(group, txn_id, half):
            self.check_hub.check(group, txn_id, half)

    @property
    def address(self) -> str:
        return format_address(self.host, self.port)

    @property
    def metrics_port(self) -> int | None:
        return self.metrics_server.port if self.metrics_server else None

    # ------------------------------------------------------------------------------------------------ start
    def start(self) -> None:
        cfg = self.config
        host, port = cfg.listen_address
        check_port_free(host, port)  # one clear error, before gRPC logs its own and before the store is made
        cfg.store_dir.mkdir(parents=True, exist_ok=True)
        options = [
            ("grpc.max_receive_message_length", cfg.grpc_max_message_bytes),
            ("grpc.max_send_message_length", cfg.grpc_max_message_bytes),
            ("grpc.so_reuseport", 0),  # a second broker on the same port must fail, not share it
            ("grpc.http2.max_frame_size", HTTP2_MAX_FRAME_BYTES),
        ]
        interceptors: list[grpc.ServerInterceptor] = [MalformedRequestGuard()]
        self.accounts = Accounts(cfg.config_dir, root_user(cfg))
        self.accounts.load()
        if cfg.auth_enabled:
            if not self.accounts.has_any_user():
                raise InvalidArgumentError(
                    f"auth is on and there is no user: set {ROOT_ACCESS_KEY_ENV} and {ROOT_SECRET_KEY_ENV} (or "
                    "auth_root_access_key and auth_root_secret_key) for the first super user"
                )
            tls = cfg.server_tls()
            held_budget = cfg.grpc_max_workers - cfg.grpc_reserved_workers  # as max_held in __init__
            self.auth_gate = AuthGate(self.accounts, AuthSettings(cfg.auth_window_s, tls is not None and
                                                                  tls.client_auth == "require"),
                                      self.metrics.auth_refusals, streams=UserStreams(held_budget))
            interceptors.append(self.auth_gate)
        if self.replication_settings is not None:
            interceptors.append(self.gate)
        self._interceptors = tuple(interceptors)
        server = grpc.server(futures.ThreadPoolExecutor(cfg.grpc_max_workers, "grpc-worker"), options=options,
                             interceptors=interceptors)
        try:
            self.port = add_port(server, format_address(host, port), cfg.server_tls(), "the broker's client port")
        except RuntimeError as e:
            raise ServiceNotAvailableError(
                f"cannot listen on {format_address(host, port)} ({e}); is another broker using it?"
            ) from None
        self.server = server
        try:
            cfg.store_dir.mkdir(parents=True, exist_ok=True)  # after the bind: a refused start leaves no directory
            self.topics.load()
            self.offsets.load()
            self.store = self._start_store(*self._store_host(host))
            self.topics.store_queue_ids = self.store.queue_ids
            for topic in self.store.topics():  # topics with data but no config entry (lost topics.json...)
                if self.topics.get(topic) is None:
                    self.topics.adopt(topic, self.store.queue_ids(topic))
            self._wire(server, self.store)
            self._start_replication(self.store)
            if cfg.metrics_port is not None:
                accounts = self.accounts
                access = (lambda header, peer: metrics_access(accounts, header, peer)) if cfg.auth_enabled else None
                self.metrics_server = MetricsServer(self.metrics, cfg.metrics_host, cfg.metrics_port,
                                                    cfg.server_tls(), access)
                self.metrics_server.start()
            self._tasks = threading.Thread(target=self._run_periodic_tasks, name="broker-tasks", daemon=True)
            self._tasks.start()
            server.start()
            self._start_remoting()
            self._start_registration()
        except BaseException:
            self._abort_start()
            raise
        self._started_at = time.time()
        log.info("broker listening on %s (store %s, %s)", self.address, cfg.store_dir, cfg.flush_disk_type)

    def advertised_address(self) -> str:
        """HOST:PORT registered with the name servers: what clients and other brokers connect to."""
        if self.config.advertised_address:
            return self.config.advertised_address
        ip = advertised_ip(self.host)
        return f"{ip}:{self.port}"

    def _own_identity(self) -> BrokerIdentity:
        if self.identity is None:
            cfg = self.config
            self.identity = BrokerIdentity(cfg.cluster_name, cfg.broker_name or default_broker_name(), cfg.broker_id,
                                           self.advertised_address(), load_store_id(cfg.config_dir))
        return self.identity

    def _start_remoting(self) -> None:
        """RocketMQ's remoting port beside the gRPC one, over the same processors (broker/remoting)."""
        cfg = self.config
        if not cfg.remoting_listen:
            return
        host, port = parse_host_port(cfg.remoting_listen)
        assert self.service is not None and self.store is not None
        consumers = self.service.consumers
        msg_ids = RemotingIds(self.store.msg_id_prefix())  # ids name the remoting address once it is bound
        access = Access.of(self)
        clients = ClientProcessors(self.service, access)
        consumers.add_listener(clients.channels.changed)  # NOTIFY_CONSUMER_IDS_CHANGED to the group's clients
        self.remoting_messages = message_processors(self, subscription_of=consumers.subscription, msg_ids=msg_ids,
                                                    clients=clients)
        table = {**broker_processors(self.service, access, clients), **self.remoting_messages.table,
                 **admin_processors(self, msg_ids)}
        authenticator = None
        if cfg.auth_enabled:  # RocketMQ 4's ACL signature on every request (broker/remoting/authentication.py)
            assert self.accounts is not None
            authenticator = Authenticator(self.accounts, anonymous_codes(), self.metrics.auth_refusals,
                                          declared_codes())
        self.remoting = RemotingServer(table, host, port, tls=cfg.server_tls(), name="broker-remoting",
                                       authenticator=authenticator, on_close=clients.channels.closed)
        self.remoting.start()
        msg_ids.bind(self.remoting_address())
        cfg.remoting_listen = format_address(host, self.remoting.port)  # a restart in place binds the same port

    def remoting_address(self) -> str:
        """HOST:PORT of the remoting port registered for RocketMQ 4 clients ("": none served)."""
        if self.remoting is None:
            return ""
        return f"{advertised_ip(self.remoting.host)}:{self.remoting.port}"

    def _start_registration(self) -> None:
        cfg = self.config
        identity = self._own_identity()
        if not cfg.namesrv_list:
            return
        replication = self.replication
        self.registrar = NameServerRegistrar(
            NameServerClient(cfg.namesrv_list, tls=cfg.client_tls(), credentials=cfg.client_credentials()),
            identity, self.topics,
            interval_ms=cfg.register_interval_ms,
            auto_create_topic_enable=cfg.auto_create_topic_enable, runtime=self._runtime,
            role="MASTER" if cfg.broker_id == 0 else "SLAVE",
            ha_address=replication.ha_advertised if replication is not None else "",
            replica_status=replication.status if replication is not None else None,
            require_authentication=cfg.auth_enabled, remoting_address=self.remoting_address(),
        )
        self.registrar.start()

    # ------------------------------------------------------------------------------------------------ replication
    def _start_replication(self, store: MessageStore) -> None:
        settings = self.replication_settings
        if settings is None:
            return
        manager = ReplicationManager(settings, self._own_identity(), store, BrokerHooks(
            start_master_services=self._start_master_services, restart=self._restart_in_background,
            replace_config=self._replace_config, role_changed=self._role_changed,
            master_from_namesrv=lambda: self.registrar.master_ha_address if self.registrar is not None else "",
            save_config=self.offsets.persist_if_dirty,
        ), self.hold.on_arrival)
        self.replication = manager
        port = manager.bind()
        ip = advertised_ip(settings.ha_listen[0] if settings.ha_listen[0] not in ("", "0.0.0.0", "::") else self.host)
        self.gate.target = manager
        manager.start(f"{ip}:{port}")
        self.config.ha_listen = f"{settings.ha_listen[0]}:{port}"  # a restart in place binds the same port
        register_replication_metrics(self.metrics, manager)

    def _start_master_services(self) -> None:
        """The services that write (delay and timer delivery, transaction recovery, check-back and decisions, pop
        revival) run on the master only."""
        if self._semantics_started or self.schedule is None or self.transactions is None:
            return
        self.schedule.reload()
        self._run_semantics()

    def _replace_config(self, name: str, data: dict[str, Any]) -> bool:
        """A config file the master sent: its manager replaces this slave's copy and reads it again."""
        if name == self.topics.path.name:
            self.topics.replace(data)
            self._role_changed()  # the registration carries the topics
        elif name == self.offsets.path.name:
            self.offsets.replace(data)
        elif self.groups is not None and name == os.path.basename(self.groups.path):
            self.groups.replace(data)
        elif self.accounts is not None and name == USERS_FILE:
            self.accounts.replace(data)
        else:
            return False  # delay and timer progress, transaction state: read when the services start (as master)
        return True

    def _role_changed(self) -> None:
        if self.registrar is not None:
            self.registrar.wake()

    def _restart_in_background(self, why: str) -> None:
        threading.Thread(target=self.restart_in_place, args=(why,), name="broker-restart", daemon=True).start()

    def restart_in_place(self, why: str) -> None:
        """Stop everything and start again on the same store and ports: what a replica does when it stops being
        master or must truncate its log (broker/ha/manager.py says why through start-up)."""
        with self._restart_lock:
            if self._stopped or self._closed:
                return
            log.warning("restarting the broker in place: %s", why)
            config = self.config
            config.listen = f"{config.listen_address[0]}:{self.port}"
            if self.metrics_server is not None:
                config.metrics_port = self.metrics_server.port
            self._stop_all()
            deadline = time.monotonic() + RESTART_BIND_WAIT_S
            while True:  # the ports just closed may take a moment to be free again
                self.__init__(config)  # type: ignore[misc]  # a fresh broker in this object: callers keep it
                try:
                    self.start()
                    return
                except ServiceNotAvailableError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)

    def _runtime(self) -> Runtime:
        """Load figures for the name servers: message rates since the previous registration."""
        now = time.monotonic()
        puts, gets = self.metrics.put_messages.value(), self.metrics.get_messages.value()
        then, puts_then, gets_then = self._last_runtime
        self._last_runtime = (now, puts, gets)
        elapsed = max(now - then, 1e-3)
        max_offset = self.store.stats().get("commit_log_max_offset", 0) if self.store is not None else 0
        return Runtime((puts - puts_then) / elapsed, (gets - gets_then) / elapsed, int(max_offset),
                       int((time.time() - self._started_at) * 1000) if self._started_at else 0)

    def _abort_start(self) -> None:
        """Undo a half-done start (port taken, store locked, bad config...) so nothing is left running."""
        self._stopped = True
        self._stop_tasks.set()
        if self.registrar is not None:
            self.registrar.shutdown()
        if self.remoting_messages is not None:
            self.remoting_messages.shutdown()  # held pulls are answered while their connections are open
        if self.remoting is not None:
            self.remoting.shutdown()
        if self.server is not None:
            self.server.stop(0)
        if self.replication is not None:
            self.replication.shutdown()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        self._stop_semantics()
        if self.store is not None:
            self.store.shutdown()

    def _start_semantics(self, store: MessageStore) -> None:
        """Builds the services that write (delay, transactions and their decisions, timers, pop); starts them unless
        replication decides when (master only)."""
        cfg, config_dir = self.config, str(store.config.config_dir)
        self.schedule = ScheduleMessageService(store, config_dir, levels=cfg.message_delay_level)
        self.groups = SubscriptionGroupManager(
            config_dir, auto_create=cfg.auto_create_subscription_group, max_groups=cfg.max_subscription_groups
        )
        self.transactions = TransactionService(
            store, config_dir, checker=self._check_back, transaction_timeout_ms=cfg.transaction_timeout_ms,
            check_interval_ms=cfg.transaction_check_interval_ms, check_max=cfg.transaction_check_max,
            max_halves=cfg.transaction_max_halves, max_open_ms=cfg.transaction_max_open_ms,
            commit_memory_bytes=cfg.transaction_commit_memory_bytes, max_outcomes=cfg.transaction_max_outcomes,
        )
        # ending or joining a transaction is decided on its recorded producer group, through every front
        self.transactions.check_group = transaction_access
        self.decisions = DecisionLog(store, config_dir)
        # Always installed, with name servers or without: a broker must never roll back alone the halves of a
        # transaction another broker decides (without name servers, only its own decisions can be found).
        name = cfg.broker_name or default_broker_name()
        client = None
        if cfg.namesrv_list:
            self._coordinator_router = Router(namesrv=cfg.namesrv_addr, timeout_s=COORDINATOR_CALL_TIMEOUT_S,
                                              tls=cfg.client_tls(), credentials=cfg.client_credentials())
            client = CoordinatorClient(self._coordinator_router)
        self.participants = ParticipantResolver(self.transactions, name,
                                                coordinator_asker(self.decisions, name, client))
        self.transactions.resolver = self.participants
        router = self._coordinator_router
        listed = None if router is None else (lambda: [b.broker_name for b in router.cluster_brokers()])
        self.transactions.require_coordinator = CoordinatorNames(name, listed).require
        sync = cfg.flush_disk_type == "SYNC_FLUSH"
        self.timers = TimerService(store, config_dir, max_delay_ms=cfg.timer_max_delay_ms,
                                   max_pending=cfg.timer_max_pending, sync=sync,
                                   compact_bytes=cfg.journal_compact_bytes)
        self.pops = rmqv2_wiring.pop_service(self, store, config_dir, sync)
        if self.replication_settings is None:
            self._run_semantics()

    def _run_semantics(self) -> None:
        """Start the services that write (a broker on its own at once; a replica when it becomes master). Each
        recovers its state from the store and its files when it starts, so a slave's copies are read then."""
        assert self.schedule is not None and self.transactions is not None and self.decisions is not None
        assert self.participants is not None and self.timers is not None and self.pops is not None
        self.schedule.start()
        self.decisions.start()
        self.participants.start()
        self.transactions.start()  # recovery: interrupted commits are finished before any request is served
        self.timers.start()  # recovery: pending timer messages scheduled again
        self.pops.start()  # recovery: in-flight messages stay in flight
        self._semantics_started = True

    def _stop_semantics(self) -> None:
        self.check_hub.shutdown()
        self.rmqv2_clients.shutdown()
        # A slave's services never ran: their state files are the master's copies, not to be overwritten.
        started, self._semantics_started = self._semantics_started, False
        if self.participants is not None:
            if started:
                self.participants.shutdown()
            self.participants = None
        if self.pops is not None:
            if started:
                self.pops.shutdown()
            self.pops = None
        if self.timers is not None:
            if started:
                self.timers.shutdown()
            self.timers = None
        if self.transactions is not None:
            if started:
                self.transactions.shutdown()
            self.transactions = None
        if self.decisions is not None:
            if started:
                self.decisions.shutdown()
            self.decisions = None
        if self._coordinator_router is not None:
            self._coordinator_router.close()
            self._coordinator_router = None
        if self.schedule is not None:
            if started:
                self.schedule.shutdown()
            self.schedule = None

    def _store_host(self, host: str) -> tuple[str, int]:
        """The address written into every stored entry, which offset msgIds carry and RocketMQ 4 clients and
        ``mqadmin queryMsgById`` connect to: the remoting address when its port is set (known before it is bound),
        else the gRPC one; the remoting front then names its own address in the ids it gives
        (broker/remoting/message_ids.py). Sluice's clients find a message by id whichever address it names."""
        if self.config.remoting_listen:
            remoting_host, remoting_port = parse_host_port(self.config.remoting_listen)
            if remoting_port:
                return advertised_ip(remoting_host), remoting_port
        return advertised_ip(host), self.port

    def _start_store(self, ip: str, port: int) -> MessageStore:
        # Built by the config, which already validated it: the store table cannot override the broker's own values.
        store = MessageStore(self.config.store_config(store_host=(ip, port)))
        store.start()
        if self.replication_settings is None:  # else through replication's read limit (broker/ha/read_limit.py)
            store.add_arrival_listener(self.hold.on_arrival)
        return store

    def _wire(self, server: grpc.Server, store: MessageStore) -> None:
        cfg = self.config
        sends = SendProcessor(store, self.topics, self.metrics, sync_flush=cfg.flush_disk_type == "SYNC_FLUSH")
        pulls = PullProcessor(
            store, self.topics, self.offsets, self.hold, self.metrics, default_max_msgs=cfg.default_pull_max_msgs,
            max_msgs=cfg.max_pull_msgs, max_bytes=cfg.max_pull_bytes, max_suspend_ms=cfg.max_suspend_timeout_ms,
        )
        self.admin = AdminProcessor(store, self.topics, self.offsets, self.consumers, pulls, self.hold)
        service = BrokerService(sends, pulls, self.admin, self.consumers, self.metrics, self.stats)
        self._start_semantics(store)
        assert self.schedule is not None and self.transactions is not None and self.groups is not None
        sends.schedule, sends.transactions, sends.timers = self.schedule, self.transactions, self.timers
        retries = RetryProcessor(RetryService(store, self.groups, self.schedule), self.groups, self.topics,
                                 dlq_pull_enable=cfg.dlq_pull_enable)
        pulls.admit, pulls.message_filter = retries.admit_pull, retries.message_filter
        assert self.pops is not None
        self.pops.admit, self.pops.message_filter = retries.admit_pull, retries.message_filter
        self.admin.on_topic_deleted = self.pops.forget_topic
        service.pops = PopProcessor(self.pops, cfg.max_suspend_timeout_ms)
        self.admin.admit_commit = retries.admit_commit
        service.transactions, service.check_hub = TransactionProcessor(self.transactions), self.check_hub
        self.check_hub.read_entry = store.lookup_entry
        service.retries, service.locks = retries, self.locks
        service.dedup = SendDeduplicator(store, cfg.send_dedup_window_ms)
        service.identity = (cfg.cluster_name, cfg.broker_name or default_broker_name())
        assert self.accounts is not None
        service.accounts = AccountsAdmin(self.accounts, cfg.auth_enabled)
        service.call_streams = self.call_streams
        service.send_one = through_interceptors(self._interceptors, SEND_MESSAGE_METHOD, service.SendMessage)
        service.pull_one = through_interceptors(self._interceptors, PULL_MESSAGE_METHOD, service.PullMessage)
        self.service = service
        pb_grpc.add_BrokerServicer_to_server(service, server)
        if cfg.rmqv2_enable:
            rmqv2_wiring.add_service(self, server, sends, pulls)
        assert self.decisions is not None
        coordinator = CoordinatorService(self.decisions, lambda txn_id: (
            self.transactions.producer_group_of(txn_id) if self.transactions is not None else None))
        cpb_grpc.add_TransactionCoordinatorServicer_to_server(coordinator, server)
        register_broker_gauges(self.metrics, store, self.topics, self.offsets, self.admin, self.hold,
                               self.call_streams)

    def stats(self) -> dict[str, float]:
        assert self.store is not None
        extra: dict[str, Any] = {
            "broker_put_messages": self.metrics.put_messages.value(),
            "broker_put_bytes": self.metrics.put_bytes.value(),
            "broker_get_messages": self.metrics.get_messages.value(),
            "broker_get_bytes": self.metrics.get_bytes.value(),
            "broker_uptime_s": time.time() - self._started_at,
        }
        if self.replication is not None:
            extra.update(self.replication.stats())
        if self.pops is not None:
            extra.update(self.pops.stats())  # pop_outstanding, pop_dead_lettered
        if self.timers is not None:
            extra["timer_pending"] = self.timers.pending_count()
            extra["timer_delivered"] = self.timers.delivered
        return self.admin.stats(extra)

    # ------------------------------------------------------------------------------------------------ periodic
    def _run_periodic_tasks(self) -> None:
        persist_s = self.config.consumer_offset_persist_interval_ms / 1000
        next_persist = time.monotonic() + persist_s
        next_expire = time.monotonic() + CONSUMER_EXPIRE_SCAN_MS / 1000
        while not self._stop_tasks.wait(min(persist_s, POP_REVIVE_S)):
            now = time.monotonic()
            if self.pops is not None and self._semantics_started:
                self._periodic("reviving pop consumption", self.pops.revive)
            if now >= next_persist:
                next_persist = now + persist_s
                self._periodic("saving consumer offsets", self.offsets.persist_if_dirty)
                if self.groups is not None:
                    self._periodic("saving subscription groups", self.groups.persist_if_dirty)
                self._periodic("saving topics", self.topics.persist_if_dirty)
            if now >= next_expire:
                next_expire = now + CONSUMER_EXPIRE_SCAN_MS / 1000
                self._periodic("expiring idle consumers", self.consumers.expire)
                self._periodic("expiring RocketMQ 5 clients", self._expire_rmqv2_clients)

    def _expire_rmqv2_clients(self) -> None:
        for client_id in self.rmqv2_clients.expire():
            if self.pops is not None:
                self.pops.release_client(client_id)

    @staticmethod
    def _periodic(what: str, task: Callable[[], object]) -> None:
        try:
            task()
        except OSError as e:
            # The disk (full, or failing): the same error every interval, so no traceback each time.
            log.error("%s failed: %s; retried at the next interval", what, e)
        except Exception:
            # Broad on purpose: whatever fails, this thread must live on, or offsets would be saved only at shutdown
            # (a crash would then lose all progress since the start, not the last interval's).
            log.exception("%s failed; retried at the next interval", what)

    # ------------------------------------------------------------------------------------------------ stop
    def shutdown(self) -> None:
        """Stop for good. A restart in place under way (another thread) ends first; the broker it started is
        stopped here, and none starts after."""
        self._closed = True
        with self._restart_lock:
            self._stop_all()

    def _stop_all(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        log.info("broker shutting down")
        if self.registrar is not None:
            self.registrar.shutdown()  # first: clients stop routing here while in-flight calls finish
        if self.remoting_messages is not None:
            self.remoting_messages.shutdown()  # held pulls are answered while their connections are open
        if self.remoting is not None:
            self.remoting.shutdown()
        self.hold.shutdown()
        self.check_hub.shutdown()  # open check streams end, so the server's stop need not wait for them
        self.rmqv2_clients.shutdown()  # and Telemetry streams
        self.call_streams.stop()  # and send and pull streams, each at its next gap between requests
        if self.pops is not None:
            self.pops.release_held()  # held receives answer now; acks are still served until the server stops
        if self.server is not None:
            self.server.stop(self.config.shutdown_grace_s).wait()
        if self.replication is not None:
            self.replication.shutdown()  # after the server: in-flight writes were answered
        self._stop_tasks.set()
        if self._tasks is not None:
            self._tasks.join()
        for what, save in (("consumer offsets", self.offsets.persist), ("topics", self.topics.persist)):
            try:
                save()
            except OSError as e:  # a full disk: the rest of the shutdown (the store's flush above all) still runs
                log.error("saving %s at shutdown failed: %s; the last saved version stays", what, e)
        if self.metrics_server is not None:
            self.metrics_server.stop()
        self._stop_semantics()
        if self.store is not None:
            self.store.shutdown()
        log.info("broker stopped")

    def __enter__(self) -> BrokerController:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

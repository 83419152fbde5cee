"""BrokerConfig: everything a broker process needs, with RocketMQ's defaults, loadable from JSON or TOML.

A config file holds the field names below at the top level and, optionally, a ``store`` table whose keys are
``StoreConfig`` field names (for example ``mapped_file_size_commit_log``). Command-line flags override the file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.address import DEFAULT_PORT, parse_endpoint, parse_listen
from broker.errors import InvalidArgumentError
from broker.format.system_topics import SCHEDULE_TOPIC
from broker.ha.replication_settings import ReplicationSettings
from broker.private_file import refuse_if_shared
from broker.semantics.delay import DelayLevels
from broker.server.thread_placement import parse_python_cpus
from broker.store.message_store import MAX_BYTES_PER_GET
from broker.store.store_config import StoreConfig

if typing.TYPE_CHECKING:
    from broker.client.credentials import Credentials
    from broker.client.tls import TlsSettings
    from broker.server.server_tls import ServerTls

FLUSH_TYPES = {"async": "ASYNC_FLUSH", "sync": "SYNC_FLUSH", "ASYNC_FLUSH": "ASYNC_FLUSH", "SYNC_FLUSH": "SYNC_FLUSH"}
# Store settings the broker sets from its own: a `store` table entry for one would silently win over what the
# broker reports and relies on (`--flush sync` running ASYNC, data apart from the config directory, msgIds naming
# another host, delayed messages looked for in another topic). Each maps to what to set instead.
BROKER_OWNED_STORE_SETTINGS = {
    "store_path": "the top-level store_path (or --store); the broker's config directory lives inside it",
    "flush_disk_type": "the top-level flush_disk_type (or --flush)",
    "store_host": "the top-level listen (or --listen), or remoting_listen when its port is set; msgIds carry it",
    "schedule_topic": "nothing: delayed messages always go to " + SCHEDULE_TOPIC,
    "delay_level_ms": 'the top-level message_delay_level (e.g. "1s 5s 10s")',
    "disk_usage_probe": "nothing: it is a test hook, not a setting",
}
# Where users read about every setting; config errors point there.
CONFIG_DOCS_SECTION = '"Configuration reference"'
# Settings that must be > 0: each is a wait between passes of a loop (0 spins a CPU), or an amount a request or a
# service needs at least one of.
POSITIVE_SETTINGS = (
    "short_polling_time_ms", "long_polling_recheck_ms", "grpc_max_workers", "max_pull_msgs", "default_pull_max_msgs",
    "max_pull_bytes", "consumer_offset_persist_interval_ms", "consumer_expire_ms", "transaction_timeout_ms",
    "transaction_check_interval_ms", "transaction_check_max", "transaction_max_halves", "transaction_max_outcomes",
    "transaction_max_open_ms",
    "register_interval_ms", "send_dedup_window_ms", "pop_max_invisible_ms", "pop_max_inflight_per_queue",
    "pop_auto_renew_invisible_ms", "timer_max_delay_ms", "timer_max_pending", "journal_compact_bytes",
    "rmqv2_max_long_polling_ms", "auth_window_s",
    "max_total_queue_nums", "max_auto_create_topics_per_request", "max_consumers", "max_subscription_groups",
    "rmqv2_max_clients",
)
# What a gRPC message holds beyond the bytes of messages: entry headers, topic and properties (under 33 KiB for
# one message), a pull answer's entry positions (5 bytes for each of at most 4096) and protobuf framing.
GRPC_FRAMING_MARGIN_BYTES = 1 << 20


def parse_host_port(text: str) -> tuple[str, int]:
    """A listen address: 'host:port', '[ipv6]:port', ':port' or 'host' -> (host, port); see broker/address.py."""
    return parse_listen(text)


def _type_ok(value: Any, hint: Any) -> bool:
    """Whether a value read from a config file (JSON or TOML types) fits a settings field's annotation."""
    if hint is Any:
        return True
    if isinstance(hint, types.UnionType):
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    origin = typing.get_origin(hint) or hint
    if origin is tuple:
        return isinstance(value, list | tuple) and _tuple_items_ok(value, typing.get_args(hint))
    return isinstance(value, origin) if isinstance(origin, type) else True


def _tuple_items_ok(value: list[Any] | tuple[Any, ...], items: tuple[Any, ...]) -> bool:
    """``tuple[int, ...]``: every item an int; ``tuple[str, int]``: exactly two items, a str then an int."""
    if not items or (len(items) == 2 and items[1] is Ellipsis):
        item = items[0] if items else Any
        return all(_type_ok(v, item) for v in value)
    return len(value) == len(items) and all(_type_ok(v, h) for v, h in zip(value, items, strict=True))


def check_setting_types(cls: type, data: dict[str, Any], source: str) -> None:
    """InvalidArgumentError naming the first setting whose value has the wrong type ("64" for a count), so a
    config file fails with what to change instead of a TypeError deep in start-up."""
    hints = typing.get_type_hints(cls)
    for name, value in data.items():
        hint = hints.get(name)
        if hint is not None and not _type_ok(value, hint):
            # tuple[str, int] says more than its __name__ ("tuple")
            wanted = str(hint) if typing.get_args(hint) else getattr(hint, "__name__", None) or str(hint)
            raise InvalidArgumentError(
                f"{source}: setting {name!r} is {value!r} ({type(value).__name__}); it must be {wanted}"
            )


def check_store_table_keys(store: dict[str, Any], source: str) -> None:
    """InvalidArgumentError for a `store` table key that is not a StoreConfig setting or that the broker owns."""
    unknown = sorted(set(store) - {f.name for f in dataclasses.fields(StoreConfig)})
    if unknown:
        settable = sorted({f.name for f in dataclasses.fields(StoreConfig)} - set(BROKER_OWNED_STORE_SETTINGS))
        raise InvalidArgumentError(
            f"{source}: unknown store setting(s) {unknown}; known store settings are {settable} "
            f"(docs/operations.md, {CONFIG_DOCS_SECTION})"
        )
    for name, instead in BROKER_OWNED_STORE_SETTINGS.items():
        if name in store:
            raise InvalidArgumentError(
                f"{source}: the store table sets {name!r}, which the broker sets itself; remove it and set {instead}"
            )


@dataclass
class BrokerConfig:
    listen: str = f"0.0.0.0:{DEFAULT_PORT}"
    store_path: str = "~/store"
    flush_disk_type: str = "ASYNC_FLUSH"
    metrics_port: int | None = None  # None: no metrics endpoint; 0: any free port
    metrics_host: str = "0.0.0.0"
    auto_create_topic_enable: bool = True
    default_topic_queue_nums: int = 8
    max_topic_queue_nums: int = 1024
    # Queues of all topics together (each is a directory, a file, an open descriptor and a memory mapping), and
    # topics one request may auto-create: a 38 KB batch once named 50 new topics (broker/server/topic_config.py).
    max_total_queue_nums: int = 8192
    max_auto_create_topics_per_request: int = 16
    # Consumers (all groups) and subscription groups kept at once: each heartbeat under a new client id or group
    # name adds one, kept until it expires (consumers) or for good (groups, in subscriptionGroup.json).
    max_consumers: int = 10_000
    max_subscription_groups: int = 10_000
    long_polling_enable: bool = True  # False: short polling, a held pull re-checks every short_polling_time_ms
    short_polling_time_ms: int = 1000
    long_polling_recheck_ms: int = 5000  # safety re-check of held pulls even without an arrival notice
    max_suspend_timeout_ms: int = 60_000  # longest a pull may ask to be held
    default_pull_max_msgs: int = 32
    max_pull_msgs: int = 4096
    max_pull_bytes: int = 16 * 1024 * 1024
    grpc_max_workers: int = 256  # held pulls occupy a worker each (an idle thread costs little)
    grpc_reserved_workers: int = 32  # never used for held pulls: sends and admin calls always find a worker
    grpc_max_message_bytes: int = 128 * 1024 * 1024
    consumer_offset_persist_interval_ms: int = 5000
    consumer_expire_ms: int = 120_000  # a consumer without a heartbeat for this long leaves its group
    shutdown_grace_s: float = 10.0
    # `sluice broker` only: Python threads on these CPUs ("auto": one CPU, "off", or a list such as "2,3"); see
    # broker/server/thread_placement.py for why
    python_cpus: str = "auto"
    # Broker semantics (RocketMQ names): delay levels, transaction check-back, dead letters, subscription groups
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    # An open transaction idle this long is checked back with its producer, and again each time this long has
    # passed since its last check (at the next check pass).
    transaction_timeout_ms: int = 6_000
    transaction_check_interval_ms: int = 60_000
    transaction_check_max: int = 15  # unanswered checks before a transaction is rolled back
    # Half messages one transaction may hold: its table is kept in memory (some 100 B a message at the worst), so
    # this bounds what one transaction's table can cost the broker.
    transaction_max_halves: int = 4_000_000
    # A transaction takes messages for this long after its first: readers of its queues wait for it meanwhile
    # (broker/semantics/transaction.py, DEFAULT_MAX_OPEN_MS).
    transaction_max_open_ms: int = 3_600_000
    # Committed entries a commit keeps from its check (before the decision) to its re-store; past this the rest are
    # made again as they are stored (broker/semantics/transaction.py), so a commit's memory stays bounded.
    transaction_commit_memory_bytes: int = 512 << 20
    # Ended single-message transactions remembered (their outcome reported to a second end): at most this many
    # within the retention time, the earliest ended forgotten first (some 600 B each: RocketMQ producers end one per
    # message). Batch transactions keep theirs for the whole retention time.
    transaction_max_outcomes: int = 500_000
    dlq_pull_enable: bool = False  # %DLQ% topics are for people: pulls refused unless an admin enables this
    auto_create_subscription_group: bool = True
    # Cluster mode (broker/server/registration.py): with name servers set, the broker registers its topics with each
    # of them every register_interval_ms and at once on every topic change. Empty: a broker on its own.
    namesrv_addr: str = ""  # HOST:PORT[,HOST:PORT...]
    cluster_name: str = "DefaultCluster"
    broker_name: str = ""  # empty: this machine's host name (RocketMQ's default)
    broker_id: int = 0  # 0: the group's master
    register_interval_ms: int = 30_000
    # HOST:PORT clients and other brokers reach this broker at, registered with the name servers. Empty: the listen
    # host when it is a concrete address, else this machine's address, with the bound port.
    advertised_address: str = ""
    # HOST:PORT of RocketMQ's remoting protocol (broker/remoting, docs/remoting.md): RocketMQ 4 clients connect here,
    # and the broker registers it with the name servers for them. Empty (the default): not served, since a port
    # nobody asked for is one more to secure; RocketMQ's own is 10911.
    remoting_listen: str = ""
    # A send retried after its answer was lost is answered with the stored result when the first attempt stored it
    # within this long (broker/server/send_dedup.py); later retries are stored again.
    send_dedup_window_ms: int = 300_000
    # Pop consumption (broker/semantics/pop.py), RocketMQ 5's defaults. A receive's invisible time must lie within
    # min..max (the RocketMQ proxy's minInvisibleTimeMillsForRecv and maxInvisibleTimeMills); a change of invisible
    # time only within 0..max.
    pop_min_invisible_ms: int = 10_000
    pop_max_invisible_ms: int = 12 * 3_600_000
    # Messages a group may have outstanding (received, not acked) per queue: their records are kept in memory (about
    # 150 B each); past it the queue gives out no new messages until some are acked.
    pop_max_inflight_per_queue: int = 65_536
    pop_auto_renew_invisible_ms: int = 60_000  # RocketMQ 5 PushConsumers' receives (auto_renew): renewed by the broker
    # Timer messages (broker/semantics/timer.py): TIMER_DELIVER_MS further ahead than this is refused (RocketMQ's
    # timerMaxDelaySec, 3 days); at most timer_max_pending wait at once (about 150 B of memory each).
    timer_max_delay_ms: int = 3 * 86_400_000
    timer_max_pending: int = 1_000_000
    # The pop and timer journals are compacted into a snapshot once they pass this size.
    journal_compact_bytes: int = 64 << 20
    # RocketMQ 5 clients (broker/rmqv2/): apache.rocketmq.v2.MessagingService on the client port, beside sluice.v1.
    rmqv2_enable: bool = True
    # A ReceiveMessage long-polls between these bounds (the RocketMQ proxy's 5 s and 20 s), within its deadline.
    rmqv2_min_long_polling_ms: int = 5_000
    rmqv2_max_long_polling_ms: int = 20_000
    # RocketMQ 5 clients remembered at once (each keeps its settings, a few hundred bytes); a user may hold a quarter
    # of them (broker/rmqv2/clients.py). Past it a new client is refused with TOO_MANY_REQUESTS.
    rmqv2_max_clients: int = 100_000
    # Replication and failover (broker/ha; the table of these settings is in broker/ha/replication_settings.py)
    role: str = ""  # "": no replication; ASYNC_MASTER | SYNC_MASTER | SLAVE (classic mode)
    controller: str = ""  # etcd://HOST:PORT[,...]: controller mode, automatic failover
    ha_listen: str = ""  # "": the listen host, client port + 1 (a free port when the client port is 0)
    ha_master_address: str = ""  # classic slave: the master's replication endpoint ("": from the name servers)
    ha_secret_file: str = ""
    min_insync_replicas: int = 2
    ha_max_lag_ms: int = 5000
    ha_ack_timeout_ms: int = 5000
    ha_lease_ttl_s: int = 5
    allow_unclean_election: bool = False
    ha_metadata_sync_ms: int = 200
    # Controller mode: TLS and credentials for etcd (broker/ha/etcd_security.py, docs/replication.md). The password
    # comes from etcd_password_file or $SLUICE_ETCD_PASSWORD only, never from this file or the command line.
    etcd_ca_file: str = ""
    etcd_cert_file: str = ""
    etcd_key_file: str = ""
    etcd_user: str = ""
    etcd_password_file: str = ""
    # TLS (broker/server/server_tls.py, docs/security.md): with a certificate and its key (PEM files) every port of the
    # broker serves TLS (client port, replication endpoint, metrics over HTTPS), and its own calls to name servers
    # and other brokers use TLS, trusting tls_ca. tls_client_auth: none | request | require (mutual TLS, clients
    # need a certificate from tls_ca). The files are read again when they change on disk.
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    tls_client_auth: str = "none"
    # Authentication and authorization (broker/auth, docs/security.md): auth_enabled turns both on. The first
    # super user is auth_root_access_key / auth_root_secret_key, or $SLUICE_ROOT_ACCESS_KEY and
    # $SLUICE_ROOT_SECRET_KEY at start; a broker with auth and no user at all refuses to start. Signed requests are
    # accepted within auth_window_s of this broker's clock. Without TLS, auth needs allow_plaintext_auth: signed
    # headers can be replayed by whoever reads the traffic, within the window. A config file that holds
    # auth_root_secret_key must be readable by its owner only (chmod 600), or the broker refuses to start.
    auth_enabled: bool = False
    allow_plaintext_auth: bool = False
    auth_window_s: int = 900
    auth_root_access_key: str = ""
    auth_root_secret_key: str = field(default="", repr=False)
    store: dict[str, Any] = field(default_factory=dict)  # StoreConfig overrides

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """InvalidArgumentError naming the first setting that cannot work, before anything is started: a value that
        only fails inside start() would leave a half-started broker, and some (a 0 interval) never fail at all."""
        parse_host_port(self.listen)
        if self.remoting_listen:
            parse_host_port(self.remoting_listen)
        if self.store_dir.exists() and not self.store_dir.is_dir():
            raise InvalidArgumentError(
                f"store path {self.store_dir} is a file, not a directory; give a directory for the store (it is "
                "created when missing)"
            )
        if self.flush_disk_type not in FLUSH_TYPES:
            raise InvalidArgumentError(f"flush type {self.flush_disk_type!r} is not one of async, sync")
        self.flush_disk_type = FLUSH_TYPES[self.flush_disk_type]
        if not 1 <= self.default_topic_queue_nums <= self.max_topic_queue_nums:
            raise InvalidArgumentError(
                f"default_topic_queue_nums {self.default_topic_queue_nums} must be in 1..{self.max_topic_queue_nums}"
            )
        if self.max_total_queue_nums < self.default_topic_queue_nums:
            raise InvalidArgumentError(
                f"max_total_queue_nums {self.max_total_queue_nums} is below default_topic_queue_nums "
                f"{self.default_topic_queue_nums}: not even one topic could be auto-created"
            )
        if not 0 <= self.grpc_reserved_workers < self.grpc_max_workers:
            raise InvalidArgumentError("grpc_reserved_workers must be in 0..grpc_max_workers-1")
        parse_python_cpus(self.python_cpus, frozenset(os.sched_getaffinity(0)))
        for name in POSITIVE_SETTINGS:
            if getattr(self, name) <= 0:
                raise InvalidArgumentError(f"{name} is {getattr(self, name)}; it must be a positive integer")
        self._check_ranges()
        self._check_cluster()
        self.server_tls()
        self._check_auth()
        self.replication()
        store = self.store_config()
        try:
            store.validate()
        except InvalidArgumentError as e:  # say where the value came from: the bare StoreConfig names are ambiguous
            raise InvalidArgumentError(f"in the store table: {e.message}") from None
        self._check_grpc_max_message_bytes(store)

    def _check_auth(self) -> None:
        if not self.auth_enabled:
            return
        if self.server_tls() is None and not self.allow_plaintext_auth:
            raise InvalidArgumentError(
                "auth without TLS sends replayable credentials in the clear: give tls_cert and tls_key (--tls-cert, "
                "--tls-key), or allow_plaintext_auth (--allow-plaintext-auth) on a network you trust"
            )
        if bool(self.auth_root_access_key) != bool(self.auth_root_secret_key):
            raise InvalidArgumentError("give auth_root_access_key and auth_root_secret_key together")

    def _check_ranges(self) -> None:
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise InvalidArgumentError(
                f"metrics_port is {self.metrics_port}; it must be a port in 0..65535 (0: any free port)"
            )
        if not (math.isfinite(self.shutdown_grace_s) and self.shutdown_grace_s >= 0):
            raise InvalidArgumentError(
                f"shutdown_grace_s is {self.shutdown_grace_s}; it must be a finite number of seconds >= 0"
            )
        if self.max_suspend_timeout_ms < 0:
            raise InvalidArgumentError(f"max_suspend_timeout_ms is {self.max_suspend_timeout_ms}; it must be >= 0")
        if not 0 <= self.pop_min_invisible_ms <= self.pop_max_invisible_ms:
            raise InvalidArgumentError(
                f"pop_min_invisible_ms is {self.pop_min_invisible_ms}; it must be in 0..pop_max_invisible_ms "
                f"({self.pop_max_invisible_ms})"
            )
        if not 0 <= self.rmqv2_min_long_polling_ms <= self.rmqv2_max_long_polling_ms:
            raise InvalidArgumentError(
                f"rmqv2_min_long_polling_ms is {self.rmqv2_min_long_polling_ms}; it must be in "
                f"0..rmqv2_max_long_polling_ms ({self.rmqv2_max_long_polling_ms})"
            )
        if self.transaction_commit_memory_bytes < 0:
            raise InvalidArgumentError(
                f"transaction_commit_memory_bytes is {self.transaction_commit_memory_bytes}; it must be >= 0"
            )

    def _check_cluster(self) -> None:
        from broker.client.namesrv_client import parse_namesrv_list
        from broker.namesrv.route_table import MAX_BROKER_ID, MAX_NAME_CHARS

        if self.namesrv_addr:
            parse_namesrv_list(self.namesrv_addr)
        for what, name in (("cluster_name", self.cluster_name), ("broker_name", self.broker_name)):
            if len(name) > MAX_NAME_CHARS or (name and (not name.isprintable() or " " in name)):
                raise InvalidArgumentError(
                    f"{what} {name[:40]!r} must be 1..{MAX_NAME_CHARS} printable characters without spaces"
                )
        if not self.cluster_name:
            raise InvalidArgumentError("cluster_name is empty; name the cluster (default DefaultCluster)")
        if not 0 <= self.broker_id <= MAX_BROKER_ID:
            raise InvalidArgumentError(f"broker_id is {self.broker_id}; it must be in 0..{MAX_BROKER_ID} (0: master)")
        if self.advertised_address:
            host, port = parse_endpoint(self.advertised_address)
            if port == 0 or host in ("0.0.0.0", "::"):
                raise InvalidArgumentError(
                    f"advertised_address {self.advertised_address!r} must name a concrete host and a port other "
                    "than 0: clients connect to it"
                )

    def replication(self) -> ReplicationSettings | None:
        """The replication settings (None: a broker without replication); InvalidArgumentError for a bad one."""
        from broker.ha import etcd_security
        from broker.ha.replication_settings import from_config

        settings = from_config(
            role=self.role, controller=self.controller, ha_listen=self.ha_listen, listen=self.listen_address,
            ha_master_address=self.ha_master_address, ha_secret_file=self.ha_secret_file,
            min_insync_replicas=self.min_insync_replicas, ha_max_lag_ms=self.ha_max_lag_ms,
            ha_ack_timeout_ms=self.ha_ack_timeout_ms, ha_lease_ttl_s=self.ha_lease_ttl_s,
            allow_unclean_election=self.allow_unclean_election, ha_metadata_sync_ms=self.ha_metadata_sync_ms,
            broker_id=self.broker_id, auth_enabled=self.auth_enabled,
        )
        etcd = etcd_security.from_config(
            ca_file=self.etcd_ca_file, cert_file=self.etcd_cert_file, key_file=self.etcd_key_file,
            user=self.etcd_user, password_file=self.etcd_password_file,
            endpoints=settings.controller if settings is not None else (),
        )
        return dataclasses.replace(settings, tls=self.server_tls(), etcd=etcd) if settings is not None else None

    def server_tls(self) -> ServerTls | None:
        """The TLS settings of every port (None: plain text); InvalidArgumentError for a bad or unreadable one."""
        from broker.server.server_tls import ServerTls

        return ServerTls.of(self.tls_cert, self.tls_key, self.tls_ca, self.tls_client_auth)

    def client_credentials(self) -> Credentials | None:
        """What this broker signs its own calls to name servers and other brokers with: the root user's, when one is
        set (every broker and name server of an authenticated cluster is started with the same root user)."""
        from broker.auth.accounts import root_user
        from broker.client.credentials import Credentials

        root = root_user(self)
        return Credentials(root.access_key, root.secret_key) if root is not None else None

    def client_tls(self) -> TlsSettings | None:
        """What the broker's own clients (of name servers, other brokers, its master) connect with."""
        tls = self.server_tls()
        return tls.client_settings() if tls is not None else None

    @property
    def namesrv_list(self) -> list[str]:
        from broker.client.namesrv_client import parse_namesrv_list

        return parse_namesrv_list(self.namesrv_addr) if self.namesrv_addr else []

    def _check_grpc_max_message_bytes(self, store: StoreConfig) -> None:
        """Every request and answer must fit one gRPC message: otherwise a pull over two big messages fails with
        RESOURCE_EXHAUSTED on every try, and the consumer never gets past them."""
        largest = max(min(self.max_pull_bytes, MAX_BYTES_PER_GET), store.max_message_size, store.batch_limit_bytes)
        needed = largest + GRPC_FRAMING_MARGIN_BYTES
        if self.grpc_max_message_bytes < needed:
            raise InvalidArgumentError(
                f"grpc_max_message_bytes is {self.grpc_max_message_bytes}, too small for a pull answer of "
                f"max_pull_bytes={self.max_pull_bytes}, a message of store.max_message_size={store.max_message_size} "
                f"or a batch of store.max_batch_bytes={store.max_batch_bytes}: it must be at least {needed} (the "
                "largest plus 1 MiB for headers and framing); raise it or lower those settings"
            )

    def store_config(self, store_host: tuple[str, int] = ("127.0.0.1", DEFAULT_PORT)) -> StoreConfig:
        """The store's settings: the broker's own (directory, flush mode, delay levels, the host in msgIds, known
        only once the port is bound) and the rest from the `store` table."""
        check_store_table_keys(self.store, "config")
        check_setting_types(StoreConfig, self.store, "config [store]")  # a config built in code skips from_dict
        try:
            delays = tuple(DelayLevels(self.message_delay_level).delays_ms)
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"message_delay_level: {e.message}") from None
        return StoreConfig(
            store_path=str(self.store_dir), flush_disk_type=self.flush_disk_type, store_host=store_host,
            schedule_topic=SCHEDULE_TOPIC, delay_level_ms=delays, **self.store,
        )

    @property
    def listen_address(self) -> tuple[str, int]:
        return parse_host_port(self.listen)

    @property
    def store_dir(self) -> Path:
        return Path(os.path.expanduser(self.store_path))

    @property
    def config_dir(self) -> Path:
        return self.store_dir / "config"

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> BrokerConfig:
        """Load a ``.json`` or ``.toml`` file; keyword overrides that are not None win over the file."""
        p = Path(path)
        try:
            with open(p, "rb") as f:
                info = os.fstat(f.fileno())  # the mode of the file read, checked below when it holds a secret
                raw = f.read()
        except OSError as e:
            raise InvalidArgumentError(f"cannot read config file {p}: {e.strerror}") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            bad = raw[e.start : e.start + 1]
            raise InvalidArgumentError(
                f"config file {p} is not UTF-8 text (byte {e.start} is {bad!r}); save it as UTF-8"
            ) from None
        # Only the name decides the format: a name not ending in .toml (.yaml included) is read as JSON.
        fmt = "TOML" if p.suffix == ".toml" else "JSON"
        try:
            data = tomllib.loads(text) if fmt == "TOML" else json.loads(text)
        except ValueError as e:  # tomllib.TOMLDecodeError and json.JSONDecodeError are both ValueErrors
            how = "" if p.suffix in (".toml", ".json") else " (only .toml files are read as TOML, others as JSON)"
            raise InvalidArgumentError(f"config file {p} is not valid {fmt}{how}: {e}") from None
        if isinstance(data, dict) and data.get("auth_root_secret_key"):
            refuse_if_shared(p, "config file", info)  # as ssh refuses a private key others can read
        return cls.from_dict(data, source=str(p), **overrides)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config", **overrides: Any) -> BrokerConfig:
        if not isinstance(data, dict):
            raise InvalidArgumentError(f"{source}: holds a {type(data).__name__}, not a table of settings by name")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidArgumentError(
                f"{source}: unknown setting(s) {unknown}; known settings are {sorted(known)} "
                f"(docs/operations.md, {CONFIG_DOCS_SECTION})"
            )
        check_setting_types(cls, data, source)
        store = data.get("store", {})
        check_store_table_keys(store, source)
        check_setting_types(StoreConfig, store, f"{source} [store]")
        merged = {**data, **{k: v for k, v in overrides.items() if v is not None}}
        return cls(**merged)

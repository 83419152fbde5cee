"""How a broker builds its pop service and its RocketMQ 5 service from its parts (called by BrokerController)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc
from rocketmq.grpc_protocol import service_pb2_grpc as v2g

from broker.client.namesrv_client import NameServerClient
from broker.rmqv2.messaging_service import Backend, MessagingService
from broker.rmqv2.route_answers import RouteSource
from broker.semantics.delay import DelayLevels
from broker.semantics.pop import PopService
from broker.semantics.pop_log import PopLog
from broker.server.broker_identity import default_broker_name
from broker.server.pull_processor import PullProcessor
from broker.server.send_processor import SendProcessor
from broker.store import MessageStore

if TYPE_CHECKING:
    from broker.server.broker_controller import BrokerController


def pop_service(c: BrokerController, store: MessageStore, config_dir: str, sync: bool) -> PopService:
    cfg = c.config
    assert c.groups is not None

    def committed(group: str, topic: str, queue_id: int) -> int | None:
        return c.offsets.query(group, topic).get(queue_id)

    def create_dlq(topic: str) -> None:
        c.topics.create(topic, 1, if_not_exists=True)

    def commit(group: str, topic: str, queue_id: int, offset: int) -> None:
        if c.topics.get(topic) is not None and c.offsets.query(group, topic).get(queue_id) != offset:
            c.offsets.commit(group, {(topic, queue_id): offset})

    def admit() -> None:
        if c.replication is not None:
            c.replication.admit_write()

    def confirm(end: int) -> bool:
        return c.replication is not None and c.replication.wrote(end)

    def replicated(folder: str) -> PopLog:  # a replicated group keeps its pop state in the commit log (pop_log.py)
        return PopLog(store, config_dir, folder, admit=admit, confirm=confirm)

    return PopService(
        store, c.groups, config_dir,
        read_queue_nums=lambda topic: c.topics.require(topic).read_queue_nums,
        committed_offset=committed, commit_offset=commit,
        create_dlq=create_dlq,
        sync=sync, min_invisible_ms=cfg.pop_min_invisible_ms, max_invisible_ms=cfg.pop_max_invisible_ms,
        max_inflight_per_queue=cfg.pop_max_inflight_per_queue,
        auto_renew_invisible_ms=cfg.pop_auto_renew_invisible_ms, compact_bytes=cfg.journal_compact_bytes,
        can_hold=c.hold.can_hold, client_alive=c.rmqv2_clients.alive,
        replicated=replicated if c.replication_settings is not None else None,
    )


def add_service(c: BrokerController, server: grpc.Server, sends: SendProcessor, pulls: PullProcessor) -> None:
    cfg = c.config
    assert c.store is not None and c.pops is not None and c.transactions is not None and c.groups is not None

    def local(topic: str) -> tuple[int, int, int]:
        t = c.admin.topic_route(topic, cfg.auto_create_topic_enable)
        return t.read_queue_nums, t.write_queue_nums, t.perm

    namesrv = NameServerClient(cfg.namesrv_list, tls=cfg.client_tls()) if cfg.namesrv_list else None
    routes = RouteSource(cfg.broker_name or default_broker_name(), local, namesrv)
    assert c.service is not None and c.service.pops is not None and c.service.transactions is not None
    backend = Backend(
        cfg, sends, pulls, c.admin, c.groups, c.consumers, routes, c.service.pops, c.service.transactions,
        max_body_bytes=c.store.config.max_message_size,
        retry_delays_ms=DelayLevels(cfg.message_delay_level).delays_ms, advertised_address=c.advertised_address,
        timers=c.timers,
    )
    v2g.add_MessagingServiceServicer_to_server(MessagingService(backend, c.rmqv2_clients), server)

"""The broker's Prometheus gauges: each a function read at every scrape, over the live store and managers.

Why at scrape time: a gauge read by a scraper walks the topics and groups once per scrape, off the write path; one
kept up to date by every write would add work to every send.
"""

from __future__ import annotations

from broker.server.admin_processor import AdminProcessor
from broker.server.call_streams import CallStreams
from broker.server.consumer_offsets import ConsumerOffsetManager
from broker.server.metrics import BrokerMetrics, Labels
from broker.server.pull_hold import PullHoldService
from broker.server.topic_config import TopicConfigManager
from broker.store.message_store import MessageStore


def register_broker_gauges(
    metrics: BrokerMetrics, store: MessageStore, topics: TopicConfigManager, offsets: ConsumerOffsetManager,
    admin: AdminProcessor, hold: PullHoldService, call_streams: CallStreams,
) -> None:
    def queue_max_offsets() -> list[tuple[Labels, float]]:
        return [
            ((("topic", t.topic), ("queue", str(q))), float(store.max_offset(t.topic, q)))
            for t in topics.topics()
            for q in range(t.read_queue_nums)
        ]

    def group_lags() -> list[tuple[Labels, float]]:
        out: list[tuple[Labels, float]] = []
        for group, topic in offsets.groups():
            total = sum(x.lag for x in admin.lags(group, [topic]))
            out.append(((("group", group), ("topic", topic)), float(total)))
        return out

    def disk_ratio() -> list[tuple[Labels, float]]:
        return [((), float(store.stats().get("disk_usage_ratio", 0.0)))]

    def commit_log_bytes() -> list[tuple[Labels, float]]:
        stats = store.stats()
        return [((), float(stats.get("commit_log_max_offset", 0)) - float(stats.get("commit_log_min_offset", 0)))]

    metrics.add_gauge("sluice_queue_max_offset", "Max offset (messages) of each queue", queue_max_offsets)
    metrics.add_gauge("sluice_group_lag", "Messages not yet consumed per group and topic", group_lags)
    metrics.add_gauge("sluice_store_disk_usage_ratio", "Used fraction of the store's file system", disk_ratio)
    metrics.add_gauge("sluice_store_commit_log_bytes", "Bytes held in commit-log files", commit_log_bytes)
    metrics.add_gauge("sluice_store_disk_full", "1 while sends are refused for want of disk space",
                           lambda: [((), float(store.disk_full))])
    metrics.add_gauge("sluice_held_pulls", "Pulls currently held by long polling",
                           lambda: [((), float(hold.held_count()))])
    metrics.add_gauge("sluice_call_streams", "Open SendStream and PullStream calls (a worker thread each)",
                           lambda: [((), float(call_streams.open_count()))])

    def transaction_held() -> list[tuple[Labels, float]]:
        held: dict[tuple[str, int], int] = {}
        for piece in store.txn_visibility.open_slices():
            for key, first in piece.first_offsets.items():
                held[key] = min(held.get(key, first), first)
        out: list[tuple[Labels, float]] = []
        for (t, q), at in sorted(held.items()):
            cq = store.queues.find(t, q)
            if cq is not None:
                out.append(((("topic", t), ("queue", str(q))), float(cq.written_offset - at)))
        return out

    metrics.add_gauge("sluice_queue_transaction_held_messages",
                           "Messages of each queue readers cannot see yet: written from the first message of "
                           "an open transaction on (its readable limit) to the end", transaction_held)

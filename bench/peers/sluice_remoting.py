"""Sluice over its RocketMQ remoting port: the same broker as ``sluice``, started with ``--remoting-listen``, its
Producer and PullConsumer given ``remoting://host:port`` (broker/client/remoting_transport.py).

Topics are created over gRPC (the admin calls are not offered over the remoting transport). The latency run's
consumer is a PullConsumer holding its pulls on the broker (PULL_MESSAGE with a suspend timeout, committing the
offset in each pull), as a RocketMQ 4 push consumer does: the PushConsumer's held-pull stream is gRPC's."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from bench.peers.pacing import seq_of
from bench.peers.sluice import SluiceBroker

REMOTING_READY = re.compile(r"remoting on \S+:(\d+)")
HELD_PULL_MS = 1000  # a held pull answers at once when a message arrives; this only bounds an idle wait


class SluiceRemoting(SluiceBroker):
    name = "sluice-remoting"

    def extra_args(self) -> list[str]:
        return ["--remoting-listen", "127.0.0.1:0"]

    def start(self, workdir: Path) -> str:
        version = super().start(workdir)
        assert self.server is not None
        match = REMOTING_READY.search(self.server.log_text())
        if match is None:
            raise RuntimeError(f"the broker's ready line names no remoting port: {self.server.log_tail()}")
        self.client_endpoint = f"remoting://127.0.0.1:{match.group(1)}"
        return version

    def latency_consumer(self) -> Callable[..., dict[int, float]]:
        return remoting_latency_consumer


def remoting_latency_consumer(
    endpoint: str, topic: str, *, ready: Callable[[], None], more: Callable[[int], bool]
) -> dict[int, float]:
    """Held pulls of the topic's one queue over remoting, each committing the offset reached."""
    from broker.client import PullConsumer

    received_at: dict[int, float] = {}
    with PullConsumer(endpoint, f"group-{topic}") as consumer:
        offset = consumer.queue_offsets(topic)[0][1]
        ready()
        while more(len(received_at)):
            result = consumer.pull(topic, 0, offset, 32, HELD_PULL_MS, commit_offset=offset)
            now = time.monotonic()
            for m in result.messages:
                received_at[seq_of(m.body)] = now
            offset = result.next_begin_offset
    return received_at

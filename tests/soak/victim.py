"""A pop consumer in a process of its own, killed by the soak with messages in flight: it receives and never
acknowledges, printing how many it holds so that the soak kills it only once it holds some.

    python -m tests.soak.victim ENDPOINT TOPIC
"""

from __future__ import annotations

import sys
import time

from broker.client import PopConsumer
from broker.errors import BrokerError

INVISIBLE_MS = 10_000  # the broker's least invisible time: what the killed consumer held comes back after it


def main(endpoint: str, topic: str) -> None:
    held = 0
    with PopConsumer(endpoint, "soak-pop", timeout_s=10) as consumer:
        while True:
            error = ""
            try:
                held += len(consumer.receive(topic, max_msgs=8, invisible_ms=INVISIBLE_MS, wait_ms=1000))
            except BrokerError as e:
                error = e.message
                time.sleep(0.2)
            sys.stdout.write(f"held {held} {error}\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

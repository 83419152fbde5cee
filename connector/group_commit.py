"""Commits a query's offsets to its consumer group on the brokers: one atomic call per broker (each broker keeps
its own queues' offsets), retried, never fatal but for a group a broker refuses to know
(auto_create_subscription_group=false): that fails the query with a message saying how to fix it.

Spark's checkpoint is the source of truth for where the query is; the group's offsets are a copy so that
``sluice group lag`` shows progress and a query without a checkpoint can resume with ``startingOffsets=committed``.
Only offsets Spark has declared done are committed (see ``SluiceStreamReader``), so the group never runs ahead of
the checkpoint. A failed commit is retried with backoff and then logged; the next trigger commits newer offsets.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from broker.errors import BrokerError, SubscriptionGroupNotExistError
from connector.broker_link import BrokerLink, unknown_group
from connector.offsets import QueueKey

log = logging.getLogger(__name__)

RETRY_DELAYS_S = (0.1, 0.5, 2.0)  # short: the driver thread waits; the next trigger retries anyway


class GroupCommitter:
    def __init__(self, group: str | None) -> None:
        self.group = group
        self.committed: dict[QueueKey, int] | None = None  # last offsets the broker acknowledged
        self.failures = 0

    def commit(self, link: BrokerLink, positions: Mapping[QueueKey, int]) -> bool:
        """Store ``positions`` for the group (one UpdateConsumerOffsets call per broker); True when stored (or
        nothing to do)."""
        if self.group is None or not positions or positions == self.committed:
            return True
        for attempt, delay in enumerate((0.0, *RETRY_DELAYS_S)):
            time.sleep(delay)
            try:
                link.commit(positions)
            except SubscriptionGroupNotExistError as exc:  # permanent: a retry or a later trigger cannot help
                raise unknown_group(self.group, exc) from None
            except BrokerError as exc:  # every client failure arrives as a BrokerError subclass
                log.warning("commit of group %r offsets failed (attempt %d): %s", self.group, attempt + 1, exc)
                continue
            self.committed = dict(positions)
            return True
        self.failures += 1
        log.error(
            "gave up committing group %r offsets after %d attempts; the query continues (the checkpoint has "
            "them) and the next batch commits newer ones",
            self.group,
            len(RETRY_DELAYS_S) + 1,
        )
        return False

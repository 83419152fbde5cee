"""How long a broker keeps an orderly consumer's queue lock without a renewal (RocketMQ's
``rocketmq.broker.rebalance.lockMaxLiveTime``): the broker expires locks after it, and a client renews well within
it, so both sides read the one number."""

from __future__ import annotations

DEFAULT_LOCK_MAX_LIVE_MS = 60_000

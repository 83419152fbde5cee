"""Rights on the topics inside a SendBatch, checked where the batch is parsed anyway.

A SendBatch names its topics inside its packed entries, not in request fields. Reading them in the gate would walk
the batch a second time (about 1 us per entry in Python, 3.8 ms for 2,000 entries of 100 B: more than storing
them), so the gate leaves a check for the call (``pending``, a context variable of the gRPC worker thread running
it) and the send processor calls ``check_topics`` with the topics its one validation of the batch found, before
anything is stored. With auth off, or for a super user, nothing is pending and the call is free.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextvars import ContextVar

TopicCheck = Callable[[Iterable[str]], None]

pending: ContextVar[TopicCheck | None] = ContextVar("sluice_pending_topic_check", default=None)


def check_topics(topics: Iterable[str]) -> None:
    """NoPermissionError unless the caller of this call may publish to every one of ``topics``."""
    check = pending.get()
    if check is not None:
        check(topics)

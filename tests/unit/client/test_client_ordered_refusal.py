"""An ordered send that never reached its broker says so, so the caller knows it may send it again."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker.client import Message, Producer
from broker.errors import BrokerUnreachableError
from broker.server.broker_controller import BrokerController


def test_an_ordered_send_to_a_broker_that_is_down_says_it_was_never_sent(
    broker_factory: Callable[..., BrokerController],
) -> None:
    """The ordered send's error was rebuilt with the added explanation and lost ``request_sent``: it said "it stored
    nothing" yet claimed the request may have reached the broker."""
    broker = broker_factory()
    with Producer(f"127.0.0.1:{broker.port}") as p:
        p.send(Message("Ordered", b"first"), queue_id=0)  # the route is known from here on
        broker.shutdown()
        with pytest.raises(BrokerUnreachableError, match="never moved to another queue") as refused:
            p.send(Message("Ordered", b"second"), queue_id=0)
        assert refused.value.request_sent is False

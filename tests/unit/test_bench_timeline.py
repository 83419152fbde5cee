"""bench.timeline's matching of stamps to a message's steps, and the broker methods it wraps (a rename there would
leave the benchmark stamping nothing)."""

from __future__ import annotations

import inspect

import pytest

from bench.timeline import STEPS, WARMUP_MSGS, steps_of
from broker.server.broker_service import BrokerService
from broker.server.pull_hold import PullHoldService
from broker.store.dispatch_service import DispatchService
from broker.store.message_store import MessageStore


def test_each_step_is_the_time_between_its_two_stamps() -> None:
    us = 1000  # stamps are ns; steps come out in us
    offset = WARMUP_MSGS
    due, called = 1_000 * us, 1_010 * us
    sends = [(offset, due, called, 1_400 * us)]
    stamps = [
        ("send", [offset], 1_200 * us, 1_290 * us),  # handler: starts 190 us after the call
        ("put", 1_230 * us, 1_270 * us),  # checks 30, put 40, after the put 20
        ("pass", 900 * us),  # an earlier pass: not this message's
        ("told", offset, 950 * us),  # told of the message before this one
        ("pass", 1_320 * us),  # 50 after the put returned
        ("told", offset + 1, 1_345 * us),  # 25 into the pass
        ("pull", offset - 1, 0, 1_000 * us, 1_340 * us),  # answered empty: not this message's answer
        ("pull", offset, 2, 1_000 * us, 1_400 * us),  # answers 55 after told
    ]
    consumer = {"answers": [(offset, 2, 1_550 * us)], "heard": {str(offset): 1_560 * us}}
    steps = steps_of(sends, stamps, consumer)
    got = {step: list(values) for step, values in steps.items()}
    assert got == {
        "behind schedule": [10.0], "client to handler": [190.0], "checks before put": [30.0], "store put": [40.0],
        "put to pass": [50.0], "dispatch pass": [25.0], "held pull answers": [55.0], "answer to consumer": [150.0],
        "to the listener": [10.0], "end to end": [560.0], "handler after put": [20.0], "send round trip": [390.0],
    }
    assert list(got) == list(STEPS)


def test_warm_up_and_unmatched_messages_are_left_out() -> None:
    sends = [(WARMUP_MSGS - 1, 0, 1, 2), (WARMUP_MSGS, 0, 1, 2)]  # the first in the warm-up; the second never heard
    stamps = [("send", [WARMUP_MSGS - 1], 1, 2), ("send", [WARMUP_MSGS], 1, 2), ("put", 1, 2), ("pass", 1),
              ("told", WARMUP_MSGS + 1, 3), ("pull", WARMUP_MSGS - 1, 2, 1, 4)]
    steps = steps_of(sends, stamps, {"answers": [(WARMUP_MSGS - 1, 2, 5)], "heard": {str(WARMUP_MSGS - 1): 6}})
    assert all(len(values) == 0 for values in steps.values())


@pytest.mark.parametrize(
    ("cls", "method", "parameters"),
    [
        (BrokerService, "SendMessage", ["self", "request", "context"]),
        (BrokerService, "PullMessage", ["self", "request", "context"]),
        (DispatchService, "run_once", ["self"]),
        (PullHoldService, "on_arrival", ["self", "topic", "queue_id", "max_offset"]),
    ],
)
def test_the_wrapped_methods_take_what_the_stamps_read(cls: type, method: str, parameters: list[str]) -> None:
    assert list(inspect.signature(getattr(cls, method)).parameters) == parameters


def test_put_message_is_the_single_put() -> None:
    assert list(inspect.signature(MessageStore.put_message).parameters)[:4] == ["self", "topic", "queue_id", "body"]

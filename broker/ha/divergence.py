"""Where a returning replica's log stops agreeing with its master's: found by comparing epoch histories, never by
trusting a high watermark (KIP-101: truncating to the high watermark after a restart loses acknowledged data).

Both sides keep an epoch file (epoch_file.py). Bytes before a history's first entry count as epoch 0 (a store that
held data before it was replicated). For the slave's newest epoch ``E``, the master finds the newest epoch ``E' <=
E`` it has and where that epoch ends on the master (the start of its next epoch, or its log end). The two logs
agree up to ``min(master's end of E', slave's end of E')``: Kafka's follower rule after OffsetsForLeaderEpoch
(KIP-279), applied to whole histories at once since both are sent in one handshake. The slave keeps everything
below that point and cuts the rest.

A slave whose agreeing prefix ends below the master's first byte (the master expired those files) cannot continue:
it discards its log and restarts at the master's minimum (``Plan.reset``). RocketMQ's classic HA left such a slave
stuck for ever (apache/rocketmq 3388).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from broker.ha.epoch_file import EpochEntry


@dataclass(frozen=True)
class Plan:
    """What the master tells a connecting slave."""

    start_offset: int  # where the slave's log continues
    truncate_to: int  # -1: keep everything; else cut the slave's log here first
    reset: bool  # discard the whole log (start_offset is then the master's first byte)


def _end_of(entries: Sequence[EpochEntry], epoch: int, log_end: int) -> tuple[int, int]:
    """(newest epoch <= ``epoch`` in ``entries``, where it ends); epoch 0 stands for bytes before the first entry."""
    for i in range(len(entries) - 1, -1, -1):
        if entries[i].epoch <= epoch:
            end = entries[i + 1].start_offset if i + 1 < len(entries) else log_end
            return entries[i].epoch, min(end, log_end)
    first = entries[0].start_offset if entries else log_end
    return 0, min(first, log_end)


def plan(
    master_entries: Sequence[EpochEntry], master_min: int, master_end: int,
    slave_entries: Sequence[EpochEntry], slave_end: int,
) -> Plan:
    if slave_end == 0 and not slave_entries:  # an empty log (new, or discarded to start again): from the first file
        return Plan(master_min, -1, False)
    slave_epoch = slave_entries[-1].epoch if slave_entries else 0
    common, master_epoch_end = _end_of(master_entries, slave_epoch, master_end)
    _, slave_epoch_end = _end_of(slave_entries, common, slave_end)
    agree = min(master_epoch_end, slave_epoch_end, slave_end)
    if agree < master_min:
        return Plan(master_min, -1, True)
    return Plan(agree, agree if agree < slave_end else -1, False)

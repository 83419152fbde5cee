"""SingleEntryEncoder: one message (``MessageStore.put_message``) encoded as a commit-log entry, or the PutResult
that refuses it.

The layout is the format room's (broker/format/single.py); what the store adds is its own limits (the largest
message, one commit-log file) and its host, and the translation of a refusal into a put status.
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.format.message import END_FILE_MIN_BLANK_LENGTH
from broker.format.single import Refusal, SingleEncoder
from broker.store.commit_log import CommitLog, now_ms
from broker.store.store_config import StoreConfig
from broker.store.store_results import PutResult, PutStatus


class SingleEntryEncoder:
    def __init__(self, config: StoreConfig, commit_log: CommitLog) -> None:
        self.config = config
        self.commit_log = commit_log
        self._single = SingleEncoder()

    def encode(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: Mapping[str, str] | None,
        *,
        flag: int,
        sys_flag: int,
        born_timestamp: int,
        born_host: tuple[str, int],
        reconsume_times: int,
        prepared_transaction_offset: int,
    ) -> bytearray | PutResult:
        """The encoded entry (queue offset, physical offset, store time still zero), or the PutResult saying why not."""
        entry = self._single.encode(
            topic, queue_id, body, properties, flag=flag, sys_flag=sys_flag, born_timestamp=born_timestamp,
            born_host=born_host, reconsume_times=reconsume_times,
            prepared_transaction_offset=prepared_transaction_offset, store_ip=self.commit_log.store_ip,
            store_port=self.commit_log.store_port, max_message_size=self.config.max_message_size, now_ms=now_ms,
        )
        if isinstance(entry, Refusal):
            status = PutStatus.PROPERTIES_SIZE_EXCEEDED if entry.properties_too_large else PutStatus.MESSAGE_ILLEGAL
            return PutResult(status, error=entry.reason)
        if len(entry) + END_FILE_MIN_BLANK_LENGTH > self.config.mapped_file_size_commit_log:
            return PutResult(
                PutStatus.MESSAGE_ILLEGAL,
                error=f"MESSAGE_SIZE_EXCEEDED: the entry is {len(entry)} bytes and cannot fit one commit-log file of "
                f"{self.config.mapped_file_size_commit_log} bytes; shrink the body or properties",
            )
        return entry

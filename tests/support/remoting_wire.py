"""Messages sent and pulled over remoting as a RocketMQ 4 client writes and reads them: SEND_MESSAGE_V2 headers with
the client's properties (UNIQ_KEY, TAGS, KEYS), bodies of 4 KiB and more zlib-compressed, pulls decoded from the
stored layout and inflated. For the tests that cross protocols (remoting in, gRPC, RocketMQ 5 or Spark out, and back).
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from broker.format.compression import compressed_body, inflated_body
from broker.format.message import StoredMessage
from broker.remoting.client import RemotingClient
from broker.remoting.codes import RequestCode, WireCode
from broker.remoting.command import RemotingCommand
from broker.remoting.message_entry import iter_stored
from broker.remoting.message_properties import format_properties
from broker.server.process import BrokerProcess

# DefaultMQProducer.compressMsgBodyOverHowmuch: a 4.x producer compresses bodies from this size on.
COMPRESS_FROM_BYTES = 4096
PULL_SUBSCRIPTION = 0x4  # PullSysFlag: the pull carries its subscription


@contextmanager
def remoting_broker(root: Path, config: Path | None = None) -> Iterator[BrokerProcess]:
    """A broker process serving gRPC and remoting (port 0 each) with its store in ``root`` (and ``config``, if
    given); afterwards stopped cleanly (asserted) and ``root`` removed: a store is preallocated, and pytest's
    tmp_path_retention_policy only removes function-scoped directories."""
    proc = BrokerProcess(root / "store", config=config, extra_args=["--remoting-listen", "127.0.0.1:0"]).start()
    yield proc
    assert proc.stop() == 0, "\n".join(proc.output)
    shutil.rmtree(root)


def send_v2(client: RemotingClient, topic: str, body: bytes, *, tags: str | None = None,
            keys: list[str] | None = None, properties: dict[str, str] | None = None,
            queue_id: int = 0) -> RemotingCommand:
    """One SEND_MESSAGE_V2 as a 4.x producer writes it; asserts it was stored and returns the answer."""
    props = {"UNIQ_KEY": uuid.uuid4().hex.upper(), "WAIT": "true", **(properties or {})}
    if tags is not None:
        props["TAGS"] = tags
    if keys:
        props["KEYS"] = " ".join(keys)
    sys_flag = 0
    if len(body) >= COMPRESS_FROM_BYTES:
        body, sys_flag = compressed_body(body)
    header = {"a": "cross-producer", "b": topic, "c": "TBW102", "d": "4", "e": str(queue_id), "f": str(sys_flag),
              "g": "1700000000000", "h": "0", "i": format_properties(props).rstrip("\x02"), "j": "0", "k": "false",
              "m": "false"}
    answer = client.invoke(RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields=header, body=body))
    assert answer.code == WireCode.SUCCESS, answer.remark
    answer.ext_fields["UNIQ_KEY"] = props["UNIQ_KEY"]  # the id a 4.x client shows as msgId
    return answer


def pull_all(client: RemotingClient, group: str, topic: str, queues: int) -> list[StoredMessage]:
    """Every message of ``topic``'s queues from offset 0, as a 4.x consumer decodes them (bodies inflated)."""
    found: list[StoredMessage] = []
    for queue in range(queues):
        offset = 0
        while True:
            ext = {"consumerGroup": group, "topic": topic, "queueId": str(queue), "queueOffset": str(offset),
                   "maxMsgNums": "32", "sysFlag": str(PULL_SUBSCRIPTION), "commitOffset": "0",
                   "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0",
                   "expressionType": "TAG"}
            answer = client.invoke(RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields=ext))
            if answer.code != WireCode.SUCCESS:
                break
            for m in iter_stored(answer.body):
                m.body = inflated_body(m.sys_flag, m.body)
                found.append(m)
            offset = int(answer.ext_fields["nextBeginOffset"])
    return found

"""Options of the ``sluice`` sink (``df.write(Stream).format("sluice")``), validated when the query starts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from broker.client.producer import DEFAULT_BATCH_LIMIT_BYTES
from broker.errors import MessageIllegalError
from broker.format.message import DEFAULT_MAX_MESSAGE_SIZE, TOPIC_PATTERN, validate_topic
from connector.auth_options import ANONYMOUS, AUTH_OPTIONS, AuthKeys, parse_auth_options
from connector.connector_errors import SourceOptionError
from connector.options import broker_options
from connector.tls_options import PLAIN, TLS_OPTIONS, TlsFiles, parse_tls_options

EXACTLY_ONCE = "exactly-once"
AT_LEAST_ONCE = "at-least-once"
DEFAULT_BATCH_MESSAGES = 16384  # with batchBytes, 2.9 MB of 100 B rows: per-call costs fell 20% (bench.spark_sink)
MAX_BATCH_MESSAGES = 65536  # one SendBatch call is one buffer in broker memory: bound it
# One SendBatch is stored whole, so it must fit the broker's max_batch_bytes (4 MiB by default): the default is
# the client's own bound under it. A broker configured for larger batches can take a larger batchBytes.
DEFAULT_BATCH_BYTES = DEFAULT_BATCH_LIMIT_BYTES
MAX_BATCH_BYTES = 32 << 20  # well under gRPC's message limit the client sets
DEFAULT_MAX_INFLIGHT = 4
MAX_INFLIGHT = 64
DEFAULT_PRODUCER_GROUP = "sluice-spark-sink"

# Options Spark itself puts in the writer's options; accepted and ignored.
SPARK_OWN = {"path", "checkpointlocation", "queryname"}
KNOWN = {
    n.lower(): n
    for n in (
        "endpoints",
        "namesrv",
        "topic",
        "deliveryGuarantee",
        "batchMessages",
        "batchBytes",
        "maxInflight",
        "producerGroup",
        "ignoreExtraColumns",
        "maxMessageSize",
        "sendRetries",
        *TLS_OPTIONS,
        *AUTH_OPTIONS,
    )
}


@dataclass(frozen=True, slots=True)
class SinkOptions:
    endpoints: str | None  # one broker; None in a cluster
    namesrv: str | None  # a cluster's name servers (rows go to queues of every broker); None with one broker
    topic: str | None
    exactly_once: bool
    batch_messages: int
    batch_bytes: int
    max_inflight: int
    producer_group: str
    ignore_extra_columns: bool
    max_message_size: int
    send_retries: int
    tls: TlsFiles = PLAIN
    auth: AuthKeys = ANONYMOUS

    def rights_needed(self) -> str:
        """What a broker with authentication must grant the query's user (broker/auth/requirements.py)."""
        if not self.exactly_once:
            return "The sluice sink (at-least-once) needs Pub on each topic it writes (Topic:<name>)"
        return (
            "The exactly-once sluice sink needs Pub on each topic it writes (Topic:<name>), Pub on its producer "
            f"group (Group:{self.producer_group}: its transactions) and Pub on the Cluster (transaction decisions "
            "and the listing of its own transactions)"
        )


def _int(opts: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SourceOptionError(f"option {name}={raw!r} is not an integer; give a number from {lo} to {hi}") from None
    if not lo <= value <= hi:
        raise SourceOptionError(f"option {name}={value} is out of range; give a number from {lo} to {hi}")
    return value


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    if raw.lower() not in ("true", "false"):
        raise SourceOptionError(f"option {name}={raw!r} must be true or false")
    return raw.lower() == "true"


def _producer_group(value: str) -> str:
    if not TOPIC_PATTERN.fullmatch(value) or len(value) > 255:
        raise SourceOptionError(
            f"option producerGroup: {value!r} must be 1..255 characters of letters, digits, '%', '|', '_', '-'"
        )
    return value


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    opts = {k.lower(): str(v) for k, v in options.items()}
    unknown = sorted(k for k in opts if k not in KNOWN and k not in SPARK_OWN)
    if unknown:
        raise SourceOptionError(f"unknown sink option(s) {unknown}; the sluice sink accepts {sorted(KNOWN.values())}")
    # at query start, not in tasks after timeouts
    endpoints, namesrv = broker_options({k: v.strip() for k, v in opts.items() if k in ("endpoints", "namesrv")})
    topic = opts.get("topic") or None
    if topic is not None:
        try:
            validate_topic(topic)
        except MessageIllegalError as e:
            raise SourceOptionError(f"option topic: {e.message}") from None
    guarantee = opts.get("deliveryguarantee", EXACTLY_ONCE).lower()
    if guarantee not in (EXACTLY_ONCE, AT_LEAST_ONCE):
        raise SourceOptionError(
            f"option deliveryGuarantee={guarantee!r}; choose {EXACTLY_ONCE} (default) or {AT_LEAST_ONCE}"
        )
    return SinkOptions(
        endpoints=endpoints,
        namesrv=namesrv,
        topic=topic,
        exactly_once=guarantee == EXACTLY_ONCE,
        batch_messages=_int(opts, "batchMessages", DEFAULT_BATCH_MESSAGES, 1, MAX_BATCH_MESSAGES),
        batch_bytes=_int(opts, "batchBytes", DEFAULT_BATCH_BYTES, 1024, MAX_BATCH_BYTES),
        max_inflight=_int(opts, "maxInflight", DEFAULT_MAX_INFLIGHT, 1, MAX_INFLIGHT),
        producer_group=_producer_group(opts.get("producergroup", DEFAULT_PRODUCER_GROUP)),
        ignore_extra_columns=_bool(opts, "ignoreExtraColumns", False),
        max_message_size=_int(opts, "maxMessageSize", DEFAULT_MAX_MESSAGE_SIZE, 1, 64 << 20),
        send_retries=_int(opts, "sendRetries", 5, 0, 100),
        tls=parse_tls_options(opts),
        auth=parse_auth_options(opts),
    )

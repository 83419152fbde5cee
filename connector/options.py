"""Every option of the ``sluice`` source, parsed and validated once when the query starts.

Names and meanings follow Spark's Kafka source where the concept is the same (``startingOffsets``,
``failOnDataLoss``, ``maxOffsetsPerTrigger``, ``minPartitions``...). Each bad value raises ``SourceOptionError``
naming the option, the value and what is accepted, so a typo fails the query at start rather than mid-run.

Where the brokers are: ``endpoints`` (one broker, host:port) or ``namesrv`` (a cluster's name servers, as the Python
client's ``namesrv=``), exactly one of them. ``brokerName`` names the one broker in the offsets and the ``broker``
column; in a cluster the name servers name each broker, so it is refused there. ``https://`` on them, or the
``tls.*`` options (tls_options.py), make every connection TLS; ``accessKey`` and ``secretKey`` (auth_options.py) sign
every call for brokers that require authentication.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from broker.address import parse_endpoint
from broker.client.namesrv_client import parse_namesrv_list
from broker.client.tls import TLS_SCHEME, split_scheme
from broker.errors import InvalidArgumentError, MessageIllegalError
from broker.format.message import TOPIC_PATTERN, validate_topic
from broker.format.system_topics import MAX_GROUP_CHARS
from connector.auth_options import ANONYMOUS, AUTH_OPTIONS, AuthKeys, parse_auth_options
from connector.connector_errors import SourceOptionError
from connector.offsets import is_decimal
from connector.tls_options import PLAIN, TLS_OPTIONS, TlsFiles, parse_tls_options

StartMode = Literal["earliest", "latest", "committed", "json", "timestamp"]
EARLIEST = -2  # in offset JSON, as Kafka's source
LATEST = -1

DEFAULT_BROKER_NAME = "broker-a"  # RocketMQ's conventional first broker; the offset keys carry it
DEFAULT_PULL_BATCH_SIZE = 4096  # the broker answers at most max_pull_msgs (4096) per pull
MAX_PULL_BATCH_SIZE = 65536  # one pull's messages are decoded into one Arrow batch: bound its memory
DEFAULT_POLL_TIMEOUT_MS = 30_000
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000  # Kafka's default maxTriggerDelay
_I64_MAX = (1 << 63) - 1  # offsets and timestamps travel as int64 on the wire
_BROKER_NAME = re.compile(r"[A-Za-z0-9_.-]+")  # fullmatch: "$" would also admit a trailing newline
_SIZE = re.compile(r"^(\d+)\s*([kmgt]?)i?b?$", re.IGNORECASE)
_DURATION = re.compile(r"^(\d+)\s*(ms|s|m|min|h|d)?$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DURATION_MS = {None: 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}

# Offsets per topic, keyed as in the Spark offset: {"topic": {"broker:queueId": n}}.
OffsetJson = dict[str, dict[str, int]]

KNOWN_OPTIONS = {
    name.lower(): name
    for name in (
        "endpoints",
        "namesrv",
        "topic",
        "topics",
        "topicPattern",
        "consumerGroup",
        "brokerName",
        "startingOffsets",
        "startingOffsetsFallback",
        "startingTimestamp",
        "startingOffsetsByTimestampStrategy",
        "endingOffsets",
        "failOnDataLoss",
        "maxMessagesPerTrigger",
        "maxOffsetsPerTrigger",
        "maxBytesPerTrigger",
        "minMessagesPerTrigger",
        "maxTriggerDelay",
        "minPartitions",
        "maxMessagesPerPartition",
        "tags",
        "pullBatchSize",
        "pollTimeoutMs",
        "includeProperties",
        *TLS_OPTIONS,
        *AUTH_OPTIONS,
    )
}


@dataclass(frozen=True, slots=True)
class StartingOffsets:
    mode: StartMode
    offsets: OffsetJson = field(default_factory=dict)  # mode "json": values may be EARLIEST / LATEST
    timestamp_ms: int = -1  # mode "timestamp"


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """The validated options of one query (picklable: executors get a copy inside each partition's reader)."""

    endpoints: str | None  # one broker; None in a cluster
    namesrv: str | None  # a cluster's name servers; None with one broker
    topics: tuple[str, ...]  # explicit topics; empty when topic_pattern is set
    topic_pattern: str | None
    consumer_group: str | None
    broker_name: str | None  # one broker: the name its offsets carry; None in a cluster (the route names brokers)
    starting: StartingOffsets
    starting_fallback: Literal["earliest", "latest"]
    timestamp_strategy: Literal["error", "latest"]
    ending: OffsetJson | None  # batch only; None = latest
    fail_on_data_loss: bool
    max_messages_per_trigger: int | None
    max_bytes_per_trigger: int | None
    min_messages_per_trigger: int | None
    max_trigger_delay_ms: int
    min_partitions: int | None
    max_messages_per_partition: int | None
    tag_expression: str  # as sent to the broker: "*" or "A || B"
    tag_set: frozenset[str] | None  # exact tags to keep; None = all
    pull_batch_size: int
    poll_timeout_ms: int
    include_properties: bool
    tls: TlsFiles = PLAIN
    auth: AuthKeys = ANONYMOUS

    @property
    def cluster(self) -> bool:
        return self.namesrv is not None

    @property
    def pull_group(self) -> str:
        """The group executors pull under (shown by the broker's consumer tools)."""
        return self.consumer_group or "spark-sluice-reader"

    def rights_needed(self) -> str:
        """What a broker with authentication must grant the query's user (broker/auth/requirements.py)."""
        listing = "; with 'topicPattern' also List on the Cluster (to list topics)" if self.topic_pattern else ""
        return (
            f"The sluice source needs Sub on each topic it reads (Topic:<name>) and on its consumer group "
            f"(Group:{self.pull_group}){listing}"
        )

    def topic_matches(self, topic: str) -> bool:
        if self.topic_pattern is not None:
            return re.fullmatch(self.topic_pattern, topic) is not None
        return topic in self.topics


def parse_options(raw: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Validate every option; ``streaming`` selects the defaults and which options are allowed."""
    opts = {str(k).lower(): str(v) for k, v in raw.items()}
    unknown = sorted(k for k in opts if k not in KNOWN_OPTIONS)
    if unknown:
        raise SourceOptionError(
            f"unknown option(s) {', '.join(repr(u) for u in unknown)}; the sluice source accepts: "
            + ", ".join(sorted(KNOWN_OPTIONS.values()))
        )
    group = _group(opts.get("consumergroup"))
    topics, pattern = _subscription(opts)
    starting = _starting(opts, streaming=streaming, group=group)
    max_msgs = _max_messages(opts)
    min_msgs = _positive_int(opts, "minMessagesPerTrigger")
    if min_msgs is not None and max_msgs is not None and min_msgs > max_msgs:
        raise SourceOptionError(
            f"option 'minMessagesPerTrigger' ({min_msgs}) is larger than 'maxMessagesPerTrigger' ({max_msgs})"
        )
    tag_expression, tag_set = _tags(opts.get("tags", "*"))
    endpoints, namesrv = broker_options(opts)
    if namesrv is not None and "brokername" in opts:
        raise SourceOptionError(
            "option 'brokerName' names the one broker of option 'endpoints'; with 'namesrv' the name servers name "
            "the brokers: drop 'brokerName'"
        )
    return SourceOptions(
        endpoints=endpoints,
        namesrv=namesrv,
        topics=topics,
        topic_pattern=pattern,
        consumer_group=group,
        broker_name=None if namesrv is not None else _broker_name(opts.get("brokername", DEFAULT_BROKER_NAME)),
        starting=starting,
        starting_fallback=_choice(  # type: ignore[arg-type]
            opts, "startingOffsetsFallback", ("earliest", "latest"), "latest" if streaming else "earliest"
        ),
        timestamp_strategy=_choice(opts, "startingOffsetsByTimestampStrategy", ("error", "latest"), "error"),  # type: ignore[arg-type]
        ending=_ending(opts, streaming=streaming),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        max_messages_per_trigger=max_msgs,
        max_bytes_per_trigger=_size(opts, "maxBytesPerTrigger"),
        min_messages_per_trigger=min_msgs,
        max_trigger_delay_ms=_duration_ms(opts, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY_MS),
        min_partitions=_positive_int(opts, "minPartitions"),
        max_messages_per_partition=_positive_int(opts, "maxMessagesPerPartition"),
        tag_expression=tag_expression,
        tag_set=tag_set,
        pull_batch_size=_bounded_int(opts, "pullBatchSize", DEFAULT_PULL_BATCH_SIZE, MAX_PULL_BATCH_SIZE),
        poll_timeout_ms=_bounded_int(opts, "pollTimeoutMs", DEFAULT_POLL_TIMEOUT_MS, 3_600_000),
        include_properties=_bool(opts, "includeProperties", False),
        tls=parse_tls_options(opts),
        auth=parse_auth_options(opts),
    )


# ------------------------------------------------------------------------------------------------ one per option


def broker_options(opts: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(endpoints, None) for one broker or (None, name servers) for a cluster, from the options of that name (keys
    lower-case; the sink's too): exactly one of them."""
    if "namesrv" in opts:
        if "endpoints" in opts:
            raise SourceOptionError(
                "give option 'endpoints' (one broker) or 'namesrv' (a cluster's name servers), not both"
            )
        try:  # https:// on one name server means TLS with all of them: kept on the list for the clients
            https = split_scheme(opts["namesrv"])[1]
            return None, (TLS_SCHEME if https else "") + ",".join(parse_namesrv_list(opts["namesrv"]))
        except InvalidArgumentError as e:
            raise SourceOptionError(f"option 'namesrv': {e.message}") from None
    return parse_endpoints(opts.get("endpoints")), None


def parse_endpoints(value: str | None) -> str:
    """Comma-separated host:port list."""
    if not value:
        raise SourceOptionError(
            "option 'endpoints' is required: the broker's host:port, e.g. 127.0.0.1:10911 (or option 'namesrv': "
            "a cluster's name servers)"
        )
    parts = [p.strip() for p in value.split(",") if p.strip()]
    for part in parts:
        try:
            parse_endpoint(split_scheme(part)[0])  # the client's own rule (broker/address.py): a port, IPv6 in brackets
        except InvalidArgumentError as e:
            raise SourceOptionError(f"option 'endpoints': {e.message}") from None
    if not parts:
        raise SourceOptionError("option 'endpoints' names no broker; give host:port, e.g. 127.0.0.1:10911")
    return ",".join(parts)


def _subscription(opts: Mapping[str, str]) -> tuple[tuple[str, ...], str | None]:
    given = [name for name in ("topic", "topics", "topicpattern") if name in opts]
    if len(given) != 1:
        raise SourceOptionError(
            "give exactly one of the options 'topic', 'topics' (comma list) or 'topicPattern' (regex); "
            f"got {len(given)}: {', '.join(KNOWN_OPTIONS[g] for g in given) or 'none'}"
        )
    if given[0] == "topicpattern":
        try:
            re.compile(opts["topicpattern"])
        except re.error as exc:
            raise SourceOptionError(f"option 'topicPattern': {opts['topicpattern']!r} is not a regex: {exc}") from None
        return (), opts["topicpattern"]
    name = KNOWN_OPTIONS[given[0]]
    topics = tuple(t.strip() for t in opts[given[0]].split(",") if t.strip())
    if not topics or (given[0] == "topic" and len(topics) != 1):
        raise SourceOptionError(
            f"option {name!r}: {opts[given[0]]!r} must name {'one topic' if name == 'topic' else 'topics'}"
        )
    for t in topics:
        try:
            validate_topic(t)
        except MessageIllegalError as exc:
            raise SourceOptionError(f"option {name!r}: {exc.message}") from None
    return tuple(dict.fromkeys(topics)), None


def _group(value: str | None) -> str | None:
    if value is None:
        return None
    if not value or not TOPIC_PATTERN.fullmatch(value) or len(value) > MAX_GROUP_CHARS:
        raise SourceOptionError(
            f"option 'consumerGroup': {value!r} must be 1..{MAX_GROUP_CHARS} characters of letters, digits, '%', "
            "'|', '_', '-' (the broker's limit: its retry topic %RETRY%<group> must fit 127 characters)"
        )
    return value


def _broker_name(value: str) -> str:
    if not _BROKER_NAME.fullmatch(value):
        raise SourceOptionError(f"option 'brokerName': {value!r} must be letters, digits, '.', '_' or '-' (no ':')")
    return value


def _starting(opts: Mapping[str, str], *, streaming: bool, group: str | None) -> StartingOffsets:
    if "startingtimestamp" in opts:
        if "startingoffsets" in opts:
            raise SourceOptionError("give either option 'startingOffsets' or 'startingTimestamp', not both")
        ts = opts["startingtimestamp"]
        if not is_decimal(ts) or int(ts) > _I64_MAX:
            raise SourceOptionError(f"option 'startingTimestamp': {ts!r} is not milliseconds since the epoch")
        return StartingOffsets("timestamp", timestamp_ms=int(ts))
    default = ("committed" if group else "latest") if streaming else "earliest"
    value = opts.get("startingoffsets", default).strip()
    if value.lower() in ("earliest", "latest", "committed"):
        mode = value.lower()
        if mode == "committed" and group is None:
            raise SourceOptionError("option 'startingOffsets' is 'committed' but no option 'consumerGroup' is given")
        if mode == "latest" and not streaming:
            raise SourceOptionError("option 'startingOffsets' cannot be 'latest' for a batch query (it reads nothing)")
        return StartingOffsets(mode)  # type: ignore[arg-type]
    offsets = _offset_json("startingOffsets", value, allowed=(EARLIEST, LATEST))
    if not streaming and any(v == LATEST for q in offsets.values() for v in q.values()):
        raise SourceOptionError("option 'startingOffsets': -1 (latest) is not allowed for a batch query")
    return StartingOffsets("json", offsets=offsets)


def _ending(opts: Mapping[str, str], *, streaming: bool) -> OffsetJson | None:
    if "endingoffsets" not in opts:
        return None
    if streaming:
        raise SourceOptionError("option 'endingOffsets' is for batch queries (spark.read) only")
    value = opts["endingoffsets"].strip()
    if value.lower() == "latest":
        return None
    offsets = _offset_json("endingOffsets", value, allowed=(LATEST,))
    return offsets


def _offset_json(name: str, value: str, *, allowed: tuple[int, ...]) -> OffsetJson:
    hint = f'{{"topic": {{"{DEFAULT_BROKER_NAME}:0": 42}}}}'
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        raise SourceOptionError(f"option {name!r}: {value[:80]!r} is neither a keyword nor JSON like {hint}") from None
    if not isinstance(parsed, dict):
        raise SourceOptionError(f"option {name!r}: JSON must be an object like {hint}")
    out: OffsetJson = {}
    for topic, queues in parsed.items():
        if not isinstance(queues, dict):
            raise SourceOptionError(f'option {name!r}: topic {topic!r} must map to {{"broker:queueId": offset}}')
        out[topic] = {}
        for key, off in queues.items():
            _, sep, qid = str(key).rpartition(":")
            ok = isinstance(off, int) and not isinstance(off, bool) and (0 <= off <= _I64_MAX or off in allowed)
            if not sep or not is_decimal(qid) or not ok:
                special = " or ".join(str(a) for a in allowed)
                raise SourceOptionError(
                    f"option {name!r}: {topic}/{key} = {off!r}; keys are 'broker:queueId', values offsets >= 0"
                    + (f" or {special}" if special else "")
                )
            out[topic][key] = off
    return out


def _max_messages(opts: Mapping[str, str]) -> int | None:
    a = _positive_int(opts, "maxMessagesPerTrigger")
    b = _positive_int(opts, "maxOffsetsPerTrigger")
    if a is not None and b is not None and a != b:
        raise SourceOptionError(
            f"options 'maxMessagesPerTrigger' ({a}) and its alias 'maxOffsetsPerTrigger' ({b}) disagree; give one"
        )
    return a if a is not None else b


def _tags(value: str) -> tuple[str, frozenset[str] | None]:
    expr = value.strip()
    if expr in ("", "*"):
        return "*", None
    tags = [t.strip() for t in expr.split("||")]
    if any(not t or any(c.isspace() for c in t) or t == "*" for t in tags):
        raise SourceOptionError(f"option 'tags': {value!r} must be '*' or tags joined by '||', e.g. 'TagA || TagB'")
    return " || ".join(tags), frozenset(tags)


def _choice(opts: Mapping[str, str], name: str, allowed: tuple[str, ...], default: str) -> str:
    value = opts.get(name.lower(), default).strip().lower()
    if value not in allowed:
        raise SourceOptionError(f"option {name!r}: {value!r} is not one of {', '.join(allowed)}")
    return value


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    value = opts.get(name.lower())
    if value is None:
        return default
    if value.strip().lower() not in ("true", "false"):
        raise SourceOptionError(f"option {name!r}: {value!r} is not 'true' or 'false'")
    return value.strip().lower() == "true"


def _positive_int(opts: Mapping[str, str], name: str) -> int | None:
    value = opts.get(name.lower())
    if value is None:
        return None
    if not is_decimal(value.strip()) or int(value) <= 0:
        raise SourceOptionError(f"option {name!r}: {value!r} is not a positive whole number")
    return int(value)


def _bounded_int(opts: Mapping[str, str], name: str, default: int, limit: int) -> int:
    value = _positive_int(opts, name)
    if value is None:
        return default
    if value > limit:
        raise SourceOptionError(f"option {name!r}: {value} is over the limit {limit}")
    return value


def _size(opts: Mapping[str, str], name: str) -> int | None:
    value = opts.get(name.lower())
    if value is None:
        return None
    m = _SIZE.match(value.strip())
    if not m or int(m.group(1)) <= 0:
        raise SourceOptionError(f"option {name!r}: {value!r} is not a positive size in bytes (e.g. 1048576, 64m, 1g)")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]


def _duration_ms(opts: Mapping[str, str], name: str, default: int) -> int:
    value = opts.get(name.lower())
    if value is None:
        return default
    m = _DURATION.match(value.strip())
    if not m:
        raise SourceOptionError(f"option {name!r}: {value!r} is not a duration (e.g. 500ms, 30s, 15m, 1h)")
    unit = m.group(2).lower() if m.group(2) else None
    return int(m.group(1)) * _DURATION_MS[unit]

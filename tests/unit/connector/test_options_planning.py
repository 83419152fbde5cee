"""Option validation (every bad value names its option) and the pure planning arithmetic."""

from __future__ import annotations

import itertools

import pytest

from connector.connector_errors import SourceOptionError
from connector.offsets import SourceOffset, parse_positions
from connector.options import parse_options
from connector.planning import OffsetRange, share_budget, split_ranges
from connector.sink_options import parse_sink_options

BASE = {"endpoints": "127.0.0.1:10911", "topic": "orders"}


def stream(**extra: str) -> object:
    return parse_options({**BASE, **extra}, streaming=True)


def test_defaults() -> None:
    o = parse_options(BASE, streaming=True)
    assert o.starting.mode == "latest" and o.fail_on_data_loss and o.tag_set is None and not o.include_properties
    assert parse_options({**BASE, "consumerGroup": "g"}, streaming=True).starting.mode == "committed"
    assert parse_options(BASE, streaming=False).starting.mode == "earliest"


def test_option_names_are_case_insensitive_and_values_parsed() -> None:
    o = parse_options(
        {**BASE, "MAXOFFSETSPERTRIGGER": "10", "maxBytesPerTrigger": "64m", "maxTriggerDelay": "30s",
         "tags": "A||B", "startingOffsets": '{"orders": {"broker-a:0": -2, "broker-a:1": 5}}'},
        streaming=True,
    )
    assert o.max_messages_per_trigger == 10 and o.max_bytes_per_trigger == 64 << 20
    assert o.max_trigger_delay_ms == 30_000 and o.tag_set == {"A", "B"} and o.tag_expression == "A || B"
    assert o.starting.offsets == {"orders": {"broker-a:0": -2, "broker-a:1": 5}}


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"endpoints": None}, "endpoints"),
        ({"endpoints": "localhost"}, "endpoints"),
        ({"endpoints": "::1:10911"}, "endpoints"),  # IPv6 without brackets: the client's rule, at query start
        ({"endpoints": " , "}, "endpoints"),
        ({"topics": "a,b"}, "topic"),
        ({"topic": "bad topic!"}, "topic"),
        ({"topic": None, "topicPattern": "("}, "topicPattern"),
        ({"consumerGroup": "bad group"}, "consumerGroup"),
        ({"consumerGroup": "g" * 121}, "consumerGroup"),  # the broker refuses it: no room for %RETRY%
        ({"startingOffsets": "committed"}, "consumerGroup"),
        ({"startingOffsets": "nonsense"}, "startingOffsets"),
        ({"startingOffsets": '{"orders": {"broker-a:x": 1}}'}, "startingOffsets"),
        ({"startingOffsets": '{"orders": {"broker-a:0": -3}}'}, "startingOffsets"),
        ({"startingTimestamp": "yesterday"}, "startingTimestamp"),
        ({"startingTimestamp": "1", "startingOffsets": "earliest"}, "startingTimestamp"),
        ({"startingOffsetsFallback": "middle"}, "startingOffsetsFallback"),
        ({"startingOffsetsByTimestampStrategy": "guess"}, "startingOffsetsByTimestampStrategy"),
        ({"endingOffsets": "latest"}, "endingOffsets"),
        ({"failOnDataLoss": "yes"}, "failOnDataLoss"),
        ({"maxMessagesPerTrigger": "0"}, "maxMessagesPerTrigger"),
        ({"maxMessagesPerTrigger": "5", "maxOffsetsPerTrigger": "6"}, "maxOffsetsPerTrigger"),
        ({"maxBytesPerTrigger": "lots"}, "maxBytesPerTrigger"),
        ({"minMessagesPerTrigger": "-1"}, "minMessagesPerTrigger"),
        ({"minMessagesPerTrigger": "10", "maxMessagesPerTrigger": "5"}, "minMessagesPerTrigger"),
        ({"maxTriggerDelay": "soon"}, "maxTriggerDelay"),
        ({"minPartitions": "x"}, "minPartitions"),
        ({"maxMessagesPerPartition": "0"}, "maxMessagesPerPartition"),
        ({"tags": "A || "}, "tags"),
        ({"pullBatchSize": "1000000"}, "pullBatchSize"),
        ({"pollTimeoutMs": "0"}, "pollTimeoutMs"),
        ({"includeProperties": "1"}, "includeProperties"),
        ({"brokerName": "a:b"}, "brokerName"),
        ({"brokerName": "broker-a\n"}, "brokerName"),  # re.match with "$" admitted a trailing newline
        ({"maxOffsetsPerTrigger": "\u00b2"}, "maxOffsetsPerTrigger"),  # str.isdigit admits '²', int() does not
        ({"pullBatchSize": "\u0663"}, "pullBatchSize"),  # an Arabic-Indic 3 was read as 3
        ({"startingTimestamp": "\u00b2"}, "startingTimestamp"),
        ({"startingOffsets": '{"orders": {"broker-a:\u00b2": 1}}'}, "startingOffsets"),
        ({"endpoints": "localhost:\u0663"}, "endpoints"),
        ({"startingOffset": "earliest"}, "startingOffset"),  # a typo is an unknown option, not ignored
        # past int64: the query failed later with protobuf's "Value out of range", naming no option
        ({"startingTimestamp": "99999999999999999999999"}, "startingTimestamp"),
        ({"startingOffsets": '{"orders": {"broker-a:0": 9223372036854775808}}'}, "startingOffsets"),
    ],
)
def test_bad_options_fail_naming_the_option(options: dict[str, str | None], named: str) -> None:
    merged = {k: v for k, v in {**BASE, **options}.items() if v is not None}
    with pytest.raises(SourceOptionError) as err:
        parse_options(merged, streaming=True)
    assert named in str(err.value)


def test_batch_only_and_stream_only_rules() -> None:
    with pytest.raises(SourceOptionError, match="startingOffsets"):
        parse_options({**BASE, "startingOffsets": "latest"}, streaming=False)
    ending = parse_options({**BASE, "endingOffsets": '{"orders": {"broker-a:0": 3}}'}, streaming=False).ending
    assert ending == {"orders": {"broker-a:0": 3}}


def test_offset_json_naming_a_queue_twice_is_refused() -> None:
    """ "broker-a:0" and "broker-a:00" both name queue 0: the last one silently won."""
    data = {"t": {"broker-a:0": 2, "broker-a:00": 7}}
    with pytest.raises(SourceOptionError, match="startingOffsets: topic 't' names queue 0 twice"):
        parse_positions("broker-a", data, what="startingOffsets")
    assert parse_positions("broker-a", {"t": {"broker-a:0": 2, "broker-a:1": 7}}, what="x") == {
        ("t", "broker-a", 0): 2,
        ("t", "broker-a", 1): 7,
    }


def test_sink_endpoints_and_producer_group_are_checked_at_query_start() -> None:
    """A sink given 'localhost' (no port) or an empty producer group failed only inside its tasks, after
    connection timeouts; the source refused the same endpoints at once."""
    base = {"endpoints": "127.0.0.1:10911", "topic": "t"}
    assert parse_sink_options(base).endpoints == "127.0.0.1:10911"
    assert parse_sink_options({**base, "endpoints": "[::1]:10911, h:1"}).endpoints == "[::1]:10911,h:1"
    bad_values = {"endpoints": ["localhost", "h:99999"], "producerGroup": ["", "a b"]}
    for name, values in bad_values.items():
        for value in values:
            with pytest.raises(SourceOptionError, match=name):
                parse_sink_options({**base, name: value})


def test_offset_json_round_trip_and_broker_check() -> None:
    off = SourceOffset({("t", "broker-a", 1): 5, ("t", "broker-a", 0): 7, ("s", "broker-a", 3): 0})
    data = off.to_json()
    assert data == {"s": {"broker-a:3": 0}, "t": {"broker-a:0": 7, "broker-a:1": 5}}
    assert SourceOffset.from_json("broker-a", data) == off
    with pytest.raises(SourceOptionError, match="brokerName"):
        SourceOffset.from_json("broker-b", data)


def test_share_budget_is_proportional_and_exact() -> None:
    start = {("t", 0): 0, ("t", 1): 0, ("t", 2): 10, ("t", 3): 5}
    latest = {("t", 0): 40, ("t", 1): 40, ("t", 2): 30, ("t", 3): 5}
    end = share_budget(start, latest, 25)
    assert {k: end[k] - start[k] for k in end} == {("t", 0): 10, ("t", 1): 10, ("t", 2): 5, ("t", 3): 0}
    for budget in range(1, 101):
        end = share_budget(start, latest, budget)
        assert sum(end[k] - start[k] for k in end) == max(budget, 3)  # three queues have a backlog: one each
        assert all(start[k] < end[k] <= latest[k] for k in end if k != ("t", 3))
        assert end[("t", 3)] == 5
    assert share_budget(start, latest, 1000) == latest
    # a queue not in start (new queue) counts from 0
    assert share_budget({}, {("t", 0): 4}, 3) == {("t", 0): 3}


def test_share_budget_never_starves_a_small_queue() -> None:
    """A queue with a small backlog beside one that stays busy got no share on any trigger (its exact share
    rounded down and lost every largest-remainder tie): one message waited for 1,000 triggers and more."""
    big, small = ("t", 0), ("t", 1)
    start, produced = {big: 0, small: 0}, 1_000_000
    for _ in range(3):
        end = share_budget(start, {big: produced, small: 1}, 100)
        assert sum(end[k] - start[k] for k in end) == 100
        start, produced = end, produced + 100
    assert start[small] == 1
    assert share_budget({}, {("t", q): 10 for q in range(5)}, 2) == {("t", q): 1 for q in range(5)}


def test_split_ranges_by_max_and_min_partitions() -> None:
    ranges = [OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 50, 60), OffsetRange("t", 2, 5, 5)]
    assert split_ranges(ranges, None, None) == ranges[:2]
    parts = split_ranges(ranges, None, 30)
    assert [(p.queue_id, p.start, p.end) for p in parts] == [
        (0, 0, 25), (0, 25, 50), (0, 50, 75), (0, 75, 100), (1, 50, 60),
    ]
    parts = split_ranges(ranges, 11, None)
    assert len(parts) >= 10 and all(p.size > 0 for p in parts)
    for qid, lo, hi in ((0, 0, 100), (1, 50, 60)):
        mine = [p for p in parts if p.queue_id == qid]
        assert mine[0].start == lo and mine[-1].end == hi
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))


def test_admission_control_follows_spark_read_limits() -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

    from connector.admission import AdmissionControl, default_read_limit

    def no_probe(*_: object) -> int:
        raise AssertionError("no byte limit configured")

    start = {("t", 0): 0, ("t", 1): 0}
    latest = {("t", 0): 30, ("t", 1): 10}
    opts = parse_options({**BASE, "maxMessagesPerTrigger": "20", "minMessagesPerTrigger": "5"}, streaming=True)
    assert default_read_limit(opts) == ReadMaxRows(20)
    ac = AdmissionControl(opts)
    # ReadAllAvailable (what the engine passes when the trigger demands everything) ignores the options
    assert ac.end_offsets(start, latest, ReadAllAvailable(), no_probe, available_now=False) == latest
    assert ac.end_offsets(start, latest, ReadMaxRows(20), no_probe, available_now=False) == {("t", 0): 15, ("t", 1): 5}
    assert ac.end_offsets(start, latest, ReadMaxRows(8), no_probe, available_now=False) == {("t", 0): 6, ("t", 1): 2}
    # fewer than minMessagesPerTrigger waiting: no batch (until maxTriggerDelay), except under AvailableNow
    few = {("t", 0): 2, ("t", 1): 1}
    assert ac.end_offsets(start, few, ReadMinRows(5), no_probe, available_now=False) == start
    assert ac.end_offsets(start, few, ReadMinRows(5), no_probe, available_now=True) == few
    late = parse_options({**BASE, "minMessagesPerTrigger": "5", "maxTriggerDelay": "0ms"}, streaming=True)
    assert AdmissionControl(late).end_offsets(start, few, ReadMinRows(5), no_probe, available_now=False) == few


def test_byte_limit_shares_bytes_by_backlog_and_always_moves() -> None:
    from pyspark.sql.streaming.datasource import ReadMaxBytes

    from connector.admission import AdmissionControl

    calls: list[tuple[object, int, int, int]] = []

    def probe(key: object, s: int, cap: int, budget: int) -> int:
        calls.append((key, s, cap, budget))
        return min(cap, s + budget // 100)  # every entry is 100 bytes

    opts = parse_options({**BASE, "maxBytesPerTrigger": "1000"}, streaming=True)
    ac = AdmissionControl(opts)
    end = ac.end_offsets({("t", 0): 0, ("t", 1): 0}, {("t", 0): 30, ("t", 1): 10}, ReadMaxBytes(1000), probe,
                         available_now=False)
    assert end == {("t", 0): 7, ("t", 1): 2} and [c[3] for c in calls] == [750, 250]
    tiny = AdmissionControl(parse_options({**BASE, "maxBytesPerTrigger": "10"}, streaming=True))
    end = tiny.end_offsets({("t", 0): 0}, {("t", 0): 30}, ReadMaxBytes(10), probe, available_now=False)
    assert end == {("t", 0): 1}  # one message even when it is larger than the whole budget

    def big_head(key: tuple[str, int], s: int, cap: int, budget: int) -> int:  # queue 1's next message: 5,000 B
        return s if key[1] == 1 and s == 0 else min(cap, s + budget // 100)

    for _ in range(3):  # queue 0 keeps the budget busy; queue 1 still moves, by one message past its share
        end = ac.end_offsets({("t", 0): 0, ("t", 1): 0}, {("t", 0): 90, ("t", 1): 10}, ReadMaxBytes(1000), big_head,
                             available_now=False)
        assert end == {("t", 0): 9, ("t", 1): 1}


def test_broker_calls_are_retried_while_the_broker_is_unreachable() -> None:
    from broker.errors import ServiceNotAvailableError, TopicNotExistError
    from connector.broker_link import retried

    failures = iter([ServiceNotAvailableError("down"), ServiceNotAvailableError("still down")])

    def flaky() -> str:
        for exc in failures:
            raise exc
        return "ok"

    assert retried(flaky) == "ok"
    with pytest.raises(TopicNotExistError):  # only unavailability is retried; a real answer is not
        retried(lambda: (_ for _ in ()).throw(TopicNotExistError("no such topic")))


def test_group_commit_failure_is_retried_logged_and_never_fatal(caplog: pytest.LogCaptureFixture) -> None:
    from connector.broker_link import DirectLink
    from connector.group_commit import GroupCommitter

    dead = "127.0.0.1:9"  # nothing listens on the discard port: every call fails as unavailable
    committer = GroupCommitter("g")
    link = DirectLink(dead, "broker-a", "g", 0.5)
    assert committer.commit(link, {("t", "broker-a", 0): 5}) is False
    assert committer.failures == 1 and committer.committed is None
    assert "gave up committing group 'g'" in caplog.text
    assert GroupCommitter(None).commit(link, {("t", "broker-a", 0): 5}) is True  # no group: nothing to do


def test_a_commit_with_too_many_attempts_names_the_fix() -> None:
    """Every task attempt's id travels in one property of the commit: past the broker's limit the sink says to
    write with fewer partitions before it asks the broker (task attempt ids are short: about 3,000 fit)."""
    from broker.errors import BrokerError
    from connector.sink_writer import _check_attempts

    _check_attempts([str(i) for i in range(3000)], "batch 7")  # up to 4-digit ids: fits
    with pytest.raises(BrokerError, match=r"batch 7: 4000 task attempts are too many .* fewer partitions"):
        _check_attempts([str(10**6 + i) for i in range(4000)], "batch 7")


def test_a_link_whose_admin_fails_closes_its_consumer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cached link opens a pull consumer, then an admin client: when the second cannot be made (no endpoint
    answers), the first one's channel is closed, not left open."""
    from broker.client import PullConsumer
    from broker.errors import ServiceNotAvailableError
    from connector import broker_link

    closed: list[bool] = []

    class SpyConsumer(PullConsumer):
        def close(self) -> None:
            closed.append(True)
            super().close()

    def no_admin(*args: object, **kwargs: object) -> None:
        raise ServiceNotAvailableError("none of the brokers answered")

    monkeypatch.setattr(broker_link, "PullConsumer", SpyConsumer)
    monkeypatch.setattr(broker_link, "Admin", no_admin)
    opts = parse_options({**BASE, "endpoints": "127.0.0.1:1"}, streaming=True)
    with pytest.raises(ServiceNotAvailableError):
        broker_link.link_for(opts)
    assert closed == [True]


def test_offset_json_naming_a_queue_that_does_not_exist_is_refused(broker: str) -> None:
    """A typo in startingOffsets is refused, not taken as 'latest' for every queue, silently (Kafka refuses too)."""
    from broker.client import Admin
    from connector.broker_link import link_for
    from connector.offset_resolver import snapshot, starting_positions

    with Admin(broker) as admin:
        admin.create_topic("jsonq", 4, if_not_exists=True)
    for given, needle in (('{"jsonq": {"broker-a:9": 5}}', "jsonq/broker-a:9, which does not exist (the topic has "
                           "queues 0..3)"), ('{"jsonx": {"broker-a:0": 0}}', "no such topic")):
        opts = parse_options({"endpoints": broker, "topicPattern": "json.*", "startingOffsets": given},
                             streaming=True)
        link = link_for(opts)
        with pytest.raises(SourceOptionError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            starting_positions(opts, link, snapshot(link, ["jsonq"]))
    ok = parse_options({"endpoints": broker, "topic": "jsonq", "startingOffsets": '{"jsonq": {"broker-a:1": -2}}'},
                       streaming=True)
    link = link_for(ok)
    assert starting_positions(ok, link, snapshot(link, ["jsonq"]))[("jsonq", "broker-a", 1)] == 0


def test_the_initial_offset_is_resolved_once(broker: str) -> None:
    """Spark asks initialOffset twice (to plan the first batch, then to run it): with startingOffsets=latest a
    second look at a moving queue started that batch after what was planned, and its messages were never read."""
    from broker.client import Admin, Message, Producer
    from connector.stream_reader import SluiceStreamReader

    with Admin(broker) as admin:
        admin.create_topic("moving", 2, if_not_exists=True)
    reader = SluiceStreamReader(parse_options({"endpoints": broker, "topic": "moving"}, streaming=True))
    first = reader.initialOffset()
    with Producer(broker) as p:
        p.send_batch([Message("moving", b"arrived between the two questions")] * 10, queue_id=0)
    wait_for_max_offset(broker, "moving", 0, 10)  # dispatched: visible to the next look
    assert reader.initialOffset() == first
    fresh = SluiceStreamReader(parse_options({"endpoints": broker, "topic": "moving"}, streaming=True))
    assert fresh.initialOffset() != first  # a new reader (a new query) does look again


def test_to_parquet_default_group_follows_the_parsed_topics() -> None:
    """--topic "clicks, views" made the group "parquet-clicks- views", refused for an option nobody set."""
    from broker.format.system_topics import MAX_GROUP_CHARS
    from connector.options import _group
    from streaming_jobs.common import group_name
    from streaming_jobs.to_parquet import default_group

    assert default_group("clicks, views") == "parquet-clicks-views" == default_group("clicks,views,")
    long_list = ",".join(f"topic_number_{i:03d}" for i in range(40))
    group = default_group(long_list)
    assert len(group) == MAX_GROUP_CHARS and group != default_group(long_list + ",one_more")
    assert _group(group) == group  # the source accepts it
    long_topic = "t" * 127  # a topic may be longer than a group: "mirror-" + it was refused by the broker
    assert len(group_name("mirror", [long_topic])) == MAX_GROUP_CHARS
    assert _group(group_name("mirror", [long_topic])) and group_name("counts", ["orders"]) == "counts-orders"


def test_a_restart_before_the_first_commit_resolves_the_same_start_with_a_group(broker: str) -> None:
    """startingOffsets=committed with no offsets yet: the fallback start is pinned in the group, so a driver
    restarted before batch 0 commits (Spark asks initialOffset again) starts where batch 0 was planned."""
    from broker.client import Admin, Message, Producer, PullConsumer
    from connector.stream_reader import SluiceStreamReader

    with Admin(broker) as admin:
        admin.create_topic("pinned", 2, if_not_exists=True)
    with Producer(broker) as p:
        p.send_batch([Message("pinned", b"old")] * 3, queue_id=1)
    wait_for_max_offset(broker, "pinned", 1, 3)
    with PullConsumer(broker, "pin-kept") as c:
        c.commit_offsets({("pinned", 1): 1})  # a queue the group has an offset for keeps it
    opts = {"endpoints": broker, "topic": "pinned", "startingOffsetsFallback": "latest"}
    for group, queue_1 in (("pin-new", 3), ("pin-kept", 1)):
        first = SluiceStreamReader(parse_options({**opts, "consumerGroup": group}, streaming=True)).initialOffset()
        start = {int(k.rsplit(":", 1)[1]): v for k, v in first["pinned"].items()}
        assert start[1] == queue_1  # the fallback (latest), or the group's own offset
        with Producer(broker) as p:
            p.send_batch([Message("pinned", b"new")] * 5, queue_id=0)
        again = SluiceStreamReader(parse_options({**opts, "consumerGroup": group}, streaming=True)).initialOffset()
        assert again == first
        with PullConsumer(broker, group) as c:
            assert c.committed_offsets("pinned") == start


def wait_for_max_offset(endpoint: str, topic: str, queue_id: int, at_least: int) -> None:
    """Sends are acknowledged before the dispatcher makes them visible: wait until the queue shows them."""
    import time

    from broker.client import Admin

    deadline = time.monotonic() + 30
    with Admin(endpoint) as admin:
        while admin.queue_offsets(topic)[queue_id][1] < at_least:
            assert time.monotonic() < deadline, f"{topic}/{queue_id} never reached {at_least}"
            time.sleep(0.01)

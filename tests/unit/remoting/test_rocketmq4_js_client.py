"""A third-party RocketMQ 4 client against real processes: ali-ons (pure JavaScript, RocketMQ 4's remoting protocol,
installed by scripts/ensure-rocketmq-js.sh from tests/remoting_js/package-lock.json) runs the scenarios in
tests/remoting_js/, one Node process each, against a ``sluice namesrv`` and two ``sluice broker`` processes served
over remoting. What the client acknowledges is read back over Sluice's own gRPC client too: one store behind both
fronts."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.client import PullConsumer
from broker.client.credentials import Credentials
from broker.client.namesrv_client import NameServerClient
from broker.client.results import PullStatus, ReceivedMessage
from broker.namesrv.local_cluster import LocalCluster, NameServerProcess
from broker.private_file import write_private
from broker.remoting.codes import WireCode
from broker.server.process import BrokerProcess
from tests.support.auth_process import ROOT, SETTINGS, Secured
from tests.support.cluster import (
    BROKER_EXPIRE_MS,
    REGISTER_INTERVAL_MS,
    create_everywhere,
    make_cluster,
    route_brokers,
    small_store_config,
)
from tests.support.waiting import wait_until

SCENARIOS = Path(__file__).resolve().parents[2] / "remoting_js"
REMOTING = ["--remoting-listen", "127.0.0.1:0"]
SCENARIO_TIMEOUT_S = 40.0  # a scenario's own waits are 20 s at most; past this the Node process is stuck
QUEUES = 2  # per broker: enough to spread sends, few enough that a consumer's rebalance and pulls stay quick


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("js-client")
    if not (SCENARIOS / "node_modules" / "ali-ons").is_dir():
        pytest.fail("the RocketMQ 4 JavaScript client is not installed: run scripts/ensure-rocketmq-js.sh")
    # Retries come back after 100 ms rather than RocketMQ's 10 s for the first redelivery.
    config = small_store_config(root, message_delay_level=" ".join(["100ms"] * 18))
    with make_cluster(root, brokers=2, broker_expire_ms=BROKER_EXPIRE_MS, config=config,
                      namesrv_args=REMOTING, extra_broker_args=REMOTING) as c:
        yield c


def namesrv(cluster: LocalCluster) -> str:
    return cluster.namesrvs[0].remoting_address


def run_scenario(name: str, on_line: Callable[[dict[str, Any]], None] | None = None, **args: object) -> Any:
    """Runs tests/remoting_js/NAME.js with ARGS as its JSON argument and gives back its result; ``on_line`` sees
    each line it writes before that."""
    proc = subprocess.Popen(["node", str(SCENARIOS / f"{name}.js"), json.dumps(args)], cwd=SCENARIOS, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stderr: list[str] = []
    drain = threading.Thread(target=lambda: stderr.extend(proc.stderr or []), daemon=True)
    drain.start()
    timer = threading.Timer(SCENARIO_TIMEOUT_S, proc.kill)
    timer.start()
    last: dict[str, Any] = {}
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            last = json.loads(line)
            if on_line is not None and "result" not in last and "error" not in last:
                on_line(last)
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    drain.join(timeout=5)
    assert proc.returncode == 0 and "result" in last, (
        f"{name}.js exited {proc.returncode}: {last}\n" + "".join(stderr[-40:])
    )
    return last["result"]


def new_topic(cluster: LocalCluster, topic: str) -> str:
    create_everywhere(cluster, topic, QUEUES)
    return topic


def read_over_grpc(cluster: LocalCluster, topic: str) -> list[ReceivedMessage]:
    """Every message of every queue of TOPIC on every broker, read by Sluice's gRPC client."""
    found: list[ReceivedMessage] = []
    with PullConsumer(namesrv=cluster.namesrv, group="grpc-reader") as consumer:
        for mq in consumer.fetch_queues(topic):
            offset = 0
            while True:
                result = consumer.pull(mq, offset, max_msgs=32)
                if result.status is not PullStatus.FOUND:
                    break
                found.extend(result.messages)
                offset = result.next_begin_offset
    return found


def test_sends_through_the_routes_reach_both_brokers_and_read_back_over_both_protocols(cluster: LocalCluster) -> None:
    topic = new_topic(cluster, "JsRoutes")
    result = run_scenario("send_routes", namesrv=namesrv(cluster), topic=topic, group="js-routes", count=20)
    sent = result["sent"]
    assert {s["sendStatus"] for s in sent} == {"SEND_OK"}
    assert {s["brokerName"] for s in sent} == set(cluster.names)  # the routes name both brokers' remoting ports
    assert sorted(m["body"] for m in result["received"]) == sorted(s["body"] for s in sent)
    by_body = {m["body"]: m for m in result["received"]}
    for s in sent:  # the consumer sees each message where the producer was told it was stored
        got = by_body[s["body"]]
        assert (got["queueId"], got["queueOffset"], got["msgId"]) == (s["queueId"], s["queueOffset"], s["msgId"])
        assert got["tags"] == ("TagOdd" if int(s["body"].split("-")[1]) % 2 else "TagEven")
        assert got["keys"] == "key-" + s["body"].split("-")[1]
    grpc = read_over_grpc(cluster, topic)
    assert sorted(m.body.decode() for m in grpc) == sorted(s["body"] for s in sent)
    # The same messages by their commit-log offsets: the ids' hosts differ, as a broker on remoting port 0 stores
    # its gRPC address and names its remoting one to remoting clients (docs/remoting.md, "Message ids").
    assert sorted(m.msg_id[-16:] for m in grpc) == sorted(s["msgId"][-16:] for s in sent)


def test_push_consumers_with_tags_and_sql92_get_what_their_expression_selects(cluster: LocalCluster) -> None:
    topic = new_topic(cluster, "JsFilters")
    count = 12  # tags cycle TagA, TagB, TagC; property n is the message's number
    result = run_scenario("push_filters", namesrv=namesrv(cluster), topic=topic, group="js-filters", count=count,
                          sql="n >= 6 AND TAGS <> 'TagC'", expectTags=8, expectSql=4)
    assert sorted(m["body"] for m in result["tags"]) == sorted(f"body-{i}" for i in range(count) if i % 3 != 2)
    assert {m["tags"] for m in result["tags"]} == {"TagA", "TagB"}
    assert sorted(m["body"] for m in result["sql"]) == sorted(f"body-{i}" for i in (6, 7, 9, 10))
    assert all(m["properties"]["n"] == m["body"].split("-")[1] for m in result["sql"])


def test_a_failed_message_comes_back_once_through_the_retry_topic(cluster: LocalCluster) -> None:
    topic = new_topic(cluster, "JsRetry")
    group = "js-retry"
    result = run_scenario("retry", namesrv=namesrv(cluster), topic=topic, group=group, count=3)
    deliveries = result["deliveries"]
    bodies = sorted(f"retry-{i}" for i in range(3))
    assert sorted(d["body"] for d in deliveries) == sorted(bodies * 2)
    first = [d for d in deliveries if d["reconsumeTimes"] == 0]
    again = [d for d in deliveries if d["reconsumeTimes"] == 1]
    assert sorted(d["body"] for d in first) == bodies and sorted(d["body"] for d in again) == bodies
    assert {d["topic"] for d in deliveries} == {topic}  # the client gives a retried message its original topic
    assert {d["properties"]["RETRY_TOPIC"] for d in again} == {topic}
    assert sorted(m.body.decode() for m in read_over_grpc(cluster, f"%RETRY%{group}")) == bodies


def test_a_group_starting_at_a_time_gets_only_the_messages_stored_since(cluster: LocalCluster) -> None:
    topic = new_topic(cluster, "JsByTime")
    result = run_scenario("offsets_by_time", namesrv=namesrv(cluster), topic=topic, group="js-by-time", count=4)
    assert sorted(m["body"] for m in result["received"]) == [f"after-{i}" for i in range(4)]
    stored = {m.body.decode(): m.store_timestamp for m in read_over_grpc(cluster, topic)}
    assert all(t < result["second"] for body, t in stored.items() if body.startswith("before"))
    assert all(t >= result["second"] for body, t in stored.items() if body.startswith("after"))


def test_a_broker_killed_mid_run_loses_nothing_acknowledged_and_sends_move_on(cluster: LocalCluster) -> None:
    topic = new_topic(cluster, "JsKilled")
    victim, survivor = cluster.names
    acked_before_kill: list[dict[str, Any]] = []

    def on_line(line: dict[str, Any]) -> None:
        if "acked" in line and cluster.brokers[victim].proc.poll() is None:  # type: ignore[union-attr]
            acked_before_kill.append(line["acked"])
            if len(acked_before_kill) == 15:
                cluster.kill(victim)

    result = run_scenario("broker_killed", on_line, namesrv=namesrv(cluster), topic=topic, count=60, pauseMs=20)
    acked = result["acked"]
    assert {a["brokerName"] for a in acked_before_kill} == {victim, survivor}
    after = acked[len(acked_before_kill) :]
    assert len(after) >= 40 and {a["brokerName"] for a in after} == {survivor}  # sends moved on
    cluster.restart(victim)  # the killed broker's store, read again: what it acknowledged is there
    want = sorted(a["body"] for a in acked)
    wait_until(lambda: sorted(m.body.decode() for m in read_over_grpc(cluster, topic)) == want,
               "every acknowledged message over gRPC", timeout_s=20)


def test_a_message_by_its_id_from_the_broker_the_id_names(cluster: LocalCluster) -> None:
    topic = new_topic(cluster, "JsById")
    result = run_scenario("message_by_id", namesrv=namesrv(cluster), topic=topic)
    stored_on = cluster.brokers[result["sent"]["brokerName"]]
    assert result["address"] == stored_on.remoting_endpoint, (  # the id leads a RocketMQ client to the remoting port
        f"the id names {result['address']}; gRPC is {stored_on.endpoint}, remoting {stored_on.remoting_endpoint}"
    )
    assert result.get("code") == 0, result
    found = result["found"]
    assert (found["msgId"], found["topic"], found["body"]) == (result["sent"]["msgId"], topic, "viewed-by-id")
    assert (found["tags"], found["keys"]) == ("TagV", "view-key")


def test_under_auth_signed_requests_are_served_and_requests_without_rights_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_ROOT_ACCESS_KEY", ROOT.access_key)  # the name server takes the broker's signed
    monkeypatch.setenv("SLUICE_ROOT_SECRET_KEY", ROOT.secret_key)  # registration only
    ns = NameServerProcess(extra_args=REMOTING, allow_anonymous_registration=False).start()
    config = tmp_path / "broker.json"
    write_private(config, json.dumps(SETTINGS).encode())  # it holds the root secret: owner-only, or refused
    broker = BrokerProcess(tmp_path / "store", config=config, extra_args=[
        "--namesrv", ns.address, "--broker-name", "broker-auth", "--register-interval-ms", str(REGISTER_INTERVAL_MS),
        *REMOTING])
    try:
        secured = Secured(broker.start())
        topic, group = secured.topic("JsAuth", 2), "js-auth"
        writer = secured.user((f"Topic:{topic}", "Pub"))
        reader = secured.user((f"Topic:{topic}", "Sub"), (f"Group:{group}", "Sub"))
        nobody = secured.user()
        names = NameServerClient([ns.address])
        try:
            wait_until(lambda: route_brokers(names, topic) == {"broker-auth"}, "the topic's route", timeout_s=10)
        finally:
            names.close()
        result = run_scenario("auth", namesrv=ns.remoting_address, topic=topic, group=group, count=3,
                              writer=js_credentials(writer), reader=js_credentials(reader),
                              nobody=js_credentials(nobody))
        assert result["sent"] == ["SEND_OK"] * 3
        for refused in ("nobody", "unsigned", "forged"):
            assert "sent" not in result[refused] and result[refused]["code"] == WireCode.NO_PERMISSION, refused
        assert sorted(m["body"] for m in result["received"]) == [f"signed-{i}" for i in range(3)]
        assert secured.max_offset(topic) == 3  # nothing of the refused sends was stored
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.stop()
        ns.stop()


def js_credentials(creds: Credentials) -> dict[str, str]:
    return {"accessKey": creds.access_key, "secretKey": creds.secret_key}

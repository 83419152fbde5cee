"""The Spark source and the exactly-once sink against a broker process that requires TLS and authentication, through
the ``accessKey``/``secretKey`` options (the driver and the executors' Python workers each sign their own calls).

Users of the module's broker: a reader with Sub on the input topic and its group only, a writer with what the
exactly-once sink needs (Pub on the output topic, on its producer group and on the Cluster), and a publisher with
Pub on both topics only. Refusals must name UNAUTHENTICATED or the missing right; the secrets must appear in no
plan, progress report, log line, checkpoint file or printed option.
"""

from __future__ import annotations

import contextlib
import pickle
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.client import Admin, Message, Producer, PullConsumer, PullStatus
from broker.format.signature import ROOT_ACCESS_KEY_ENV, ROOT_SECRET_KEY_ENV
from broker.proto import sluice_pb2 as pb
from broker.server.process import BrokerProcess
from connector.connector_errors import SourceOptionError
from connector.options import parse_options
from connector.sink_options import parse_sink_options
from tests.support.certs import Pki

ROOT, ROOT_SECRET = "root", "root-secret-7c41d0"
SOURCE_TOPIC, SINK_TOPIC, QUIET_TOPIC = "AuthSparkIn", "AuthSparkOut", "AuthSparkQuiet"
READ_GROUP, SINK_GROUP = "auth-spark-reader", "auth-spark-sink"
READER, READER_SECRET = "reader", "reader-secret-5f1c9a"
WRITER, WRITER_SECRET = "writer", "writer-secret-9e2a44"
PUBLISHER, PUBLISHER_SECRET = "publisher", "publisher-secret-03b7e1"
SECRETS = (ROOT_SECRET, READER_SECRET, WRITER_SECRET, PUBLISHER_SECRET)
MESSAGES = 24


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[BrokerProcess]:
    """A broker process with TLS and --auth; its root user comes from the environment, as an operator gives it."""
    root = tmp_path_factory.mktemp("auth-spark-broker")
    proc = BrokerProcess(root / "store", extra_args=["--auth", "--tls-cert", str(pki.server_cert),
                                                     "--tls-key", str(pki.server_key)])
    with pytest.MonkeyPatch.context() as env:
        env.setenv(ROOT_ACCESS_KEY_ENV, ROOT)
        env.setenv(ROOT_SECRET_KEY_ENV, ROOT_SECRET)
        proc.start()
    try:
        with Admin(proc.endpoint, tls_ca=str(pki.ca), access_key=ROOT, secret_key=ROOT_SECRET) as admin:
            admin.create_topic(SOURCE_TOPIC, 2)
            admin.create_topic(SINK_TOPIC, 2)
            admin.create_topic(QUIET_TOPIC, 2)
            add_user(admin, READER, READER_SECRET, (f"Topic:{SOURCE_TOPIC}", "Sub"), (f"Group:{READ_GROUP}", "Sub"))
            add_user(admin, WRITER, WRITER_SECRET, (f"Topic:{SINK_TOPIC}", "Pub"), (f"Topic:{QUIET_TOPIC}", "Pub"),
                     (f"Group:{SINK_GROUP}", "Pub"), ("Cluster", "Pub"))
            add_user(admin, PUBLISHER, PUBLISHER_SECRET, (f"Topic:{SOURCE_TOPIC}", "Pub"),
                     (f"Topic:{SINK_TOPIC}", "Pub"))
        with Producer(proc.endpoint, tls_ca=str(pki.ca), access_key=PUBLISHER, secret_key=PUBLISHER_SECRET) as p:
            for i in range(MESSAGES):
                p.send(Message(SOURCE_TOPIC, f"m{i}".encode()))
        yield proc
        assert all(s not in line for line in proc.output for s in SECRETS), "a secret in the broker's log"
        assert proc.stop() == 0
    finally:
        if proc.proc is not None and proc.proc.poll() is None:
            proc.kill()
        shutil.rmtree(root)  # the preallocated store: only function-scoped tmp dirs are removed by pytest


def add_user(admin: Admin, access_key: str, secret_key: str, *grants: tuple[str, str]) -> None:
    conn = admin.router.direct
    conn.call(conn.stub.CreateUser, pb.UserRequest(access_key=access_key, secret_key=secret_key))
    for resource, action in grants:
        entry = pb.AclEntry(access_key=access_key, resource=resource, actions=[action], decision="Allow")
        conn.call(conn.stub.GrantAcl, pb.GrantAclRequest(entry=entry))


def source(spark: Any, broker: BrokerProcess, pki: Pki, *, streaming: bool = False, **credentials: str) -> Any:
    reader = (spark.readStream if streaming else spark.read).format("sluice")
    options = {"endpoints": broker.endpoint, "topic": SOURCE_TOPIC, "consumerGroup": READ_GROUP,
               "startingOffsets": "earliest", "tls.caFile": str(pki.ca), **credentials}
    return reader.options(**options).load()


def sink_options(broker: BrokerProcess, pki: Pki, topic: str = SINK_TOPIC, **credentials: str) -> dict[str, str]:
    return {"endpoints": broker.endpoint, "topic": topic, "producerGroup": SINK_GROUP, "tls.caFile": str(pki.ca),
            **credentials}


def as_user(access_key: str, secret_key: str) -> dict[str, str]:
    return {"accessKey": access_key, "secretKey": secret_key}


def sink_bodies(broker: BrokerProcess, pki: Pki) -> list[bytes]:
    got: list[bytes] = []
    with PullConsumer(broker.endpoint, "auth-spark-check", tls_ca=str(pki.ca), access_key=ROOT,
                      secret_key=ROOT_SECRET) as consumer:
        for queue_id in range(2):
            result = consumer.pull(SINK_TOPIC, queue_id, 0, 256)
            if result.status is PullStatus.FOUND:
                got += [m.body for m in result.messages]
    return sorted(got)


@contextlib.contextmanager
def spark_log(spark: Any, path: Path) -> Iterator[None]:
    """Everything Spark's JVM logs at INFO, also written to ``path`` (its console is not this process's stderr)."""
    jvm = spark._jvm
    core = jvm.org.apache.logging.log4j.core
    context = jvm.org.apache.logging.log4j.LogManager.getContext(False)
    config = context.getConfiguration()
    layout = core.layout.PatternLayout.newBuilder().withPattern("%p %c: %m%n").build()
    appender = (core.appender.FileAppender.newBuilder().withFileName(str(path)).setName("auth-spark-test")
                .setLayout(layout).build())
    appender.start()
    config.addAppender(appender)
    config.getRootLogger().addAppender(appender, None, None)
    context.updateLoggers()
    spark.sparkContext.setLogLevel("INFO")
    try:
        yield
    finally:
        spark.sparkContext.setLogLevel("ERROR")
        config.getRootLogger().removeAppender("auth-spark-test")
        context.updateLoggers()
        appender.stop()


def refusal(action: Any) -> str:
    """The text of the error ``action`` fails with: a failed write job reaches Python as py4j's own error."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    with pytest.raises((PySparkException, Py4JJavaError)) as info:
        action()
    return str(info.value)


# ------------------------------------------------------------------------------------------------ the options


def test_the_credential_options_go_together_and_never_print_the_secret() -> None:
    base = {"endpoints": "127.0.0.1:10911", "topic": "t"}
    for parse in (lambda o: parse_options(o, streaming=True), parse_sink_options):
        with pytest.raises(SourceOptionError, match="'accessKey' and 'secretKey' go together"):
            parse({**base, "accessKey": READER})
        with pytest.raises(SourceOptionError, match="'accessKey' and 'secretKey' go together") as missing_key:
            parse({**base, "SECRETKEY": READER_SECRET})
        assert READER_SECRET not in str(missing_key.value)
        with pytest.raises(SourceOptionError, match="option 'accessKey'"):
            parse({**base, "accessKey": "no spaces allowed", "secretKey": READER_SECRET})
        with pytest.raises(SourceOptionError, match="option 'secretKey'") as too_long:
            parse({**base, "accessKey": READER, "secretKey": "s" * 65})
        assert "s" * 65 not in str(too_long.value)
        options = parse({**base, "accessKey": READER, "secretKey": READER_SECRET})
        assert options.auth.credentials() is not None
        assert READER in repr(options) and READER_SECRET not in repr(options) and READER_SECRET not in str(options)
        # the executors get the secret inside the pickled options
        assert pickle.loads(pickle.dumps(options)).auth.secret_key == READER_SECRET
        assert parse(base).auth.credentials() is None  # neither: anonymous calls


# ------------------------------------------------------------------------------------------------ Spark


@pytest.mark.spark
def test_a_stream_reads_and_writes_exactly_once_with_credentials(spark: Any, broker: BrokerProcess, pki: Pki,
                                                                 tmp_path: Path) -> None:
    stream = source(spark, broker, pki, streaming=True, **as_user(READER, READER_SECRET)).select("body")
    query = (
        stream.writeStream.format("sluice")
        .options(**sink_options(broker, pki, **as_user(WRITER, WRITER_SECRET)))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), "the query did not finish"
        assert query.exception() is None
    finally:
        query.stop()
    assert sink_bodies(broker, pki) == sorted(f"m{i}".encode() for i in range(MESSAGES))
    with Admin(broker.endpoint, tls_ca=str(pki.ca), access_key=ROOT, secret_key=ROOT_SECRET) as admin:
        committed = admin.committed_offsets(READ_GROUP, SOURCE_TOPIC)  # the source's group commits, as the reader
    assert sum(committed.values()) == MESSAGES


@pytest.mark.spark
def test_no_plan_progress_log_or_checkpoint_shows_a_secret(
    spark: Any, broker: BrokerProcess, pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "spark.log"
    with spark_log(spark, log):
        batch = source(spark, broker, pki, **as_user(READER, READER_SECRET))
        batch.explain(extended=True)
        assert batch.count() == MESSAGES
        stream = source(spark, broker, pki, streaming=True, **as_user(READER, READER_SECRET)).select("body")
        stream.explain(extended=True)
        query = (
            stream.writeStream.format("sluice")
            .options(**sink_options(broker, pki, QUIET_TOPIC, **as_user(WRITER, WRITER_SECRET)))
            .option("deliveryGuarantee", "at-least-once")  # the same options; the exactly-once run is above
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        try:
            assert query.awaitTermination(120), "the query did not finish"
            query.explain(extended=True)
            shown = "\n".join(str(p) for p in query.recentProgress) + str(query.status)
        finally:
            query.stop()
    printed = capsys.readouterr().out
    assert "numInputRows" in shown and "== Physical Plan ==" in printed
    # the stream's plan shows its options, with Spark's default redaction of both names
    assert "secretKey=*********(redacted)" in printed and "accessKey=*********(redacted)" in printed
    logged = log.read_text(encoding="utf-8", errors="replace")
    assert "INFO" in logged and "MicroBatchExecution" in logged
    checkpoint = b"".join(p.read_bytes() for p in (tmp_path / "checkpoint").rglob("*") if p.is_file())
    for secret in (READER_SECRET, WRITER_SECRET):
        assert secret not in printed, "a secret in a plan"
        assert secret not in shown, "a secret in the query's progress"
        assert secret not in logged, "a secret in Spark's log"
        assert secret.encode() not in checkpoint, "a secret in the checkpoint"


@pytest.mark.spark
def test_the_source_refuses_to_read_without_the_right_credentials(spark: Any, broker: BrokerProcess,
                                                                  pki: Pki) -> None:
    anonymous = refusal(lambda: source(spark, broker, pki).collect())
    assert "UNAUTHENTICATED" in anonymous and "requires credentials" in anonymous
    assert "Give the options 'accessKey' and 'secretKey'" in anonymous
    wrong = refusal(lambda: source(spark, broker, pki, **as_user(READER, "not-the-secret")).collect())
    assert "UNAUTHENTICATED" in wrong and "the signature is wrong" in wrong and f"access key '{READER}'" in wrong
    assert "not-the-secret" not in wrong and READER_SECRET not in wrong
    # a user who may publish to the topic may see its offsets, but not read its messages
    publisher = refusal(lambda: source(spark, broker, pki, **as_user(PUBLISHER, PUBLISHER_SECRET)).collect())
    assert "NO_PERMISSION" in publisher and f"lacks Sub on Group:{READ_GROUP}" in publisher
    assert f"needs Sub on each topic it reads (Topic:<name>) and on its consumer group (Group:{READ_GROUP})" in (
        publisher
    )
    assert PUBLISHER_SECRET not in publisher


@pytest.mark.spark
def test_the_exactly_once_sink_refuses_to_write_without_the_right_credentials(spark: Any, broker: BrokerProcess,
                                                                              pki: Pki) -> None:
    rows = spark.createDataFrame([(f"x{i}",) for i in range(4)], "body string").coalesce(1)

    def write(**credentials: str) -> str:
        return refusal(lambda: rows.write.format("sluice").options(**sink_options(broker, pki, **credentials))
                       .mode("append").save())

    anonymous = write()
    assert "UNAUTHENTICATED" in anonymous and "requires credentials" in anonymous
    wrong = write(**as_user(WRITER, "not-the-secret"))
    assert "UNAUTHENTICATED" in wrong and "the signature is wrong" in wrong and "not-the-secret" not in wrong
    # the reader may not publish at all; the publisher may publish plain messages, but not transactional halves
    reader = write(**as_user(READER, READER_SECRET))
    assert "NO_PERMISSION" in reader and f"on Topic:{SINK_TOPIC}" in reader
    assert f"Pub on its producer group (Group:{SINK_GROUP}" in reader and "Pub on the Cluster" in reader
    publisher = write(**as_user(PUBLISHER, PUBLISHER_SECRET))
    assert "NO_PERMISSION" in publisher and f"lacks Pub on Group:{SINK_GROUP}" in publisher
    assert all(s not in anonymous + wrong + reader + publisher for s in SECRETS)
    assert b"x0" not in sink_bodies(broker, pki)  # nothing of the refused writes was committed

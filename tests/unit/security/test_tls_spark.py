"""The Spark source and the exactly-once sink against a broker that requires mutual TLS, through the tls.* options
(the driver and the executors' Python workers each open their own TLS connections)."""

from __future__ import annotations

from typing import Any

import pytest

from broker.client import Admin, Message, Producer, PullConsumer, PullStatus
from tests.support.certs import Pki, tls_settings

pytestmark = pytest.mark.spark


def mutual(pki: Pki) -> dict[str, str]:
    return {"tls_ca": str(pki.ca), "tls_cert": str(pki.client_cert), "tls_key": str(pki.client_key)}


def spark_options(pki: Pki) -> dict[str, str]:
    return {"tls.caFile": str(pki.ca), "tls.certFile": str(pki.client_cert), "tls.keyFile": str(pki.client_key)}


def test_the_source_reads_over_mutual_tls(spark: Any, broker_factory: Any, pki: Pki) -> None:
    b = broker_factory(**tls_settings(pki, tls_ca=str(pki.ca), tls_client_auth="require"))
    with Admin(b.address, **mutual(pki)) as admin:
        admin.create_topic("TlsSource", 2)
    with Producer(b.address, **mutual(pki)) as producer:
        for i in range(30):
            producer.send(Message("TlsSource", f"r{i}".encode()))
    reader = spark.read.format("sluice").option("endpoints", b.address).option("topic", "TlsSource")
    for key, value in spark_options(pki).items():
        reader = reader.option(key, value)
    bodies = sorted(bytes(r.body) for r in reader.load().select("body").collect())
    assert bodies == sorted(f"r{i}".encode() for i in range(30))


def test_the_sink_writes_over_mutual_tls(spark: Any, broker_factory: Any, pki: Pki) -> None:
    b = broker_factory(**tls_settings(pki, tls_ca=str(pki.ca), tls_client_auth="require"))
    with Admin(b.address, **mutual(pki)) as admin:
        admin.create_topic("TlsSink", 2)
    df = spark.createDataFrame([(f"w{i}",) for i in range(40)], "body string").repartition(2)
    writer = df.write.format("sluice").option("endpoints", f"https://{b.address}").option("topic", "TlsSink")
    for key, value in spark_options(pki).items():
        writer = writer.option(key, value)
    writer.mode("append").save()  # exactly-once (the default): transactions committed by the driver, over TLS too
    got: list[bytes] = []
    with PullConsumer(b.address, "tls-sink-check", **mutual(pki)) as consumer:
        for queue_id in range(2):
            result = consumer.pull("TlsSink", queue_id, 0, 64)
            if result.status is PullStatus.FOUND:
                got += [m.body for m in result.messages]
    assert sorted(got) == sorted(f"w{i}".encode() for i in range(40))

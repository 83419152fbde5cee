"""The README's Python and Spark examples, taken from README.md and run as written against a real broker process
(`python -m broker broker`), each in a fresh Python process as a reader would run it; then the broker is asked
what the example did.

The broker gets small store files (a config file), which changes nothing the examples can see. The examples find
it through ``$SLUICE_ENDPOINT``, as the README says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.client import Admin, PullConsumer, PullStatus
from broker.server.process import BrokerProcess

EXAMPLE_TIMEOUT_S = 180  # a Spark example starts a JVM and Python workers on a busy 2-core machine
ORDERS = 101  # the Python example's 1 + 99 messages, and one transactional message


@pytest.fixture
def broker_process(tmp_path: Path, broker_defaults: tuple[dict[str, Any], dict[str, Any]]) -> Iterator[BrokerProcess]:
    config = tmp_path / "broker.json"
    config.write_text(json.dumps({"store": broker_defaults[0]}))  # the unit suites' small store files
    broker = BrokerProcess(tmp_path / "store", config=config).start()
    try:
        yield broker
    finally:
        assert broker.stop() == 0, "\n".join(broker.output)


def run_example(code: str, endpoint: str, cwd: Path) -> str:
    """Run ``code`` in a new interpreter (this venv's, as a reader's activated one); its output, or a failure
    showing it. PYSPARK_PYTHON is left unset: the example must work without it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env["SLUICE_ENDPOINT"] = endpoint
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT_S
    )
    assert proc.returncode == 0, f"the example exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-6000:]}"
    return proc.stdout


def messages(endpoint: str, topic: str) -> list[bytes]:
    """Every body stored in the topic, queue by queue."""
    bodies: list[bytes] = []
    with PullConsumer(endpoint, group="readme-check") as consumer:
        for queue_id in sorted(consumer.queue_offsets(topic)):
            offset = 0
            while (r := consumer.pull(topic, queue_id, offset, max_msgs=1000)).status is PullStatus.FOUND:
                bodies += [m.body for m in r.messages]
                offset = r.next_begin_offset
    return bodies


def test_the_python_client_example_runs_as_written(
    broker_process: BrokerProcess, readme_block: Callable[..., str], tmp_path: Path
) -> None:
    out = run_example(readme_block("Python client"), broker_process.endpoint, tmp_path)
    lines = out.splitlines()
    assert lines[0].startswith("sent ") and " to queue " in lines[0], out
    assert "pulled 100" in lines and "pushed 100" in lines, out
    assert lines[-1].startswith("transaction ") and lines[-1].endswith(" COMMIT_MESSAGE"), out
    endpoint = broker_process.endpoint
    bodies = messages(endpoint, "orders")
    assert sorted(json.loads(b)["id"] for b in bodies) == list(range(1, ORDERS + 1))
    with Admin(endpoint) as admin:
        assert admin.topic_info("orders").read_queue_nums == 4
        committed = admin.committed_offsets("billing", "orders")
        lag = {q.queue_id: q.lag for q in admin.consumer_lag("billing", "orders")}
    assert sum(committed.values()) == 100, committed  # the pull part ran before the transactional message
    assert sum(lag.values()) == 1, lag


def test_the_rocketmq_5_client_example_runs_as_written(
    broker_process: BrokerProcess, readme_block: Callable[..., str], tmp_path: Path
) -> None:
    out = run_example(readme_block("RocketMQ 5 clients"), broker_process.endpoint, tmp_path)
    assert out.splitlines()[-1].startswith("sent "), out
    assert messages(broker_process.endpoint, "orders") == [b"from the official client"]
    with Admin(broker_process.endpoint) as admin:  # stored with its key, as any message
        assert [m.body for m in admin.query_by_key("orders", "order-rmq5")] == [b"from the official client"]


@pytest.mark.spark
@pytest.mark.slow  # a JVM and its Python workers: about a minute, two on a busy machine
def test_the_spark_example_runs_as_written(
    broker_process: BrokerProcess, readme_block: Callable[..., str], tmp_path: Path
) -> None:
    endpoint = broker_process.endpoint
    run_example(readme_block("Python client"), endpoint, tmp_path)  # the README's order: its topic first
    out = run_example(readme_block("Spark"), endpoint, tmp_path)
    assert f"rows written: {ORDERS}" in out.splitlines(), out
    shouted = messages(endpoint, "orders-shouted")
    assert sorted(shouted) == sorted(f'{{"ID": {i}}}'.encode() for i in range(1, ORDERS + 1))
    assert (tmp_path / "checkpoints" / "orders-shouted" / "commits").is_dir()  # where the example said

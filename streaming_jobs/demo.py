"""`make demo`: click events through Sluice and Spark Structured Streaming, exactly once, in four steps.

1. broker: starts ``python -m broker broker`` (the ``sluice broker`` command) as a child process on a free loopback
   port with a temporary store, removed at the end (``--endpoints`` uses a running broker instead);
2. produce: a realistic sample of click-stream events as JSON, tagged by event type, keyed by user, spread over the
   eight queues of ``clicks``; then one heartbeat event three minutes of event time after the last click, as a real
   source's idle ticks would send, so that the watermark passes the last window (it is read like any event, so
   the query reads one message more than the number of clicks, and it is not counted);
3. stream: ``readStream.format("sluice")`` -> parse -> enrich (funnel stage, revenue) -> counts per event type per
   event-time minute (watermark 1 minute, append mode: each window is written once, when it closes) ->
   ``writeStream.format("sluice")`` exactly once into ``click-stats``, until caught up (Trigger.AvailableNow);
4. check: reads ``click-stats`` back with a batch ``spark.read``, prints the per-minute table, checks that the counts
   add up to what was sent, and prints the consumer group's lag per queue (0: the query read everything).

``python -m streaming_jobs.demo --events 20000`` runs a smaller sample; ``--endpoints`` uses a running broker.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from broker.client import Admin, Message, Producer
from broker.server.process import BrokerProcess
from streaming_jobs.common import (
    INTERRUPTED_EXIT,
    await_query,
    positive_int,
    require_java,
    run_job,
    setup_logging,
    spark_session,
)

SOURCE_TOPIC = "clicks"
RESULT_TOPIC = "click-stats"
GROUP = "demo-etl"
EVENT_WEIGHTS = {"view": 60, "click": 25, "search": 8, "add_to_cart": 5, "purchase": 2}
STAGES = {"view": "browse", "search": "browse", "click": "engage", "add_to_cart": "intent", "purchase": "convert"}
SPAN_MINUTES = 10  # events are spread over the last ten minutes of event time
PRODUCE_CHUNK = 2000
SOURCE_QUEUES = 8
HEARTBEATS = 1  # read by the query like the clicks (so counted in its input rows), never counted as a click
HEARTBEAT_AFTER_MIN = 3  # event time past the last click: more than the watermark (1 minute) plus a window


def make_events(n: int, seed: int = 7) -> list[Message]:
    rnd = random.Random(seed)
    kinds, weights = list(EVENT_WEIGHTS), list(EVENT_WEIGHTS.values())
    start_ms = (int(time.time()) // 60 - SPAN_MINUTES) * 60_000
    msgs = []
    for i in range(n):
        kind = rnd.choices(kinds, weights)[0]
        user = f"u{rnd.randrange(5000):04d}"
        event = {
            "id": i,
            "user": user,
            "event": kind,
            "page": f"/product/{rnd.randrange(800)}",
            "ts": start_ms + i * SPAN_MINUTES * 60_000 // n,
            "price": round(rnd.uniform(5, 250), 2) if kind in ("add_to_cart", "purchase") else None,
        }
        msgs.append(Message(SOURCE_TOPIC, json.dumps(event).encode(), tags=kind, keys=(user,)))
    return msgs


def heartbeat(after_ms: int) -> Message:
    """An event that only moves event time forward (it is not counted)."""
    body = json.dumps({"id": -1, "user": "", "event": "heartbeat", "page": "", "ts": after_ms, "price": None})
    return Message(SOURCE_TOPIC, body.encode(), tags="heartbeat")


def start_broker(store: Path) -> BrokerProcess:
    """Step 1: ``python -m broker broker`` in a child process, on a free loopback port."""
    broker = BrokerProcess(store).start()
    assert broker.proc is not None
    print(f"\n[1/4] broker: started `python -m broker broker` as a child process (pid {broker.proc.pid}) on "
          f"{broker.endpoint}, store in {store} (removed at the end)")
    return broker


def produce(endpoint: str, n: int) -> None:
    print(f"\n[2/4] produce: {n} click events (JSON, tagged by event type, keyed by user) to topic {SOURCE_TOPIC} "
          f"({SOURCE_QUEUES} queues), then {HEARTBEATS} heartbeat event {HEARTBEAT_AFTER_MIN} minutes of event time "
          "later, so that the watermark passes the last minute")
    with Admin(endpoint) as admin:
        admin.create_topic(SOURCE_TOPIC, SOURCE_QUEUES, if_not_exists=True)
        admin.create_topic(RESULT_TOPIC, 4, if_not_exists=True)
    msgs = make_events(n)
    with Producer(endpoint, group="demo-producer") as producer, tqdm(total=n, unit="msg", desc="produce") as bar:
        for lo in range(0, n, PRODUCE_CHUNK):
            chunk = msgs[lo : lo + PRODUCE_CHUNK]
            producer.send_batch(chunk)  # spread over the queues
            bar.update(len(chunk))
        last_ms = json.loads(msgs[-1].body)["ts"]
        producer.send(heartbeat(last_ms + HEARTBEAT_AFTER_MIN * 60_000))


def run_pipeline(endpoint: str, checkpoint: str, sent: int) -> None:
    print(f"\n[3/4] stream: readStream {SOURCE_TOPIC} -> parse JSON -> counts per event type per event-time minute "
          f"(1-minute watermark, append mode) -> writeStream {RESULT_TOPIC} exactly once, until caught up "
          "(Trigger.AvailableNow; Spark starts in a few seconds)")
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    spark = spark_session("sluice-demo")
    schema = StructType(
        [StructField("id", LongType()), StructField("user", StringType()), StructField("event", StringType()),
         StructField("page", StringType()), StructField("ts", LongType()), StructField("price", DoubleType())]
    )
    raw = (
        spark.readStream.format("sluice")
        .option("endpoints", endpoint)
        .option("topic", SOURCE_TOPIC)
        .option("consumerGroup", GROUP)
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", "100000")
        .load()
    )
    events = raw.select(F.from_json(F.col("body").cast("string"), schema).alias("e")).select("e.*")
    stage = F.create_map(*[F.lit(x) for kv in STAGES.items() for x in kv])
    enriched = (
        events.withColumn("event_time", F.timestamp_millis("ts"))
        .withColumn("stage", stage[F.col("event")])
        .withColumn("revenue", F.when(F.col("event") == "purchase", F.col("price")).otherwise(F.lit(0.0)))
    )
    per_minute = (
        # No filter for the heartbeat here: Spark pushes such a filter below the watermark, which would then never
        # see it. Its own window stays open (it is the newest), so it is never written.
        enriched.withWatermark("event_time", "1 minute")
        .groupBy(F.window("event_time", "1 minute").alias("w"), "event", "stage")
        .agg(F.count("*").alias("events"), F.round(F.sum("revenue"), 2).alias("revenue"))
    )
    out = per_minute.select(
        F.to_json(
            F.struct(F.date_format("w.start", "HH:mm").alias("minute"), "event", "stage", "events", "revenue")
        ).alias("body"),
        F.col("event").alias("tags"),
        F.concat_ws("|", F.date_format("w.start", "HH:mm"), "event").alias("keys"),
    )
    query = (
        out.writeStream.format("sluice")
        .option("endpoints", endpoint)
        .option("topic", RESULT_TOPIC)
        .option("checkpointLocation", checkpoint)
        .outputMode("append")
        .trigger(availableNow=True)
        .start()
    )
    if await_query(query) == INTERRUPTED_EXIT:
        raise KeyboardInterrupt  # the query is stopped; main stops the broker and reports
    progress = query.recentProgress
    rows = sum(p["numInputRows"] for p in progress)
    print(f"streaming query done: {len(progress)} micro-batches read {input_rows_text(rows, sent)}")


def input_rows_text(rows: int, sent: int) -> str:
    """The query's input rows, with what they are: the clicks and the heartbeat (not a lost or extra click)."""
    if rows == sent + HEARTBEATS:
        return f"{rows} messages ({sent} click events + {HEARTBEATS} heartbeat)"
    return f"{rows} messages (expected {sent} click events + {HEARTBEATS} heartbeat)"


def show_results(endpoint: str, sent: int) -> int:
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    spark = spark_session("sluice-demo")
    schema = StructType(
        [StructField("minute", StringType()), StructField("event", StringType()), StructField("stage", StringType()),
         StructField("events", LongType()), StructField("revenue", DoubleType())]
    )
    rows = (
        spark.read.format("sluice").option("endpoints", endpoint).option("topic", RESULT_TOPIC).load()
        .select(F.from_json(F.col("body").cast("string"), schema).alias("r"))
        .select("r.*")
    )
    # Append mode writes each (minute, event) once; summing would show a duplicate as a doubled count.
    latest = rows.groupBy("minute", "event").agg(F.sum("events").alias("events"), F.sum("revenue").alias("revenue"))
    table = latest.groupBy("minute").pivot("event", list(EVENT_WEIGHTS)).agg(F.first("events")).orderBy("minute")
    print(f"\n[4/4] check: batch read of {RESULT_TOPIC} (spark.read.format(\"sluice\"))")
    print("\nevents per minute and type (read back from topic click-stats):")
    table.fillna(0).show(SPAN_MINUTES + 2, truncate=False)
    total = latest.agg(F.sum("events"), F.sum("revenue")).first()
    assert total is not None  # an aggregate without grouping always has one row
    counted, revenue = int(total[0] or 0), float(total[1] or 0.0)
    print(f"events sent: {sent}   events counted: {counted}   purchase revenue: {revenue:,.2f}")
    with Admin(endpoint) as admin:
        lags = admin.consumer_lag(GROUP, SOURCE_TOPIC)
    print(f"\nconsumer group {GROUP} on {SOURCE_TOPIC}: the offsets the streaming query committed (lag 0: it read "
          "every message)")
    print(f"{'queue':>5} {'broker offset':>14} {'committed':>10} {'lag':>6}")
    for lag in sorted(lags, key=lambda x: x.queue_id):
        print(f"{lag.queue_id:>5} {lag.broker_offset:>14} {lag.consumer_offset:>10} {lag.lag:>6}")
    if counted != sent:
        print(f"MISMATCH: counted {counted} events, sent {sent}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m streaming_jobs.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=positive_int, default=200_000, help="click events to produce (>= 1)")
    ap.add_argument("--endpoints", default=None, help="use this broker instead of starting one")
    ap.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING or ERROR")
    args = ap.parse_args(argv)
    setup_logging(args.log_level)
    require_java()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sluice-demo-") as tmp:
        broker = None
        endpoint = args.endpoints
        print(f"Sluice demo: {args.events} click events through a broker and a Spark streaming query, exactly once")
        if endpoint is None:
            broker = start_broker(Path(tmp) / "store")
            endpoint = broker.endpoint
        else:
            print(f"\n[1/4] broker: using the running broker at {endpoint} (--endpoints)")
        try:
            produce(endpoint, args.events)
            run_pipeline(endpoint, str(Path(tmp) / "checkpoint"), args.events)
            rc = show_results(endpoint, args.events)
        except KeyboardInterrupt:
            print("\ninterrupted: demo stopped", file=sys.stderr)
            rc = INTERRUPTED_EXIT
        finally:
            if broker is not None:
                broker.stop()
                print("\nbroker stopped; its temporary store is removed")
    print(f"\ndemo finished in {time.monotonic() - started:.0f} s")
    return rc


if __name__ == "__main__":
    run_job(main)

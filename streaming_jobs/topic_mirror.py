"""Mirror one topic into another, exactly once, with an optional filter and body transform.

    python -m streaming_jobs.topic_mirror --source orders --target orders-eu \\
        --checkpoint /chk/mirror --where "tags = 'eu'" --transform "upper(cast(body as string))"

``--where`` and ``--transform`` are Spark SQL expressions over the source columns (topic, queue_id, tags, keys, body,
properties, ...). Tags, keys and the application's properties are carried over (the broker's own, such as DELAY or
REAL_TOPIC, are not: they would make the copy behave as a retry, a delayed or a transactional message). The source
queue number is the sharding key, so all messages of one source queue go to one target queue, in order.
"""

from __future__ import annotations

import argparse

from broker.client.outgoing_message import BROKER_PROPERTIES, BROKER_PROPERTY_PREFIXES
from streaming_jobs.common import base_parser, brokers, group_name, read_sluice, run_job, run_query, start_session


def build_parser() -> argparse.ArgumentParser:
    ap = base_parser("topic_mirror", __doc__ or "", "mirror-<source>")
    ap.add_argument("--source", required=True, help="topic to read")
    ap.add_argument("--target", required=True, help="topic to write")
    ap.add_argument("--where", default=None, help="Spark SQL filter over the source columns")
    ap.add_argument("--transform", default=None, help="Spark SQL expression giving the new body")
    ap.add_argument("--delivery", choices=("exactly-once", "at-least-once"), default="exactly-once",
                    help="the sink's deliveryGuarantee")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.source == args.target:  # the query would read its own output back and copy it again, forever
        ap.error(f"--source and --target are both {args.source!r}; mirror into another topic")
    spark = start_session("sluice-topic-mirror", args)
    from pyspark.sql import functions as F

    group = args.group or group_name("mirror", [args.source])
    df = read_sluice(spark, args, {"topic": args.source, "consumerGroup": group, "includeProperties": "true"})
    if args.where:
        df = df.where(F.expr(args.where))
    body = F.expr(args.transform) if args.transform else F.col("body")
    system = F.array(*[F.lit(name) for name in sorted(BROKER_PROPERTIES)])
    (prefix,) = BROKER_PROPERTY_PREFIXES
    user_properties = F.map_filter("properties", lambda k, _v: ~F.array_contains(system, k) & ~k.startswith(prefix))
    out = df.select(
        body.alias("body"),
        "tags",
        "keys",
        user_properties.alias("properties"),
        F.col("queue_id").cast("string").alias("sharding_key"),
    )
    writer = (
        out.writeStream.format("sluice")
        .options(**brokers(args))
        .option("topic", args.target)
        .option("deliveryGuarantee", args.delivery)
        .option("checkpointLocation", args.checkpoint)
    )
    return run_query(writer, args)


if __name__ == "__main__":
    run_job(main)

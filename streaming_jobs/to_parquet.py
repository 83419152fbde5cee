"""Copy a topic into partitioned Parquet with Spark's exactly-once file sink.

    python -m streaming_jobs.to_parquet --topic clicks --output /data/clicks --checkpoint /chk/clicks-parquet

Rows keep every source column; the output is partitioned by ``date`` (the store day, UTC) and ``topic``. The
file sink's own log makes the files exactly-once; the consumer group's offsets show progress in ``sluice group lag``.
"""

from __future__ import annotations

import argparse

from streaming_jobs.common import base_parser, group_name, read_sluice, run_job, run_query, start_session


def build_parser() -> argparse.ArgumentParser:
    ap = base_parser("to_parquet", __doc__ or "", "parquet-<topic>")
    ap.add_argument("--topic", required=True, help="topic (or comma-separated topics) to read")
    ap.add_argument("--output", required=True, help="Parquet output directory")
    ap.add_argument("--body-as-string", action="store_true", help="store the body as UTF-8 text instead of binary")
    return ap


def default_group(topics: str) -> str:
    """parquet-<topics joined by '-'>, from the topic names as the source parses them ("a, b" is a and b)."""
    return group_name("parquet", [t.strip() for t in topics.split(",") if t.strip()])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    spark = start_session("sluice-to-parquet", args)
    from pyspark.sql import functions as F

    group = args.group or default_group(args.topic)
    df = read_sluice(spark, args, {"topics": args.topic, "consumerGroup": group})
    df = df.withColumn("date", F.to_date("store_timestamp"))
    if args.body_as_string:
        df = df.withColumn("body", F.col("body").cast("string"))
    writer = (
        df.writeStream.format("parquet")
        .option("path", args.output)
        .option("checkpointLocation", args.checkpoint)
        .partitionBy("date", "topic")
    )
    return run_query(writer, args)


if __name__ == "__main__":
    run_job(main)

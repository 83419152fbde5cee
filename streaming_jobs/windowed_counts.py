"""Event-time windowed counts with a watermark, results written to a topic exactly once.

    python -m streaming_jobs.windowed_counts --source clicks --target click-counts --checkpoint /chk/counts \\
        --time-field ts --key-field event --window "1 minute" --watermark "2 minutes"

The body is JSON; ``--time-field`` holds epoch milliseconds (or use ``--time-from store`` for the broker's store
time) and ``--key-field`` the value to count by. Windows are emitted once, when the watermark passes their end
(append mode), as JSON ``{"window_start", "window_end", "key", "count"}`` with the key as tag.
"""

from __future__ import annotations

import argparse

from streaming_jobs.common import base_parser, brokers, group_name, read_sluice, run_job, run_query, start_session


def build_parser() -> argparse.ArgumentParser:
    ap = base_parser("windowed_counts", __doc__ or "", "counts-<source>")
    ap.add_argument("--source", required=True, help="topic of JSON events to read")
    ap.add_argument("--target", required=True, help="topic to write the window counts to")
    ap.add_argument("--time-field", default="ts", help="JSON field with event time in epoch ms")
    ap.add_argument("--time-from", choices=("body", "store"), default="body",
                    help="event time from the body's --time-field, or the broker's store time")
    ap.add_argument("--key-field", default="event", help="JSON field to count by")
    ap.add_argument("--window", default="1 minute", help="window length (a Spark interval)")
    ap.add_argument("--watermark", default="2 minutes", help="how late an event may come and still be counted")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.source == args.target:  # the counts would be read back as events and counted again
        ap.error(f"--source and --target are both {args.source!r}; write the counts to another topic")
    spark = start_session("sluice-windowed-counts", args)
    from pyspark.sql import functions as F

    group = args.group or group_name("counts", [args.source])
    raw = read_sluice(spark, args, {"topic": args.source, "consumerGroup": group})
    text = F.col("body").cast("string")
    key = F.get_json_object(text, f"$.{args.key_field}")
    if args.time_from == "store":
        event_time = F.col("store_timestamp")
    else:
        event_time = F.timestamp_millis(F.get_json_object(text, f"$.{args.time_field}").cast("long"))
    events = raw.select(event_time.alias("event_time"), key.alias("key")).where(F.col("event_time").isNotNull())
    counts = (
        events.withWatermark("event_time", args.watermark)
        .groupBy(F.window("event_time", args.window).alias("w"), "key")
        .count()
    )
    out = counts.select(
        F.to_json(
            F.struct(F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"), "key", "count")
        ).alias("body"),
        F.coalesce(F.col("key"), F.lit("")).alias("tags"),
    )
    writer = (
        out.writeStream.format("sluice")
        .options(**brokers(args))
        .option("topic", args.target)
        .option("checkpointLocation", args.checkpoint)
        .outputMode("append")
    )
    return run_query(writer, args)


if __name__ == "__main__":
    run_job(main)

"""The streaming query of the exactly-once test, run as its own driver process so the test can SIGKILL it.

python eo_query.py ENDPOINT TOPIC GROUP CHECKPOINT OUTPUT continuous|available-now MAX_PER_TRIGGER

ENDPOINT is a broker's host:port, or namesrv=HOST:PORT for a cluster.
"""

from __future__ import annotations

import os
import sys

os.environ["PYSPARK_PYTHON"] = sys.executable


from streaming_jobs.common import spark_session


def main() -> int:
    endpoint, topic, group, checkpoint, output, mode, max_per_trigger = sys.argv[1:8]
    spark = spark_session("sluice-eo", shuffle_partitions=2, driver_memory="768m")
    cluster = endpoint.startswith("namesrv=")
    where = ("namesrv", endpoint.removeprefix("namesrv=")) if cluster else ("endpoints", endpoint)
    df = (
        spark.readStream.format("sluice").option(*where).option("topic", topic)
        .option("consumerGroup", group).option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", max_per_trigger).load()
        .select("broker", "queue_id", "queue_offset", "body")
    )
    writer = df.writeStream.format("parquet").option("path", output).option("checkpointLocation", checkpoint)
    if mode == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="100 milliseconds")
    query = writer.start()
    print("started", flush=True)
    query.awaitTermination()
    return 0 if query.exception() is None else 1


if __name__ == "__main__":
    sys.exit(main())

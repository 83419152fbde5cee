"""Topic A -> transform -> topic B through the sluice sink, as its own driver process so a test can SIGKILL it.

python sink_eo_query.py ENDPOINT SOURCE TARGET CHECKPOINT GUARANTEE MAX_PER_TRIGGER

ENDPOINT is a broker's host:port, or namesrv=HOST:PORT for a cluster (source and sink both).
"""

from __future__ import annotations

import os
import sys

os.environ["PYSPARK_PYTHON"] = sys.executable

from pyspark.sql import functions as F

from streaming_jobs.common import spark_session


def main() -> int:
    endpoint, source, target, checkpoint, guarantee, max_per_trigger = sys.argv[1:7]
    spark = spark_session("sluice-sink-eo", shuffle_partitions=2, driver_memory="768m")
    cluster = endpoint.startswith("namesrv=")
    where = ("namesrv", endpoint.removeprefix("namesrv=")) if cluster else ("endpoints", endpoint)
    df = (
        spark.readStream.format("sluice").option(*where).option("topic", source)
        .option("consumerGroup", f"mirror-{target}").option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", max_per_trigger).load()
    )
    # The transform: the body gains a suffix, the tag and the source queue are carried over. In a cluster the key
    # is the id's last two digits: 100 keys spread over every broker's queues, where 4 queue ids would not be.
    key = F.substring(F.col("body").cast("string"), -2, 2) if cluster else F.col("queue_id").cast("string")
    out = df.select(
        F.concat(F.col("body").cast("string"), F.lit("|mirrored")).alias("body"),
        F.col("tags"),
        key.alias("sharding_key"),
    )
    query = (
        out.writeStream.format("sluice").option(*where).option("topic", target)
        .option("deliveryGuarantee", guarantee).option("checkpointLocation", checkpoint)
        .trigger(availableNow=True).start()
    )
    print("started", flush=True)
    query.awaitTermination()
    return 0 if query.exception() is None else 1


if __name__ == "__main__":
    sys.exit(main())

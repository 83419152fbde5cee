"""What every job shares: a Spark session with the sluice source registered, and a clear Java check."""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from broker.format.system_topics import MAX_GROUP_CHARS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

log = logging.getLogger(__name__)

INTERRUPTED_EXIT = 130  # 128 + SIGINT, the shell's convention (as `sluice` commands)
AWAIT_POLL_S = 1  # a query is waited for in py4j calls this long, so that Ctrl-C is seen between them

JAVA_HELP = (
    "Spark needs Java 17 or newer and none was found (no `java` on PATH, no JAVA_HOME).\n"
    "Install it, then run the job again:\n"
    "  Debian/Ubuntu:  sudo apt-get install -y openjdk-17-jre-headless\n"
    "  macOS:          brew install openjdk@17\n"
)


def require_java() -> None:
    """Exit with install instructions when Spark could not start for lack of Java."""
    home = os.environ.get("JAVA_HOME")
    if (home and os.path.exists(os.path.join(home, "bin", "java"))) or shutil.which("java"):
        return
    sys.stderr.write(JAVA_HELP)
    raise SystemExit(2)


def spark_session(
    app: str,
    cores: int = 2,
    shuffle_partitions: int = 4,
    driver_memory: str = "2g",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A local session tuned for a small machine, with ``format("sluice")`` registered; ``conf`` adds settings
    (the test suites use it too)."""
    require_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from connector import register

    builder = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", driver_memory)
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    quiet_accumulator_hangups(spark)
    return spark


def quiet_accumulator_hangups(spark: SparkSession) -> None:
    """Make the driver's accumulator server take a connection the JVM closed as closed, not print a traceback.

    Spark runs a Python data source's planning, and a Python sink's commit and abort, in Python workers from the
    query's own thread, and merges their accumulator updates into the driver's server over an NIO channel. Stopping
    a query (Ctrl-C) interrupts that thread, and an interrupted thread's I/O closes the channel: the server's handler
    reads EOF, socketserver prints it as "Exception occurred during processing of request" with a traceback, and the
    JVM opens a new connection for its next update. That print tells a user nothing to act on; any other error of the
    server is still printed."""
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is None:  # a PySpark without it, or a stopped context: nothing prints
        return
    report = server.handle_error

    def handle_error(request: object, client_address: object) -> None:
        if isinstance(sys.exc_info()[1], (EOFError, ConnectionError)):  # called in socketserver's ``except``
            log.debug("the JVM closed its accumulator connection (%s)", client_address)
            return
        report(request, client_address)

    server.handle_error = handle_error


def group_name(prefix: str, topics: list[str]) -> str:
    """A job's default consumer group: ``<prefix>-<topics joined by '-'>``. A long one is cut and made unique with a
    hash of the whole list: the broker's group limit (MAX_GROUP_CHARS, room for %RETRY%) is shorter than a topic
    name may be."""
    group = "-".join([prefix, *topics])
    if len(group) <= MAX_GROUP_CHARS:
        return group
    digest = hashlib.sha256(",".join(topics).encode()).hexdigest()[:16]
    return f"{group[: MAX_GROUP_CHARS - 17]}-{digest}"


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (0 would mean 'no limit' to a truthiness test, silently)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1; leave the option out for no limit")
    return value


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The job's docstring as written (its example command keeps its lines) and every option's default."""


def base_parser(job: str, description: str, default_group: str) -> argparse.ArgumentParser:
    """The options every job shares; ``job`` is its module name (``topic_mirror``) for the usage line,
    ``default_group`` says which consumer group it commits to without ``--group`` (``mirror-<source>``)."""
    ap = argparse.ArgumentParser(prog=f"python -m streaming_jobs.{job}", description=description,
                                 formatter_class=HelpFormatter)
    ap.add_argument("--group", default=None, help=f"consumer group to commit offsets for (default: {default_group})")
    ap.add_argument("--starting-offsets", default="committed", help="earliest | latest | committed | JSON")
    ap.add_argument(
        "--endpoints", default=os.environ.get("SLUICE_ENDPOINT", "127.0.0.1:10911"), help="broker host:port"
    )
    ap.add_argument("--namesrv", default=None,
                    help="name servers host:port[,host:port] instead of --endpoints: the job finds every broker of "
                         "its topics and follows a replicated group's master when it moves")
    ap.add_argument("--checkpoint", required=True, help="Spark checkpoint directory (keep it to resume exactly once)")
    ap.add_argument("--trigger", choices=("available-now", "continuous"), default="continuous",
                    help="available-now: process what is there, then stop; continuous: run until stopped")
    ap.add_argument("--interval", default="1 second", help="micro-batch interval for --trigger continuous")
    ap.add_argument("--max-messages-per-trigger", type=positive_int, default=None,
                    help="admission limit per micro-batch (>= 1)")
    ap.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING or ERROR")
    return ap


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def start_session(app: str, args: argparse.Namespace) -> SparkSession:
    """The job's logging (``--log-level``) and its Spark session."""
    setup_logging(args.log_level)
    return spark_session(app)


def read_sluice(spark: SparkSession, args: argparse.Namespace, options: Mapping[str, str]) -> DataFrame:
    """The sluice source as every job reads it: from ``--endpoints`` (or ``--namesrv``), at ``--starting-offsets``
    (the earliest where the group has no offset yet), at most ``--max-messages-per-trigger`` a micro-batch;
    ``options`` name the topics and the consumer group, and add the job's own."""
    reader = spark.readStream.format("sluice").options(**brokers(args), **options)
    reader = reader.option("startingOffsets", args.starting_offsets).option("startingOffsetsFallback", "earliest")
    if args.max_messages_per_trigger is not None:
        reader = reader.option("maxMessagesPerTrigger", str(args.max_messages_per_trigger))
    return reader.load()


def brokers(args: argparse.Namespace) -> dict[str, str]:
    """The connector's option naming the cluster: ``--namesrv`` when given (``--endpoints`` is then unused)."""
    return {"namesrv": args.namesrv} if args.namesrv else {"endpoints": args.endpoints}


def with_trigger(writer: DataStreamWriter, trigger: str, interval: str) -> DataStreamWriter:
    """``--trigger available-now`` or a processing-time trigger every ``interval``."""
    return writer.trigger(availableNow=True) if trigger == "available-now" else writer.trigger(processingTime=interval)


def run_query(writer: DataStreamWriter, args: argparse.Namespace) -> int:
    """Start the job's query with its ``--trigger`` and wait for it to end (await_query: 0, or 130)."""
    return await_query(with_trigger(writer, args.trigger, args.interval).start())


def await_query(query: StreamingQuery) -> int:
    """Wait until the query ends (available-now) or Ctrl-C; then stop it and say how far it got (0, or 130).

    PySpark's own SIGINT handler calls into the JVM from inside the handler, while the main thread is in the middle
    of a py4j call, and py4j logs a traceback ("reentrant call"). So this waits in short py4j calls with a handler
    that only takes note, and stops the query itself. Every micro-batch that finished is in the checkpoint (and,
    exactly once, in the sink); the one in flight is not, and the next run with the same --checkpoint redoes it."""
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    try:
        while not query.awaitTermination(AWAIT_POLL_S) and not interrupted.is_set():
            pass
    finally:
        signal.signal(signal.SIGINT, previous)
    if not interrupted.is_set():
        return 0
    query.stop()
    last = query.lastProgress
    # Stop the session too: at interpreter exit, PySpark's accumulator server thread would otherwise read from the
    # JVM going away and print an EOFError traceback.
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is not None:
        session.stop()
    where = f"after micro-batch {last['batchId']}" if last else "before its first micro-batch finished"
    print(f"interrupted: query stopped {where}; run again with the same --checkpoint to go on from there",
          file=sys.stderr)
    return INTERRUPTED_EXIT


def run_job(main: Callable[[], int]) -> None:
    """``sys.exit(main())``, with Ctrl-C before the query runs (Spark starting) one line and 130, not a traceback."""
    try:
        code = main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = INTERRUPTED_EXIT
    sys.exit(code)

"""Sluice beside Redis Streams and NATS JetStream, and beside the limits of this machine.

    python -m bench.peers [--systems sluice,sluice-remoting,redis,nats,relay,relay-streams,tcp-relay] [--scale 1.0]
                          [--rounds 1]
                          [--latency-rates 5000,250] [--no-charts]

Same machine, loopback, same message count and size, each system through its standard Python client:

- **Redis Streams**: Debian's ``redis-server`` (AOF, ``appendfsync everysec``), redis-py with hiredis; produce =
  pipelined XADD, consume = XREADGROUP with the previous batch's XACK pipelined in the same round trip.
- **NATS JetStream**: Debian's ``nats-server -js`` (file storage), nats-py; produce = ``publish_async`` (up to
  4000 acks pending), consume = pull ``fetch`` with AckAll, acking the last message of each batch.
- **Sluice**: a broker subprocess (``python -m broker broker``, ASYNC_FLUSH), broker.client; produce =
  ``Producer.send_batch``, consume = ``PullConsumer.pull`` carrying the commit offset (and, as a second figure,
  ``pull_raw``, which leaves entries encoded as the Spark connector reads them, and as a third ``pull_raw`` with
  ``decode_entry`` on every entry, every field decoded up front). All are timed once the broker has indexed the
  whole queue (the wait after the produce is recorded as ``index_wait_s``).
- **The relay** (latency rows only): ``bench.hops``'s bare grpcio relay, a ``Put`` that wakes a held ``Get``, sent to
  and read from exactly as the brokers are. It stores and checks nothing: its rows are what any broker reached
  through Python gRPC with a call a message pays at least on this machine, rate by rate. **relay-streams**: the
  same relay with the puts on one bidirectional stream and the bodies pushed on one server stream (``bench.hops``
  says more): what a protocol built on streams could reach.

Every system gets one stream / one queue, batches of ``BATCH_MSGS`` messages, an uncounted warm-up run, and
flushes to disk asynchronously (Redis every second, NATS on its sync interval, Sluice every 500 ms). The clients
all run in this process, which keeps large freed blocks for reuse (``broker.client.tune_malloc()``, as a producer
that sends large batches is advised to): the same for every client; ``--default-malloc`` leaves glibc's defaults.

End-to-end latency, at a fixed 5k msgs/s (a broker's load, more than one sender may carry) and at 250 msgs/s (a
rate every system's single sends sustain here, so the figures show the systems rather than queueing behind a
saturated sender): the producer sends single messages with the synchronous API at a fixed rate; the consumer
runs in its own process (Sluice's a PushConsumer, the time taken in its listener); latency = receive time -
scheduled send time, so a sender that falls behind the rate
counts against its system (the achieved rate is reported beside; a sender that can't keep up stops after
``LATENCY_MAX_WALL_S``).

Consume with every field of every message read, like for like (Sluice's pull and push listener beside Redis's
``XREAD`` and ``XREADGROUP ... NOACK``, the same fields on both sides, medians of at least three rounds with their
spread): ``bench.peers.every_field``, run after the rows above when Sluice and Redis are both among the systems.

**sluice-remoting** is the same broker over its RocketMQ remoting port (``remoting://``, a PullConsumer holding
its pulls for the latency rows); **tcp-relay** (``tcp_floor``) is their floor: a bare asyncio TCP relay doing the
remoting framing and nothing else. **One synchronous sender** (``sync_sender``): sends a second of each system
that offers ``sync_sends``, median of at least three rounds with the lowest and highest. Every figure's median
and spread over the rounds are in the JSON (``spread``); latency rows are the median of ``--rounds`` runs.

The limits: sequential disk write bandwidth with fdatasync (the ceiling for sustained produce), and gRPC on
loopback with 1 MiB messages through a trivial sink/source service in another process (the ceiling of any
gRPC broker in Python here). Sluice's MB/s are printed as ratios of them, and its consume rates as ratios of the peers'.
With Sluice among the systems, ``bench.hops`` follows: a message's time hop by hop, each beside its floor here (a
bare grpcio round trip, a thread wake-up).

The peers are started by the benchmark from their Debian packages (installed with apt-get when missing) on free
loopback ports, in a temporary directory removed at the end. Their clients are benchmark-only packages
(``pip install redis hiredis nats-py matplotlib``). Writes bench/results/peers.json and the charts
bench/results/peers_throughput.png and bench/results/peers_latency.png. Other load on the machine skews every
figure: the load average at start and end is recorded in the JSON.

The package holds one module per system (``sluice``, ``redis_streams``, ``nats_jetstream``, ``relay``), the
``every_field`` rows, the machine's ``floors``, the ``table`` and ``charts``, the ``rounds`` over the systems and the
``cli``; ``results``, ``pacing``, ``processes`` and ``settings`` are what they share.
"""

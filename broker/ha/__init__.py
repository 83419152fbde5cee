"""Replication and automatic failover of a broker group (one master, its slaves), RocketMQ's HA and controller
mode over Kafka's rules. docs/replication.md is the operator's guide; this is the design, module by module.

* **Log shipping** (master_endpoint.py, slave_fetcher.py, chunk.py, ha.proto): the slave fetches the master's commit-log
  bytes from where its own log ends and writes them at the same offsets, byte for byte (CommitLog.append_replicated),
  after checking framing, CRC and PHYSICALOFFSET; its own dispatcher builds its consume queues and index. Each fetch
  reports what the slave holds: that is its acknowledgement.
* **Epochs** (epoch_file.py, divergence.py): every replica records which master epoch wrote which part of its log.
  A replica that returns cuts its log where it stops agreeing with the master (the newest common epoch's end on
  both sides: KIP-101, RIP-44), crash-safely (store/truncation.py: an intent file, carried out by start-up); one
  older than the master's first file discards its log and starts there (not stuck, as in RocketMQ 3388).
* **In-sync set and confirmed offset** (in_sync.py, read_limit.py): replicas caught up within ha_max_lag_ms are in
  sync; the confirmed offset (high watermark) is the lowest offset they all hold. Readers never see past it, on the
  master or a slave.
* **Acknowledgements** (replication_gate.py): a SYNC_MASTER (and every master in controller mode) refuses writes while
  fewer than min_insync_replicas are in sync, and acknowledges once every in-sync replica holds the write; a wait that
  runs out answers FLUSH_SLAVE_TIMEOUT, which the producer reports as an unknown outcome and retries under the same
  UNIQ_KEY (deduplicated through the replicated index, also by a new master). Slaves refuse writes.
* **Controller mode** (controller.py, etcd_client.py): the group's master, epoch and in-sync set live in etcd; the
  master holds a lease; when it expires a member of the in-sync set takes epoch + 1 in one etcd transaction. Fencing:
  a master whose lease lapses, or that sees a newer epoch (in etcd, or in a replica's Hello), stops acknowledging
  and restarts in place as a replica; replicas refuse masters older than the newest epoch they know; only the
  master of the current epoch can change the recorded in-sync set.
* **Metadata** (metadata_sync.py): the master's topics, subscription groups, consumer offsets, delay progress and
  transaction state files reach the slaves with the fetches, and so does the snapshot of the pop record, whose
  changes are messages in the log (broker/semantics/pop_log.py).
* **Roles** (manager.py): taking and leaving office; replication_settings.py lists every setting;
  replication_metrics.py the metrics;
  (broker/client/cluster_view.py: what `sluice cluster list` shows); local_group.py and etcd_process.py run groups
  for tests and benchmarks.
"""

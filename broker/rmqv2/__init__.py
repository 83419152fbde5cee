"""RocketMQ 5 clients against Sluice: ``apache.rocketmq.v2.MessagingService`` beside ``sluice.v1`` on the broker's
client port (gRPC routes each call by its service name), so the official clients (Java, Go, Node.js, C#, Rust,
Python) work unchanged, in plain text (the Python and Node.js clients' default; the Java and Go clients need
TLS switched off).

The protocol's stubs come from the official Python client's package (``rocketmq-python-client``, pinned in
pyproject.toml), which ships them as ``rocketmq.grpc_protocol``; nothing generated from the RocketMQ protocol is
kept in this repository.

This package only translates; the capabilities are the broker's own, shared with Sluice's clients:

| RPC                               | what the broker does                                                           |
|-----------------------------------|--------------------------------------------------------------------------------|
| QueryRoute                        | the topic's queues: this broker's, or the cluster's from the name servers      |
| QueryAssignment                   | per readable broker one assignment (queue -1), or every queue for FIFO groups  |
| Heartbeat                         | the client is alive; a consumer joins its group (ConsumerManager)              |
| Telemetry                         | settings in, the broker's settings out; transaction check-backs                |
| NotifyClientTermination           | the client leaves its group; its auto-renewed messages are released            |
| SendMessage                       | NORMAL, FIFO (message group -> one queue), DELAY (timer.py), TRANSACTION halves |
| EndTransaction                    | commit or roll back (from the client or after a check-back)                    |
| ReceiveMessage                    | pop (semantics/pop.py): invisible time or auto-renew, long polling, attempt id |
| AckMessage                        | ends a delivery                                                                |
| ChangeInvisibleDuration           | a new invisible time and a new receipt handle                                  |
| ForwardMessageToDeadLetterQueue   | into %DLQ%{group}, then ended                                                  |
| PullMessage                       | a pull (PullProcessor), messages streamed, then the next offset                |
| UpdateOffset / GetOffset          | the group's committed offset of a queue                                        |
| QueryOffset                       | a queue's min or max offset, or the first offset at a time                     |
| RecallMessage                     | removes a timer message before its time (the send answered its recall handle) |
| SyncLiteSubscription              | answered UNSUPPORTED (lite topics)                                             |

Message ids: the client's id travels as the ``UNIQ_KEY`` property and is what every answer, query by key and
dead-letter record names, through both protocols (Sluice's own Producer sets one on every message too).
"""

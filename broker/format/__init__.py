"""The message format: what a message is on the wire and on disk, shared by every room that reads or writes one.

The store keeps entries in this format, the semantics (delays, transactions, retries) rewrite them, the server and
the RocketMQ 5 front translate them, and the client and the Spark connector encode and decode them without any of
those rooms. So this room sits at the bottom: it imports only ``broker.errors`` and itself (an import contract in
pyproject.toml keeps it so), and the client and the connector need nothing else of the broker's inside.

It holds:

* ``message``: the entry layout (88-byte header, field positions, magic codes, sys flags), the single-message
  encoding and decoding, RocketMQ's property string (``Prop`` names), message ids (the offset id, ``UNIQ_KEY``)
  and topic validation;
* ``single``: one message encoded as a commit-log entry from its fields, with the checks a put of one message
  makes (what ``MessageStore.put_message`` writes);
* ``properties``: scanning and checking property sections without decoding them (a numpy kernel);
* ``numbers``: the decimal numbers that properties carry;
* ``scan_kernel``: the vectorised walk over a run of entries that ``batch`` and ``properties`` build on;
* ``pulled_columns``: every field ``message.decode_entry`` gives, for all entries of a pull answer at once (one
  column a field), which the client's pulled messages read when an application reads their fields;
* ``batch``: the batch encoding clients send and the broker validates, splices and splits;
* ``send_checks``: what every sent message must be (transaction bits, reconsume times, canonical properties, a
  producer group), checked alike by the broker on every send path and by a client that makes half messages;
* ``system_topics``: the names of RocketMQ's and Sluice's system topics and groups, the retry / dead-letter
  topic names, and the longest group name they leave room for;
* ``transaction_codec``: the wire parts of a transaction: half-message properties and entries, op messages,
  decision properties, committed entries;
* ``txn_decision``: a transaction decision over several brokers and its bounds (its protobuf form is
  ``broker/proto/decision.py``: this room imports no stubs);
* ``lock_lease``: how long a broker keeps an orderly consumer's queue lock, which the client renews within;
* ``signature``: how a request is signed (the client signs, ``broker/auth`` verifies).
"""

"""RocketMQ's remoting protocol: the TCP wire RocketMQ 4 clients, ``mqadmin`` and the RocketMQ tools speak.

A frame is ``total length (4) | serialization type (1) + header length (3) | header | body``, big-endian; the header
is JSON or RocketMQ's binary ``ROCKETMQ`` layout and carries ``code``, ``language``, ``version``, ``opaque``,
``flag``, ``remark`` and ``extFields`` (docs/remoting.md). This room holds the codec, the transport and the
translation of request codes into Sluice's own processors; it decides nothing a broker does (the processors do).

Modules:
- ``command``: :class:`RemotingCommand`, the decoded frame, and the flag bits.
- ``processor``: the interface a request code's handler implements, and the context it is given.
- ``codes``: RocketMQ's request and response codes, and Sluice's refusal codes as RocketMQ's.
- ``frame``, ``json_header``, ``binary_header``, ``language``: the codec; ``fastjson``: JSON bodies as RocketMQ's
  Java side writes and reads them.
- ``server`` and ``connection``: the transport (asyncio I/O, a bounded worker pool); ``client``: a blocking client.
- ``handler``, ``header_fields``: a processor made of one function, and reading a request's ext fields.
- ``broker_table``: the broker's processor table; ``offset_processor`` and ``client_processor`` translate their codes
  to the broker's processors. (The name server's are in broker/namesrv/remoting_processor.py.)

Dependencies: this room imports the broker's processors (broker/server), never the store, semantics or replication
directly; only the wiring (server, name server, command line) and the client import it (pyproject's import
contracts).
"""

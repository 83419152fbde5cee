"""RocketMQ's remoting protocol: the TCP wire RocketMQ 4 clients, ``mqadmin`` and the RocketMQ tools speak.

A frame is ``total length (4) | serialization type (1) + header length (3) | header | body``, big-endian; the header
is JSON or RocketMQ's binary ``ROCKETMQ`` layout and carries ``code``, ``language``, ``version``, ``opaque``,
``flag``, ``remark`` and ``extFields`` (docs/remoting.md). This room holds the codec, the transport and the
translation of request codes into Sluice's own processors; it decides nothing a broker does (the processors do).

Modules:
- ``command``: :class:`RemotingCommand`, the decoded frame, and the flag bits.
- ``processor``: the interface a request code's handler implements, and the context it is given.
"""

"""Offset message ids as remoting clients must see them: naming the broker's *remoting* address.

A RocketMQ offset message id is the store host (IPv4 and port) and the commit-log offset, and a 4.x client or
``mqadmin queryMsgById`` connects to the address in the id and asks ``VIEW_MESSAGE_BY_ID`` there with the offset.
Sluice's store writes one store host into every entry it stores (entries are replicated and pulled byte for byte):
the broker's remoting address when its port is set, else its gRPC address, since a remoting port of 0 is known only
once bound, after the store starts (BrokerController._store_host). For that case, and for entries stored before the
port was set, the remoting front names its own address in the ids it gives:

* send answers (``msgId``, which the client keeps as ``offsetMsgId``) carry the remoting address and the
  commit-log offset (:meth:`RemotingIds.msg_id`);
* the entries ``VIEW_MESSAGE_BY_ID`` and ``QUERY_MESSAGE`` answer have their STOREHOST field set to the remoting
  address (:meth:`RemotingIds.served`), so the ids a client decodes from them lead back to this port;
* ``VIEW_MESSAGE_BY_ID`` reads its ``offset`` field alone: an id of either address finds the message.

* pulled entries likewise (:meth:`RemotingIds.served_all`: a copy of the answer with 8 bytes set per entry, made
  only when the store's host is not the remoting address, that is with a remoting port of 0).

Entries with an IPv6 host field, and brokers whose remoting address is not IPv4, keep the stored host.
"""

from __future__ import annotations

import ipaddress

from broker.format.message import I32, POS_STORE_HOST, POS_SYS_FLAG, SysFlag, msg_id_at

_V6_FLAGS = SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6
_HOST_BYTES = 8  # IPv4 address and int32 port


class RemotingIds:
    """The remoting address put in ids; set once the remoting port is bound (``bind``). Until then, and for a
    broker serving no remoting port, ids keep the store's own host."""

    def __init__(self, store_prefix: str) -> None:
        self.store_prefix = store_prefix  # the store's host as 16 hex characters (MessageStore.msg_id_prefix)
        self.prefix = store_prefix
        self._host: bytes | None = None

    def bind(self, address: str) -> None:
        """``address``: the remoting HOST:PORT registered for clients."""
        host, _, port = address.rpartition(":")
        try:
            ip = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return
        if ip.version != 4:
            return
        self._host = ip.packed + I32.pack(int(port))
        self.prefix = self._host.hex().upper()

    def msg_id(self, commitlog_offset: int) -> str:
        return msg_id_at(self.prefix, commitlog_offset)

    def served_all(self, entries: bytes) -> bytes:
        """A pull answer's entries (one after another, each led by its total size) with their STOREHOST naming the
        remoting address; the same bytes when the store already writes that address (a set remoting port)."""
        if self._host is None or self.prefix == self.store_prefix:
            return entries
        out = bytearray(entries)
        pos = 0
        while pos + POS_STORE_HOST + _HOST_BYTES <= len(out):
            size = I32.unpack_from(out, pos)[0]
            if size <= 0:
                break  # not an entry: leave the rest as it is
            if not I32.unpack_from(out, pos + POS_SYS_FLAG)[0] & _V6_FLAGS:
                out[pos + POS_STORE_HOST : pos + POS_STORE_HOST + _HOST_BYTES] = self._host
            pos += size
        return bytes(out)

    def served(self, entry: bytes) -> bytes:
        """``entry`` with its STOREHOST naming the remoting address (unchanged when that cannot be written)."""
        if self._host is None or len(entry) < POS_STORE_HOST + _HOST_BYTES:
            return entry
        if I32.unpack_from(entry, POS_SYS_FLAG)[0] & _V6_FLAGS:
            return entry
        return entry[:POS_STORE_HOST] + self._host + entry[POS_STORE_HOST + _HOST_BYTES :]

"""The few etcd calls controller mode makes, over etcd's JSON gateway (``/v3/...``) with the ``etcd3gw`` client.

Why etcd3gw: it is maintained (OpenStack's, released 2026), synchronous (the broker's threads call it; no event
loop to host), speaks the gateway that etcd 3.4 (Debian's etcd-server) and later serve, and depends on no
protobuf or gRPC stubs of its own, so it cannot clash with the broker's pinned protobuf runtime. ``aetcd`` needs
asyncio; ``etcd3`` is unmaintained and breaks on protobuf >= 4.

Only these calls: get (one key or a prefix), compare-and-set transactions (raw gateway txn: keys and values in
base64, revisions as strings), leases (grant, keep-alive, revoke). Every call has a timeout (``timeout_s``); with
several endpoints each is tried in turn, starting with the last that answered. Failures raise
``CoordinationError`` (a ServiceNotAvailableError).
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import etcd3gw
from etcd3gw import exceptions as etcd_errors

from broker.errors import ServiceNotAvailableError

DEFAULT_TIMEOUT_S = 1.0
MAX_VALUE_BYTES = 64 * 1024  # controller values are small JSON documents; a bigger one is not ours


class CoordinationError(ServiceNotAvailableError):
    """etcd did not answer (or refused): the broker cannot know or change its group's state now."""


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: dict[str, Any]
    mod_revision: int
    create_revision: int
    lease: int


def _b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.b64encode(raw).decode("ascii")


def _decode(kv: dict[str, Any]) -> KeyValue | None:
    raw = base64.b64decode(kv.get("value", ""))
    if len(raw) > MAX_VALUE_BYTES:
        return None
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    return KeyValue(base64.b64decode(kv["key"]).decode("utf-8", "replace"), value, int(kv.get("mod_revision", 0)),
                    int(kv.get("create_revision", 0)), int(kv.get("lease", 0)))  # fmt: skip


class Put:
    def __init__(self, key: str, value: dict[str, Any], lease: int = 0) -> None:
        self.request: dict[str, Any] = {"key": _b64(key), "value": _b64(json.dumps(value, sort_keys=True))}
        if lease:
            self.request["lease"] = str(lease)


class Compare:
    """One condition of a transaction on a key's revision: ``mod`` (last change) or ``create`` (0: absent)."""

    def __init__(self, key: str, target: str, revision: int) -> None:
        assert target in ("MOD", "CREATE"), target
        field = "mod_revision" if target == "MOD" else "create_revision"
        self.request = {"key": _b64(key), "result": "EQUAL", "target": target, field: str(revision)}


class Etcd:
    def __init__(self, endpoints: Sequence[tuple[str, int]], timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._clients = [etcd3gw.Etcd3Client(host=h, port=p, timeout=timeout_s, api_path="/v3/") for h, p in endpoints]
        self._preferred = 0
        self._lock = threading.Lock()
        self.endpoints = [f"{h}:{p}" for h, p in endpoints]

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        with self._lock:
            start = self._preferred
        errors: list[str] = []
        for i in range(len(self._clients)):
            index = (start + i) % len(self._clients)
            client = self._clients[index]
            try:
                result = client.post(client.get_url(path), json=body)
            except (etcd_errors.Etcd3Exception, OSError, ValueError) as e:
                errors.append(f"{self.endpoints[index]}: {type(e).__name__} {str(e)[:200]}")
                continue
            with self._lock:
                self._preferred = index
            return result
        raise CoordinationError("etcd did not answer (" + "; ".join(errors) + ")")

    def get(self, key: str) -> KeyValue | None:
        result = self._post("/kv/range", {"key": _b64(key)})
        for kv in result.get("kvs", []):
            return _decode(kv)
        return None

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        result = self._post("/kv/range", {"key": _b64(prefix), "range_end": _b64(end)})
        return [kv for kv in (_decode(raw) for raw in result.get("kvs", [])) if kv is not None]

    def put(self, key: str, value: dict[str, Any], lease: int = 0) -> None:
        self._post("/kv/put", Put(key, value, lease).request)

    def delete(self, key: str) -> None:
        self._post("/kv/deleterange", {"key": _b64(key)})

    def transaction(self, compare: list[Compare], success: list[Put]) -> bool:
        """Apply every put when every comparison holds, atomically; whether they held."""
        body = {"compare": [c.request for c in compare], "success": [{"request_put": p.request} for p in success]}
        return bool(self._post("/kv/txn", body).get("succeeded", False))

    def grant(self, ttl_s: int) -> int:
        return int(self._post("/lease/grant", {"TTL": str(ttl_s)})["ID"])

    def keep_alive(self, lease: int) -> int:
        """The lease's remaining TTL after the refresh; -1 when it has expired already."""
        result = self._post("/lease/keepalive", {"ID": str(lease)})
        return int(result.get("result", {}).get("TTL", -1))

    def revoke(self, lease: int) -> None:
        self._post("/lease/revoke", {"ID": str(lease)})

    def close(self) -> None:
        for client in self._clients:
            client.session.close()

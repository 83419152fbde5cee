"""The few etcd calls controller mode makes, over etcd's JSON gateway (``/v3/...``) with the ``etcd3gw`` client.

Why etcd3gw: it is maintained (OpenStack's, released 2026), synchronous (the broker's threads call it; no event
loop to host), speaks the gateway that etcd 3.4 (Debian's etcd-server) and later serve, and depends on no
protobuf or gRPC stubs of its own, so it cannot clash with the broker's pinned protobuf runtime. ``aetcd`` needs
asyncio; ``etcd3`` is unmaintained and breaks on protobuf >= 4.

Only these calls: get (one key or a prefix), compare-and-set transactions (raw gateway txn: keys and values in
base64, revisions as strings), leases (grant, keep-alive, revoke). Every call has a timeout (``timeout_s``); with
several endpoints each is tried in turn, starting with the last that answered. Failures raise
``CoordinationError`` (a ServiceNotAvailableError); a refusal of this broker's credentials raises one of its
subclasses with the matching response code: ``EtcdTlsError`` and ``EtcdAuthError`` (UNAUTHENTICATED),
``EtcdPermissionError`` (NO_PERMISSION).

TLS, client certificates and etcd users come from ``EtcdSecurity`` (etcd_security.py). etcd3gw takes the CA and
the client certificate itself; it knows nothing of etcd's users, so this module authenticates
(``/v3/auth/authenticate``, name and password) and sends the token in the ``Authorization`` header, once per
endpoint, and again when etcd answers that the token is no longer valid (simple tokens expire after
``--auth-token-ttl``, 300 s by default, and with a restart of the member).
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

from broker.errors import ResponseCode, ServiceNotAvailableError
from broker.ha.etcd_security import EtcdSecurity

DEFAULT_TIMEOUT_S = 1.0
MAX_VALUE_BYTES = 64 * 1024  # controller values are small JSON documents; a bigger one is not ours


class CoordinationError(ServiceNotAvailableError):
    """etcd did not answer (or refused): the broker cannot know or change its group's state now."""


class EtcdTlsError(CoordinationError):
    """The TLS connection to etcd failed: no client certificate where etcd requires one, one etcd does not trust,
    an etcd certificate not from etcd_ca_file, or TLS on one side only. Nothing was sent."""

    code = ResponseCode.UNAUTHENTICATED


class EtcdAuthError(CoordinationError):
    """etcd refused this broker's user: a wrong name or password, or no user given where etcd has auth enabled."""

    code = ResponseCode.UNAUTHENTICATED


class EtcdPermissionError(CoordinationError):
    """etcd knows the user but its roles do not grant read and write on the group's keys (``/sluice/``)."""

    code = ResponseCode.NO_PERMISSION


# etcd's gRPC status codes, as its gateway answers them in a JSON body's "code"
_GRPC_INVALID_ARGUMENT, _GRPC_PERMISSION_DENIED, _GRPC_UNAUTHENTICATED = 3, 7, 16
_TLS_SIGNS = ("SSL", "TLS", "CERTIFICATE", "certificate")
_MISSING_USER = "user name is empty"
_BAD_CREDENTIALS = "authentication failed"
_HTTP_TO_HTTPS = "HTTP request to an HTTPS server"
_CLOSED_UNANSWERED = "closed connection without response"  # what a TLS-only etcd does to a plain HTTP request


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
                    int(kv.get("create_revision", 0)), int(kv.get("lease", 0)))


class Put:
    def __init__(self, key: str, value: dict[str, Any], lease: int = 0) -> None:
        self.request: dict[str, Any] = {"key": _b64(key), "value": _b64(json.dumps(value, sort_keys=True))}
        if lease:
            self.request["lease"] = str(lease)


class RevisionCondition:
    """One condition of a transaction on a key's revision: ``mod`` (last change) or ``create`` (0: absent)."""

    def __init__(self, key: str, target: str, revision: int) -> None:
        assert target in ("MOD", "CREATE"), target
        field = "mod_revision" if target == "MOD" else "create_revision"
        self.request = {"key": _b64(key), "result": "EQUAL", "target": target, field: str(revision)}


def _etcd_error(e: Exception) -> tuple[int, str]:
    """etcd's gRPC code and message from a refused call (0 and the text when it is no etcd answer)."""
    detail = getattr(e, "detail_text", None) or ""
    try:
        body = json.loads(detail)
    except ValueError:
        return 0, detail or str(e)
    if not isinstance(body, dict):
        return 0, detail
    return int(body.get("code", 0) or 0), str(body.get("message") or body.get("error") or detail)


def classify(e: Exception, security: EtcdSecurity) -> type[CoordinationError]:
    """The kind of failure an etcd call met, from what etcd3gw raised."""
    code, text = _etcd_error(e)
    if code == _GRPC_PERMISSION_DENIED:
        return EtcdPermissionError
    refused = code == _GRPC_INVALID_ARGUMENT and (_MISSING_USER in text or _BAD_CREDENTIALS in text)
    if code == _GRPC_UNAUTHENTICATED or refused:
        return EtcdAuthError
    if _HTTP_TO_HTTPS in text or (security.protocol == "https" and any(s in text for s in _TLS_SIGNS)):
        return EtcdTlsError
    return CoordinationError


def explain(kind: type[CoordinationError], security: EtcdSecurity) -> str:
    """What to change, for a refusal of this kind."""
    if kind is EtcdTlsError:
        if security.protocol == "http":
            return "etcd serves TLS: give etcd_ca_file (--etcd-ca-file), the CA that signed its certificate"
        return (
            "the TLS connection failed: etcd's certificate must come from etcd_ca_file, and an etcd started "
            "with --client-cert-auth needs etcd_cert_file and etcd_key_file from its --trusted-ca-file"
        )
    if kind is EtcdAuthError:
        if not security.user:
            return "etcd has auth enabled: give etcd_user (--etcd-user) and its password"
        return f"etcd refused user {security.user!r}: check the password (etcd_password_file or $SLUICE_ETCD_PASSWORD)"
    if kind is EtcdPermissionError:
        return f"etcd user {security.user!r} needs a role with read and write on /sluice/"
    return "etcd did not answer"


class Etcd:
    def __init__(self, endpoints: Sequence[tuple[str, int]], timeout_s: float = DEFAULT_TIMEOUT_S,
                 security: EtcdSecurity | None = None) -> None:
        self.security = s = security or EtcdSecurity()
        self._clients = [
            etcd3gw.Etcd3Client(host=h, port=p, protocol=s.protocol, ca_cert=s.ca_file or None,
                                cert_cert=s.cert_file or None, cert_key=s.key_file or None, timeout=timeout_s,
                                api_path="/v3/")
            for h, p in endpoints
        ]
        # requests lets $REQUESTS_CA_BUNDLE override a session's CA: the CA goes with every request instead
        self._verify: dict[str, Any] = {"verify": s.ca_file} if s.ca_file else {}
        self._tokens: dict[int, str] = {}  # endpoint index -> its auth token (etcd users only)
        self._preferred = 0
        self._lock = threading.Lock()
        self.endpoints = [f"{h}:{p}" for h, p in endpoints]

    def _token(self, index: int, renew: bool) -> str:
        """The endpoint's auth token, asked for when there is none yet (or ``renew``)."""
        with self._lock:
            token = self._tokens.get(index, "")
        if token and not renew:
            return token
        client = self._clients[index]
        answer = client.post(client.get_url("/auth/authenticate"), json={"name": self.security.user,
                             "password": self.security.password}, **self._verify)
        token = str(answer.get("token", ""))
        with self._lock:
            self._tokens[index] = token
        return token

    def _call(self, index: int, path: str, body: dict[str, Any]) -> Any:
        client = self._clients[index]
        if not self.security.user:
            return client.post(client.get_url(path), json=body, **self._verify)
        for renew in (False, True):
            headers = {"Authorization": self._token(index, renew)}
            try:
                return client.post(client.get_url(path), json=body, headers=headers, **self._verify)
            except etcd_errors.Etcd3Exception as e:
                if renew or _etcd_error(e)[0] != _GRPC_UNAUTHENTICATED:  # an expired token: authenticate again
                    raise
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        with self._lock:
            start = self._preferred
        errors: list[str] = []
        kinds: list[type[CoordinationError]] = []
        for i in range(len(self._clients)):
            index = (start + i) % len(self._clients)
            try:
                result = self._call(index, path, body)
            except (etcd_errors.Etcd3Exception, OSError, ValueError) as e:
                kinds.append(classify(e, self.security))
                errors.append(f"{self.endpoints[index]}: {type(e).__name__} {_etcd_error(e)[1][:200]}")
                continue
            with self._lock:
                self._preferred = index
            return result
        # a refusal of this broker's credentials says more than another endpoint's silence
        kind = next((k for k in (EtcdPermissionError, EtcdAuthError, EtcdTlsError) if k in kinds), CoordinationError)
        hint = ""
        closed = any(_CLOSED_UNANSWERED in e for e in errors)
        if kind is CoordinationError and self.security.protocol == "http" and closed:
            hint = "; an etcd that serves TLS only closes plain connections so: if it does, give etcd_ca_file"
        raise kind(f"{explain(kind, self.security)}{hint} (" + "; ".join(errors) + ")")

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

    def transaction(self, compare: list[RevisionCondition], success: list[Put]) -> bool:
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

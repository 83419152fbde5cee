"""The wrapped handler of each method, made once: what the broker's server interceptors share.

gRPC calls every interceptor's ``intercept_service`` on every call. An interceptor that built a new handler object
each time would allocate per call and, worse, defeat the interceptor in front of it, which sees a handler it has
never seen: the request guard kept one entry per call that way (1.1 KB a call with auth on). Each interceptor
keeps, per method name, the handler it was given and the one it made from it, and makes a new one only when the
handler it is given changes (it never does once the server runs); the table is bounded by the number of methods.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc


class WrappedHandlers:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def get(self, method: str, handler: grpc.RpcMethodHandler,
            wrap: Callable[[grpc.RpcMethodHandler], grpc.RpcMethodHandler]) -> grpc.RpcMethodHandler:
        """``wrap(handler)``, made once per method and handler."""
        known = self._wrapped.get(method)
        if known is not None and known[0] is handler:
            return known[1]
        wrapped = wrap(handler)
        with self._lock:
            self._wrapped[method] = (handler, wrapped)
        return wrapped

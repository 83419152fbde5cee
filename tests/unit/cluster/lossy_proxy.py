"""A TCP proxy in front of a broker that can lose one answer: the request reaches the broker, the reply never
reaches the client.

``lose_next_answer()`` arms it: the next bytes a client sends (the next call's request) are forwarded, everything
the broker sends back on that connection is dropped, and the connection is cut ``cut_after_s`` later, when the
broker has certainly stored what it was sent. The client sees its call fail mid-flight (UNAVAILABLE, connection
closed), exactly as when a network path dies after the request went out. Later connections pass through.
"""

from __future__ import annotations

import socket
import threading
import time

CHUNK_BYTES = 65536
MIN_REQUEST_BYTES = 64  # smaller client writes are HTTP/2 housekeeping (window updates, acks), not a call


class LossyProxy:
    def __init__(self, upstream: str, cut_after_s: float = 1.0) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.cut_after_s = cut_after_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._armed = threading.Event()
        self.answers_lost = 0
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def lose_next_answer(self) -> None:
        self._armed.set()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self._sockets += [client, server]
            state = {"losing": False}
            threading.Thread(target=self._pump_up, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._pump_down, args=(server, client, state), daemon=True).start()

    def _pump_up(self, client: socket.socket, server: socket.socket, state: dict[str, bool]) -> None:
        try:
            while data := client.recv(CHUNK_BYTES):
                if len(data) >= MIN_REQUEST_BYTES and self._armed.is_set() and not state["losing"]:
                    self._armed.clear()
                    state["losing"] = True
                    self.answers_lost += 1
                    threading.Thread(target=self._cut_later, args=(client, server), daemon=True).start()
                server.sendall(data)
        except OSError:
            pass

    def _pump_down(self, server: socket.socket, client: socket.socket, state: dict[str, bool]) -> None:
        try:
            while data := server.recv(CHUNK_BYTES):
                if not state["losing"]:
                    client.sendall(data)
        except OSError:
            pass

    def _cut_later(self, client: socket.socket, server: socket.socket) -> None:
        time.sleep(self.cut_after_s)
        for s in (client, server):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        for s in self._sockets:
            try:
                s.close()
            except OSError:
                pass

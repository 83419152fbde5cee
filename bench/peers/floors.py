"""The machine's floors for throughput: sequential disk writes with fdatasync, and 1 MiB gRPC calls on loopback.

Apart because they measure the machine, not any system: Sluice's MB/s are printed as ratios of them."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from bench.peers.processes import Server
from bench.peers.settings import (
    DISK_BLOCK_BYTES,
    DISK_PROBE_BYTES,
    DISK_SYNC_EVERY_BYTES,
    GRPC_PROBE_CALLS,
    GRPC_PROBE_MSG_BYTES,
    MB,
)


def disk_write_mb_s(directory: Path) -> float:
    """Sequential 1 MiB writes with fdatasync every 16 MiB and at the end: MB/s that reached the disk."""
    block = os.urandom(DISK_BLOCK_BYTES)
    path = directory / "disk-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        t0 = time.perf_counter()
        written = 0
        while written < DISK_PROBE_BYTES:
            written += os.write(fd, block)
            if written % DISK_SYNC_EVERY_BYTES == 0:
                os.fdatasync(fd)
        os.fdatasync(fd)
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()
    return written / elapsed / MB


GRPC_SINK_SERVER = """
import sys
from concurrent import futures
import grpc
size_limit = 64 * 1024 * 1024
def put(request, context):
    return b""
def get(request, context):
    return bytes(int.from_bytes(request, "big"))
handlers = {
    "Put": grpc.unary_unary_rpc_method_handler(put, lambda b: b, lambda b: b),
    "Get": grpc.unary_unary_rpc_method_handler(get, lambda b: b, lambda b: b),
}
server = grpc.server(futures.ThreadPoolExecutor(4), options=[
    ("grpc.max_receive_message_length", size_limit), ("grpc.max_send_message_length", size_limit)])
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Sink", handlers),))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print("ready", port, flush=True)
server.wait_for_termination()
"""


def grpc_loopback_mb_s(workdir: Path) -> tuple[float, float]:
    """(upload, download) MB/s of 1 MiB unary calls to a trivial gRPC service in another process."""
    import grpc

    server = Server([sys.executable, "-c", GRPC_SINK_SERVER], workdir / "grpc-sink.log")
    try:
        server.wait_for(lambda: "ready" in server.log_text(), "gRPC sink")
        port = int(server.log_text().split()[1])
        limit = 64 * 1024 * 1024
        options = [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)]
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            put = channel.unary_unary("/bench.Sink/Put")
            get = channel.unary_unary("/bench.Sink/Get")
            payload = os.urandom(GRPC_PROBE_MSG_BYTES)
            size_request = GRPC_PROBE_MSG_BYTES.to_bytes(8, "big")
            put(payload)
            get(size_request)  # warm-up: connection and first allocation
            t0 = time.perf_counter()
            for _ in range(GRPC_PROBE_CALLS):
                put(payload)
            upload_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            for _ in range(GRPC_PROBE_CALLS):
                assert len(get(size_request)) == GRPC_PROBE_MSG_BYTES
            download_s = time.perf_counter() - t0
    finally:
        server.stop()
    total = GRPC_PROBE_MSG_BYTES * GRPC_PROBE_CALLS
    return total / upload_s / MB, total / download_s / MB

"""Which threads should serve the remoting port: the candidates measured side by side on this machine.

RocketMQ's design (an accept thread, I/O threads, codec threads, a processor pool per request code) was written for
the JVM. In Python the GIL changes the costs, so each candidate is measured here as a bare server doing the
remoting framing (broker/remoting/frame.py) and a fixed amount of work per request standing in for a processor
(``--work-us`` of CPU: the broker's send processor costs some 150-250 us a send here), answered in each of these
ways:

- ``asyncio-inline``: one asyncio thread reads, decodes, runs the work and answers (no thread switch; a processor
  that blocks, as a SYNC_FLUSH send or a held pull does, would stop every connection);
- ``asyncio-pool``: the asyncio thread reads and decodes, a thread pool runs the work (what broker/remoting/server.py
  does, so that processors may block);
- ``asyncio-pool-per-code``: as above with one pool per request code (RocketMQ's processor table; two codes here);
- ``threads``: a thread per connection with blocking sockets (selector-free; the work runs on the reading thread).

Clients: one synchronous sender (sends a second, each waiting for its answer) and ``--senders`` synchronous
senders in processes of their own (their sum). Every figure is the median of ``--rounds`` rounds taken in turn over
the candidates, with the lowest and highest. ``python -m bench.remoting_threads``; JSON in bench/results/.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from broker.remoting.command import RemotingCommand
from broker.remoting.frame import body_length, decode_frame, encode_frame

CANDIDATES = ("asyncio-inline", "asyncio-pool", "asyncio-pool-per-code", "threads")
SEND, PULL = 310, 11  # the two request codes the clients alternate between (one pool each for -per-code)
POOL_THREADS = 32  # broker/remoting/server.py's pool size

SERVER = r'''
import asyncio, socket, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from broker.remoting.frame import body_length, decode_frame, encode_frame

kind, work_s, pool_threads = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])

def work(command):
    end = time.thread_time() + work_s
    while time.thread_time() < end:
        pass
    return encode_frame(command.response(0, ext_fields={"queueId": "0", "queueOffset": "0"}))

async def serve(reader, writer, pools):
    loop = asyncio.get_running_loop()
    try:
        while True:
            prefix = await reader.readexactly(4)
            command = decode_frame(await reader.readexactly(body_length(prefix)))
            if pools is None:
                writer.write(work(command))
            else:
                pool = pools.get(command.code, pools[None])
                writer.write(await loop.run_in_executor(pool, work, command))
    except (asyncio.IncompleteReadError, ConnectionError):
        pass

async def main(pools):
    server = await asyncio.start_server(lambda r, w: serve(r, w, pools), "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()

def read_exactly(conn, n):
    data = bytearray()
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError
        data += chunk
    return bytes(data)

def per_connection(conn):
    with conn:
        try:
            while True:
                prefix = read_exactly(conn, 4)
                conn.sendall(work(decode_frame(read_exactly(conn, body_length(prefix)))))
        except ConnectionError:
            pass

if kind == "threads":
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    while True:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=per_connection, args=(conn,), daemon=True).start()
elif kind == "asyncio-inline":
    asyncio.run(main(None))
elif kind == "asyncio-pool":
    asyncio.run(main({None: ThreadPoolExecutor(pool_threads)}))
else:
    half = max(pool_threads // 2, 1)
    asyncio.run(main({None: ThreadPoolExecutor(half), 310: ThreadPoolExecutor(half), 11: ThreadPoolExecutor(half)}))
'''


def start_server(kind: str, work_us: float) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-c", SERVER, kind, str(work_us / 1e6), str(POOL_THREADS)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def sync_sends(port: int, seconds: float) -> float:
    """One synchronous sender's sends a second, alternating the two codes."""
    conn = socket.create_connection(("127.0.0.1", port))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    frames = [encode_frame(RemotingCommand(code, opaque=1, ext_fields={"b": "T", "e": "0"}, body=b"x" * 100))
              for code in (SEND, PULL)]
    sent = 0
    start = time.perf_counter()
    deadline = start + seconds
    with conn, conn.makefile("rb") as answers:
        while time.perf_counter() < deadline:
            conn.sendall(frames[sent & 1])
            decode_frame(answers.read(body_length(answers.read(4))))
            sent += 1
    return sent / (time.perf_counter() - start)


def _sender(port: int, seconds: float, out: mp.Queue[float]) -> None:
    out.put(sync_sends(port, seconds))


def concurrent_sends(port: int, senders: int, seconds: float) -> float:
    """``senders`` synchronous senders in processes of their own: their sends a second together."""
    out: mp.Queue[float] = mp.Queue()
    procs = [mp.Process(target=_sender, args=(port, seconds, out)) for _ in range(senders)]
    for p in procs:
        p.start()
    total = sum(out.get(timeout=seconds + 30) for _ in procs)
    for p in procs:
        p.join()
    return total


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1), "max": round(max(values), 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.remoting_threads", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="each measurement's length")
    parser.add_argument("--work-us", type=float, default=150.0, help="CPU a request's processor stands for")
    parser.add_argument("--senders", type=int, default=4)
    args = parser.parse_args(argv)
    one: dict[str, list[float]] = {k: [] for k in CANDIDATES}
    many: dict[str, list[float]] = {k: [] for k in CANDIDATES}
    for _ in range(args.rounds):
        for kind in CANDIDATES:  # in turn, so that the machine's drift falls on every candidate alike
            proc, port = start_server(kind, args.work_us)
            try:
                one[kind].append(sync_sends(port, args.seconds))
                many[kind].append(concurrent_sends(port, args.senders, args.seconds))
            finally:
                proc.kill()
                proc.wait()
    rows = {k: {"one_sender": spread(one[k]), f"{args.senders}_senders": spread(many[k])} for k in CANDIDATES}
    print(f"{'candidate':<24}{'1 sender /s':>22}{f'{args.senders} senders /s':>24}")
    for k, r in rows.items():
        a, b = r["one_sender"], r[f"{args.senders}_senders"]
        print(f"{k:<24}{a['median']:>10.0f} [{a['min']:.0f}, {a['max']:.0f}]{b['median']:>12.0f} "
              f"[{b['min']:.0f}, {b['max']:.0f}]")
    out = Path(__file__).with_name("results") / "remoting_threads.json"
    out.parent.mkdir(exist_ok=True)
    report = {"benchmark": "remoting_threads", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "args": vars(args), "load_avg_1m": round(os.getloadavg()[0], 2), "candidates": rows}
    out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()

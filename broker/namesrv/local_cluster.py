"""A cluster on this machine: a name server and brokers as child processes, for tests, benchmarks and trying a
cluster out.

Each process prints its ``ready on HOST:PORT`` line; brokers listen on port 0 of 127.0.0.1 and register with the
name server(s) under names ``broker-a``, ``broker-b``, ... unless told otherwise. ``kill`` is a SIGKILL (a crash),
``stop`` a SIGTERM (a clean shutdown, which unregisters), ``restart`` starts a broker again on the same store
(and, by default, the same port, so clients holding its address find it again).

Name servers start with ``--allow-anonymous-registration`` unless told otherwise: a cluster on one machine is for
tests and trials. With ``$SLUICE_ROOT_ACCESS_KEY`` and ``$SLUICE_ROOT_SECRET_KEY`` in the environment (which every
process here inherits) registration is authenticated all the same: the flag only lets a name server start without
them.
"""

from __future__ import annotations

import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from broker.address import local_endpoint
from broker.errors import ServiceNotAvailableError
from broker.server.process import REMOTING_PATTERN, BrokerProcess, ServiceProcess


class NameServerProcess(ServiceProcess):
    what = "name server"
    keeps_stdout = True

    def __init__(self, *, listen: str = "127.0.0.1:0", broker_expire_ms: int | None = None,
                 log_level: str = "WARNING", extra_args: list[str] | None = None,
                 allow_anonymous_registration: bool = True) -> None:
        args = [sys.executable, "-m", "broker", "--log-level", log_level, "namesrv", "--listen", listen,
                *(extra_args or [])]
        if allow_anonymous_registration:
            args.append("--allow-anonymous-registration")
        if broker_expire_ms is not None:
            args += ["--broker-expire-ms", str(broker_expire_ms)]
        super().__init__(args)
        self.address = ""
        self.remoting_address = ""  # HOST:PORT of its remoting port (``--remoting-listen``), "" when none

    def _ready(self, line: str, match: re.Match[str]) -> None:
        self.address = local_endpoint(match.group(1).strip("[]"), int(match.group(2)))
        remoting = REMOTING_PATTERN.search(line)
        if remoting:
            self.remoting_address = local_endpoint(remoting.group(1).strip("[]"), int(remoting.group(2)))


class LocalCluster:
    """``LocalCluster(tmp_path, brokers=3).start()``; ``namesrv`` is the address list for clients."""

    def __init__(
        self, root: Path, *, brokers: int = 3, namesrvs: int = 1, cluster: str = "DefaultCluster",
        flush: str = "async", broker_expire_ms: int | None = None, register_interval_ms: int | None = None,
        config: Path | None = None, log_level: str = "WARNING", extra_broker_args: list[str] | None = None,
        python_cpus: list[str] | None = None, namesrv_args: list[str] | None = None,
    ) -> None:
        self.root = root
        self.cluster = cluster
        self.flush = flush
        self.config = config
        self.log_level = log_level
        self.register_interval_ms = register_interval_ms
        self.extra_broker_args = extra_broker_args or []
        # Each broker's --python-cpus, in turn (broker/server/thread_placement.py): "auto" pins every broker's
        # Python threads to the same lowest CPU, so brokers sharing a machine are given one CPU each.
        self.python_cpus = python_cpus or []
        self.namesrvs = [NameServerProcess(broker_expire_ms=broker_expire_ms, log_level=log_level,
                                           extra_args=namesrv_args) for _ in range(namesrvs)]
        self.names = [f"broker-{chr(ord('a') + i)}" for i in range(brokers)]
        self.brokers: dict[str, BrokerProcess] = {}

    @property
    def namesrv(self) -> str:
        return ",".join(n.address for n in self.namesrvs)

    def start(self) -> LocalCluster:
        try:
            for ns in self.namesrvs:
                ns.start()
            with ThreadPoolExecutor(len(self.names) or 1) as pool:  # brokers start side by side
                for started in [pool.submit(self.add_broker, name) for name in self.names]:
                    started.result()
        except BaseException:
            self.close()
            raise
        return self

    def _broker_args(self, name: str) -> list[str]:
        args = ["--namesrv", self.namesrv, "--cluster", self.cluster, "--broker-name", name]
        if self.register_interval_ms is not None:
            args += ["--register-interval-ms", str(self.register_interval_ms)]
        if self.python_cpus:
            index = self.names.index(name) if name in self.names else len(self.names)
            args += ["--python-cpus", self.python_cpus[index % len(self.python_cpus)]]
        return args + self.extra_broker_args

    def add_broker(self, name: str, listen: str = "127.0.0.1:0") -> BrokerProcess:
        broker = BrokerProcess(self.root / name, listen=listen, flush=self.flush, config=self.config,
                               log_level=self.log_level, extra_args=self._broker_args(name))
        broker.start()
        self.brokers[name] = broker
        if name not in self.names:
            self.names.append(name)
        return broker

    def endpoint(self, name: str) -> str:
        return self.brokers[name].endpoint

    def kill(self, name: str) -> None:
        self.brokers[name].kill()

    def stop(self, name: str) -> int:
        return self.brokers[name].stop()

    def restart(self, name: str, *, same_port: bool = True) -> BrokerProcess:
        old = self.brokers[name]
        if old.proc is not None and old.proc.poll() is None:
            old.stop()
        listen = f"127.0.0.1:{old.port}" if same_port else "127.0.0.1:0"
        deadline = time.monotonic() + 30
        while True:  # the old port may linger for a moment after the process ended
            try:
                return self.add_broker(name, listen)
            except ServiceNotAvailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def close(self) -> None:
        for broker in self.brokers.values():
            if broker.proc is not None and broker.proc.poll() is None:
                broker.kill()
        for ns in self.namesrvs:
            if ns.running:
                ns.kill()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
